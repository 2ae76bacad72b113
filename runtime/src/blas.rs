//! cuBLASLt: one handle and one workspace per stream.

use std::fmt;
use std::sync::Arc;

use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{CudaSlice, CudaStream};

use crate::device::Device;
use crate::error::{Error, Result};

/// cuBLASLt's recommended workspace on Hopper.
pub const WORKSPACE_BYTES: usize = 32 * 1024 * 1024;

/// A cuBLASLt handle with the workspace of one stream. Two streams never share a
/// workspace: matmuls running at once on two streams would overwrite each other's.
pub struct BlasHandle {
    handle: lt_sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    device: Device,
}

impl fmt::Debug for BlasHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlasHandle")
            .field("workspace_bytes", &self.workspace.len())
            .finish()
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created in `new` and is destroyed once. A failure is
        // ignored rather than panicking in Drop; the handle is gone either way.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

impl BlasHandle {
    /// Creates the handle and allocates its workspace (`what` names it in an
    /// out-of-memory error).
    pub(crate) fn new(device: &Device, stream: &Arc<CudaStream>, what: &str) -> Result<Self> {
        // SAFETY: uninitialised bytes are fine for a scratch workspace cuBLASLt writes
        // before it reads.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(device.alloc_error(what, WORKSPACE_BYTES))?;
        let handle = lt::create_handle().map_err(Error::blas("cublasLtCreate"))?;
        Ok(BlasHandle {
            handle,
            workspace,
            device: device.clone(),
        })
    }

    /// The workspace size in bytes.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.len()
    }

    #[allow(dead_code)]
    pub(crate) fn device(&self) -> &Device {
        &self.device
    }
}
