use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod s {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    // The capture stream is shared by the op's calls: `&`, not `&mut`.
    fn clear(stream: &mut CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        stream.memset_zeros(x)
    }
}

fn main() {}
