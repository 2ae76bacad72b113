//! A component whose sizes travel with its buffers: plain-data fields beside the step
//! buffers of a `#[derive(StepBuffer)]` struct, read by the op that takes it.
use stepgraph::{Blas, CaptureStream, DeviceBuffer, Matmul, MatmulArgs, Result, StepBuffer};

/// A linear layer: its weights and its output, with the shapes they have.
#[derive(StepBuffer)]
pub struct Linear {
    pub w: DeviceBuffer<f32>,
    pub out: DeviceBuffer<f32>,
    /// `[out, in]`: the shape of `w`.
    pub shape: [usize; 2],
    /// Rows of the batch.
    pub len: usize,
}

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub input: DeviceBuffer<f32>,
        pub layer: Linear,
    }

    fn prepare(s: &CaptureStream<'_>, input: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(input)
    }

    fn forward(b: &Blas<'_>, input: &DeviceBuffer<f32>, layer: &mut Linear) -> Result<()> {
        let [out, inner] = layer.shape;
        let fc = Matmul::new(layer.len, out, inner).with_trans_b(true);
        b.matmul(&fc, input, &layer.w, &mut layer.out, MatmulArgs::new())
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    assert_eq!(plan.ops.len(), 2);
}
