//! The device handle and device buffers.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaContext, CudaStream, DeviceRepr, ValidAsZeroBits};

use crate::driver::memory::{DeviceBuffer, DeviceMem, DeviceMemMut};
use crate::error::{Error, Result};

/// The oldest compute capability stepgraph runs on: 8.0 (Ampere). Its kernels ship as
/// compute_80 PTX, which the driver JIT-compiles for any newer GPU, and a crate's own
/// kernels are built for sm_80 to sm_90 by default (`stepgraph-build`).
pub const REQUIRED_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// A CUDA device with its primary context.
///
/// Creating one checks that the driver and cuBLASLt libraries can be loaded (cudarc
/// panics on a missing library; this turns that into [`Error::LibraryMissing`]) and that
/// the GPU is at least compute capability 8.0 ([`REQUIRED_COMPUTE_CAPABILITY`]).
///
/// It also turns off cudarc's automatic event tracking for the context. That tracking
/// makes a stream wait on events recorded by earlier, uncaptured work whenever a buffer is
/// used; inside a stream capture such a wait refers to work outside the graph and breaks
/// the capture. stepgraph orders all work itself, by the plan.
///
/// ```no_run
/// let device = stepgraph::Device::new(0)?;
/// println!("{}", device.name());
/// # Ok::<(), stepgraph::Error>(())
/// ```
#[derive(Clone)]
pub struct Device {
    ctx: Arc<CudaContext>,
    /// A stream for host transfers and setup work outside any capture.
    host_stream: Arc<CudaStream>,
    name: Arc<str>,
    compute_capability: (i32, i32),
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ctx.ordinal())
            .field("name", &self.name)
            .field("compute_capability", &self.compute_capability)
            .finish()
    }
}

/// Checks that a compute capability can run stepgraph: 8.0 or newer.
pub fn check_compute_capability(
    ordinal: usize,
    name: &str,
    (major, minor): (i32, i32),
) -> Result<()> {
    if (major, minor) < REQUIRED_COMPUTE_CAPABILITY {
        return Err(Error::UnsupportedDevice {
            ordinal,
            name: name.to_string(),
            major,
            minor,
        });
    }
    Ok(())
}

/// Fails with [`Error::LibraryMissing`] unless a shared library named `library` (short
/// name, as cudarc looks it up: `cuda`, `cublasLt`) can be loaded under one of the file
/// names cudarc would try. cudarc panics when it cannot load a library; checking first
/// turns that into an error naming what was looked for.
pub fn require_library(library: &'static str) -> Result<()> {
    let candidates = cudarc::get_lib_name_candidates(library);
    for name in &candidates {
        // SAFETY: loading a CUDA library runs only its initialisers, which have no
        // preconditions; the handle is dropped (the library stays loaded for cudarc).
        if unsafe { libloading::Library::new(name) }.is_ok() {
            return Ok(());
        }
    }
    Err(Error::LibraryMissing {
        library,
        candidates: candidates.join(", "),
        hint: "install the CUDA 13 driver/toolkit or add its lib folder to LD_LIBRARY_PATH",
    })
}

/// Fails with [`Error::LibraryMissing`] unless the CUDA driver and cuBLASLt libraries
/// can be loaded.
pub fn check_libraries() -> Result<()> {
    require_library("cuda")?;
    require_library("cublasLt")
}

impl Device {
    /// How many GPUs the driver sees (after checking the driver library is there).
    pub fn count() -> Result<usize> {
        require_library("cuda")?;
        let n = CudaContext::device_count().map_err(Error::driver("cuDeviceGetCount"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// Opens GPU `ordinal` after checking the libraries and the compute capability.
    pub fn new(ordinal: usize) -> Result<Device> {
        crate::scope::check("Device::new")?;
        check_libraries()?;
        let count = CudaContext::device_count().map_err(Error::driver("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(Error::driver("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: stepgraph orders every use of its buffers through the plan's events and
        // synchronises the host stream around transfers, which is what the untracked mode
        // requires. The primary context is shared with any other `CudaContext::new` of the
        // process (cudarc retains it), but the tracking flag is this value's own.
        unsafe { ctx.disable_event_tracking() };
        Self::open(ctx)
    }

    /// A device over an existing cudarc context: a trainer's own `CudaContext` (and so its
    /// buffers, streams and kernels) enters a step this way. The checks of
    /// [`Device::new`] apply.
    ///
    /// The context's automatic event tracking must be off
    /// ([`CudaContext::disable_event_tracking`]), or this fails saying so. With it on,
    /// cudarc makes a stream wait on events recorded by earlier, uncaptured work whenever
    /// a buffer is used; inside a capture such a wait refers to work outside the graph
    /// and breaks the capture. Turning it off is `unsafe` in cudarc, and its contract
    /// becomes the program's: every use of a `CudaSlice` on more than one stream is
    /// ordered by hand. stepgraph orders everything it issues through the plan, and
    /// synchronises its host stream around transfers; the rest of the program must do
    /// the same for its own streams. A program that captures graphs of its own with
    /// several streams has tracking off already, for the same reason.
    ///
    /// ```no_run
    /// use stepgraph::cudarc::driver::CudaContext;
    ///
    /// let ctx = CudaContext::new(0)?;
    /// // SAFETY: this program orders its streams itself: it captures graphs, and uses each
    /// // buffer on one stream at a time.
    /// unsafe { ctx.disable_event_tracking() };
    /// let device = stepgraph::Device::from_context(ctx.clone())?;
    /// assert!(std::sync::Arc::ptr_eq(device.context(), &ctx));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Device> {
        crate::scope::check("Device::from_context")?;
        check_libraries()?;
        if ctx.is_event_tracking() {
            return Err(Error::Interop {
                what: format!("Device::from_context: the context of GPU {}", ctx.ordinal()),
                problem: "it tracks events; expected it off (`unsafe { \
                          ctx.disable_event_tracking() }`, whose contract is that the program \
                          orders its streams itself): cudarc's event waits refer to work \
                          outside a capture and break it"
                    .into(),
            });
        }
        Self::open(ctx)
    }

    /// The checks and the host stream, for a context whose event tracking is off.
    fn open(ctx: Arc<CudaContext>) -> Result<Device> {
        let name = ctx.name().map_err(Error::driver("cuDeviceGetName"))?;
        let cc = ctx
            .compute_capability()
            .map_err(Error::driver("cuDeviceGetAttribute"))?;
        check_compute_capability(ctx.ordinal(), &name, cc)?;
        let host_stream = ctx.new_stream().map_err(Error::driver("cuStreamCreate"))?;
        Ok(Device {
            ctx,
            host_stream,
            name: name.into(),
            compute_capability: cc,
        })
    }

    /// The cudarc context: the way down for code that allocates, loads modules or
    /// creates streams with cudarc itself. Work issued through it is outside every
    /// step's plan, and outside the checks that refuse host-side calls inside an op: do
    /// it before or after a step's replay, ordered with the step by the program (see
    /// [`Step::wait`](crate::Step::wait)).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The compute capability, `(major, minor)`: `(9, 0)` on Hopper, `(8, 0)` on an A100.
    /// Which generation-specific kernel to launch is better read off the image the driver
    /// loaded ([`Module::image`](crate::Module::image)), which also honours the
    /// [portable mode](crate::env::PORTABLE).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .map_err(Error::driver("cuMemGetInfo"))
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> Result<i32> {
        self.ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(Error::driver("cuDeviceGetAttribute"))
    }

    /// Turns an allocation failure into [`Error::OutOfMemory`] naming what was allocated.
    pub(crate) fn alloc_error(
        &self,
        what: &str,
        bytes: usize,
    ) -> impl FnOnce(cudarc::driver::DriverError) -> Error + '_ {
        let what = what.to_string();
        move |e| {
            if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                let (free, total) = self.ctx.mem_get_info().unwrap_or((0, 0));
                Error::OutOfMemory {
                    what,
                    bytes,
                    free,
                    total,
                }
            } else {
                Error::Driver {
                    call: "cuMemAlloc",
                    source: e,
                }
            }
        }
    }

    /// Allocates `len` zeroed elements. `what` names the buffer in an out-of-memory error.
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        what: &str,
        len: usize,
    ) -> Result<DeviceBuffer<T>> {
        crate::scope::check("Device::alloc_zeros")?;
        let bytes = byte_len::<T>(what, len)?;
        let slice = self
            .host_stream
            .alloc_zeros::<T>(len)
            .map_err(self.alloc_error(what, bytes))?;
        self.host_stream
            .synchronize()
            .map_err(Error::driver("cuStreamSynchronize"))?;
        Ok(DeviceBuffer::wrap(slice))
    }

    /// Allocates a buffer holding a copy of `data`.
    pub fn upload_new<T: DeviceRepr>(&self, what: &str, data: &[T]) -> Result<DeviceBuffer<T>> {
        crate::scope::check("Device::upload_new")?;
        let bytes = std::mem::size_of_val(data);
        let slice = self
            .host_stream
            .clone_htod(data)
            .map_err(self.alloc_error(what, bytes))?;
        self.host_stream
            .synchronize()
            .map_err(Error::driver("cuStreamSynchronize"))?;
        Ok(DeviceBuffer::wrap(slice))
    }

    /// Copies `data` into `buf` (a buffer, a view, a `CudaSlice`), which must have the
    /// same length. Blocks until done.
    pub fn upload<T: DeviceRepr>(&self, buf: &mut impl DeviceMemMut<T>, data: &[T]) -> Result<()> {
        self.write_in_place(buf, data)
    }

    /// Copies `data` into `buf` in place (its address is unchanged, so a graph that
    /// captured it stays valid). Takes `&`: device memory is not Rust memory, and the
    /// caller (a step's `upload`) has made sure no replay is using it.
    pub(crate) fn write_in_place<T: DeviceRepr>(
        &self,
        buf: &impl DeviceMem<T>,
        data: &[T],
    ) -> Result<()> {
        crate::scope::check("Device::upload")?;
        if buf.len() != data.len() {
            return Err(Error::LengthMismatch {
                what: "upload into device memory".into(),
                expected: buf.len(),
                found: data.len(),
            });
        }
        self.bind()?;
        // SAFETY: `buf` holds `data.len()` elements (checked); the copy is synchronised
        // before `data` is released.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                buf.device_address(),
                data,
                self.host_stream.cu_stream(),
            )
        }
        .map_err(Error::driver("cuMemcpyHtoDAsync"))?;
        self.sync_host_stream()
    }

    /// Copies `buf` (a buffer, a view, a `CudaSlice`) to the host. Blocks until done (and
    /// so until earlier work on the device that the caller has synchronised with has
    /// finished).
    pub fn download<T: DeviceRepr + Clone + Default>(
        &self,
        buf: &impl DeviceMem<T>,
    ) -> Result<Vec<T>> {
        crate::scope::check("Device::download")?;
        let mut out = vec![T::default(); buf.len()];
        self.bind()?;
        // SAFETY: `out` has room for `buf.len()` elements, and the copy is synchronised
        // before `out` is returned.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut out,
                buf.device_address(),
                self.host_stream.cu_stream(),
            )
        }
        .map_err(Error::driver("cuMemcpyDtoHAsync"))?;
        self.sync_host_stream()?;
        Ok(out)
    }

    /// Copies every buffer of `bufs` to the host, in order: the copies are queued one
    /// after another and waited for once, instead of once each as [`Device::download`]
    /// per buffer would. Blocks until done.
    pub fn download_many<T: DeviceRepr + Clone + Default, M: DeviceMem<T> + ?Sized>(
        &self,
        bufs: &[&M],
    ) -> Result<Vec<Vec<T>>> {
        crate::scope::check("Device::download_many")?;
        self.bind()?;
        let mut outs: Vec<Vec<T>> = bufs.iter().map(|b| vec![T::default(); b.len()]).collect();
        let mut queued = Ok(());
        for (out, buf) in outs.iter_mut().zip(bufs) {
            // SAFETY: `out` has room for `buf.len()` elements, and every queued copy is
            // synchronised below, before `outs` is returned or dropped.
            queued = unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    out,
                    buf.device_address(),
                    self.host_stream.cu_stream(),
                )
            }
            .map_err(Error::driver("cuMemcpyDtoHAsync"));
            if queued.is_err() {
                break;
            }
        }
        // Even after a failed copy: the ones queued before it write into `outs`.
        let synced = self.sync_host_stream();
        queued?;
        synced?;
        Ok(outs)
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))
    }

    fn sync_host_stream(&self) -> Result<()> {
        self.host_stream
            .synchronize()
            .map_err(Error::driver("cuStreamSynchronize"))
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        crate::scope::check("Device::synchronize")?;
        self.ctx
            .synchronize()
            .map_err(Error::driver("cuCtxSynchronize"))
    }
}

/// Allocation of a fresh copy with the same shape, used for per-stream and per-branch
/// scratch: the user supplies one copy, stepgraph allocates the others when the step is
/// built. Implement it for a component (a struct of buffers) to use it as scratch.
pub trait AllocLike: Sized {
    /// A new, uninitialised-in-meaning (zeroed) value shaped like `self`.
    fn alloc_like(&self, device: &Device, what: &str) -> Result<Self>;
}

impl<T: DeviceRepr + ValidAsZeroBits> AllocLike for DeviceBuffer<T> {
    fn alloc_like(&self, device: &Device, what: &str) -> Result<Self> {
        device.alloc_zeros(what, self.len())
    }
}

/// A trainer's own `CudaSlice` as per-stream or per-branch scratch: the copies are made in
/// the device's context (whose event tracking is off), like the step's other buffers.
impl<T: DeviceRepr + ValidAsZeroBits> AllocLike for cudarc::driver::CudaSlice<T> {
    fn alloc_like(&self, device: &Device, what: &str) -> Result<Self> {
        Ok(device.alloc_zeros(what, self.len())?.into_cuda_slice())
    }
}

impl<T: AllocLike, const N: usize> AllocLike for [T; N] {
    fn alloc_like(&self, device: &Device, what: &str) -> Result<Self> {
        let v: Vec<T> = self
            .iter()
            .map(|x| x.alloc_like(device, what))
            .collect::<Result<_>>()?;
        match v.try_into() {
            Ok(a) => Ok(a),
            Err(_) => Err(Error::Internal {
                what: format!("{what}: an array's copy has another length than the array"),
            }),
        }
    }
}

/// The size in bytes of `len` elements of `T`, checked before it reaches the driver (and
/// cudarc, which multiplies without a check).
fn byte_len<T>(what: &str, len: usize) -> Result<usize> {
    let size = std::mem::size_of::<T>();
    len.checked_mul(size).ok_or_else(|| Error::TooLarge {
        what: format!("allocating {what}: elements of {size} bytes"),
        found: len as u64,
        max: (usize::MAX / size.max(1)) as u64,
        why: "beyond it the size in bytes overflows",
    })
}

/// The stream priorities of the context bound to this thread: (least, greatest), where
/// greatest is numerically the smallest.
pub(crate) fn stream_priority_range() -> Result<(i32, i32)> {
    cudarc::driver::result::stream::get_priority_range()
        .map_err(Error::driver("cuCtxGetStreamPriorityRange"))
}

// Here rather than with the buffer, so that memory needs nothing of the device: a
// buffer taken from cudarc is checked against the device's context.
impl<T> DeviceBuffer<T> {
    /// Takes a cudarc allocation made in `device`'s context: a trainer's existing
    /// buffers enter a step this way.
    ///
    /// Fails if the slice belongs to another context, or if the `CudaContext` value it was
    /// made with tracks events (each value has its own flag: make the slices with the
    /// context given to [`Device::from_context`], whose tracking is off). stepgraph orders
    /// every use of the buffer through the plan.
    ///
    /// ```no_run
    /// use stepgraph::{Device, DeviceBuffer};
    ///
    /// let ctx = stepgraph::cudarc::driver::CudaContext::new(0)?;
    /// // SAFETY: this program orders its streams itself (it captures graphs).
    /// unsafe { ctx.disable_event_tracking() };
    /// let stream = ctx.default_stream();
    /// let weights = stream.clone_htod(&[0.5f32; 1024])?;
    ///
    /// let device = Device::from_context(ctx)?;
    /// let weights = DeviceBuffer::from_cuda_slice(&device, weights)?;
    /// assert_eq!(weights.len(), 1024);
    /// let back: stepgraph::cudarc::driver::CudaSlice<f32> = weights.into_cuda_slice();
    /// assert_eq!(back.len(), 1024);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_cuda_slice(
        device: &Device,
        slice: cudarc::driver::CudaSlice<T>,
    ) -> Result<DeviceBuffer<T>> {
        let ours = device.context().cu_ctx();
        let theirs = slice.context().cu_ctx();
        if ours != theirs {
            return Err(Error::Interop {
                what: format!(
                    "DeviceBuffer::from_cuda_slice: a CudaSlice of {} elements",
                    slice.len()
                ),
                problem: format!(
                    "it belongs to another CUDA context than device {} ({}): expected a slice \
                     allocated in the device's context",
                    device.ordinal(),
                    device.name()
                ),
            });
        }
        // Each `CudaContext` value has its own flag, and a slice follows its own's.
        if slice.context().is_event_tracking() {
            return Err(Error::Interop {
                what: format!(
                    "DeviceBuffer::from_cuda_slice: a CudaSlice of {} elements",
                    slice.len()
                ),
                problem: "it comes from a CudaContext that tracks events: expected one with \
                          tracking off, such as the one given to Device::from_context (its \
                          events would break the capture)"
                    .into(),
            });
        }
        Ok(DeviceBuffer::wrap(slice))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_whose_size_overflows_names_the_buffer_and_sizes() {
        assert_eq!(byte_len::<f32>("x", 10).unwrap(), 40);
        assert_eq!(byte_len::<()>("unit", usize::MAX).unwrap(), 0);
        let e = byte_len::<f32>("scratch `tmp`", usize::MAX / 2).unwrap_err();
        assert!(
            matches!(&e, Error::TooLarge { found, max, .. }
                if *found == (usize::MAX / 2) as u64 && *max == (usize::MAX / 4) as u64),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "allocating scratch `tmp`: elements of 4 bytes: expected at most {}, found {} \
                 (beyond it the size in bytes overflows)",
                usize::MAX / 4,
                usize::MAX / 2
            )
        );
    }

    #[test]
    fn compute_capability_below_sm80_is_refused_with_the_found_version() {
        let err = check_compute_capability(0, "Tesla V100", (7, 0)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("7.0"), "{msg}");
        assert!(msg.contains("Tesla V100"), "{msg}");
        assert!(msg.contains("8.0"), "{msg}");
        assert!(check_compute_capability(0, "T4", (7, 5)).is_err());
        for (name, cc) in [
            ("A100", (8, 0)),
            ("A10", (8, 6)),
            ("L4", (8, 9)),
            ("H200", (9, 0)),
        ] {
            assert!(check_compute_capability(0, name, cc).is_ok(), "{name}");
        }
    }

    #[test]
    fn a_missing_library_is_an_error_naming_the_files_tried() {
        let err = require_library("stepgraph_no_such_library").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(
            err,
            Error::LibraryMissing {
                library: "stepgraph_no_such_library",
                ..
            }
        ));
        assert!(msg.contains("libstepgraph_no_such_library.so"), "{msg}");
        assert!(msg.contains("LD_LIBRARY_PATH"), "{msg}");
    }

    #[test]
    fn compute_capability_sm90_and_newer_is_accepted() {
        assert!(check_compute_capability(0, "H100", (9, 0)).is_ok());
        assert!(check_compute_capability(0, "B200", (10, 0)).is_ok());
    }
}
