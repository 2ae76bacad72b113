//! The capture stream an op receives, kernels and modules.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};

use crate::blas::BlasHandle;
use crate::device::{Device, DeviceBuffer};
use crate::error::{Error, Result};
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
    /// [`Launch::launch`].
    pub fn launch<'b>(&'b self, kernel: &'b Kernel) -> Launch<'b> {
        Launch {
            args: self.stream.launch_builder(&kernel.func),
            mode: self.mode,
            kernel: kernel.name,
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

/// A kernel launch being assembled. Arguments are pushed in the kernel's parameter order.
pub struct Launch<'b> {
    args: LaunchArgs<'b>,
    mode: Mode,
    kernel: &'static str,
    counts: &'b Cell<OpCounts>,
}

impl fmt::Debug for Launch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("kernel", &self.kernel)
            .finish()
    }
}

impl<'b> Launch<'b> {
    /// Passes a buffer the kernel only reads, as a `const T*`.
    pub fn buf<T>(&mut self, buf: &'b DeviceBuffer<T>) -> &mut Self {
        self.args.arg(&buf.slice);
        self
    }

    /// Passes a buffer the kernel writes, as a `T*`.
    pub fn buf_mut<T>(&mut self, buf: &'b mut DeviceBuffer<T>) -> &mut Self {
        self.args.arg(&mut buf.slice);
        self
    }

    /// Passes a value by copy.
    pub fn arg<T: DeviceRepr>(&mut self, value: &'b T) -> &mut Self {
        self.args.arg(value);
        self
    }

    /// Enqueues the launch (nothing happens in a dry pass).
    ///
    /// # Safety
    /// The arguments pushed must match the kernel's parameter list in number, order and
    /// type, and the grid must only index inside the buffers passed. Typed wrappers in a
    /// kernel registry discharge this once per kernel.
    pub unsafe fn launch(&mut self, config: LaunchConfig) -> Result<()> {
        let mut c = self.counts.get();
        c.launches += 1;
        self.counts.set(c);
        if !self.mode.enqueues() {
            return Ok(());
        }
        // SAFETY: the caller upholds the kernel's argument contract (see above).
        unsafe { self.args.launch(config) }
            .map(|_| ())
            .map_err(Error::driver("cuLaunchKernel"))
    }
}

/// A loaded module (a cubin embedded in the binary).
#[derive(Clone)]
pub struct Module {
    name: &'static str,
    inner: Arc<CudaModule>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module").field("name", &self.name).finish()
    }
}

impl Module {
    /// Loads a cubin (or PTX text, NUL-terminated) image.
    pub fn load(device: &Device, name: &'static str, image: &[u8]) -> Result<Module> {
        let inner = device
            .context()
            .load_module(cudarc::nvrtc::Ptx::from_binary(image.to_vec()))
            .map_err(Error::driver("cuModuleLoadData"))?;
        Ok(Module { name, inner })
    }

    /// Looks up a kernel by its (`extern "C"`) name.
    pub fn kernel(&self, name: &'static str) -> Result<Kernel> {
        check_kernel_name(self.name, name)?;
        let func = self
            .inner
            .load_function(name)
            .map_err(|source| Error::KernelMissing {
                module: self.name,
                kernel: name,
                source,
            })?;
        Ok(Kernel { name, func })
    }
}

/// The driver takes the name as a C string: cudarc makes one with
/// `CString::new(..).unwrap()`, which panics on a NUL byte inside the name.
fn check_kernel_name(module: &str, name: &str) -> Result<()> {
    match name.find('\0') {
        Some(at) => Err(Error::Invalid(format!(
            "kernel name {name:?} in module `{module}`: expected a name without NUL bytes \
             (the driver takes a C string), found one at byte {at}"
        ))),
        None => Ok(()),
    }
}

/// A kernel function of a loaded module. It keeps its module loaded, so a graph that
/// captured a launch of it stays valid while the kernel is alive.
#[derive(Clone)]
pub struct Kernel {
    name: &'static str,
    func: CudaFunction,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel").field("name", &self.name).finish()
    }
}

impl Kernel {
    /// The kernel's name.
    pub fn name(&self) -> &'static str {
        self.name
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_name_with_a_nul_byte_is_refused_before_the_driver() {
        check_kernel_name("dqn", "adam_update").unwrap();
        let e = check_kernel_name("dqn", "adam\0update").unwrap_err();
        assert!(matches!(e, Error::Invalid(_)));
        assert_eq!(
            e.to_string(),
            "kernel name \"adam\\0update\" in module `dqn`: expected a name without NUL \
             bytes (the driver takes a C string), found one at byte 4"
        );
    }
}
