//! cuBLASLt: one handle and one workspace per stream, and matmul plans built once.
//!
//! A matmul is described by a [`Matmul`] spec (shape, transposes, [`Precision`],
//! [`Epilogue`]). The first time a stream's [`BlasHandle`] sees a spec outside a capture
//! (the dry pass, or an eager run) it builds a plan: the matrix layouts, the matmul
//! descriptor and the algorithm `cublasLtMatmulAlgoGetHeuristic` picks for the stream's
//! workspace. Inside a capture the plan is only looked up, so nothing is created and no
//! heuristic runs while the stream is being captured.
//!
//! Users think in row-major matrices; cuBLASLt thinks in column-major ones. A row-major
//! `X[r, c]` is the column-major `Xᵀ` with the same bytes, so `D = op(A)·op(B)` is computed
//! as `Dᵀ = op(B)ᵀ·op(A)ᵀ`: cuBLASLt's A is the user's B and the other way round, with the
//! user's transpose flags kept. [`col_major_problem`] does that swap, and the epilogue
//! mapping follows it (see [`Epilogue`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::Arc;

use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

use crate::driver::device::Device;
use crate::driver::memory::{DeviceMem, DeviceMemMut};
use crate::error::{Error, Result};
use crate::scope::Mode;

mod op;

pub use op::Blas;

/// cuBLASLt's recommended workspace on Hopper.
pub const WORKSPACE_BYTES: usize = 32 * 1024 * 1024;

// ---------------------------------------------------------------------------------------
// The spec: what a user writes.
// ---------------------------------------------------------------------------------------

/// Element types and accumulation of a matmul.
///
/// Every precision scales by `f32` alpha and beta and accumulates in `f32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// `f32` in and out, exact `f32` products (`CUBLAS_COMPUTE_32F`).
    F32,
    /// `f32` in and out, inputs rounded to TF32 (10-bit mantissa) on the tensor cores
    /// (`CUBLAS_COMPUTE_32F_FAST_TF32`): several times faster, about 1e-3 relative error.
    Tf32,
    /// `bf16` A, B, C and D (and bias and GELU input), `f32` accumulation
    /// (`CUBLAS_COMPUTE_32F`).
    Bf16,
}

impl Precision {
    /// The short name used in shapes and errors (`f32`, `tf32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    fn compute_type(self) -> lt_sys::cublasComputeType_t {
        use lt_sys::cublasComputeType_t as C;
        match self {
            Precision::F32 | Precision::Bf16 => C::CUBLAS_COMPUTE_32F,
            Precision::Tf32 => C::CUBLAS_COMPUTE_32F_FAST_TF32,
        }
    }

    /// The type of A, B, C, D, the bias and the GELU input.
    fn data_type(self) -> lt_sys::cudaDataType {
        match self {
            Precision::F32 | Precision::Tf32 => lt_sys::cudaDataType::CUDA_R_32F,
            Precision::Bf16 => lt_sys::cudaDataType::CUDA_R_16BF,
        }
    }

    /// The type of alpha and beta; always f32, which is what `MatmulArgs` holds.
    fn scale_type(self) -> lt_sys::cudaDataType {
        lt_sys::cudaDataType::CUDA_R_32F
    }

    fn elem(self) -> sealed::ElemKind {
        match self {
            Precision::F32 | Precision::Tf32 => sealed::ElemKind::F32,
            Precision::Bf16 => sealed::ElemKind::Bf16,
        }
    }
}

/// What cuBLASLt does to the product before it stores D, in the row-major terms of
/// [`Matmul`] (`D[m, n]`, `bias[n]` indexed by the column of D).
///
/// Operands beyond A, B, C and D are passed in [`MatmulArgs`]:
///
/// | epilogue | D | bias | aux |
/// | --- | --- | --- | --- |
/// | `Default` | `P` | – | – |
/// | `Relu`, `Gelu` | `act(P)` | – | – |
/// | `Bias` | `P + bias` | [`bias`](MatmulArgs::bias), `n` | – |
/// | `ReluBias`, `GeluBias` | `act(P + bias)` | [`bias`](MatmulArgs::bias), `n` | – |
/// | `ReluAux` | `relu(P)` | – | [`save_relu_mask`](MatmulArgs::save_relu_mask) |
/// | `ReluAuxBias` | `relu(P + bias)` | [`bias`](MatmulArgs::bias), `n` | [`save_relu_mask`](MatmulArgs::save_relu_mask) |
/// | `GeluAux` | `gelu(P)` | – | [`save_gelu_input`](MatmulArgs::save_gelu_input) |
/// | `GeluAuxBias` | `gelu(P + bias)` | [`bias`](MatmulArgs::bias), `n` | [`save_gelu_input`](MatmulArgs::save_gelu_input) |
/// | `DRelu` | `P ⊙ mask` | – | [`relu_mask`](MatmulArgs::relu_mask) |
/// | `DReluBgrad` | `P ⊙ mask` | [`bias_grad`](MatmulArgs::bias_grad), `n`: column sums of D | [`relu_mask`](MatmulArgs::relu_mask) |
/// | `DGelu` | `P ⊙ gelu'(x)` | – | [`gelu_input`](MatmulArgs::gelu_input) |
/// | `DGeluBgrad` | `P ⊙ gelu'(x)` | [`bias_grad`](MatmulArgs::bias_grad), `n`: column sums of D | [`gelu_input`](MatmulArgs::gelu_input) |
/// | `BgradA` | `P` | [`bias_grad`](MatmulArgs::bias_grad), `m`: `Σₖ op(A)[i, k]` | – |
/// | `BgradB` | `P` | [`bias_grad`](MatmulArgs::bias_grad), `n`: `Σₖ op(B)[k, j]` | – |
///
/// where `P = alpha·op(A)·op(B) + beta·C`. GELU is cuBLASLt's tanh approximation,
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
///
/// The aux matrix has the shape of D, `m` rows of [`Matmul::aux_ld`] elements: for ReLU
/// one bit per element (a bit mask packed in bytes, row `i` starting at byte
/// `i·aux_ld/8`, bit `j % 8` of byte `j / 8` set where `D[i, j] > 0`), for GELU the GELU
/// input `x` in the element type. [`Matmul::aux_len`] says how long the buffer must be.
///
/// `BgradA` is cuBLASLt's `BGRADB` and `BgradB` its `BGRADA`: cuBLASLt is column-major,
/// so the row-major `D = op(A)·op(B)` runs as `Dᵀ = op(B)ᵀ·op(A)ᵀ`, with cuBLASLt's A
/// being the user's B. The names here follow the user's A and B.
/// The usual use of `BgradA` is the weight gradient of a linear layer,
/// `dW[out, in] = dYᵀ·X` with `A = dY` stored `[batch, out]` (`trans_a`), whose bias
/// gradient `Σ_batch dY` comes out of the same matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// `D = P`.
    Default,
    /// `D = relu(P)`.
    Relu,
    /// `D = P + bias`.
    Bias,
    /// `D = relu(P + bias)`.
    ReluBias,
    /// `D = gelu(P)`.
    Gelu,
    /// `D = gelu(P + bias)`.
    GeluBias,
    /// `D = relu(P)`, and the ReLU bit mask is stored to aux.
    ReluAux,
    /// `D = relu(P + bias)`, and the ReLU bit mask is stored to aux.
    ReluAuxBias,
    /// `D = gelu(P)`, and the GELU input `P` is stored to aux.
    GeluAux,
    /// `D = gelu(P + bias)`, and the GELU input `P + bias` is stored to aux.
    GeluAuxBias,
    /// `D = P ⊙ mask`, the ReLU mask read from aux.
    DRelu,
    /// `D = P ⊙ mask`, and the bias gradient (column sums of D) is stored to bias.
    DReluBgrad,
    /// `D = P ⊙ gelu'(x)`, the GELU input `x` read from aux.
    DGelu,
    /// `D = P ⊙ gelu'(x)`, and the bias gradient (column sums of D) is stored to bias.
    DGeluBgrad,
    /// `D = P`, and `bias[i] = Σₖ op(A)[i, k]` (length `m`) is stored to bias.
    BgradA,
    /// `D = P`, and `bias[j] = Σₖ op(B)[k, j]` (length `n`) is stored to bias.
    BgradB,
}

/// How an epilogue uses the bias pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BiasUse {
    /// Read and added to every row of D.
    Add,
    /// Written with a bias gradient.
    Grad,
}

/// How an epilogue uses the aux pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AuxUse {
    SaveReluMask,
    ReluMask,
    SaveGeluInput,
    GeluInput,
}

impl AuxUse {
    fn is_relu(self) -> bool {
        matches!(self, AuxUse::SaveReluMask | AuxUse::ReluMask)
    }

    fn is_output(self) -> bool {
        matches!(self, AuxUse::SaveReluMask | AuxUse::SaveGeluInput)
    }

    /// The `MatmulArgs` method that passes this operand, for error messages.
    fn method(self) -> &'static str {
        match self {
            AuxUse::SaveReluMask => "save_relu_mask",
            AuxUse::ReluMask => "relu_mask",
            AuxUse::SaveGeluInput => "save_gelu_input",
            AuxUse::GeluInput => "gelu_input",
        }
    }
}

impl Epilogue {
    /// cuBLASLt's epilogue for the row-major product (A and B swapped).
    fn to_lt(self) -> lt_sys::cublasLtEpilogue_t {
        use lt_sys::cublasLtEpilogue_t as E;
        match self {
            Epilogue::Default => E::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Relu => E::CUBLASLT_EPILOGUE_RELU,
            Epilogue::Bias => E::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::ReluBias => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            Epilogue::Gelu => E::CUBLASLT_EPILOGUE_GELU,
            Epilogue::GeluBias => E::CUBLASLT_EPILOGUE_GELU_BIAS,
            Epilogue::ReluAux => E::CUBLASLT_EPILOGUE_RELU_AUX,
            Epilogue::ReluAuxBias => E::CUBLASLT_EPILOGUE_RELU_AUX_BIAS,
            Epilogue::GeluAux => E::CUBLASLT_EPILOGUE_GELU_AUX,
            Epilogue::GeluAuxBias => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            Epilogue::DRelu => E::CUBLASLT_EPILOGUE_DRELU,
            Epilogue::DReluBgrad => E::CUBLASLT_EPILOGUE_DRELU_BGRAD,
            Epilogue::DGelu => E::CUBLASLT_EPILOGUE_DGELU,
            Epilogue::DGeluBgrad => E::CUBLASLT_EPILOGUE_DGELU_BGRAD,
            // cuBLASLt's A is the user's B: reducing the user's op(A) over k is
            // reducing cuBLASLt's B, whose result has the length of Dᵀ's columns (m).
            Epilogue::BgradA => E::CUBLASLT_EPILOGUE_BGRADB,
            Epilogue::BgradB => E::CUBLASLT_EPILOGUE_BGRADA,
        }
    }

    const fn bias_use(self) -> Option<BiasUse> {
        match self {
            Epilogue::Bias
            | Epilogue::ReluBias
            | Epilogue::GeluBias
            | Epilogue::ReluAuxBias
            | Epilogue::GeluAuxBias => Some(BiasUse::Add),
            Epilogue::DReluBgrad | Epilogue::DGeluBgrad | Epilogue::BgradA | Epilogue::BgradB => {
                Some(BiasUse::Grad)
            }
            Epilogue::Default
            | Epilogue::Relu
            | Epilogue::Gelu
            | Epilogue::ReluAux
            | Epilogue::GeluAux
            | Epilogue::DRelu
            | Epilogue::DGelu => None,
        }
    }

    const fn aux_use(self) -> Option<AuxUse> {
        match self {
            Epilogue::ReluAux | Epilogue::ReluAuxBias => Some(AuxUse::SaveReluMask),
            Epilogue::DRelu | Epilogue::DReluBgrad => Some(AuxUse::ReluMask),
            Epilogue::GeluAux | Epilogue::GeluAuxBias => Some(AuxUse::SaveGeluInput),
            Epilogue::DGelu | Epilogue::DGeluBgrad => Some(AuxUse::GeluInput),
            _ => None,
        }
    }
}

/// One matmul, in row-major terms: `D[m, n] = epilogue(alpha·op(A)[m, k]·op(B)[k, n] +
/// beta·C[m, n])`, with `op(X) = Xᵀ` where `trans_x` is set.
///
/// Every matrix is a packed row-major buffer: A holds `m × k` elements (`k × m` when
/// `trans_a`), B `k × n` (`n × k` when `trans_b`), C and D `m × n`. With `batch > 1` each
/// buffer holds `batch` such matrices one after the other, and one bias (if any) is
/// shared by all.
///
/// The spec is the key of a stream's plan cache: the first matmul with a spec outside a
/// capture builds its plan (layouts, descriptor, the heuristic's algorithm); a capture
/// only looks it up. Build one with [`Matmul::new`] and the `with_*` methods; they are
/// `const`, so specs can be constants.
///
/// ```
/// use stepgraph::{Epilogue, Matmul, Precision};
///
/// // h[batch, hidden] = relu(x[batch, input] · w[hidden, input]ᵀ + b[hidden])
/// const FC1: Matmul = Matmul::new(256, 512, 128)
///     .with_trans_b(true)
///     .with_precision(Precision::Bf16)
///     .with_epilogue(Epilogue::ReluBias);
/// assert_eq!(FC1.b_len(), 512 * 128);
/// assert_eq!(FC1.bias_len(), Some(512));
/// assert_eq!(
///     FC1.to_string(),
///     "256x512x128 bf16 trans_a=false trans_b=true epilogue=ReluBias"
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Matmul {
    /// Rows of D (and of op(A)).
    pub m: usize,
    /// Columns of D (and of op(B)).
    pub n: usize,
    /// The reduced dimension: columns of op(A), rows of op(B).
    pub k: usize,
    /// A is stored `k × m` and used transposed.
    pub trans_a: bool,
    /// B is stored `n × k` and used transposed.
    pub trans_b: bool,
    /// Element types and accumulation.
    pub precision: Precision,
    /// What is applied to the product before D is stored.
    pub epilogue: Epilogue,
    /// Number of independent products in a strided batch (1: no batch).
    pub batch: usize,
    /// Elements between the starts of consecutive rows of A as stored (row-major), when
    /// A is a block of a wider matrix; `None`: A is packed (its stored column count).
    pub ld_a: Option<usize>,
    /// The same for B.
    pub ld_b: Option<usize>,
    /// The same for D, and for C, which has D's layout.
    pub ld_d: Option<usize>,
    /// How many SMs cuBLASLt's heuristic plans the matmul for.
    pub sm_target: SmTarget,
}

/// How many of the GPU's SMs cuBLASLt plans a matmul for
/// (`CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`).
///
/// cuBLASLt picks a matmul's tiles and its split of `k` so that its grid fills the GPU.
/// A matmul that runs beside others on parallel streams (a stream group's members, each
/// doing the same layer) does not have the GPU to itself: planned for all of it, each
/// splits `k` as if alone, and the partial products and their reductions of all of them
/// take turns on the SMs. Planned for its share, each launches a grid that fits beside
/// the others.
///
/// Whether it pays depends on the shapes and on what really runs at once: measure the
/// step both ways (a matmul's result is the same to within its precision either way,
/// not bit for bit, since the split of `k` may change).
///
/// ```
/// use stepgraph::{Matmul, Precision, SmTarget};
///
/// // One of two critics' layers, on its own stream beside the other's.
/// let fc = Matmul::new(16384, 256, 256)
///     .with_trans_b(true)
///     .with_precision(Precision::Tf32)
///     .with_sm_target(SmTarget::Share(2));
/// assert_eq!(fc.sm_target.sms(132), Some(66));
/// assert!(fc.to_string().ends_with(" sms=1/2"));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SmTarget {
    /// The whole GPU: cuBLASLt's default.
    #[default]
    Whole,
    /// The GPU's SMs divided by this many, rounded down: for a matmul that runs beside
    /// this many − 1 others like it (pass a stream group's `NAME_WIDTH`).
    Share(u32),
    /// Exactly this many SMs (at most the GPU's).
    Count(u32),
}

impl SmTarget {
    /// The SM count it stands for on a GPU of `sms` SMs: `None` for the whole GPU, or for
    /// a target that names no SM or more than the GPU has.
    pub const fn sms(self, sms: u32) -> Option<u32> {
        let n = match self {
            SmTarget::Whole => return None,
            SmTarget::Share(0) => return None,
            SmTarget::Share(parts) => sms / parts,
            SmTarget::Count(n) => n,
        };
        if n == 0 || n > sms { None } else { Some(n) }
    }
}

impl std::str::FromStr for SmTarget {
    type Err = Error;

    /// What [`Display`](fmt::Display) writes: `whole`, `1/N` for a share, or a count.
    ///
    /// ```
    /// use stepgraph::SmTarget;
    ///
    /// assert_eq!("1/4".parse::<SmTarget>()?, SmTarget::Share(4));
    /// assert_eq!("66".parse::<SmTarget>()?, SmTarget::Count(66));
    /// assert!("half".parse::<SmTarget>().is_err());
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    fn from_str(s: &str) -> Result<SmTarget> {
        let positive = |n: &str| n.parse::<u32>().ok().filter(|&n| n > 0);
        let target = match s.strip_prefix("1/") {
            _ if s == "whole" => Some(SmTarget::Whole),
            Some(parts) => positive(parts).map(SmTarget::Share),
            None => positive(s).map(SmTarget::Count),
        };
        target.ok_or_else(|| Error::Config {
            name: "SM target",
            expected: "`whole`, `1/N` (a share of the GPU, N at least 1) or a count of SMs (at \
                       least 1)"
                .into(),
            found: format!("`{s}`"),
        })
    }
}

impl fmt::Display for SmTarget {
    /// `whole`, `1/N` for a share, or the count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SmTarget::Whole => write!(f, "whole"),
            SmTarget::Share(parts) => write!(f, "1/{parts}"),
            SmTarget::Count(n) => write!(f, "{n}"),
        }
    }
}

/// A leading dimension, or the packed one.
const fn ld_or(ld: Option<usize>, cols: usize) -> usize {
    match ld {
        Some(ld) => ld,
        None => cols,
    }
}

/// Elements from the first of a strided batch of row-major `rows × cols` blocks, rows `ld`
/// apart and batches `rows·ld` apart, to the last: `batch·rows·cols` when packed.
const fn extent((rows, cols, ld): (usize, usize, usize), batch: usize) -> usize {
    if rows == 0 || cols == 0 || batch == 0 {
        return 0;
    }
    batch
        .saturating_mul(rows)
        .saturating_sub(1)
        .saturating_mul(ld)
        .saturating_add(cols)
}

/// `x` rounded up to a multiple of `to`, saturating: a length that large matches no
/// buffer, so the buffer checks refuse it instead of the arithmetic panicking.
const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to).saturating_mul(to)
}

/// cuBLASLt wants the ReLU mask's leading dimension, in bits, to be a multiple of 128.
const RELU_MASK_LD_ALIGN: usize = 128;
/// cuBLASLt wants the GELU input's leading dimension, in elements, to be a multiple of 8.
const GELU_INPUT_LD_ALIGN: usize = 8;

impl Matmul {
    /// `D[m, n] = A[m, k]·B[k, n]` in exact f32, no transposes, no epilogue, no batch.
    pub const fn new(m: usize, n: usize, k: usize) -> Matmul {
        Matmul {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            precision: Precision::F32,
            epilogue: Epilogue::Default,
            batch: 1,
            ld_a: None,
            ld_b: None,
            ld_d: None,
            sm_target: SmTarget::Whole,
        }
    }

    /// Uses A transposed: A is stored `k × m`.
    pub const fn with_trans_a(mut self, trans_a: bool) -> Matmul {
        self.trans_a = trans_a;
        self
    }

    /// Uses B transposed: B is stored `n × k` (a `[out, in]` weight in `x·Wᵀ`).
    pub const fn with_trans_b(mut self, trans_b: bool) -> Matmul {
        self.trans_b = trans_b;
        self
    }

    /// Sets the element types and accumulation.
    pub const fn with_precision(mut self, precision: Precision) -> Matmul {
        self.precision = precision;
        self
    }

    /// Sets the epilogue.
    pub const fn with_epilogue(mut self, epilogue: Epilogue) -> Matmul {
        self.epilogue = epilogue;
        self
    }

    /// Runs `batch` independent products over consecutive matrices of each buffer.
    pub const fn with_batch(mut self, batch: usize) -> Matmul {
        self.batch = batch;
        self
    }

    /// Reads A as a block of a wider row-major matrix whose rows are `ld` elements apart
    /// (at least A's stored column count: `k`, or `m` with [`trans_a`](Matmul::trans_a)).
    /// Pass a view that starts at the block's first element: `Span::columns` gives it.
    ///
    /// ```
    /// use stepgraph::{Matmul, Span};
    ///
    /// // D[64, 128] = X[:, 18..530] · W[512, 128], X being [64, 530].
    /// let fc = Matmul::new(64, 128, 512).with_ld_a(530);
    /// assert_eq!(fc.a_len(), 63 * 530 + 512);
    /// assert_eq!(Span::columns(64, 530, 18, 512).len(), fc.a_len());
    /// ```
    pub const fn with_ld_a(mut self, ld: usize) -> Matmul {
        self.ld_a = Some(ld);
        self
    }

    /// Reads B as a block of a wider row-major matrix, as [`with_ld_a`](Matmul::with_ld_a).
    ///
    /// ```
    /// // B = the first 64 columns of a [256, 100] matrix.
    /// let m = stepgraph::Matmul::new(32, 64, 256).with_ld_b(100);
    /// assert_eq!(m.b_len(), 255 * 100 + 64);
    /// ```
    pub const fn with_ld_b(mut self, ld: usize) -> Matmul {
        self.ld_b = Some(ld);
        self
    }

    /// Writes D (and reads C) as a block of a wider row-major matrix whose rows are `ld`
    /// elements apart (at least `n`); the elements between the block's rows are left as
    /// they are.
    ///
    /// ```
    /// // D = columns 7..103 of a [64, 131] matrix: pass `Span::columns(64, 131, 7, 96)`.
    /// let m = stepgraph::Matmul::new(64, 96, 512).with_ld_d(131);
    /// assert_eq!(m.d_len(), stepgraph::Span::columns(64, 131, 7, 96).len());
    /// ```
    pub const fn with_ld_d(mut self, ld: usize) -> Matmul {
        self.ld_d = Some(ld);
        self
    }

    /// Plans the matmul for a part of the GPU's SMs: see [`SmTarget`].
    pub const fn with_sm_target(mut self, target: SmTarget) -> Matmul {
        self.sm_target = target;
        self
    }

    /// A as stored: (rows, columns, leading dimension).
    const fn stored_a(&self) -> (usize, usize, usize) {
        let (rows, cols) = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        (rows, cols, ld_or(self.ld_a, cols))
    }

    /// B as stored: (rows, columns, leading dimension).
    const fn stored_b(&self) -> (usize, usize, usize) {
        let (rows, cols) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        (rows, cols, ld_or(self.ld_b, cols))
    }

    /// D as stored: (rows, columns, leading dimension).
    const fn stored_d(&self) -> (usize, usize, usize) {
        (self.m, self.n, ld_or(self.ld_d, self.n))
    }

    /// Elements of A: `batch·m·k`, or, with a leading dimension, from the first element of
    /// the first batch's block to the last of the last's (saturating: no buffer is that
    /// long, so the length checks refuse an overflowing spec rather than the product
    /// panicking).
    pub const fn a_len(&self) -> usize {
        extent(self.stored_a(), self.batch)
    }

    /// Elements of B: `batch·k·n`, or its extent with a leading dimension.
    pub const fn b_len(&self) -> usize {
        extent(self.stored_b(), self.batch)
    }

    /// Elements of C and of D: `batch·m·n`, or their extent with a leading dimension.
    pub const fn d_len(&self) -> usize {
        extent(self.stored_d(), self.batch)
    }

    /// Elements of the bias (read or written, see [`Epilogue`]), if the epilogue has one.
    pub const fn bias_len(&self) -> Option<usize> {
        match self.epilogue.bias_use() {
            None => None,
            Some(_) if matches!(self.epilogue, Epilogue::BgradA) => Some(self.m),
            Some(_) => Some(self.n),
        }
    }

    /// Leading dimension of the aux matrix, in its elements (bits for a ReLU mask), if
    /// the epilogue has one: `n` rounded up to 128 for a ReLU mask, to 8 for a GELU input.
    pub const fn aux_ld(&self) -> Option<usize> {
        match self.epilogue.aux_use() {
            None => None,
            Some(AuxUse::SaveReluMask | AuxUse::ReluMask) => {
                Some(round_up(self.n, RELU_MASK_LD_ALIGN))
            }
            Some(AuxUse::SaveGeluInput | AuxUse::GeluInput) => {
                Some(round_up(self.n, GELU_INPUT_LD_ALIGN))
            }
        }
    }

    /// Length of the aux buffer, if the epilogue has one: bytes (`DeviceBuffer<u8>`) of a
    /// ReLU mask, elements of a GELU input. `m` rows of [`aux_ld`](Matmul::aux_ld).
    pub const fn aux_len(&self) -> Option<usize> {
        match (self.epilogue.aux_use(), self.aux_ld()) {
            (Some(AuxUse::SaveReluMask | AuxUse::ReluMask), Some(ld)) => {
                Some(self.m.saturating_mul(ld) / 8)
            }
            (Some(_), Some(ld)) => Some(self.m.saturating_mul(ld)),
            _ => None,
        }
    }

    /// Checks what cuBLASLt or the cache cannot take, before any length is computed.
    fn check_spec(&self) -> Result<()> {
        let invalid = |why: &str| {
            Err(Error::Matmul {
                shape: self.to_string(),
                problem: why.to_string(),
            })
        };
        // A zero dimension makes an empty layout, which cuBLASLt refuses.
        if self.m == 0 || self.n == 0 || self.k == 0 || self.batch == 0 {
            return invalid("m, n, k and batch must all be at least 1");
        }
        // The element counts below, and their sizes in bytes, must not wrap.
        let limit = isize::MAX as usize / 8;
        let product = |dims: &[usize]| {
            dims.iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .is_some_and(|x| x <= limit)
        };
        let (m, n, k, batch) = (self.m, self.n, self.k, self.batch);
        // The widest aux row (a ReLU mask's, n rounded up to 128) bounds every aux length.
        let aux_row = n.checked_next_multiple_of(RELU_MASK_LD_ALIGN);
        if !(product(&[batch, m, k])
            && product(&[batch, k, n])
            && product(&[batch, m, n])
            && aux_row.is_some_and(|row| product(&[m, row])))
        {
            return invalid("the buffer sizes overflow");
        }
        if self.batch > i32::MAX as usize {
            return invalid("batch must fit in 32 bits");
        }
        for (which, given, (rows, cols, ld)) in [
            ('A', self.ld_a, self.stored_a()),
            ('B', self.ld_b, self.stored_b()),
            ('D', self.ld_d, self.stored_d()),
        ] {
            if given.is_some() && ld < cols {
                return invalid(&format!(
                    "the leading dimension of {which} must be at least its {cols} stored \
                     columns, found {ld}"
                ));
            }
            if !product(&[batch, rows, ld]) || ld > i64::MAX as usize / 2 {
                return invalid("the buffer sizes overflow");
            }
        }
        // cuBLASLt's aux and bias-gradient batch strides are not set here; a batch would
        // write every product's aux over the first one's.
        if self.batch > 1
            && (self.epilogue.aux_use().is_some()
                || self.epilogue.bias_use() == Some(BiasUse::Grad))
        {
            return invalid("epilogues with an aux matrix or a bias gradient take no batch");
        }
        match self.sm_target {
            SmTarget::Share(0) => return invalid("an SM share must divide the GPU by at least 1"),
            SmTarget::Count(0) => return invalid("an SM count target must be at least 1"),
            _ => {}
        }
        // cuBLASLt has no DRELU/DGELU kernel for k = 1.
        if self.k == 1
            && matches!(
                self.epilogue,
                Epilogue::DRelu | Epilogue::DReluBgrad | Epilogue::DGelu | Epilogue::DGeluBgrad
            )
        {
            return invalid("cuBLASLt's DRelu and DGelu epilogues need k > 1");
        }
        Ok(())
    }

    /// Names operand `which` with its row-major shape for a length error.
    fn describe(&self, which: char) -> String {
        let (name, rows, cols, trans, ld) = match which {
            'A' => (("m", "k"), self.m, self.k, self.trans_a, self.ld_a),
            'B' => (("k", "n"), self.k, self.n, self.trans_b, self.ld_b),
            _ => (("m", "n"), self.m, self.n, false, self.ld_d),
        };
        let batch = if self.batch > 1 {
            format!("{} batches of ", self.batch)
        } else {
            String::new()
        };
        let trans = if trans { ", stored transposed" } else { "" };
        let ld = ld
            .map(|ld| format!(", rows {ld} apart"))
            .unwrap_or_default();
        format!(
            "matmul operand {which} ({batch}{} x {} = {} x {}{trans}{ld})",
            name.0, name.1, rows, cols
        )
    }
}

impl fmt::Display for Matmul {
    /// `128x64x256 f32 trans_a=false trans_b=true epilogue=ReluBias` (m×n×k), with
    /// ` batch=4` appended for a batch.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{}x{} {} trans_a={} trans_b={} epilogue={:?}",
            self.m,
            self.n,
            self.k,
            self.precision.name(),
            self.trans_a,
            self.trans_b,
            self.epilogue
        )?;
        if self.batch != 1 {
            write!(f, " batch={}", self.batch)?;
        }
        for (name, ld) in [
            ("ld_a", self.ld_a),
            ("ld_b", self.ld_b),
            ("ld_d", self.ld_d),
        ] {
            if let Some(ld) = ld {
                write!(f, " {name}={ld}")?;
            }
        }
        if self.sm_target != SmTarget::Whole {
            write!(f, " sms={}", self.sm_target)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Element types.
// ---------------------------------------------------------------------------------------

mod sealed {
    /// The element type behind a `BlasElem`, compared with the precision's.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ElemKind {
        F32,
        Bf16,
    }

    pub trait Sealed {
        const KIND: ElemKind;
    }

    impl Sealed for f32 {
        const KIND: ElemKind = ElemKind::F32;
    }

    impl Sealed for half::bf16 {
        const KIND: ElemKind = ElemKind::Bf16;
    }
}

/// An element type of matmul buffers: `f32` (for [`Precision::F32`] and
/// [`Precision::Tf32`]) or [`half::bf16`] (for [`Precision::Bf16`]). Sealed; a matmul
/// whose buffers do not match its precision fails with [`Error::Matmul`].
pub trait BlasElem: DeviceRepr + sealed::Sealed {}

impl BlasElem for f32 {}
impl BlasElem for half::bf16 {}

fn elem_name(kind: sealed::ElemKind) -> &'static str {
    match kind {
        sealed::ElemKind::F32 => "f32",
        sealed::ElemKind::Bf16 => "bf16",
    }
}

// ---------------------------------------------------------------------------------------
// Call arguments.
// ---------------------------------------------------------------------------------------

enum BiasArg<'b, T> {
    Add(&'b dyn DeviceMem<T>),
    Grad(&'b mut dyn DeviceMemMut<T>),
}

enum AuxArg<'b, T> {
    SaveReluMask(&'b mut dyn DeviceMemMut<u8>),
    ReluMask(&'b dyn DeviceMem<u8>),
    SaveGeluInput(&'b mut dyn DeviceMemMut<T>),
    GeluInput(&'b dyn DeviceMem<T>),
}

impl<T> AuxArg<'_, T> {
    fn use_(&self) -> AuxUse {
        match self {
            AuxArg::SaveReluMask(_) => AuxUse::SaveReluMask,
            AuxArg::ReluMask(_) => AuxUse::ReluMask,
            AuxArg::SaveGeluInput(_) => AuxUse::SaveGeluInput,
            AuxArg::GeluInput(_) => AuxUse::GeluInput,
        }
    }

    fn len(&self) -> usize {
        match self {
            AuxArg::SaveReluMask(b) => b.len(),
            AuxArg::ReluMask(b) => b.len(),
            AuxArg::SaveGeluInput(b) => b.len(),
            AuxArg::GeluInput(b) => b.len(),
        }
    }
}

/// The scalars and the operands beyond A, B and D of one [`Blas::matmul`] call.
///
/// [`MatmulArgs::new`] is `alpha = 1`, `beta = 0`, no C, no bias, no aux. Which of bias and
/// aux a call needs, and whether it reads or writes them, is fixed by the spec's
/// [`Epilogue`]; a missing or extra one fails the call with [`Error::Matmul`] before
/// anything runs. A buffer the epilogue writes is taken `&mut`, one it reads `&`.
///
/// alpha and beta are read on the host when the matmul is issued: a captured matmul
/// replays with the values it was captured with.
///
/// ```no_run
/// # use stepgraph::{DeviceBuffer, MatmulArgs};
/// # fn f(c: &DeviceBuffer<f32>, bias: &DeviceBuffer<f32>) {
/// // D = 0.5·A·B + C + bias
/// let args = MatmulArgs::new().alpha(0.5).beta(1.0).c(c).bias(bias);
/// # let _ = args;
/// # }
/// ```
pub struct MatmulArgs<'b, T> {
    alpha: f32,
    beta: f32,
    c: Option<&'b dyn DeviceMem<T>>,
    bias: Option<BiasArg<'b, T>>,
    aux: Option<AuxArg<'b, T>>,
}

impl<T> fmt::Debug for MatmulArgs<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MatmulArgs")
            .field("alpha", &self.alpha)
            .field("beta", &self.beta)
            .field("c", &self.c.is_some())
            .field(
                "bias",
                &self.bias.as_ref().map(|b| match b {
                    BiasArg::Add(_) => BiasUse::Add,
                    BiasArg::Grad(_) => BiasUse::Grad,
                }),
            )
            .field("aux", &self.aux.as_ref().map(AuxArg::use_))
            .finish()
    }
}

impl<T> Default for MatmulArgs<'_, T> {
    fn default() -> Self {
        MatmulArgs {
            alpha: 1.0,
            beta: 0.0,
            c: None,
            bias: None,
            aux: None,
        }
    }
}

impl<'b, T> MatmulArgs<'b, T> {
    /// `alpha = 1`, `beta = 0`, nothing else.
    pub fn new() -> Self {
        Self::default()
    }

    /// Scales the product.
    #[must_use]
    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }

    /// Scales C. With `beta != 0` and no [`c`](MatmulArgs::c), D is accumulated into in
    /// place (C is D). With `beta = 0`, C is not read.
    #[must_use]
    pub fn beta(mut self, beta: f32) -> Self {
        self.beta = beta;
        self
    }

    /// A separate C (`m × n`) added as `beta·C`; D is then written without being read.
    #[must_use]
    pub fn c(mut self, c: &'b impl DeviceMem<T>) -> Self {
        self.c = Some(c);
        self
    }

    /// The bias added to every row of the product (length `n`), for the `*Bias`
    /// epilogues. Replaces an earlier bias or bias gradient.
    #[must_use]
    pub fn bias(mut self, bias: &'b impl DeviceMem<T>) -> Self {
        self.bias = Some(BiasArg::Add(bias));
        self
    }

    /// Where the `*Bgrad*` epilogues store the bias gradient (length
    /// [`Matmul::bias_len`]). Replaces an earlier bias or bias gradient.
    #[must_use]
    pub fn bias_grad(mut self, bias_grad: &'b mut impl DeviceMemMut<T>) -> Self {
        self.bias = Some(BiasArg::Grad(bias_grad));
        self
    }

    /// Where `ReluAux` and `ReluAuxBias` store the ReLU bit mask ([`Matmul::aux_len`]
    /// bytes). Replaces an earlier aux.
    #[must_use]
    pub fn save_relu_mask(mut self, mask: &'b mut impl DeviceMemMut<u8>) -> Self {
        self.aux = Some(AuxArg::SaveReluMask(mask));
        self
    }

    /// The ReLU bit mask `DRelu` and `DReluBgrad` read, as a forward `ReluAux*` matmul of
    /// the same `m` and `n` stored it. Replaces an earlier aux.
    #[must_use]
    pub fn relu_mask(mut self, mask: &'b impl DeviceMem<u8>) -> Self {
        self.aux = Some(AuxArg::ReluMask(mask));
        self
    }

    /// Where `GeluAux` and `GeluAuxBias` store the GELU input ([`Matmul::aux_len`]
    /// elements). Replaces an earlier aux.
    #[must_use]
    pub fn save_gelu_input(mut self, input: &'b mut impl DeviceMemMut<T>) -> Self {
        self.aux = Some(AuxArg::SaveGeluInput(input));
        self
    }

    /// The GELU input `DGelu` and `DGeluBgrad` read, as a forward `GeluAux*` matmul of
    /// the same `m` and `n` stored it. Replaces an earlier aux.
    #[must_use]
    pub fn gelu_input(mut self, input: &'b impl DeviceMem<T>) -> Self {
        self.aux = Some(AuxArg::GeluInput(input));
        self
    }
}

// ---------------------------------------------------------------------------------------
// Pure checks and layout logic.
// ---------------------------------------------------------------------------------------

/// The lengths and roles of a call's operands, for [`check_operands`].
#[derive(Clone, Copy, Debug)]
struct Operands {
    elem: sealed::ElemKind,
    a: usize,
    b: usize,
    c: Option<usize>,
    d: usize,
    bias: Option<(BiasUse, usize)>,
    aux: Option<(AuxUse, usize)>,
}

impl Operands {
    fn of<T: BlasElem>(
        a: &dyn DeviceMem<T>,
        b: &dyn DeviceMem<T>,
        d: &dyn DeviceMem<T>,
        args: &MatmulArgs<'_, T>,
    ) -> Operands {
        Operands {
            elem: T::KIND,
            a: a.len(),
            b: b.len(),
            c: args.c.map(|c| c.len()),
            d: d.len(),
            bias: args.bias.as_ref().map(|bias| match bias {
                BiasArg::Add(x) => (BiasUse::Add, x.len()),
                BiasArg::Grad(x) => (BiasUse::Grad, x.len()),
            }),
            aux: args.aux.as_ref().map(|aux| (aux.use_(), aux.len())),
        }
    }
}

/// Checks a call's operands against its spec, before anything touches CUDA: cuBLASLt
/// reads and writes exactly the extents the spec implies, so a short buffer would be
/// read or written past its end on the GPU.
/// Inside an op, every output a matmul writes must lie in memory the op takes `&mut`.
fn check_outputs<T: BlasElem>(d: &impl DeviceMem<T>, args: &MatmulArgs<'_, T>) -> Result<()> {
    crate::driver::memory::check_write_mem(d, || "matmul output D".into())?;
    if let Some(BiasArg::Grad(grad)) = &args.bias {
        crate::driver::memory::check_write_mem(&**grad, || "matmul bias gradient".into())?;
    }
    match &args.aux {
        Some(AuxArg::SaveReluMask(mask)) => {
            crate::driver::memory::check_write_mem(&**mask, || "matmul ReLU mask".into())
        }
        Some(AuxArg::SaveGeluInput(input)) => {
            crate::driver::memory::check_write_mem(&**input, || "matmul GELU input".into())
        }
        _ => Ok(()),
    }
}

fn check_operands(spec: &Matmul, ops: &Operands) -> Result<()> {
    spec.check_spec()?;
    let invalid = |problem: String| {
        Err(Error::Matmul {
            shape: spec.to_string(),
            problem,
        })
    };
    // cuBLASLt reads the bytes with the precision's type whatever Rust thinks they are.
    if ops.elem != spec.precision.elem() {
        return invalid(format!(
            "{} buffers given, but precision {} takes {} buffers",
            elem_name(ops.elem),
            spec.precision.name(),
            elem_name(spec.precision.elem())
        ));
    }
    // A packed operand is the whole buffer or view; a block of a wider matrix (a
    // leading dimension) may be followed by more of that matrix.
    let operand = |which: char, expected: usize, found: usize, strided: bool| {
        if !strided {
            return crate::error::check_len(spec.describe(which), expected, found);
        }
        if found < expected {
            let operand = spec.describe(which);
            return invalid(format!(
                "{}: expected at least {expected} elements, found {found}",
                operand.strip_prefix("matmul ").unwrap_or(&operand)
            ));
        }
        Ok(())
    };
    operand('A', spec.a_len(), ops.a, spec.ld_a.is_some())?;
    operand('B', spec.b_len(), ops.b, spec.ld_b.is_some())?;
    if let Some(c) = ops.c {
        operand('C', spec.d_len(), c, spec.ld_d.is_some())?;
    }
    operand('D', spec.d_len(), ops.d, spec.ld_d.is_some())?;

    // The epilogue dereferences the bias and aux pointers: a missing one would be a
    // null (or stale) pointer on the GPU, and one of the wrong direction would be
    // written through a shared borrow.
    match (spec.epilogue.bias_use(), ops.bias) {
        (None, None) => {}
        (None, Some(_)) => {
            return invalid(format!(
                "epilogue {:?} takes no bias, but one was given",
                spec.epilogue
            ));
        }
        (Some(want), None) => {
            return invalid(format!(
                "epilogue {:?} needs a bias {}, passed with MatmulArgs::{}",
                spec.epilogue,
                if want == BiasUse::Add {
                    "to add"
                } else {
                    "gradient output"
                },
                if want == BiasUse::Add {
                    "bias"
                } else {
                    "bias_grad"
                }
            ));
        }
        (Some(want), Some((given, len))) => {
            if want != given {
                return invalid(format!(
                    "epilogue {:?} {} the bias: pass it with MatmulArgs::{}",
                    spec.epilogue,
                    if want == BiasUse::Add {
                        "reads"
                    } else {
                        "writes"
                    },
                    if want == BiasUse::Add {
                        "bias"
                    } else {
                        "bias_grad"
                    }
                ));
            }
            let expected = spec.bias_len().unwrap_or(0);
            let dim = if spec.epilogue == Epilogue::BgradA {
                "m"
            } else {
                "n"
            };
            crate::error::check_len(
                format!(
                    "matmul bias of epilogue {:?} ({dim} = {expected})",
                    spec.epilogue
                ),
                expected,
                len,
            )?;
        }
    }
    match (spec.epilogue.aux_use(), ops.aux) {
        (None, None) => {}
        (None, Some(_)) => {
            return invalid(format!(
                "epilogue {:?} takes no aux matrix, but one was given",
                spec.epilogue
            ));
        }
        (Some(want), None) => {
            return invalid(format!(
                "epilogue {:?} needs MatmulArgs::{}",
                spec.epilogue,
                want.method()
            ));
        }
        (Some(want), Some((given, len))) => {
            if want != given {
                return invalid(format!(
                    "epilogue {:?} needs MatmulArgs::{}, not {}",
                    spec.epilogue,
                    want.method(),
                    given.method()
                ));
            }
            let expected = spec.aux_len().unwrap_or(0);
            let ld = spec.aux_ld().unwrap_or(0);
            let what = if want.is_relu() {
                format!(
                    "matmul ReLU mask in bytes (m = {} rows of {ld} bits)",
                    spec.m
                )
            } else {
                format!("matmul GELU input (m = {} rows of ld {ld})", spec.m)
            };
            crate::error::check_len(what, expected, len)?;
        }
    }
    Ok(())
}

/// One cuBLASLt matrix layout: a column-major `rows × cols` matrix with leading dimension
/// `ld`, and whether the matmul uses it transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LtLayout {
    rows: u64,
    cols: u64,
    ld: i64,
    transpose: bool,
}

impl LtLayout {
    /// Elements between one batch's matrix and the next (the buffers are packed).
    fn stride(&self) -> i64 {
        self.ld * self.cols as i64
    }
}

/// The column-major problem cuBLASLt solves for a row-major spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LtProblem {
    /// cuBLASLt's A operand: the user's B.
    lt_a: LtLayout,
    /// cuBLASLt's B operand: the user's A.
    lt_b: LtLayout,
    /// C and D: the user's `m × n` row-major D seen as a column-major `n × m`.
    lt_d: LtLayout,
}

/// Turns `D = op(A)·op(B)` on row-major buffers into `Dᵀ = op(B)ᵀ·op(A)ᵀ` on the same
/// buffers read column-major.
///
/// A row-major `r × c` buffer is a column-major `c × r` matrix with leading dimension `c`,
/// its transpose. So B (row-major `k × n`) is column-major `Bᵀ`, `n × k`: exactly
/// `op(B)ᵀ`, used untransposed. B stored `n × k` (trans_b) is column-major `k × n`, which
/// must be transposed to give the `n × k` `op(B)ᵀ`. A likewise gives the `k × m` right
/// operand, so each user flag stays as it is and only the operands swap.
fn col_major_problem(spec: &Matmul) -> LtProblem {
    let stored = |(rows, cols, ld): (usize, usize, usize), transpose: bool| LtLayout {
        // Row-major `rows × cols`, rows `ld` apart, read column-major: `cols × rows`.
        rows: cols as u64,
        cols: rows as u64,
        ld: ld as i64,
        transpose,
    };
    LtProblem {
        lt_a: stored(spec.stored_b(), spec.trans_b),
        lt_b: stored(spec.stored_a(), spec.trans_a),
        lt_d: stored(spec.stored_d(), false),
    }
}

// ---------------------------------------------------------------------------------------
// Owned cuBLASLt descriptors.
// ---------------------------------------------------------------------------------------

/// `cublasLtMatmulDescSetAttribute`/`...PreferenceSetAttribute`/`...LayoutSetAttribute`
/// take the value by pointer and size; `V` must be the attribute's documented type.
fn attr_ptr<V>(value: &V) -> (*const c_void, usize) {
    ((value as *const V).cast(), std::mem::size_of::<V>())
}

/// An owned `cublasLtMatrixLayout_t`.
struct Layout(lt_sys::cublasLtMatrixLayout_t);

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created in `Layout::new`, destroyed once here. A failure only leaks the
        // descriptor's host memory; Drop must not panic, so it is ignored.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

impl Layout {
    /// [cublasLtMatrixLayoutCreate](https://docs.nvidia.com/cuda/cublas/#cublasltmatrixlayoutcreate),
    /// plus the strided-batch attributes when `batch > 1`.
    fn new(ty: lt_sys::cudaDataType, l: &LtLayout, batch: usize) -> Result<Layout> {
        let layout = Layout(
            lt::create_matrix_layout(ty, l.rows, l.cols, l.ld)
                .map_err(Error::blas("cublasLtMatrixLayoutCreate"))?,
        );
        if batch > 1 {
            use lt_sys::cublasLtMatrixLayoutAttribute_t as A;
            let count = batch as i32;
            let stride = l.stride();
            for (attr, (ptr, size)) in [
                (A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, attr_ptr(&count)),
                (
                    A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    attr_ptr(&stride),
                ),
            ] {
                // SAFETY: the layout is alive; BATCH_COUNT is an int32_t and
                // STRIDED_BATCH_OFFSET an int64_t, the types of `count` and `stride`.
                unsafe { lt::set_matrix_layout_attribute(layout.0, attr, ptr, size) }
                    .map_err(Error::blas("cublasLtMatrixLayoutSetAttribute"))?;
            }
        }
        Ok(layout)
    }
}

/// An owned `cublasLtMatmulDesc_t`.
struct MatmulDesc(lt_sys::cublasLtMatmulDesc_t);

impl Drop for MatmulDesc {
    fn drop(&mut self) {
        // SAFETY: created in `MatmulDesc::new`, destroyed once here; a failure is ignored
        // as in `Layout`.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

impl MatmulDesc {
    /// [cublasLtMatmulDescCreate](https://docs.nvidia.com/cuda/cublas/#cublasltmatmuldesccreate).
    fn new(precision: Precision) -> Result<MatmulDesc> {
        lt::create_matmul_desc(precision.compute_type(), precision.scale_type())
            .map(MatmulDesc)
            .map_err(Error::blas("cublasLtMatmulDescCreate"))
    }

    /// [cublasLtMatmulDescSetAttribute](https://docs.nvidia.com/cuda/cublas/#cublasltmatmuldescsetattribute):
    /// a host-side write into the descriptor, allowed during a capture.
    ///
    /// # Safety
    /// `V` must be the type cuBLASLt documents for `attr`.
    unsafe fn set<V>(&self, attr: lt_sys::cublasLtMatmulDescAttributes_t, value: &V) -> Result<()> {
        let (ptr, size) = attr_ptr(value);
        // SAFETY: the descriptor is alive (owned by self); the caller guarantees the
        // value's type, and `ptr` is valid for `size` bytes for the call.
        unsafe { lt::set_matmul_desc_attribute(self.0, attr, ptr, size) }
            .map_err(Error::blas("cublasLtMatmulDescSetAttribute"))
    }

    /// Points the epilogue at this call's bias and aux buffers (0 where unused).
    fn set_pointers(&self, ptrs: &EpiloguePtrs) -> Result<()> {
        use lt_sys::cublasLtMatmulDescAttributes_t as A;
        if let Some(bias) = ptrs.bias {
            // SAFETY: BIAS_POINTER is a `void*`, the size of a device address.
            unsafe { self.set(A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias) }?;
        }
        if let Some(aux) = ptrs.aux {
            // SAFETY: EPILOGUE_AUX_POINTER is a `void*`, the size of a device address.
            unsafe { self.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux) }?;
        }
        Ok(())
    }
}

/// An owned `cublasLtMatmulPreference_t`.
struct Preference(lt_sys::cublasLtMatmulPreference_t);

impl Drop for Preference {
    fn drop(&mut self) {
        // SAFETY: created in `Preference::new`, destroyed once here; a failure is ignored
        // as in `Layout`.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

impl Preference {
    /// A heuristic preference limited to `workspace_bytes` of workspace, for matrices
    /// whose addresses (cuBLASLt's A, B, C and D) have the alignments given, in bytes.
    fn new(workspace_bytes: usize, align: [u32; 4]) -> Result<Preference> {
        use lt_sys::cublasLtMatmulPreferenceAttributes_t as P;
        let pref = Preference(
            lt::create_matmul_pref().map_err(Error::blas("cublasLtMatmulPreferenceCreate"))?,
        );
        let bytes = workspace_bytes as u64;
        let set = |attr: P, (ptr, size): (*const c_void, usize)| {
            // SAFETY: the preference is alive; the caller passes each attribute's
            // documented type (below).
            unsafe { lt::set_matmul_pref_attribute(pref.0, attr, ptr, size) }
                .map_err(Error::blas("cublasLtMatmulPreferenceSetAttribute"))
        };
        // MAX_WORKSPACE_BYTES is a uint64_t, the MIN_ALIGNMENT_*_BYTES uint32_t. 256, the
        // alignment of every whole buffer, is cuBLASLt's default.
        set(
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            attr_ptr(&bytes),
        )?;
        for (attr, a) in [
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ]
        .into_iter()
        .zip(align)
        {
            set(attr, attr_ptr(&a))?;
        }
        Ok(pref)
    }
}

/// Device addresses of a call's epilogue operands, `None` where the epilogue has none.
#[derive(Clone, Copy, Debug, Default)]
struct EpiloguePtrs {
    bias: Option<u64>,
    aux: Option<u64>,
}

/// The alignment in bytes (a power of two, at most 256) of an address: whole buffers are
/// 256-byte aligned, views at an offset less.
fn alignment(ptr: u64) -> u32 {
    1 << ptr.trailing_zeros().min(8)
}

/// What a plan is built for: the spec, and the alignment of each matrix's address, which
/// the algorithm may rely on (views at odd offsets need one that does not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    spec: Matmul,
    /// The user's A, B, C and D.
    align: [u32; 4],
}

impl PlanKey {
    fn new(spec: &Matmul, m: &MatrixPtrs) -> PlanKey {
        PlanKey {
            spec: *spec,
            align: [m.a, m.b, m.c, m.d].map(alignment),
        }
    }
}

/// Everything a matmul needs but its pointers and scalars, built once per spec.
struct Plan {
    desc: MatmulDesc,
    lt_a: Layout,
    lt_b: Layout,
    /// The layout of C and of D.
    lt_d: Layout,
    algo: lt_sys::cublasLtMatmulAlgo_t,
}

/// cuBLASLt's operation values: `CUBLAS_OP_N` and `CUBLAS_OP_T`.
fn lt_op(transpose: bool) -> i32 {
    i32::from(transpose)
}

// ---------------------------------------------------------------------------------------
// The handle and its plan cache.
// ---------------------------------------------------------------------------------------

/// A cuBLASLt handle with the workspace of one stream and the matmul plans built for it.
/// Two streams never share a workspace: matmuls running at once on two streams would
/// overwrite each other's.
///
/// Plans are built outside any capture (the dry pass, or an eager matmul) and only looked
/// up inside one. A handle is used from one thread.
pub struct BlasHandle {
    /// Declared first, so the descriptors go before the handle.
    plans: RefCell<HashMap<PlanKey, Plan>>,
    handle: lt_sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    device: Device,
}

impl fmt::Debug for BlasHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlasHandle")
            .field("workspace_bytes", &self.workspace.len())
            .field("plans", &self.planned())
            .finish()
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        self.plans.get_mut().clear();
        // SAFETY: the handle was created in `new` and is destroyed once. A failure is
        // ignored rather than panicking in Drop; the handle is gone either way.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

impl BlasHandle {
    /// Creates the handle and allocates its workspace (`what` names it in an
    /// out-of-memory error).
    pub(crate) fn new(device: &Device, stream: &Arc<CudaStream>, what: &str) -> Result<Self> {
        crate::scope::check("BlasHandle::new")?;
        // SAFETY: uninitialised bytes are fine for a scratch workspace cuBLASLt writes
        // before it reads.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(device.alloc_error(what, WORKSPACE_BYTES))?;
        let handle = lt::create_handle().map_err(Error::blas("cublasLtCreate"))?;
        Ok(BlasHandle {
            plans: RefCell::new(HashMap::new()),
            handle,
            workspace,
            device: device.clone(),
        })
    }

    /// The raw cuBLASLt handle.
    pub(crate) fn raw(&self) -> lt_sys::cublasLtHandle_t {
        self.handle
    }

    /// The workspace's device address and size in bytes.
    pub(crate) fn workspace_raw(&self) -> (u64, usize) {
        let (ptr, _sync) = self.workspace.device_ptr(self.workspace.stream());
        (ptr, self.workspace.len())
    }

    /// The workspace size in bytes.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.len()
    }

    /// How many matmul plans this handle holds.
    pub fn planned(&self) -> usize {
        self.plans.borrow().len()
    }

    /// Whether a plan for `spec` has been built, so that a capture may issue it. A matmul
    /// issued through [`Blas::planned_for`] is planned as `spec.with_sm_target(target)`
    /// (unless `spec` names a target itself): ask for that spec.
    pub fn is_planned(&self, spec: &Matmul) -> bool {
        self.plans.borrow().keys().any(|k| k.spec == *spec)
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Builds the plan for `spec`: layouts, descriptor with the epilogue set and pointed at
    /// `ptrs` (cuBLASLt's heuristic reads their alignment), and the heuristic's algorithm.
    /// Never called inside a capture.
    fn build_plan(&self, key: &PlanKey, ptrs: &EpiloguePtrs) -> Result<Plan> {
        use lt_sys::cublasLtMatmulDescAttributes_t as A;
        let spec = &key.spec;
        let problem = col_major_problem(spec);
        let ty = spec.precision.data_type();
        let lt_a = Layout::new(ty, &problem.lt_a, spec.batch)?;
        let lt_b = Layout::new(ty, &problem.lt_b, spec.batch)?;
        let lt_d = Layout::new(ty, &problem.lt_d, spec.batch)?;
        let desc = MatmulDesc::new(spec.precision)?;
        let epilogue = spec.epilogue.to_lt() as u32;
        // SAFETY: TRANSA and TRANSB are `int32_t` (cublasOperation_t), EPILOGUE a
        // `uint32_t` (cublasLtEpilogue_t), EPILOGUE_AUX_LD an `int64_t`.
        unsafe {
            desc.set(
                A::CUBLASLT_MATMUL_DESC_TRANSA,
                &lt_op(problem.lt_a.transpose),
            )?;
            desc.set(
                A::CUBLASLT_MATMUL_DESC_TRANSB,
                &lt_op(problem.lt_b.transpose),
            )?;
            desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
            if let Some(ld) = spec.aux_ld() {
                desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(ld as i64))?;
            }
        }
        if spec.sm_target != SmTarget::Whole {
            let sms = self.device.sm_count()?;
            let target = u32::try_from(sms)
                .ok()
                .and_then(|sms| spec.sm_target.sms(sms))
                .ok_or_else(|| Error::Matmul {
                    shape: spec.to_string(),
                    problem: format!(
                        "the SM target {} names no SM of the GPU's {sms}: expected a count \
                         from 1 to {sms}, or a share of at most {sms}",
                        spec.sm_target
                    ),
                })?;
            // SAFETY: SM_COUNT_TARGET is an `int32_t`; `target` is at most the device's
            // SM count, an `int`.
            unsafe { desc.set(A::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &(target as i32)) }?;
        }
        desc.set_pointers(ptrs)?;
        // cuBLASLt's A and B are the user's B and A (see `col_major_problem`).
        let [a, b, c, d] = key.align;
        let pref = Preference::new(self.workspace.len(), [b, a, c, d])?;

        let mut result = MaybeUninit::<lt_sys::cublasLtMatmulHeuristicResult_t>::uninit();
        let mut count: c_int = 0;
        // SAFETY: every descriptor is alive; C and D share a layout; `result` has room for
        // the one result asked for and `count` says whether it was written.
        let status = unsafe {
            lt_sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                desc.0,
                lt_a.0,
                lt_b.0,
                lt_d.0,
                lt_d.0,
                pref.0,
                1,
                result.as_mut_ptr(),
                &mut count,
            )
        };
        let no_algorithm = || Error::NoMatmulAlgorithm {
            shape: spec.to_string(),
        };
        match status {
            lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS if count > 0 => {}
            // cuBLASLt answers NOT_SUPPORTED, or success with no result, when no kernel
            // fits the layouts, types and epilogue.
            lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            | lt_sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => return Err(no_algorithm()),
            other => {
                return Err(Error::blas("cublasLtMatmulAlgoGetHeuristic")(CublasError(
                    other,
                )));
            }
        }
        // SAFETY: count > 0, so cuBLASLt wrote the first result.
        let result = unsafe { result.assume_init() };
        if result.state != lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(no_algorithm());
        }
        Ok(Plan {
            desc,
            lt_a,
            lt_b,
            lt_d,
            algo: result.algo,
        })
    }
}

// ---------------------------------------------------------------------------------------
// The matmul call.
// ---------------------------------------------------------------------------------------

/// Device addresses of one call's matrices.
#[derive(Clone, Copy, Debug)]
struct MatrixPtrs {
    a: u64,
    b: u64,
    c: u64,
    d: u64,
}

impl Blas<'_> {
    /// `D = epilogue(alpha·op(A)·op(B) + beta·C)` on row-major buffers, as `spec` says.
    ///
    /// Every buffer length is checked against the spec (and the buffers' element type
    /// against its precision) first, with errors that name the operand. Then, by the
    /// pass's [`Mode`]:
    ///
    /// - [`Mode::Dry`]: builds the spec's plan if this stream has none, and warms it by
    ///   running the matmul once on the stream into temporary outputs (D, and the bias
    ///   gradient or aux the epilogue writes) with `beta = 0`, waits for it and frees the
    ///   temporaries. The caller's buffers are only read.
    /// - [`Mode::Capture`]: issues the matmul with the plan the dry pass built; without one
    ///   it fails with [`Error::MatmulNotPlanned`], since building a plan inside a capture
    ///   is not allowed.
    /// - [`Mode::Eager`]: builds the plan if needed and issues the matmul.
    ///
    /// Fails with [`Error::NoMatmulAlgorithm`] where cuBLASLt has no kernel for the spec.
    ///
    /// ```no_run
    /// use stepgraph::exec::{BlasSession, Mode};
    /// use stepgraph::{Device, Epilogue, Matmul, MatmulArgs, Precision};
    ///
    /// let device = Device::new(0)?;
    /// let (batch, input, hidden) = (64, 128, 256);
    /// let x = device.upload_new("x", &vec![0.5f32; batch * input])?;
    /// let w = device.upload_new("w", &vec![0.25f32; hidden * input])?; // [hidden, input]
    /// let b = device.upload_new("b", &vec![1.0f32; hidden])?;
    /// let mut h = device.alloc_zeros::<f32>("h", batch * hidden)?;
    ///
    /// // h = relu(x · wᵀ + b)
    /// let fc = Matmul::new(batch, hidden, input)
    ///     .with_trans_b(true)
    ///     .with_precision(Precision::Tf32)
    ///     .with_epilogue(Epilogue::ReluBias);
    /// let session = BlasSession::new(&device)?;
    /// session
    ///     .blas(Mode::Eager)
    ///     .matmul(&fc, &x, &w, &mut h, MatmulArgs::new().bias(&b))?;
    /// session.synchronize()?;
    /// let h = device.download(&h)?;
    /// assert_eq!(h.len(), batch * hidden);
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    pub fn matmul<T: BlasElem>(
        &self,
        spec: &Matmul,
        a: &impl DeviceMem<T>,
        b: &impl DeviceMem<T>,
        d: &mut impl DeviceMemMut<T>,
        args: MatmulArgs<'_, T>,
    ) -> Result<()> {
        let spec = &self.planned(spec);
        check_operands(spec, &Operands::of(a, b, d, &args))?;
        check_outputs(d, &args)?;
        let stream: &CudaStream = self.stream;
        stream
            .context()
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;

        let a_ptr = a.device_address();
        let b_ptr = b.device_address();
        let c_given = args.c.map(|c| c.device_address());
        let bias_ptr = args.bias.as_ref().map(|bias| match bias {
            BiasArg::Add(x) => x.device_address(),
            BiasArg::Grad(x) => x.device_address(),
        });
        let aux_ptr = args.aux.as_ref().map(|aux| match aux {
            AuxArg::SaveReluMask(x) => x.device_address(),
            AuxArg::ReluMask(x) => x.device_address(),
            AuxArg::SaveGeluInput(x) => x.device_address(),
            AuxArg::GeluInput(x) => x.device_address(),
        });
        let ptrs = EpiloguePtrs {
            bias: bias_ptr,
            aux: aux_ptr,
        };

        let d_ptr = d.device_address();
        // No C: C is D, read in place when beta != 0.
        let matrices = MatrixPtrs {
            a: a_ptr,
            b: b_ptr,
            c: c_given.unwrap_or(d_ptr),
            d: d_ptr,
        };
        let key = PlanKey::new(spec, &matrices);
        match self.mode {
            // The warm-up allocates, runs and waits on purpose, before any capture: the
            // capture guard, which refuses all three inside an op, leaves it be.
            Mode::Dry => {
                crate::scope::exempt(|| self.warm::<T>(&key, a_ptr, b_ptr, ptrs, args.alpha))
            }
            Mode::Capture | Mode::Eager => {
                if self.mode == Mode::Eager && !self.handle.plans.borrow().contains_key(&key) {
                    let plan = self.handle.build_plan(&key, &ptrs)?;
                    self.handle.plans.borrow_mut().insert(key, plan);
                }
                let plans = self.handle.plans.borrow();
                let plan = plans.get(&key).ok_or_else(|| Error::MatmulNotPlanned {
                    shape: spec.to_string(),
                })?;
                self.enqueue(plan, matrices, ptrs, args.alpha, args.beta)?;
                self.count(|c| c.matmuls += 1);
                Ok(())
            }
        }
    }

    /// The dry pass: plan if needed, then one run into temporary outputs, waited for.
    fn warm<T: BlasElem>(
        &self,
        key: &PlanKey,
        a: u64,
        b: u64,
        given: EpiloguePtrs,
        alpha: f32,
    ) -> Result<()> {
        let spec = &key.spec;
        let stream = self.stream;
        let device = self.handle.device();
        let what = |operand: &str| format!("temporary {operand} of the dry run of matmul {spec}");
        let d_len = spec.d_len();
        // SAFETY: (here and for the two below) the matmul writes every element of a
        // temporary output before anything reads it, and nothing reads them after.
        let mut d_tmp = unsafe { stream.alloc::<T>(d_len) }
            .map_err(device.alloc_error(&what("D"), d_len * std::mem::size_of::<T>()))?;
        let bias_tmp = match (spec.epilogue.bias_use(), spec.bias_len()) {
            (Some(BiasUse::Grad), Some(len)) => Some(
                // SAFETY: as above.
                unsafe { stream.alloc::<T>(len) }.map_err(
                    device.alloc_error(&what("bias gradient"), len * std::mem::size_of::<T>()),
                )?,
            ),
            _ => None,
        };
        let aux_bytes = match (spec.epilogue.aux_use(), spec.aux_len()) {
            (Some(AuxUse::SaveReluMask), Some(len)) => Some(len),
            (Some(AuxUse::SaveGeluInput), Some(len)) => Some(len * std::mem::size_of::<T>()),
            _ => None,
        };
        let aux_tmp = match aux_bytes {
            Some(bytes) => Some(
                // SAFETY: as above; a GELU input is written as T, but cuBLASLt only needs
                // the bytes, and a fresh allocation is aligned for any element type.
                unsafe { stream.alloc::<u8>(bytes) }
                    .map_err(device.alloc_error(&what("aux"), bytes))?,
            ),
            None => None,
        };

        let (d_ptr, _d) = d_tmp.device_ptr_mut(stream);
        let bias_tmp_ptr = bias_tmp.as_ref().map(|x| x.device_ptr(stream));
        let aux_tmp_ptr = aux_tmp.as_ref().map(|x| x.device_ptr(stream));
        // Outputs go to the temporaries; inputs (bias to add, mask or GELU input to read)
        // are the caller's, only read.
        let ptrs = EpiloguePtrs {
            bias: bias_tmp_ptr.as_ref().map(|(p, _)| *p).or(given.bias),
            aux: match spec.epilogue.aux_use() {
                Some(u) if u.is_output() => aux_tmp_ptr.as_ref().map(|(p, _)| *p),
                _ => given.aux,
            },
        };

        // Planned for the caller's alignment: the temporaries are aligned at least as well.
        if !self.handle.plans.borrow().contains_key(key) {
            let plan = self.handle.build_plan(key, &ptrs)?;
            self.handle.plans.borrow_mut().insert(*key, plan);
        }
        {
            let plans = self.handle.plans.borrow();
            let plan = plans.get(key).ok_or_else(|| Error::MatmulNotPlanned {
                shape: spec.to_string(),
            })?;
            let matrices = MatrixPtrs {
                a,
                b,
                c: d_ptr,
                d: d_ptr,
            };
            // beta = 0: the temporary D is never read.
            self.enqueue(plan, matrices, ptrs, alpha, 0.0)?;
        }
        stream
            .synchronize()
            .map_err(Error::driver("cuStreamSynchronize"))?;
        // The temporaries are freed (stream-ordered, after the wait) as they drop here.
        Ok(())
    }

    /// Points the plan's descriptor at this call's epilogue operands and issues
    /// [cublasLtMatmul](https://docs.nvidia.com/cuda/cublas/#cublasltmatmul) on the stream.
    /// Nothing is created: this is what runs inside a capture.
    fn enqueue(
        &self,
        plan: &Plan,
        m: MatrixPtrs,
        ptrs: EpiloguePtrs,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        plan.desc.set_pointers(&ptrs)?;
        let stream: &CudaStream = self.stream;
        let (workspace, _w) = self.handle.workspace.device_ptr(stream);
        // SAFETY: the plan's descriptors are alive (the cache borrow is held by the
        // caller); the caller checked every buffer against the spec the layouts were
        // built from, and the pointers are of live buffers borrowed for this call (a
        // captured matmul's buffers are kept alive by the step that owns the graph). The
        // scale type is f32, matching `alpha` and `beta`, read on the host (the default
        // host pointer mode). cuBLASLt's A is the user's B (see `col_major_problem`). The
        // workspace belongs to this stream alone.
        unsafe {
            lt::matmul(
                self.handle.handle,
                plan.desc.0,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                m.b as *const c_void,
                plan.lt_a.0,
                m.a as *const c_void,
                plan.lt_b.0,
                m.c as *const c_void,
                plan.lt_d.0,
                m.d as *mut c_void,
                plan.lt_d.0,
                &plan.algo,
                workspace as *mut c_void,
                self.handle.workspace.len(),
                stream.cu_stream() as lt_sys::cudaStream_t,
            )
        }
        .map_err(Error::blas("cublasLtMatmul"))
    }
}

// ---------------------------------------------------------------------------------------
// Outside a step.
// ---------------------------------------------------------------------------------------

/// A stream of its own with a cuBLASLt handle and workspace, for matmuls outside a step:
/// tests, one-off setup, checks against a reference.
///
/// Work goes on the session's stream; call [`synchronize`](BlasSession::synchronize)
/// before reading results with [`Device::download`], which uses another stream.
/// [`Mode::Capture`] here only means "fail unless planned": nothing is being captured.
///
/// ```no_run
/// use stepgraph::exec::{BlasSession, Mode};
/// use stepgraph::{Device, Matmul, MatmulArgs};
///
/// let device = Device::new(0)?;
/// let a = device.upload_new("a", &[1.0f32, 2.0, 3.0, 4.0])?; // 2 x 2
/// let b = device.upload_new("b", &[1.0f32, 0.0, 0.0, 1.0])?; // identity
/// let mut d = device.alloc_zeros::<f32>("d", 4)?;
/// let session = BlasSession::new(&device)?;
/// session
///     .blas(Mode::Eager)
///     .matmul(&Matmul::new(2, 2, 2), &a, &b, &mut d, MatmulArgs::new())?;
/// session.synchronize()?;
/// assert_eq!(device.download(&d)?, [1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), stepgraph::Error>(())
/// ```
pub struct BlasSession {
    /// Declared before the stream, though the workspace holds the stream alive anyway.
    handle: BlasHandle,
    stream: Arc<CudaStream>,
}

impl fmt::Debug for BlasSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlasSession")
            .field("handle", &self.handle)
            .finish()
    }
}

impl BlasSession {
    /// Creates the stream, the handle and its workspace.
    pub fn new(device: &Device) -> Result<BlasSession> {
        let stream = device
            .context()
            .new_stream()
            .map_err(Error::driver("cuStreamCreate"))?;
        let handle = BlasHandle::new(device, &stream, "cuBLASLt workspace of a BlasSession")?;
        Ok(BlasSession { handle, stream })
    }

    /// The cuBLASLt view of the session's stream in `mode`.
    pub fn blas(&self, mode: Mode) -> Blas<'_> {
        Blas {
            handle: &self.handle,
            stream: &self.stream,
            mode,
            counts: None,
            sm_target: SmTarget::Whole,
        }
    }

    /// The handle, with its plan cache.
    pub fn handle(&self) -> &BlasHandle {
        &self.handle
    }

    /// The session's stream.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for the work issued on the session's stream.
    pub fn synchronize(&self) -> Result<()> {
        crate::scope::check("BlasSession::synchronize")?;
        self.stream
            .synchronize()
            .map_err(Error::driver("cuStreamSynchronize"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ops_for(spec: &Matmul) -> Operands {
        Operands {
            elem: spec.precision.elem(),
            a: spec.a_len(),
            b: spec.b_len(),
            c: None,
            d: spec.d_len(),
            bias: spec
                .epilogue
                .bias_use()
                .map(|u| (u, spec.bias_len().unwrap())),
            aux: spec
                .epilogue
                .aux_use()
                .map(|u| (u, spec.aux_len().unwrap())),
        }
    }

    const ALL_EPILOGUES: [Epilogue; 16] = [
        Epilogue::Default,
        Epilogue::Relu,
        Epilogue::Bias,
        Epilogue::ReluBias,
        Epilogue::Gelu,
        Epilogue::GeluBias,
        Epilogue::ReluAux,
        Epilogue::ReluAuxBias,
        Epilogue::GeluAux,
        Epilogue::GeluAuxBias,
        Epilogue::DRelu,
        Epilogue::DReluBgrad,
        Epilogue::DGelu,
        Epilogue::DGeluBgrad,
        Epilogue::BgradA,
        Epilogue::BgradB,
    ];

    fn mismatch(err: Error) -> (String, usize, usize) {
        match err {
            Error::LengthMismatch {
                what,
                expected,
                found,
            } => (what, expected, found),
            other => panic!("expected LengthMismatch, got {other:?}"),
        }
    }

    /// The message of a [`Error::Matmul`]; any other error fails the test.
    fn invalid(err: Error) -> String {
        match &err {
            Error::Matmul { shape, .. } => {
                assert!(!shape.is_empty(), "{err:?}");
                err.to_string()
            }
            other => panic!("expected Matmul, got {other:?}"),
        }
    }

    #[test]
    fn shape_string_names_dims_types_transposes_and_epilogue() {
        let spec = Matmul::new(128, 64, 256)
            .with_trans_b(true)
            .with_epilogue(Epilogue::ReluBias);
        assert_eq!(
            spec.to_string(),
            "128x64x256 f32 trans_a=false trans_b=true epilogue=ReluBias"
        );
        let batched = Matmul::new(2, 3, 4)
            .with_precision(Precision::Bf16)
            .with_batch(5);
        assert_eq!(
            batched.to_string(),
            "2x3x4 bf16 trans_a=false trans_b=false epilogue=Default batch=5"
        );
    }

    #[test]
    fn precision_maps_to_compute_data_and_element_types() {
        use lt_sys::cublasComputeType_t as C;
        use lt_sys::cudaDataType as D;
        assert_eq!(Precision::F32.compute_type(), C::CUBLAS_COMPUTE_32F);
        assert_eq!(Precision::F32.data_type(), D::CUDA_R_32F);
        assert_eq!(
            Precision::Tf32.compute_type(),
            C::CUBLAS_COMPUTE_32F_FAST_TF32
        );
        assert_eq!(Precision::Tf32.data_type(), D::CUDA_R_32F);
        assert_eq!(Precision::Bf16.compute_type(), C::CUBLAS_COMPUTE_32F);
        assert_eq!(Precision::Bf16.data_type(), D::CUDA_R_16BF);
        for p in [Precision::F32, Precision::Tf32, Precision::Bf16] {
            assert_eq!(p.scale_type(), D::CUDA_R_32F, "alpha and beta are f32");
        }
        assert_eq!(<f32 as sealed::Sealed>::KIND, Precision::Tf32.elem());
        assert_eq!(<half::bf16 as sealed::Sealed>::KIND, Precision::Bf16.elem());
    }

    #[test]
    fn epilogues_map_to_cublaslt_with_a_and_b_swapped_for_bias_gradients() {
        use lt_sys::cublasLtEpilogue_t as E;
        let expected = [
            E::CUBLASLT_EPILOGUE_DEFAULT,
            E::CUBLASLT_EPILOGUE_RELU,
            E::CUBLASLT_EPILOGUE_BIAS,
            E::CUBLASLT_EPILOGUE_RELU_BIAS,
            E::CUBLASLT_EPILOGUE_GELU,
            E::CUBLASLT_EPILOGUE_GELU_BIAS,
            E::CUBLASLT_EPILOGUE_RELU_AUX,
            E::CUBLASLT_EPILOGUE_RELU_AUX_BIAS,
            E::CUBLASLT_EPILOGUE_GELU_AUX,
            E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            E::CUBLASLT_EPILOGUE_DRELU,
            E::CUBLASLT_EPILOGUE_DRELU_BGRAD,
            E::CUBLASLT_EPILOGUE_DGELU,
            E::CUBLASLT_EPILOGUE_DGELU_BGRAD,
            // The user's A is cuBLASLt's B.
            E::CUBLASLT_EPILOGUE_BGRADB,
            E::CUBLASLT_EPILOGUE_BGRADA,
        ];
        for (e, lt) in ALL_EPILOGUES.iter().zip(expected) {
            assert_eq!(e.to_lt(), lt, "{e:?}");
        }
    }

    #[test]
    fn bias_and_aux_lengths_follow_the_row_major_shape() {
        let spec = |e| Matmul::new(6, 10, 4).with_epilogue(e);
        assert_eq!(spec(Epilogue::Default).bias_len(), None);
        assert_eq!(spec(Epilogue::Bias).bias_len(), Some(10));
        assert_eq!(spec(Epilogue::DReluBgrad).bias_len(), Some(10));
        assert_eq!(spec(Epilogue::BgradA).bias_len(), Some(6));
        assert_eq!(spec(Epilogue::BgradB).bias_len(), Some(10));
        // ReLU mask: 10 bits per row padded to 128 bits = 16 bytes, 6 rows.
        assert_eq!(spec(Epilogue::ReluAuxBias).aux_ld(), Some(128));
        assert_eq!(spec(Epilogue::ReluAuxBias).aux_len(), Some(6 * 16));
        assert_eq!(spec(Epilogue::DRelu).aux_len(), Some(6 * 16));
        // GELU input: 10 elements per row padded to 16.
        assert_eq!(spec(Epilogue::GeluAux).aux_ld(), Some(16));
        assert_eq!(spec(Epilogue::DGeluBgrad).aux_len(), Some(6 * 16));
        assert_eq!(spec(Epilogue::Gelu).aux_len(), None);
        let wide = Matmul::new(3, 129, 2).with_epilogue(Epilogue::ReluAux);
        assert_eq!(wide.aux_ld(), Some(256));
        assert_eq!(wide.aux_len(), Some(3 * 32));
    }

    #[test]
    fn matching_operands_pass_for_every_epilogue_and_precision() {
        for e in ALL_EPILOGUES {
            for p in [Precision::F32, Precision::Tf32, Precision::Bf16] {
                let spec = Matmul::new(16, 24, 8)
                    .with_trans_a(true)
                    .with_precision(p)
                    .with_epilogue(e);
                check_operands(&spec, &ops_for(&spec)).unwrap();
            }
        }
    }

    #[test]
    fn each_wrong_length_names_its_operand_and_shape() {
        let spec = Matmul::new(128, 256, 64).with_trans_b(true);
        let ok = ops_for(&spec);

        let (what, expected, found) =
            mismatch(check_operands(&spec, &Operands { a: 5, ..ok }).unwrap_err());
        assert_eq!(what, "matmul operand A (m x k = 128 x 64)");
        assert_eq!((expected, found), (128 * 64, 5));

        let (what, expected, _) =
            mismatch(check_operands(&spec, &Operands { b: 5, ..ok }).unwrap_err());
        assert_eq!(
            what,
            "matmul operand B (k x n = 64 x 256, stored transposed)"
        );
        assert_eq!(expected, 64 * 256);

        let (what, _, _) =
            mismatch(check_operands(&spec, &Operands { c: Some(1), ..ok }).unwrap_err());
        assert_eq!(what, "matmul operand C (m x n = 128 x 256)");

        let (what, expected, _) =
            mismatch(check_operands(&spec, &Operands { d: 7, ..ok }).unwrap_err());
        assert_eq!(what, "matmul operand D (m x n = 128 x 256)");
        assert_eq!(expected, 128 * 256);

        let batched = Matmul::new(2, 3, 4).with_batch(3);
        let (what, expected, _) = mismatch(
            check_operands(
                &batched,
                &Operands {
                    a: 1,
                    ..ops_for(&batched)
                },
            )
            .unwrap_err(),
        );
        assert_eq!(what, "matmul operand A (3 batches of m x k = 2 x 4)");
        assert_eq!(expected, 24);
    }

    #[test]
    fn wrong_bias_and_aux_lengths_are_length_mismatches() {
        let spec = Matmul::new(8, 12, 4).with_epilogue(Epilogue::ReluAuxBias);
        let ok = ops_for(&spec);
        let (what, expected, found) = mismatch(
            check_operands(
                &spec,
                &Operands {
                    bias: Some((BiasUse::Add, 8)),
                    ..ok
                },
            )
            .unwrap_err(),
        );
        assert!(what.contains("bias"), "{what}");
        assert_eq!((expected, found), (12, 8));
        let (what, expected, _) = mismatch(
            check_operands(
                &spec,
                &Operands {
                    aux: Some((AuxUse::SaveReluMask, 8 * 12)),
                    ..ok
                },
            )
            .unwrap_err(),
        );
        assert!(what.contains("ReLU mask"), "{what}");
        assert_eq!(expected, 8 * 16);

        let bgrad_a = Matmul::new(8, 12, 4).with_epilogue(Epilogue::BgradA);
        let (what, expected, _) = mismatch(
            check_operands(
                &bgrad_a,
                &Operands {
                    bias: Some((BiasUse::Grad, 12)),
                    ..ops_for(&bgrad_a)
                },
            )
            .unwrap_err(),
        );
        assert!(what.contains("m = 8"), "{what}");
        assert_eq!(expected, 8);
    }

    #[test]
    fn missing_extra_or_misdirected_epilogue_operands_are_refused() {
        let relu_bias = Matmul::new(4, 4, 4).with_epilogue(Epilogue::ReluBias);
        let msg = invalid(
            check_operands(
                &relu_bias,
                &Operands {
                    bias: None,
                    ..ops_for(&relu_bias)
                },
            )
            .unwrap_err(),
        );
        assert!(msg.contains("MatmulArgs::bias"), "{msg}");

        let msg = invalid(
            check_operands(
                &relu_bias,
                &Operands {
                    bias: Some((BiasUse::Grad, 4)),
                    ..ops_for(&relu_bias)
                },
            )
            .unwrap_err(),
        );
        assert!(msg.contains("reads the bias"), "{msg}");

        let plain = Matmul::new(4, 4, 4);
        let msg = invalid(
            check_operands(
                &plain,
                &Operands {
                    bias: Some((BiasUse::Add, 4)),
                    ..ops_for(&plain)
                },
            )
            .unwrap_err(),
        );
        assert!(msg.contains("takes no bias"), "{msg}");
        let msg = invalid(
            check_operands(
                &plain,
                &Operands {
                    aux: Some((AuxUse::GeluInput, 32)),
                    ..ops_for(&plain)
                },
            )
            .unwrap_err(),
        );
        assert!(msg.contains("takes no aux"), "{msg}");

        let drelu = Matmul::new(4, 4, 4).with_epilogue(Epilogue::DReluBgrad);
        let msg = invalid(
            check_operands(
                &drelu,
                &Operands {
                    aux: Some((AuxUse::SaveReluMask, 64)),
                    ..ops_for(&drelu)
                },
            )
            .unwrap_err(),
        );
        assert!(
            msg.contains("MatmulArgs::relu_mask, not save_relu_mask"),
            "{msg}"
        );
        let msg = invalid(
            check_operands(
                &drelu,
                &Operands {
                    aux: None,
                    ..ops_for(&drelu)
                },
            )
            .unwrap_err(),
        );
        assert!(msg.contains("needs MatmulArgs::relu_mask"), "{msg}");
    }

    #[test]
    fn element_type_must_match_the_precision() {
        let spec = Matmul::new(4, 4, 4).with_precision(Precision::Bf16);
        let msg = invalid(
            check_operands(
                &spec,
                &Operands {
                    elem: sealed::ElemKind::F32,
                    ..ops_for(&spec)
                },
            )
            .unwrap_err(),
        );
        assert!(
            msg.contains("f32 buffers given, but precision bf16"),
            "{msg}"
        );
    }

    #[test]
    fn degenerate_specs_are_refused_before_lengths() {
        for spec in [
            Matmul::new(0, 4, 4),
            Matmul::new(4, 0, 4),
            Matmul::new(4, 4, 0),
            Matmul::new(4, 4, 4).with_batch(0),
            Matmul::new(usize::MAX / 2, 4, 4),
            Matmul::new(4, 4, 4)
                .with_batch(2)
                .with_epilogue(Epilogue::ReluAuxBias),
            Matmul::new(4, 4, 4)
                .with_batch(2)
                .with_epilogue(Epilogue::BgradA),
            Matmul::new(4, 4, 1).with_epilogue(Epilogue::DGelu),
        ] {
            invalid(check_operands(&spec, &ops_for(&Matmul::new(1, 1, 1))).unwrap_err());
        }
        // A batch with a shared bias is fine.
        let spec = Matmul::new(4, 4, 4)
            .with_batch(2)
            .with_epilogue(Epilogue::GeluBias);
        check_operands(&spec, &ops_for(&spec)).unwrap();
    }

    #[test]
    fn sm_targets_resolve_against_the_gpu_and_name_themselves() {
        assert_eq!(SmTarget::Whole.sms(132), None);
        assert_eq!(SmTarget::Share(1).sms(132), Some(132));
        assert_eq!(SmTarget::Share(2).sms(132), Some(66));
        // Rounded down, never to nothing.
        assert_eq!(SmTarget::Share(5).sms(132), Some(26));
        assert_eq!(SmTarget::Share(133).sms(132), None);
        assert_eq!(SmTarget::Share(0).sms(132), None);
        assert_eq!(SmTarget::Count(132).sms(132), Some(132));
        assert_eq!(SmTarget::Count(133).sms(132), None);
        assert_eq!(SmTarget::Count(0).sms(132), None);
        let spec = Matmul::new(8, 4, 2);
        assert!(!spec.to_string().contains("sms="));
        assert_eq!(
            spec.with_sm_target(SmTarget::Count(40))
                .with_ld_d(5)
                .to_string(),
            "8x4x2 f32 trans_a=false trans_b=false epilogue=Default ld_d=5 sms=40"
        );
        // What Display writes parses back; nothing else does.
        for t in [
            SmTarget::Whole,
            SmTarget::Share(1),
            SmTarget::Share(7),
            SmTarget::Count(132),
        ] {
            assert_eq!(t.to_string().parse::<SmTarget>().unwrap(), t);
        }
        for bad in ["", "0", "1/0", "1/", "2/3", "-4", "whole ", "half", "1/x"] {
            let e = bad.parse::<SmTarget>().unwrap_err();
            assert!(
                matches!(&e, Error::Config { name: "SM target", found, .. }
                    if *found == format!("`{bad}`")),
                "{e:?}"
            );
            let msg = e.to_string();
            assert!(msg.ends_with(&format!("found `{bad}`")), "{msg}");
        }
        // A spec planned for a share is a plan of its own.
        assert_ne!(spec, spec.with_sm_target(SmTarget::Share(2)));
    }

    #[test]
    fn an_sm_target_of_nothing_is_refused() {
        for (target, why) in [
            (
                SmTarget::Share(0),
                "an SM share must divide the GPU by at least 1",
            ),
            (SmTarget::Count(0), "an SM count target must be at least 1"),
        ] {
            let spec = Matmul::new(4, 4, 4).with_sm_target(target);
            let msg = invalid(spec.check_spec().unwrap_err());
            assert!(msg.ends_with(why), "{msg}");
        }
        Matmul::new(4, 4, 4)
            .with_sm_target(SmTarget::Share(3))
            .check_spec()
            .unwrap();
    }

    #[test]
    fn an_n_that_overflows_when_rounded_up_is_refused_not_a_panic() {
        // n rounds up to the ReLU mask's 128-bit rows past usize::MAX.
        let spec = Matmul::new(1, usize::MAX - 3, 1);
        let msg = invalid(spec.check_spec().unwrap_err());
        assert!(msg.ends_with(": the buffer sizes overflow"), "{msg}");
    }

    #[test]
    fn buffer_lengths_of_a_huge_spec_saturate_rather_than_panic() {
        let spec = Matmul::new(usize::MAX / 2, 3, 5).with_epilogue(Epilogue::DRelu);
        assert_eq!(
            (spec.a_len(), spec.b_len(), spec.d_len()),
            (usize::MAX, 15, usize::MAX)
        );
        assert_eq!(spec.aux_len(), Some(usize::MAX / 8));
    }

    #[test]
    fn col_major_problem_swaps_operands_and_keeps_transposes() {
        // (m, n, k) = (2, 3, 5), all four transpose combinations.
        let l = |rows, cols, ld, transpose| LtLayout {
            rows,
            cols,
            ld,
            transpose,
        };
        let p = |ta, tb| col_major_problem(&Matmul::new(2, 3, 5).with_trans_a(ta).with_trans_b(tb));

        // NN: B row-major k x n is col-major n x k (= op(B)ᵀ); A m x k is col-major k x m.
        assert_eq!(
            p(false, false),
            LtProblem {
                lt_a: l(3, 5, 3, false),
                lt_b: l(5, 2, 5, false),
                lt_d: l(3, 2, 3, false),
            }
        );
        // B stored n x k: col-major k x n, transposed to n x k.
        assert_eq!(
            p(false, true),
            LtProblem {
                lt_a: l(5, 3, 5, true),
                lt_b: l(5, 2, 5, false),
                lt_d: l(3, 2, 3, false),
            }
        );
        // A stored k x m: col-major m x k, transposed to k x m.
        assert_eq!(
            p(true, false),
            LtProblem {
                lt_a: l(3, 5, 3, false),
                lt_b: l(2, 5, 2, true),
                lt_d: l(3, 2, 3, false),
            }
        );
        assert_eq!(
            p(true, true),
            LtProblem {
                lt_a: l(5, 3, 5, true),
                lt_b: l(2, 5, 2, true),
                lt_d: l(3, 2, 3, false),
            }
        );
        assert_eq!(p(false, false).lt_d.stride(), 6);
    }

    /// What cuBLASLt computes from column-major layouts: `D = op(A)·op(B)`, with
    /// `X[r][c]` at `x[r + c·ld]` and op transposing where the layout says so.
    fn lt_gemm(p: &LtProblem, a: &[f64], b: &[f64]) -> Vec<f64> {
        let at = |l: &LtLayout, x: &[f64], r: u64, c: u64| {
            let (r, c) = if l.transpose { (c, r) } else { (r, c) };
            x[(r + c * l.ld as u64) as usize]
        };
        let (rows, cols) = (p.lt_d.rows, p.lt_d.cols);
        let k = if p.lt_a.transpose {
            p.lt_a.rows
        } else {
            p.lt_a.cols
        };
        let mut d = vec![0.0; (p.lt_d.ld as u64 * cols) as usize];
        for c in 0..cols {
            for r in 0..rows {
                let sum = (0..k)
                    .map(|i| at(&p.lt_a, a, r, i) * at(&p.lt_b, b, i, c))
                    .sum();
                d[(r + c * p.lt_d.ld as u64) as usize] = sum;
            }
        }
        d
    }

    proptest! {
        /// Feeding the user's buffers to cuBLASLt's column-major arithmetic, swapped as
        /// `col_major_problem` says, gives the row-major product.
        #[test]
        fn swapped_col_major_product_is_the_row_major_product(
            m in 1usize..6, n in 1usize..6, k in 1usize..6,
            trans_a: bool, trans_b: bool, seed: u64,
        ) {
            let spec = Matmul::new(m, n, k).with_trans_a(trans_a).with_trans_b(trans_b);
            let mut s = seed | 1;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 17) as f64 - 8.0
            };
            let a: Vec<f64> = (0..m * k).map(|_| next()).collect();
            let b: Vec<f64> = (0..k * n).map(|_| next()).collect();
            let op_a = |i: usize, l: usize| if trans_a { a[l * m + i] } else { a[i * k + l] };
            let op_b = |l: usize, j: usize| if trans_b { b[j * k + l] } else { b[l * n + j] };
            let expected: Vec<f64> = (0..m * n)
                .map(|x| (0..k).map(|l| op_a(x / n, l) * op_b(l, x % n)).sum())
                .collect();
            let problem = col_major_problem(&spec);
            // cuBLASLt's A is the user's B and its B the user's A.
            let got = lt_gemm(&problem, &b, &a);
            prop_assert_eq!(got, expected);
        }
    }
}
