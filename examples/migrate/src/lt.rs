//! cuBLASLt as hand-written trainers wrap it: one handle, a default stream and workspace,
//! and a plan per GEMM shape, chosen once.
//!
//! Matrices are row-major, as the rest of the trainer sees them; cuBLASLt's are
//! column-major. A row-major `X[r, c]` with row stride `ld` has the bytes of the
//! column-major `Xᵀ[c, r]` with leading dimension `ld`, so `D = op(A)·op(B)` is issued as
//! `Dᵀ = op(B)ᵀ·op(A)ᵀ`: cuBLASLt's A is the caller's B and the other way round, each
//! keeping its transpose flag ([`Gemm::col_major`]).
//!
//! The algorithm of a shape is chosen by `cublasLtMatmulAlgoGetHeuristic` the first time
//! the shape is seen ([`Lt::prepare`]), for a workspace of [`WORKSPACE_BYTES`], whatever
//! workspace a later call passes: cuBLASLt's results may differ between algorithms, so a
//! choice that followed the workspace would make the same step give other bits when it
//! runs with another workspace. Every call then passes the algorithm's own workspace need
//! as the workspace size, so the call is the same with the default workspace and with an
//! override.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::error::{Error, Result};

/// The workspace the algorithms are chosen for, and the size of the default workspace:
/// cuBLASLt's recommendation on Hopper, and the size of stepgraph's per-stream workspaces.
pub const WORKSPACE_BYTES: usize = 32 * 1024 * 1024;

/// The alignment `cublasLtMatmul` requires of the workspace pointer.
pub const WORKSPACE_ALIGN: u64 = 256;

/// The alignment of every operand's address that the algorithms are chosen for (the
/// heuristic is told so, and [`Lt::matmul`] checks it): 16 bytes, four `f32`s, lets
/// cuBLASLt use vector loads while still allowing views that start inside an allocation.
pub const OPERAND_ALIGN: u64 = 16;

/// The shape of one `D = op(A)·op(B)` on row-major `f32` matrices: `op(A)` is `[m, k]`,
/// `op(B)` is `[k, n]`, `D` is `[m, n]`.
///
/// Each operand is stored row-major with a row stride (its leading dimension): by default
/// its row length (packed), or a larger stride given with [`with_lda`](Gemm::with_lda) and
/// friends, which reads every `ld`-th run of a buffer (one token's row of each sample, a
/// column block of a wider matrix) without a copy.
///
/// ```
/// use stepgraph_migrate::lt::Gemm;
///
/// // y = x · wᵀ for x [256, 64] and a linear layer's weight w [128, 64].
/// let fc = Gemm::new(256, 128, 64).trans_b();
/// assert_eq!((fc.a().rows, fc.a().cols), (256, 64));
/// assert_eq!((fc.b().rows, fc.b().cols), (128, 64));
/// assert_eq!(fc.d().extent(), 256 * 128);
///
/// // Row 0 of each sample of a [256, 8, 64] tensor: 256 rows of 64, 512 apart.
/// let first = Gemm::new(256, 4, 64).trans_b().with_lda(8 * 64);
/// assert_eq!(first.a().extent(), 255 * 512 + 64);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gemm {
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    lda: Option<usize>,
    ldb: Option<usize>,
    ldd: Option<usize>,
}

/// How one operand is stored: `rows` rows of `cols` elements, `ld` elements apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Rows as stored (for a transposed operand, the columns of its `op`).
    pub rows: usize,
    /// Elements per row as stored.
    pub cols: usize,
    /// Elements from one row's start to the next's, at least `cols`.
    pub ld: usize,
}

impl Stored {
    /// The elements a buffer needs to hold the matrix: up to the end of its last row.
    pub fn extent(&self) -> usize {
        (self.rows - 1) * self.ld + self.cols
    }

    /// Whether the rows are back to back.
    pub fn is_packed(&self) -> bool {
        self.ld == self.cols
    }
}

/// A matrix as cuBLASLt sees it: column-major, `rows × cols` with leading dimension `ld`,
/// and whether the matmul transposes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColMajor {
    /// Rows of the column-major matrix.
    pub rows: usize,
    /// Columns of the column-major matrix.
    pub cols: usize,
    /// Leading dimension in elements.
    pub ld: usize,
    /// `CUBLAS_OP_T` rather than `CUBLAS_OP_N`.
    pub trans: bool,
}

/// The problem cuBLASLt is given for a [`Gemm`]: `d = op(a)·op(b)`, column-major, where
/// `a` is the caller's B and `b` the caller's A.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColMajorProblem {
    /// cuBLASLt's A: the caller's B.
    pub a: ColMajor,
    /// cuBLASLt's B: the caller's A.
    pub b: ColMajor,
    /// cuBLASLt's D (and C): `Dᵀ`, `n × m`.
    pub d: ColMajor,
}

impl Gemm {
    /// `D[m, n] = A[m, k]·B[k, n]`, every operand packed and none transposed.
    pub fn new(m: usize, n: usize, k: usize) -> Gemm {
        Gemm {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            lda: None,
            ldb: None,
            ldd: None,
        }
    }

    /// A is stored as `[k, m]` and used transposed.
    pub fn trans_a(mut self) -> Gemm {
        self.trans_a = true;
        self
    }

    /// B is stored as `[n, k]` and used transposed: `x·wᵀ` for a weight `w[out, in]`.
    pub fn trans_b(mut self) -> Gemm {
        self.trans_b = true;
        self
    }

    /// A's row stride, in elements, instead of its row length.
    pub fn with_lda(mut self, ld: usize) -> Gemm {
        self.lda = Some(ld);
        self
    }

    /// B's row stride, in elements, instead of its row length.
    pub fn with_ldb(mut self, ld: usize) -> Gemm {
        self.ldb = Some(ld);
        self
    }

    /// D's row stride, in elements, instead of its row length.
    pub fn with_ldd(mut self, ld: usize) -> Gemm {
        self.ldd = Some(ld);
        self
    }

    /// `(m, n, k)`.
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.m, self.n, self.k)
    }

    /// How A is stored.
    pub fn a(&self) -> Stored {
        let (rows, cols) = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        Stored {
            rows,
            cols,
            ld: self.lda.unwrap_or(cols),
        }
    }

    /// How B is stored.
    pub fn b(&self) -> Stored {
        let (rows, cols) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        Stored {
            rows,
            cols,
            ld: self.ldb.unwrap_or(cols),
        }
    }

    /// How D is stored.
    pub fn d(&self) -> Stored {
        Stored {
            rows: self.m,
            cols: self.n,
            ld: self.ldd.unwrap_or(self.n),
        }
    }

    /// The same problem in cuBLASLt's column-major terms (see the [module](self) docs).
    pub fn col_major(&self) -> ColMajorProblem {
        let swap = |s: Stored, trans: bool| ColMajor {
            rows: s.cols,
            cols: s.rows,
            ld: s.ld,
            trans,
        };
        ColMajorProblem {
            a: swap(self.b(), self.trans_b),
            b: swap(self.a(), self.trans_a),
            d: swap(self.d(), false),
        }
    }

    /// Checks the shape itself: no empty dimension, every stride at least its row length,
    /// every operand's extent representable (cuBLASLt takes `u64` sizes and `i64`
    /// strides).
    pub fn check(&self) -> Result<()> {
        if self.m == 0 || self.n == 0 || self.k == 0 {
            return Err(Error::Invalid(format!(
                "matmul {self}: an empty dimension (cuBLASLt has no algorithm for it)"
            )));
        }
        for (name, s) in [("A", self.a()), ("B", self.b()), ("D", self.d())] {
            if s.ld < s.cols {
                return Err(Error::Invalid(format!(
                    "matmul {self}: {name}'s row stride {} is less than its row length {}: \
                     its rows would overlap",
                    s.ld, s.cols
                )));
            }
            let extent = (s.rows - 1)
                .checked_mul(s.ld)
                .and_then(|x| x.checked_add(s.cols));
            if extent.is_none_or(|e| i64::try_from(e).is_err()) {
                return Err(Error::Invalid(format!(
                    "matmul {self}: {name} is too large to address"
                )));
            }
        }
        Ok(())
    }

    /// Checks buffer lengths against the shape: a packed operand must be exactly its
    /// matrix (a longer buffer is likelier a mistake than a plan), a strided one must reach
    /// the end of its last row.
    pub fn check_operands(&self, a_len: usize, b_len: usize, d_len: usize) -> Result<()> {
        self.check()?;
        for (name, s, len) in [
            ("A", self.a(), a_len),
            ("B", self.b(), b_len),
            ("D", self.d(), d_len),
        ] {
            let fits = if s.is_packed() {
                len == s.extent()
            } else {
                len >= s.extent()
            };
            if !fits {
                let want = if s.is_packed() { "" } else { "at least " };
                return Err(Error::Invalid(format!(
                    "matmul {self}: {name} holds {len} elements, and its {} rows of {} with \
                     stride {} need {want}{}",
                    s.rows,
                    s.cols,
                    s.ld,
                    s.extent()
                )));
            }
        }
        Ok(())
    }
}

impl fmt::Display for Gemm {
    /// `[256x64]·[64x128]ᵀ` style: the stored shapes, `ᵀ` on a transposed operand, `/ld`
    /// on a strided one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let one = |f: &mut fmt::Formatter<'_>, s: Stored, t: bool| {
            write!(f, "[{}x{}", s.rows, s.cols)?;
            if !s.is_packed() {
                write!(f, "/{}", s.ld)?;
            }
            write!(f, "]{}", if t { "ᵀ" } else { "" })
        };
        one(f, self.a(), self.trans_a)?;
        f.write_str("·")?;
        one(f, self.b(), self.trans_b)?;
        write!(f, " -> [{}x{}", self.m, self.n)?;
        if !self.d().is_packed() {
            write!(f, "/{}", self.d().ld)?;
        }
        f.write_str("]")
    }
}

// ---------------------------------------------------------------------------------------
// Owned descriptors.
// ---------------------------------------------------------------------------------------

/// The (pointer, size) of an attribute value for the `...SetAttribute` calls, which read
/// `size` bytes at `pointer`; `V` must be the attribute's documented type.
fn attr<V>(value: &V) -> (*const c_void, usize) {
    ((value as *const V).cast(), std::mem::size_of::<V>())
}

/// An owned `cublasLtMatrixLayout_t`.
struct Layout(sys::cublasLtMatrixLayout_t);

impl Layout {
    /// [cublasLtMatrixLayoutCreate](https://docs.nvidia.com/cuda/cublas/#cublasltmatrixlayoutcreate)
    /// for an `f32` matrix.
    fn new(m: &ColMajor) -> Result<Layout> {
        // `Gemm::check` bounded every extent by i64::MAX, so none of these casts truncates.
        lt::create_matrix_layout(
            sys::cudaDataType::CUDA_R_32F,
            m.rows as u64,
            m.cols as u64,
            m.ld as i64,
        )
        .map(Layout)
        .map_err(Error::blas("cublasLtMatrixLayoutCreate"))
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created in `Layout::new` and destroyed once, here. A failure only leaks
        // host memory, and Drop must not panic, so it is ignored.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

/// An owned `cublasLtMatmulDesc_t`.
struct MatmulDesc(sys::cublasLtMatmulDesc_t);

impl MatmulDesc {
    /// [cublasLtMatmulDescCreate](https://docs.nvidia.com/cuda/cublas/#cublasltmatmuldesccreate)
    /// with `CUBLAS_COMPUTE_32F`, and the transposes set.
    ///
    /// Exact `f32` products rather than TF32 (`CUBLAS_COMPUTE_32F_FAST_TF32`): the heads'
    /// GEMMs are small enough that their time is latency, not tensor-core throughput, and
    /// exact products let the GPU step be checked against the CPU reference at `f32`
    /// tolerances rather than at TF32's 1e-3.
    fn new(problem: &ColMajorProblem) -> Result<MatmulDesc> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map(MatmulDesc)
        .map_err(Error::blas("cublasLtMatmulDescCreate"))?;
        for (attribute, trans) in [
            (A::CUBLASLT_MATMUL_DESC_TRANSA, problem.a.trans),
            (A::CUBLASLT_MATMUL_DESC_TRANSB, problem.b.trans),
        ] {
            // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
            let op = i32::from(trans);
            let (ptr, size) = attr(&op);
            // SAFETY: the descriptor is alive; TRANSA and TRANSB are `int32_t`
            // (cublasOperation_t), the type of `op`, which outlives the call.
            unsafe { lt::set_matmul_desc_attribute(desc.0, attribute, ptr, size) }
                .map_err(Error::blas("cublasLtMatmulDescSetAttribute"))?;
        }
        Ok(desc)
    }
}

impl Drop for MatmulDesc {
    fn drop(&mut self) {
        // SAFETY: created in `MatmulDesc::new` and destroyed once, here; a failure is
        // ignored as in `Layout`.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

/// An owned `cublasLtMatmulPreference_t`: the workspace and alignments the algorithm is
/// chosen for.
struct Preference(sys::cublasLtMatmulPreference_t);

impl Preference {
    fn new() -> Result<Preference> {
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let pref = lt::create_matmul_pref()
            .map(Preference)
            .map_err(Error::blas("cublasLtMatmulPreferenceCreate"))?;
        let workspace = WORKSPACE_BYTES as u64;
        let align = OPERAND_ALIGN as u32;
        for (attribute, (ptr, size)) in [
            (
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                attr(&workspace),
            ),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, attr(&align)),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, attr(&align)),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, attr(&align)),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, attr(&align)),
        ] {
            // SAFETY: the preference is alive; MAX_WORKSPACE_BYTES is a `uint64_t` and
            // the MIN_ALIGNMENT_*_BYTES are `uint32_t`, the types of `workspace` and
            // `align`, which outlive the call.
            unsafe { lt::set_matmul_pref_attribute(pref.0, attribute, ptr, size) }
                .map_err(Error::blas("cublasLtMatmulPreferenceSetAttribute"))?;
        }
        Ok(pref)
    }
}

impl Drop for Preference {
    fn drop(&mut self) {
        // SAFETY: created in `Preference::new` and destroyed once, here; a failure is
        // ignored as in `Layout`.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

/// Everything a matmul of one shape needs but its pointers: built once, reused by every
/// call of the shape, eager or captured.
struct Plan {
    desc: MatmulDesc,
    a: Layout,
    b: Layout,
    /// The layout of C and of D (C is D, read with beta = 0).
    d: Layout,
    algo: sys::cublasLtMatmulAlgo_t,
    /// The workspace the algorithm needs, at most [`WORKSPACE_BYTES`].
    workspace_bytes: usize,
}

// ---------------------------------------------------------------------------------------
// The handle.
// ---------------------------------------------------------------------------------------

/// A cuBLASLt handle with the trainer's default stream and workspace, and the plans of
/// the shapes it has seen.
///
/// Used from one thread (the plan cache is a `RefCell`). The plans are dropped before the
/// handle.
pub struct Lt {
    plans: RefCell<HashMap<Gemm, Plan>>,
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

impl fmt::Debug for Lt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lt")
            .field("workspace_bytes", &self.workspace.len())
            .field("plans", &self.plans.try_borrow().map(|p| p.len()).ok())
            .finish_non_exhaustive()
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.get_mut().clear();
        // SAFETY: the handle was created in `new` and is destroyed once, here, after every
        // descriptor made for it. A failure is ignored rather than panicking in Drop.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

impl Lt {
    /// Creates the handle ([cublasLtCreate](https://docs.nvidia.com/cuda/cublas/#cublasltcreate))
    /// and allocates the default workspace on `stream`, the default stream of every
    /// matmul.
    pub fn new(stream: Arc<CudaStream>) -> Result<Lt> {
        stream
            .context()
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        // SAFETY: a workspace is scratch that cuBLASLt writes before it reads.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(Error::driver("cuMemAllocAsync"))?;
        let handle = lt::create_handle().map_err(Error::blas("cublasLtCreate"))?;
        Ok(Lt {
            plans: RefCell::new(HashMap::new()),
            handle,
            workspace,
            stream,
        })
    }

    /// The default stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The default workspace, [`WORKSPACE_BYTES`] long.
    pub fn workspace(&self) -> &CudaSlice<u8> {
        &self.workspace
    }

    /// The raw handle, for cuBLASLt calls this wrapper does not make. It stays owned by
    /// this `Lt`: do not destroy it.
    pub fn cu_handle(&self) -> sys::cublasLtHandle_t {
        self.handle
    }

    /// How many shapes have a plan.
    pub fn planned(&self) -> usize {
        self.plans.try_borrow().map_or(0, |p| p.len())
    }

    /// Builds the plan of `gemm` if it has none (layouts, descriptor, and the algorithm
    /// [cublasLtMatmulAlgoGetHeuristic](https://docs.nvidia.com/cuda/cublas/#cublasltmatmulalgogetheuristic)
    /// picks for a [`WORKSPACE_BYTES`] workspace) and returns the workspace its algorithm
    /// needs. A matmul plans its shape itself; calling this first keeps the heuristic out
    /// of a capture and says how large a workspace override must be.
    pub fn prepare(&self, gemm: &Gemm) -> Result<usize> {
        gemm.check()?;
        self.with_plan(gemm, |plan| Ok(plan.workspace_bytes))
    }

    /// Runs `f` on the plan of `gemm`, building it first if needed.
    fn with_plan<T>(&self, gemm: &Gemm, f: impl FnOnce(&Plan) -> Result<T>) -> Result<T> {
        let mut plans = self.plans.try_borrow_mut().map_err(|_| {
            Error::Invalid("Lt is in use by another call on this thread".to_string())
        })?;
        if !plans.contains_key(gemm) {
            let plan = self.build_plan(gemm)?;
            plans.insert(*gemm, plan);
        }
        match plans.get(gemm) {
            Some(plan) => f(plan),
            None => Err(Error::Invalid(format!("matmul {gemm}: no plan"))),
        }
    }

    fn build_plan(&self, gemm: &Gemm) -> Result<Plan> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        let problem = gemm.col_major();
        let desc = MatmulDesc::new(&problem)?;
        let a = Layout::new(&problem.a)?;
        let b = Layout::new(&problem.b)?;
        let d = Layout::new(&problem.d)?;
        let pref = Preference::new()?;
        // SAFETY: the handle and every descriptor are alive for the call; C and D share a
        // layout.
        let result = unsafe {
            lt::get_matmul_algo_heuristic(self.handle, desc.0, a.0, b.0, d.0, d.0, pref.0)
        }
        .map_err(Error::blas("cublasLtMatmulAlgoGetHeuristic"))?;
        if result.workspaceSize > WORKSPACE_BYTES {
            return Err(Error::Invalid(format!(
                "matmul {gemm}: cuBLASLt chose an algorithm that needs {} bytes of workspace, \
                 more than the {WORKSPACE_BYTES} it was offered",
                result.workspaceSize
            )));
        }
        Ok(Plan {
            desc,
            a,
            b,
            d,
            algo: result.algo,
            workspace_bytes: result.workspaceSize,
        })
    }

    /// `D = op(A)·op(B)` as `gemm` says, with
    /// [cublasLtMatmul](https://docs.nvidia.com/cuda/cublas/#cublasltmatmul), on the
    /// default stream and workspace or on the overrides.
    ///
    /// - `override_stream`: the stream to issue on instead of [`Lt::stream`].
    /// - `override_workspace`: `(device address, bytes)` of a workspace to use instead of
    ///   the default one, at least as large as the shape's algorithm needs
    ///   ([`Lt::prepare`] says how much) and [`WORKSPACE_ALIGN`]-aligned. It must stay
    ///   allocated until the matmul has run (for a captured matmul, for as long as the
    ///   graph is replayed), and nothing else may use it meanwhile. Two streams that run
    ///   matmuls at the same time each need their own: with only a stream override, the
    ///   default workspace is shared with every other user of it.
    ///
    /// The lengths of `a`, `b` and `d` are checked against the shape
    /// ([`Gemm::check_operands`]) and their addresses against [`OPERAND_ALIGN`]; the
    /// workspace against the algorithm's need. Nothing else happens on the host (no
    /// allocation, no synchronisation), so a call can be captured; the first call of a
    /// shape builds its plan, which only creates host-side descriptors.
    pub fn matmul<A, B, D>(
        &self,
        override_stream: Option<&Arc<CudaStream>>,
        override_workspace: Option<(u64, usize)>,
        gemm: &Gemm,
        a: &A,
        b: &B,
        d: &mut D,
    ) -> Result<()>
    where
        A: DevicePtr<f32>,
        B: DevicePtr<f32>,
        D: DevicePtrMut<f32>,
    {
        gemm.check_operands(a.len(), b.len(), d.len())?;
        let stream: &CudaStream = override_stream.unwrap_or(&self.stream);
        stream
            .context()
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        self.with_plan(gemm, |plan| {
            let need = plan.workspace_bytes;
            let (default_ws, _ws) = self.workspace.device_ptr(stream);
            let workspace = match override_workspace {
                None => default_ws,
                Some((ptr, bytes)) => check_workspace(gemm, ptr, bytes, need)?,
            };
            // Untracked slices (see `Trainer::new`) record nothing in these guards; they are
            // kept until the matmul is issued all the same, as cudarc asks.
            let (a_ptr, _a) = a.device_ptr(stream);
            let (b_ptr, _b) = b.device_ptr(stream);
            let (d_ptr, _d) = d.device_ptr_mut(stream);
            for (name, ptr) in [("A", a_ptr), ("B", b_ptr), ("D", d_ptr)] {
                if ptr % OPERAND_ALIGN != 0 {
                    return Err(Error::Invalid(format!(
                        "matmul {gemm}: {name} starts at {ptr:#x}, not {OPERAND_ALIGN}-byte \
                         aligned as its algorithm was chosen for"
                    )));
                }
            }
            let (alpha, beta) = (1.0f32, 0.0f32);
            // SAFETY: the plan's descriptors are alive (the cache is borrowed for the
            // call) and were built from `gemm`, against which every buffer's length was
            // checked, so cuBLASLt stays inside them; the buffers are borrowed for the
            // call and, when captured, kept by the caller as long as the graph. cuBLASLt's
            // A is the caller's B (`Gemm::col_major`). Alpha and beta are f32, the scale
            // type, read from the host (the default pointer mode) during the call. The
            // workspace is the default one or an override checked to be large enough for
            // the algorithm, whose need is the size passed.
            unsafe {
                lt::matmul(
                    self.handle,
                    plan.desc.0,
                    (&alpha as *const f32).cast(),
                    (&beta as *const f32).cast(),
                    b_ptr as *const c_void,
                    plan.a.0,
                    a_ptr as *const c_void,
                    plan.b.0,
                    d_ptr as *const c_void,
                    plan.d.0,
                    d_ptr as *mut c_void,
                    plan.d.0,
                    &plan.algo,
                    workspace as *mut c_void,
                    need,
                    stream.cu_stream() as sys::cudaStream_t,
                )
            }
            .map_err(Error::blas("cublasLtMatmul"))
        })
    }
}

/// Checks a workspace override against what the algorithm of `gemm` needs.
fn check_workspace(gemm: &Gemm, ptr: u64, bytes: usize, need: usize) -> Result<u64> {
    if ptr == 0 || !ptr.is_multiple_of(WORKSPACE_ALIGN) {
        return Err(Error::Invalid(format!(
            "matmul {gemm}: the workspace override starts at {ptr:#x}; cuBLASLt needs a \
             {WORKSPACE_ALIGN}-byte aligned device address"
        )));
    }
    if bytes < need {
        return Err(Error::Invalid(format!(
            "matmul {gemm}: the workspace override has {bytes} bytes, and the algorithm chosen \
             for this shape (for a {WORKSPACE_BYTES}-byte workspace) needs {need}"
        )));
    }
    Ok(ptr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row-major `op(X)[i, j]` of a stored matrix.
    fn op_at(x: &[f64], s: Stored, trans: bool, i: usize, j: usize) -> f64 {
        if trans {
            x[j * s.ld + i]
        } else {
            x[i * s.ld + j]
        }
    }

    /// `D = op(A)·op(B)` the way the caller means it, row-major.
    fn row_major(g: &Gemm, a: &[f64], b: &[f64]) -> Vec<f64> {
        let (m, n, k) = g.dims();
        let d = g.d();
        let mut out = vec![f64::NAN; d.extent()];
        for i in 0..m {
            for j in 0..n {
                out[i * d.ld + j] = (0..k)
                    .map(|l| op_at(a, g.a(), g.trans_a, i, l) * op_at(b, g.b(), g.trans_b, l, j))
                    .sum();
            }
        }
        out
    }

    /// What cuBLASLt computes for a column-major problem: BLAS's definition of
    /// `D = op(A)·op(B)`, element `(i, j)` of a matrix at `i + j ld`.
    fn col_major(p: &ColMajorProblem, a: &[f64], b: &[f64], d_len: usize) -> Vec<f64> {
        let at = |x: &[f64], c: &ColMajor, i: usize, j: usize| {
            if c.trans {
                x[j + i * c.ld]
            } else {
                x[i + j * c.ld]
            }
        };
        let k = if p.a.trans { p.a.rows } else { p.a.cols };
        let mut out = vec![f64::NAN; d_len];
        for i in 0..p.d.rows {
            for j in 0..p.d.cols {
                out[i + j * p.d.ld] = (0..k).map(|l| at(a, &p.a, i, l) * at(b, &p.b, l, j)).sum();
            }
        }
        out
    }

    fn data(n: usize, salt: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 7 + salt * 13) % 17) as f64 - 8.0)
            .collect()
    }

    #[test]
    fn the_swapped_column_major_problem_computes_the_row_major_product() {
        for trans_a in [false, true] {
            for trans_b in [false, true] {
                for pad in [0, 3] {
                    let mut g = Gemm::new(5, 4, 3);
                    if trans_a {
                        g = g.trans_a();
                    }
                    if trans_b {
                        g = g.trans_b();
                    }
                    if pad > 0 {
                        g = g
                            .with_lda(g.a().cols + pad)
                            .with_ldb(g.b().cols + pad + 1)
                            .with_ldd(g.d().cols + pad);
                    }
                    g.check().unwrap();
                    let (a, b) = (data(g.a().extent(), 1), data(g.b().extent(), 2));
                    let p = g.col_major();
                    // Cuda's A is the caller's B.
                    let lt = col_major(&p, &b, &a, g.d().extent());
                    let want = row_major(&g, &a, &b);
                    // Padding between rows is written by neither.
                    for (i, (x, y)) in lt.iter().zip(&want).enumerate() {
                        assert!(
                            x == y || (x.is_nan() && y.is_nan()),
                            "{g} at {i}: {x} vs {y}"
                        );
                    }
                    assert_eq!((p.d.rows, p.d.cols), (4, 5), "{g}");
                }
            }
        }
    }

    #[test]
    fn a_linear_layer_maps_to_weight_transposed_first() {
        // y[256, 128] = x[256, 64] · w[128, 64]ᵀ
        let p = Gemm::new(256, 128, 64).trans_b().col_major();
        assert_eq!(
            p.a,
            ColMajor {
                rows: 64,
                cols: 128,
                ld: 64,
                trans: true
            }
        );
        assert_eq!(
            p.b,
            ColMajor {
                rows: 64,
                cols: 256,
                ld: 64,
                trans: false
            }
        );
        assert_eq!(
            p.d,
            ColMajor {
                rows: 128,
                cols: 256,
                ld: 128,
                trans: false
            }
        );
    }

    #[test]
    fn strided_operands_need_their_last_row_and_packed_ones_their_exact_length() {
        // Row 0 of each of 4 samples of [4, 3, 2]: rows 6 apart.
        let g = Gemm::new(4, 5, 2).trans_b().with_lda(6);
        assert_eq!(g.a().extent(), 3 * 6 + 2);
        assert!(g.check_operands(24, 10, 20).is_ok());
        assert!(g.check_operands(20, 10, 20).is_ok());
        let e = g.check_operands(19, 10, 20).unwrap_err().to_string();
        assert!(e.contains("A holds 19") && e.contains("at least 20"), "{e}");
        let e = g.check_operands(24, 11, 20).unwrap_err().to_string();
        assert!(e.contains("B holds 11") && e.contains("need 10"), "{e}");
        let e = g.check_operands(24, 10, 21).unwrap_err().to_string();
        assert!(e.contains("D holds 21"), "{e}");
    }

    #[test]
    fn bad_shapes_are_refused_before_cublaslt_sees_them() {
        assert!(Gemm::new(0, 1, 1).check().is_err());
        let e = Gemm::new(2, 3, 4)
            .with_lda(3)
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("A's row stride 3 is less than its row length 4"),
            "{e}"
        );
        assert!(Gemm::new(usize::MAX / 2, 1, 4).with_lda(8).check().is_err());
    }

    #[test]
    fn a_shape_prints_its_stored_operands() {
        let g = Gemm::new(4, 8, 64).trans_a().with_ldb(16);
        assert_eq!(g.to_string(), "[64x4]ᵀ·[64x8/16] -> [4x8]");
    }

    #[test]
    fn a_workspace_override_must_be_aligned_and_large_enough() {
        let g = Gemm::new(2, 2, 2);
        assert_eq!(check_workspace(&g, 0x1000, 4096, 4096).unwrap(), 0x1000);
        assert!(check_workspace(&g, 0, 4096, 0).is_err());
        assert!(check_workspace(&g, 0x1010, 4096, 0).is_err());
        let e = check_workspace(&g, 0x1000, 100, 4096)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("has 100 bytes") && e.contains("needs 4096"),
            "{e}"
        );
    }
}
