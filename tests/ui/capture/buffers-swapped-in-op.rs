use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub front: DeviceBuffer<f32>,
        pub back: DeviceBuffer<f32>,
    }

    fn flip(s: &CaptureStream<'_>, front: &mut DeviceBuffer<f32>, back: &mut DeviceBuffer<f32>) -> Result<()> {
        std::mem::swap(front, back);
        s.memset_zeros(front)
    }
}

fn main() {}
