//! Ops may name their lifetimes: the step calls them like any other.
use stepgraph::{Blas, CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    fn clear<'a>(s: &CaptureStream<'a>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    fn copy<'s, 'b: 's>(s: &'s CaptureStream<'b>, blas: &Blas<'s>, x: &'s DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = blas;
        s.copy(x, y)
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    assert_eq!(plan.ops.len(), 2);
}
