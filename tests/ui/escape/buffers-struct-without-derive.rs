// A struct of buffers is a step buffer only with `#[derive(StepBuffer)]`, which checks
// each of its fields.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

pub struct Linear {
    pub w: DeviceBuffer<f32>,
    pub b: DeviceBuffer<f32>,
}

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub layer: Linear,
    }

    fn forward(s: &CaptureStream<'_>, layer: &Linear, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(&layer.w, x)
    }
}

fn main() {}
