//! A trainer's own cudarc memory as the step's buffers: `CudaSlice`s, a struct of them,
//! per-stream scratch of them, and existing cudarc code run on the op's stream.
use std::sync::Arc;

use stepgraph::cudarc::driver::{CudaSlice, CudaStream, DriverError};
use stepgraph::{CaptureStream, Error, Result, StepBuffer};

/// A layer of the trainer, as it already was, plus the derive.
#[derive(Debug, StepBuffer)]
pub struct Linear {
    pub w: CudaSlice<f32>,
    pub b: CudaSlice<f32>,
}

/// An existing function of the trainer, unchanged.
fn zero(stream: &Arc<CudaStream>, x: &mut CudaSlice<f32>) -> std::result::Result<(), DriverError> {
    stream.memset_zeros(x)
}

#[stepgraph::step(streams(main, side))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub layer: Linear,
        pub out: CudaSlice<f32>,
        #[scratch(per_stream)]
        pub tmp: CudaSlice<f32>,
        pub side_out: CudaSlice<f32>,
    }

    fn forward(s: &CaptureStream<'_>, layer: &Linear, #[out] tmp: &mut CudaSlice<f32>, out: &mut CudaSlice<f32>) -> Result<()> {
        s.copy(&layer.w, tmp)?;
        s.copy(tmp, out)
    }

    #[stream(side)]
    fn other(s: &CaptureStream<'_>, layer: &Linear, #[out] tmp: &mut CudaSlice<f32>, side_out: &mut CudaSlice<f32>) -> Result<()> {
        s.copy(&layer.b, tmp)?;
        // SAFETY: `zero` issues one memset of `side_out` on the stream it is given.
        if let Some(stream) = unsafe { s.cuda_stream() } {
            zero(stream, side_out).map_err(Error::driver("zero"))?;
        }
        Ok(())
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    plan.audit().unwrap();
    // Each stream has its own copy of `tmp`: the two ops are independent.
    assert_eq!(plan.ops[1].waits.len(), 1); // the fork from capture begin, nothing else
    assert!(plan.events[plan.ops[1].waits[0].index()].after.is_none());
}
