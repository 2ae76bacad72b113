//! The capture stream an op receives, and kernel launches on it.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{
    CudaStream, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};

use crate::blas::{BlasHandle, Matmul, SmTarget};
use crate::error::{Error, Result};
use crate::flag::DeviceFlag;
use crate::host_io::{self, Captured, HostInput, HostOutput, IoKind, IoPass};
use crate::kernel::{ArgCheck, Kernel};
use crate::memory::{DeviceMem, DeviceMemMut};
use crate::scalars::DeviceScalars;
use crate::verify::OpCounts;

/// How a pass over the step's ops treats the work they issue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Nothing is enqueued: arguments are checked and matmul plans are built and warmed.
    /// Runs once before every capture, so nothing is created inside a capture.
    Dry,
    /// Work is enqueued on a stream under stream capture.
    Capture,
    /// Work is enqueued and runs as it is issued (the eager baseline).
    Eager,
}

impl Mode {
    /// Whether work is put on the stream in this mode.
    pub fn enqueues(self) -> bool {
        !matches!(self, Mode::Dry)
    }
}

/// The stream an op is issued on, during capture.
///
/// It can launch kernels, run cuBLASLt matmuls (through [`Blas`]), copy device to device,
/// memset and refresh device scalars. It has no way to synchronise, to allocate or to copy
/// to the host: each of those breaks or stalls a stream capture, so an op that tries one
/// does not compile.
///
/// ```compile_fail
/// fn bad(stream: &stepgraph::CaptureStream<'_>) {
///     stream.synchronize(); // no such method: a capture cannot wait for the host
/// }
/// ```
pub struct CaptureStream<'a> {
    pub(crate) stream: &'a Arc<CudaStream>,
    pub(crate) mode: Mode,
    pub(crate) name: &'static str,
    pub(crate) blas: &'a BlasHandle,
    /// What the op issued on this stream, for the verifier.
    pub(crate) counts: Cell<OpCounts>,
    /// The pass's copies to and from host rings; `None` inside a conditional op, whose
    /// copies could not be pointed at a new slot per replay.
    pub(crate) io: Option<&'a IoPass>,
    /// The op runs under a condition (`#[every]`, `#[when]`): its work is a conditional
    /// node's body.
    pub(crate) conditional: bool,
}

impl fmt::Debug for CaptureStream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureStream")
            .field("name", &self.name)
            .field("mode", &self.mode)
            .finish()
    }
}

impl<'a> CaptureStream<'a> {
    /// The plan's name of the stream this op is placed on (`main`, `branch[2]`). In a
    /// one-stream baseline capture the op still reports its planned stream.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// How this pass treats issued work.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// This stream's cuBLASLt handle and workspace.
    pub fn blas(&self) -> Blas<'_> {
        Blas {
            handle: self.blas,
            stream: self.stream,
            mode: self.mode,
            counts: Some(&self.counts),
            sm_target: SmTarget::Whole,
        }
    }

    /// Starts a kernel launch; add arguments in the kernel's parameter order, then call
    /// [`Launch::launch`], which checks them against the kernel's parameter list.
    ///
    /// A crate's kernels built with `stepgraph-build` have typed launchers that do this
    /// for each kernel (see [`include_kernels!`](crate::include_kernels)); this is the way
    /// for a kernel without one.
    pub fn launch<'b>(&'b self, kernel: &'b Kernel) -> Launch<'b> {
        Launch {
            args: self.stream.launch_builder(kernel.function()),
            mode: self.mode,
            kernel,
            check: ArgCheck::default(),
            counts: &self.counts,
            refused: None,
        }
    }

    pub(crate) fn count(&self, f: impl FnOnce(&mut OpCounts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }

    /// Sets every element of `buf` (a buffer or a view) to zero bits.
    pub fn memset_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        buf: &mut impl DeviceMemMut<T>,
    ) -> Result<()> {
        crate::guard::check_write_mem(buf, || "memset".into())?;
        if self.mode.enqueues() {
            let bytes = buf.len() * size_of::<T>();
            self.bind()?;
            // SAFETY: the address and length are those of live device memory borrowed
            // mutably for this call (a captured memset's memory is kept alive by the step
            // that owns the graph).
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    buf.device_address(),
                    0,
                    bytes,
                    self.stream.cu_stream(),
                )
            }
            .map_err(Error::driver("cuMemsetD8Async"))?;
        }
        self.count(|c| c.memsets += 1);
        Ok(())
    }

    /// Sets or clears `flag` (a captured memset), for a `#[when(flag)]` op later in the
    /// step or in a later replay. A kernel of the op's own may write it instead, to decide
    /// from the data.
    pub fn set_flag(&self, flag: &mut DeviceFlag, set: bool) -> Result<()> {
        crate::guard::check_write_mem(flag, || "set_flag".into())?;
        if self.mode.enqueues() {
            self.bind()?;
            // SAFETY: the address is that of the flag's one live u32, borrowed mutably for
            // this call (a captured memset's memory is kept alive by the step that owns
            // the graph).
            unsafe {
                cudarc::driver::sys::cuMemsetD32Async(
                    flag.device_address(),
                    u32::from(set),
                    1,
                    self.stream.cu_stream(),
                )
            }
            .result()
            .map_err(Error::driver("cuMemsetD32Async"))?;
        }
        self.count(|c| c.memsets += 1);
        Ok(())
    }

    /// Copies `src` into `dst` (buffers or views); both must have the same length.
    pub fn copy<T: DeviceRepr>(
        &self,
        src: &impl DeviceMem<T>,
        dst: &mut impl DeviceMemMut<T>,
    ) -> Result<()> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                what: "device-to-device copy destination".into(),
                expected: src.len(),
                found: dst.len(),
            });
        }
        crate::guard::check_write_mem(dst, || "copy destination".into())?;
        if self.mode.enqueues() {
            self.bind()?;
            // SAFETY: both are live device memory of `len` elements (checked above),
            // borrowed for this call; they cannot overlap, as `dst` is borrowed mutably.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    dst.device_address(),
                    src.device_address(),
                    src.len() * size_of::<T>(),
                    self.stream.cu_stream(),
                )
            }
            .map_err(Error::driver("cuMemcpyDtoDAsync"))?;
        }
        self.count(|c| c.copies += 1);
        Ok(())
    }

    fn bind(&self) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))
    }

    /// The stream as cudarc's, for existing code that issues its own work: kernels
    /// launched with cudarc, cuBLASLt called with a stream and a workspace (see
    /// [`Blas::workspace`]). `None` in a [`Mode::Dry`] pass, which enqueues nothing: the
    /// dry pass runs before every capture, and work issued then would run for real.
    ///
    /// The verifier checks that an op that took the stream put work into the graph, and
    /// at least what it issued through this type.
    ///
    /// # Safety
    ///
    /// Only capture-legal work may be issued on it, and only work on it:
    /// - no synchronisation of it, of the context or of an event recorded on it, no
    ///   query of its work, no copy to or from pageable host memory (each fails the
    ///   capture, or stalls it);
    /// - no allocation or free in the middle of the step's work (use the step's
    ///   buffers and scratch);
    /// - no work on any other stream (one of the program's own, cudarc's default
    ///   stream): it runs once, while the step is built, and never in a replay;
    /// - no wait on an event recorded outside the capture;
    /// - only the memory the op's parameters grant, read or written as their `&` and
    ///   `&mut` say: the plan orders the op by its parameters and nothing else.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use stepgraph::cudarc::driver::{CudaSlice, CudaStream, DriverError};
    /// use stepgraph::{CaptureStream, DeviceBuffer, Error, Result};
    ///
    /// // An existing function of a cudarc trainer, unchanged.
    /// fn zero_grads(stream: &Arc<CudaStream>, g: &mut CudaSlice<f32>) -> Result<(), DriverError> {
    ///     stream.memset_zeros(g)
    /// }
    ///
    /// // The op that wraps it.
    /// fn zero(s: &CaptureStream<'_>, grads: &mut DeviceBuffer<f32>) -> Result<()> {
    ///     // SAFETY: `zero_grads` issues one memset on the stream it is given, the capture
    ///     // stream, of `grads`, which it writes in place.
    ///     unsafe {
    ///         if let Some(stream) = s.cuda_stream() {
    ///             zero_grads(stream, grads.cuda_slice_mut()).map_err(Error::driver("zero_grads"))?;
    ///         }
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub unsafe fn cuda_stream(&self) -> Option<&'a Arc<CudaStream>> {
        if !self.mode.enqueues() {
            return None;
        }
        self.count(|c| c.raw += 1);
        Some(self.stream)
    }

    /// Copies the scalars' pinned host values to their device copy. Captured, this is a
    /// memcpy node that reads the host values at every replay, so kernels that read the
    /// device copy see the values set before that replay without a re-capture.
    pub fn refresh<T: DeviceRepr + ValidAsZeroBits + Copy>(
        &self,
        scalars: &mut DeviceScalars<T>,
    ) -> Result<()> {
        crate::guard::check_write_mem(scalars.on_device(), || "refresh of device scalars".into())?;
        if self.mode.enqueues() {
            scalars.enqueue_refresh(self.stream)?;
        }
        self.count(|c| c.copies += 1);
        Ok(())
    }

    /// Copies the host input's slot that the host filled last into `dst` (a buffer or a
    /// view of the same length). Captured, this is a memcpy node from pinned memory that
    /// is pointed at the newest slot before each replay ([`HostInput`] says how the slots
    /// turn), so the copy runs on a copy engine inside the graph and the host fills the
    /// next batch while the replay runs.
    ///
    /// Fails inside an `#[every]` or `#[when]` op (the copy runs at every replay, or its slots could
    /// not be told apart), and for a length mismatch.
    pub fn stage<T: DeviceRepr>(
        &self,
        input: &HostInput<T>,
        dst: &mut impl DeviceMemMut<T>,
    ) -> Result<()> {
        crate::error::check_len(
            format!("the device side of the staged copy of `{}`", input.name()),
            input.len(),
            dst.len(),
        )?;
        crate::guard::check_write_mem(dst, || format!("staged copy of `{}`", input.name()))?;
        self.host_copy(&input.ring, dst.device_address())
    }

    /// Copies `src` (a buffer or a view) into the next slot of a host output. Captured,
    /// this is a memcpy node to pinned memory that is pointed at the next slot before
    /// each replay; the host reads the newest finished replay's values with
    /// [`Step::read_back`](crate::Step::read_back), without waiting for the GPU.
    ///
    /// Fails inside an `#[every]` or `#[when]` op, and for a length mismatch.
    pub fn read_back<T: DeviceRepr>(
        &self,
        src: &impl DeviceMem<T>,
        out: &mut HostOutput<T>,
    ) -> Result<()> {
        crate::error::check_len(
            format!("the device side of the read-back into `{}`", out.name()),
            out.len(),
            src.len(),
        )?;
        self.host_copy(&out.ring, src.device_address())
    }

    fn host_copy(&self, ring: &std::sync::Arc<host_io::Ring>, device: u64) -> Result<()> {
        let Some(io) = self.io else {
            return Err(Error::Invalid(format!(
                "`{}` is copied inside a conditional op: host inputs and outputs are copied at \
                 every replay, in an op without #[every] or #[when]",
                ring.what
            )));
        };
        if self.mode.enqueues() {
            ring.bind(io.owner)?;
            let slot = {
                let mut st = ring.state();
                // A graph's copy is pointed at its slot before each replay; until then it
                // refers to the slot replay `io.seq` would use.
                let slot = st.slot_for(ring.direction, io.seq);
                if io.kind == Some(IoKind::Eager) {
                    st.mark(slot, io.seq);
                }
                slot
            };
            self.bind()?;
            host_io::enqueue(
                ring.direction,
                ring.slot_ptr(slot),
                device,
                ring.bytes,
                self.stream,
            )?;
            if self.mode == Mode::Capture && io.kind == Some(IoKind::Graph) {
                let node = match crate::every::capture_dependencies(self.stream)?.as_slice() {
                    [node] => *node,
                    found => {
                        return Err(Error::Invalid(format!(
                            "after the copy of `{}` the capture expected one new node, found {} \
                             dependencies",
                            ring.what,
                            found.len()
                        )));
                    }
                };
                io.captured.borrow_mut().push(Captured {
                    ring: ring.clone(),
                    slot,
                    node,
                });
            }
        }
        self.count(|c| c.copies += 1);
        Ok(())
    }
}

/// A kernel launch being assembled. Arguments are pushed in the kernel's parameter order;
/// the size of each is recorded, and [`Launch::launch`] refuses a launch whose arguments
/// differ from the kernel's parameters in number or size, before the driver sees it.
pub struct Launch<'b> {
    args: LaunchArgs<'b>,
    mode: Mode,
    kernel: &'b Kernel,
    check: ArgCheck,
    counts: &'b Cell<OpCounts>,
    /// A write argument outside what the op may write: the launch is refused.
    refused: Option<Error>,
}

impl fmt::Debug for Launch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("kernel", &self.kernel.name())
            .finish()
    }
}

/// What a buffer argument is to the kernel: a device address (`CUdeviceptr`).
const DEVICE_POINTER_BYTES: usize = size_of::<cudarc::driver::sys::CUdeviceptr>();

impl<'b> Launch<'b> {
    /// Passes a buffer or a view the kernel only reads, as a `const T*`.
    pub fn buf<T>(&mut self, buf: &'b impl DeviceMem<T>) -> &mut Self {
        self.check.push(self.kernel.params(), DEVICE_POINTER_BYTES);
        buf.push_arg(&mut self.args);
        self
    }

    /// Passes a buffer or a view the kernel writes, as a `T*`.
    pub fn buf_mut<T>(&mut self, buf: &'b mut impl DeviceMemMut<T>) -> &mut Self {
        if self.refused.is_none() {
            let (kernel, index) = (self.kernel.name(), self.check.pushed());
            self.refused = crate::guard::check_write_mem(&*buf, || {
                format!("argument {index} of kernel `{kernel}`")
            })
            .err();
        }
        self.check.push(self.kernel.params(), DEVICE_POINTER_BYTES);
        buf.push_arg_mut(&mut self.args);
        self
    }

    /// Passes a value by copy.
    pub fn arg<T: DeviceRepr>(&mut self, value: &'b T) -> &mut Self {
        self.check.push(self.kernel.params(), size_of::<T>());
        self.args.arg(value);
        self
    }

    /// Enqueues the launch (nothing happens in a dry pass), with
    /// [`cuLaunchKernel`](https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html).
    ///
    /// Fails with [`Error::LaunchArguments`], naming the kernel and the argument, if the
    /// arguments differ from the kernel's parameter list in number or in any argument's
    /// size, and inside an op with [`Error::UngrantedWrite`] if a `buf_mut` argument lies
    /// outside every buffer the op takes `&mut`; nothing is launched (or counted) then.
    ///
    /// # Safety
    /// The arguments must have the types the kernel reads (the check sees sizes: a `u32`
    /// where it reads a `float`, or a buffer of the wrong element type, passes it), and
    /// the grid and the size arguments must keep every access inside the buffers passed.
    /// Typed launchers generated by `stepgraph-build` discharge the first obligation.
    pub unsafe fn launch(&mut self, config: LaunchConfig) -> Result<()> {
        if let Some(refused) = self.refused.take() {
            return Err(refused);
        }
        self.check
            .finish(self.kernel.params())
            .map_err(|mismatch| Error::LaunchArguments {
                kernel: self.kernel.name(),
                mismatch,
            })?;
        let mut c = self.counts.get();
        c.launches += 1;
        self.counts.set(c);
        if !self.mode.enqueues() {
            return Ok(());
        }
        // SAFETY: the count and sizes match the kernel's parameters (checked above); the
        // caller upholds the types and the bounds (see above).
        unsafe { self.args.launch(config) }
            .map(|_| ())
            .map_err(Error::driver("cuLaunchKernel"))
    }
}

/// The cuBLASLt handle and workspace of the stream an op runs on.
#[derive(Clone, Copy)]
pub struct Blas<'a> {
    pub(crate) handle: &'a BlasHandle,
    pub(crate) stream: &'a Arc<CudaStream>,
    pub(crate) mode: Mode,
    /// The op's counters, when the view comes from a capture stream.
    pub(crate) counts: Option<&'a Cell<OpCounts>>,
    /// What matmuls whose spec names no SM target are planned for.
    pub(crate) sm_target: SmTarget,
}

impl Blas<'_> {
    /// The same view, with every matmul whose spec names no SM target of its own planned
    /// for `target` (see [`SmTarget`]): one line at the top of a stream group member's op
    /// instead of a target on each of its specs.
    ///
    /// ```no_run
    /// use stepgraph::{CaptureStream, Matmul, MatmulArgs, Result, SmTarget};
    ///
    /// /// One of four branches' layers, each branch on a stream of `branch[4]`.
    /// fn branch(s: &CaptureStream<'_>, x: &stepgraph::DeviceBuffer<f32>,
    ///           w: &stepgraph::DeviceBuffer<f32>, y: &mut stepgraph::DeviceBuffer<f32>)
    ///           -> Result<()> {
    ///     let blas = s.blas().planned_for(SmTarget::Share(4));
    ///     let fc = Matmul::new(16384, 64, 256).with_trans_b(true);
    ///     blas.matmul(&fc, x, w, y, MatmulArgs::new()) // planned for 132 / 4 SMs on an H200
    /// }
    /// ```
    pub fn planned_for(self, target: SmTarget) -> Self {
        Blas {
            sm_target: target,
            ..self
        }
    }

    /// `spec`, planned for this view's SM target unless it names one itself.
    pub(crate) fn planned(&self, spec: &Matmul) -> Matmul {
        if spec.sm_target == SmTarget::Whole {
            spec.with_sm_target(self.sm_target)
        } else {
            *spec
        }
    }

    /// The stream's cuBLASLt handle, for an existing cuBLASLt call of the program's own.
    /// Using it is `unsafe` (a raw FFI handle); issue with it only on the stream of
    /// [`CaptureStream::cuda_stream`], whose contract applies, and do not destroy it.
    ///
    /// ```no_run
    /// fn op(s: &stepgraph::CaptureStream<'_>) -> stepgraph::Result<()> {
    ///     let handle = s.blas().cublaslt_handle();
    ///     assert!(!handle.is_null());
    ///     Ok(())
    /// }
    /// ```
    pub fn cublaslt_handle(&self) -> cudarc::cublaslt::sys::cublasLtHandle_t {
        self.handle.raw()
    }

    /// The stream's cuBLASLt workspace as device address and size in bytes
    /// ([`WORKSPACE_BYTES`](crate::exec::WORKSPACE_BYTES)): what an existing cuBLASLt call
    /// takes as its workspace override. It belongs to this stream alone, so a call on
    /// this stream may use it whole, and no call on another stream may use it at all.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use stepgraph::cudarc::driver::{CudaSlice, CudaStream};
    /// use stepgraph::{CaptureStream, Error, Result};
    ///
    /// # #[derive(Debug)] struct LtError;
    /// # impl std::fmt::Display for LtError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("lt") } }
    /// # impl std::error::Error for LtError {}
    /// /// A trainer's existing cuBLASLt wrapper, with its overrides.
    /// fn gemm(
    ///     stream: Option<&Arc<CudaStream>>,
    ///     workspace: Option<(u64, usize)>,
    ///     a: &CudaSlice<f32>,
    ///     d: &mut CudaSlice<f32>,
    /// ) -> std::result::Result<(), LtError> {
    /// #   let _ = (stream, workspace, a, d);
    ///     Ok(()) // cublasLtMatmul(.., workspace.0, workspace.1, stream)
    /// }
    ///
    /// fn head(s: &CaptureStream<'_>, a: &CudaSlice<f32>, d: &mut CudaSlice<f32>) -> Result<()> {
    ///     let workspace = s.blas().workspace();
    ///     // SAFETY: `gemm` issues one cuBLASLt matmul on the stream it is given.
    ///     match unsafe { s.cuda_stream() } {
    ///         Some(stream) => gemm(Some(stream), Some(workspace), a, d).map_err(Error::external),
    ///         None => Ok(()), // the dry pass
    ///     }
    /// }
    /// ```
    pub fn workspace(&self) -> (u64, usize) {
        self.handle.workspace_raw()
    }

    pub(crate) fn count(&self, f: impl FnOnce(&mut OpCounts)) {
        if let Some(cell) = self.counts {
            let mut c = cell.get();
            f(&mut c);
            cell.set(c);
        }
    }
}

impl fmt::Debug for Blas<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blas")
            .field("mode", &self.mode)
            .field("sm_target", &self.sm_target)
            .finish()
    }
}
