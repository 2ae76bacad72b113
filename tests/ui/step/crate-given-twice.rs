use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main), crate = ::stepgraph, crate = ::stepgraph)]
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
