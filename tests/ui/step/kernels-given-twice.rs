use stepgraph::{CaptureStream, DeviceBuffer, Result};

pub struct A;
pub struct B;

// One kernels type per step: a struct holding both registries if it needs two.
#[stepgraph::step(streams(main), kernels = A, kernels = B)]
mod s {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    fn clear(stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        stream.memset_zeros(x)
    }
}

fn main() {}
