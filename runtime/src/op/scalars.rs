//! Device scalars: values that change every step, read by kernels from device memory.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DeviceRepr, ValidAsZeroBits};

use crate::driver::device::Device;
use crate::driver::memory::DeviceBuffer;
use crate::error::{Error, Result};

/// Proof that no replay of a step is in flight, so host memory that its graph reads may
/// be written. Obtained from the generated `Step::host_access`, which waits for the last
/// replay; while it is alive the step cannot be replayed (it borrows the step).
#[derive(Debug)]
pub struct HostAccess<'s> {
    pub(crate) _step: std::marker::PhantomData<&'s ()>,
}

/// A few values (Adam's step count and bias corrections, a learning rate, an exploration
/// schedule) that kernels read from device memory and that change between replays.
///
/// The host values live in pinned memory; an op calls
/// [`CaptureStream::refresh`](crate::CaptureStream::refresh) to capture a copy from there to
/// the device copy, so every replay sees the values set before it, with no re-capture.
///
/// ```no_run
/// # use stepgraph::{Device, DeviceScalars};
/// let device = Device::new(0)?;
/// let lr = DeviceScalars::new(&device, "adam", &[1e-3f32, 0.9, 0.999])?;
/// assert_eq!(lr.len(), 3);
/// # Ok::<(), stepgraph::Error>(())
/// ```
pub struct DeviceScalars<T> {
    host: *mut T,
    len: usize,
    device: DeviceBuffer<T>,
    ctx: Arc<CudaContext>,
}

// SAFETY: the pinned allocation is owned by this value and only written through
// `set`, which takes `&mut self` or a `HostAccess` proof; the pointer is not shared.
unsafe impl<T: Send> Send for DeviceScalars<T> {}

impl<T> fmt::Debug for DeviceScalars<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceScalars")
            .field("len", &self.len)
            .finish()
    }
}

impl<T> Drop for DeviceScalars<T> {
    fn drop(&mut self) {
        // SAFETY: `host` came from `malloc_host` in `new` and is freed once.
        self.ctx
            .record_err(unsafe { crate::driver::transfer::free_host(self.host.cast()) });
    }
}

impl<T> DeviceScalars<T> {
    /// The device copy, whatever the element type.
    pub(crate) fn device_copy(&self) -> &DeviceBuffer<T> {
        &self.device
    }
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> DeviceScalars<T> {
    /// Allocates the pinned host values and their device copy, both set to `init`.
    pub fn new(device: &Device, what: &str, init: &[T]) -> Result<Self> {
        crate::scope::check("DeviceScalars::new")?;
        let bytes = std::mem::size_of_val(init);
        let ctx = device.context().clone();
        ctx.bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        // SAFETY: plain page-locked allocation of `bytes` bytes (at least one, so the
        // pointer is never dangling); initialised right below before any read.
        let host = crate::driver::transfer::malloc_host(bytes.max(1))
            .map_err(device.alloc_error(what, bytes))?
            .cast::<T>();
        // SAFETY: `host` has room for `init.len()` elements of T and is suitably aligned
        // (page-locked allocations are page aligned).
        unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), host, init.len()) };
        let scalars = DeviceScalars {
            host,
            len: init.len(),
            device: device.upload_new(what, init)?,
            ctx,
        };
        Ok(scalars)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device copy, for kernels to read.
    pub fn on_device(&self) -> &DeviceBuffer<T> {
        &self.device
    }

    /// The host value at `index`, read on the host.
    ///
    /// Fails with [`Error::HostCallInOp`] while an op is being issued: read there, the
    /// value would be frozen into the graph at its capture-time value, while every
    /// replay's kernels read the device copy that [`CaptureStream::refresh`] updates.
    /// Kernels read [`on_device`](Self::on_device) instead.
    ///
    /// [`CaptureStream::refresh`]: crate::CaptureStream::refresh
    pub fn get(&self, index: usize) -> Result<T> {
        crate::scope::check("DeviceScalars::get")?;
        self.check(index)?;
        // SAFETY: in bounds (checked); the memory is initialised.
        Ok(unsafe { self.host.add(index).read() })
    }

    /// Sets the host value at `index`; the next replay's refresh copies it to the device.
    /// The proof says no replay is reading the host values now.
    pub fn set(&self, _no_replay_in_flight: &HostAccess<'_>, index: usize, value: T) -> Result<()> {
        crate::scope::check("DeviceScalars::set")?;
        self.check(index)?;
        // SAFETY: in bounds; `HostAccess` guarantees no copy of these values is in flight,
        // and this value is not shared between threads (it is not Sync).
        unsafe { self.host.add(index).write(value) };
        Ok(())
    }

    fn check(&self, index: usize) -> Result<()> {
        if index >= self.len {
            return Err(Error::OutOfBounds {
                what: format!("device scalar index {index}"),
                start: index,
                end: index.saturating_add(1),
                len: self.len,
            });
        }
        Ok(())
    }

    pub(crate) fn enqueue_refresh(&mut self, stream: &CudaStream) -> Result<()> {
        let dst = self.device.device_address();
        // SAFETY: `host` holds `len` initialised values in pinned memory that outlives
        // this value's graph (the step owns both); the slice is only read by the copy.
        let src = unsafe { std::slice::from_raw_parts(self.host, self.len) };
        // SAFETY: dst has `len` elements; pinned source, so the captured node reads the
        // host memory at replay time.
        unsafe { crate::driver::transfer::copy_htod(stream, dst, src) }
            .map_err(Error::driver("cuMemcpyHtoDAsync"))
    }
}
