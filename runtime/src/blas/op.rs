//! What an op holds of cuBLASLt: its stream's handle and workspace.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::{BlasHandle, Matmul, SmTarget};
use crate::scope::{Mode, OpCounts};

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
    /// [`CaptureStream::cuda_stream`](crate::CaptureStream::cuda_stream), whose contract applies, and do not destroy it.
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
