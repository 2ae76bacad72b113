use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod s {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    async fn clear(stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        stream.memset_zeros(x)
    }
}

fn main() {}
