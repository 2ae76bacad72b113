//! Copies and memsets on a stream, and page-locked host memory: the driver's calls, each
//! returning the driver's error for the caller to name what it was doing.
//!
//! Every function here is a single driver call with cudarc's contract for it: the
//! addresses are live allocations of at least the bytes named, for as long as the work
//! (or a graph that captured it) may run.

use cudarc::driver::sys;
use cudarc::driver::{CudaStream, DriverError, result};

/// The size of a device address as a kernel parameter.
pub(crate) const DEVICE_POINTER_BYTES: usize = size_of::<sys::CUdeviceptr>();

/// Sets `bytes` bytes at `address` to `value`, on `stream`.
///
/// # Safety
/// `address` is live device memory of at least `bytes` bytes that nothing else uses
/// while the memset may run.
pub(crate) unsafe fn memset_d8(
    stream: &CudaStream,
    address: u64,
    value: u8,
    bytes: usize,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memset_d8_async(address, value, bytes, stream.cu_stream()) }
}

/// Sets `count` 32-bit words at `address` to `value`, on `stream`.
///
/// # Safety
/// `address` is live, 4-byte aligned device memory of at least `count` words that
/// nothing else uses while the memset may run.
pub(crate) unsafe fn memset_d32(
    stream: &CudaStream,
    address: u64,
    value: u32,
    count: usize,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemsetD32Async(address, value, count, stream.cu_stream()) }.result()
}

/// Copies `bytes` bytes from `src` to `dst` on the device, on `stream`.
///
/// # Safety
/// Both are live device memory of at least `bytes` bytes that do not overlap, and
/// nothing else writes them while the copy may run.
pub(crate) unsafe fn copy_dtod(
    stream: &CudaStream,
    dst: u64,
    src: u64,
    bytes: usize,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
}

/// Copies `src` from the host to `dst` on the device, on `stream`.
///
/// # Safety
/// `dst` is live device memory with room for `src`; `src` stays alive and unwritten
/// until the copy is done (pinned memory, for a copy a graph captures).
pub(crate) unsafe fn copy_htod<T>(
    stream: &CudaStream,
    dst: u64,
    src: &[T],
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }
}

/// Copies device memory at `src` into `dst` on the host, on `stream`.
///
/// # Safety
/// `src` is live device memory of at least `dst`'s bytes; `dst` stays alive and unread
/// until the copy is done (pinned memory, for a copy a graph captures).
pub(crate) unsafe fn copy_dtoh<T>(
    stream: &CudaStream,
    dst: &mut [T],
    src: u64,
) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }
}

/// Allocates `bytes` bytes of page-locked host memory, uninitialised, in the context
/// bound to this thread.
pub(crate) fn malloc_host(bytes: usize) -> Result<*mut u8, DriverError> {
    // SAFETY: a plain allocation; the caller initialises it before reading it and frees
    // it with `free_host`.
    unsafe { result::malloc_host(bytes, 0) }.map(|p| p.cast())
}

/// Frees what [`malloc_host`] returned.
///
/// # Safety
/// `ptr` came from [`malloc_host`], is freed once, and nothing (no graph node) uses it
/// after.
pub(crate) unsafe fn free_host(ptr: *mut u8) -> Result<(), DriverError> {
    // SAFETY: the caller's contract.
    unsafe { result::free_host(ptr.cast()) }
}
