//! The capture stream an op receives, and kernel launches on it.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{
    CudaStream, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};

use crate::blas::BlasHandle;
use crate::device::DeviceBuffer;
use crate::error::{Error, Result};
use crate::kernel::{ArgCheck, Kernel};
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
        }
    }

    pub(crate) fn count(&self, f: impl FnOnce(&mut OpCounts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }

    /// Sets every element of `buf` to zero bits.
    pub fn memset_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        buf: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        if self.mode.enqueues() {
            self.stream
                .memset_zeros(&mut buf.slice)
                .map_err(Error::driver("cuMemsetD8Async"))?;
        }
        self.count(|c| c.memsets += 1);
        Ok(())
    }

    /// Copies `src` into `dst`; both must have the same length.
    pub fn copy<T: DeviceRepr>(
        &self,
        src: &DeviceBuffer<T>,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                what: "device-to-device copy destination".into(),
                expected: src.len(),
                found: dst.len(),
            });
        }
        if self.mode.enqueues() {
            self.stream
                .memcpy_dtod(&src.slice, &mut dst.slice)
                .map_err(Error::driver("cuMemcpyDtoDAsync"))?;
        }
        self.count(|c| c.copies += 1);
        Ok(())
    }

    /// Copies the scalars' pinned host values to their device copy. Captured, this is a
    /// memcpy node that reads the host values at every replay, so kernels that read the
    /// device copy see the values set before that replay without a re-capture.
    pub fn refresh<T: DeviceRepr + ValidAsZeroBits + Copy>(
        &self,
        scalars: &mut DeviceScalars<T>,
    ) -> Result<()> {
        if self.mode.enqueues() {
            scalars.enqueue_refresh(self.stream)?;
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
    /// Passes a buffer the kernel only reads, as a `const T*`.
    pub fn buf<T>(&mut self, buf: &'b DeviceBuffer<T>) -> &mut Self {
        self.check.push(self.kernel.params(), DEVICE_POINTER_BYTES);
        self.args.arg(&buf.slice);
        self
    }

    /// Passes a buffer the kernel writes, as a `T*`.
    pub fn buf_mut<T>(&mut self, buf: &'b mut DeviceBuffer<T>) -> &mut Self {
        self.check.push(self.kernel.params(), DEVICE_POINTER_BYTES);
        self.args.arg(&mut buf.slice);
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
    /// size; nothing is launched (or counted) then.
    ///
    /// # Safety
    /// The arguments must have the types the kernel reads (the check sees sizes: a `u32`
    /// where it reads a `float`, or a buffer of the wrong element type, passes it), and
    /// the grid and the size arguments must keep every access inside the buffers passed.
    /// Typed launchers generated by `stepgraph-build` discharge the first obligation.
    pub unsafe fn launch(&mut self, config: LaunchConfig) -> Result<()> {
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
}

impl Blas<'_> {
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
        f.debug_struct("Blas").field("mode", &self.mode).finish()
    }
}
