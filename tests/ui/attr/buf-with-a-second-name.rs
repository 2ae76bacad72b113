use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    fn clear(s: &CaptureStream<'_>, #[buf(x, y)] out: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(out)
    }
}

fn main() {}
