use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    #[op]
    #[op]
    fn clear(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }
}

fn main() {}
