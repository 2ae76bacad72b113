use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod s {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    // The error lands on the op's name: its result is not `Result<()>`.
    fn clear(stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<u32> {
        stream.memset_zeros(x)?;
        Ok(3)
    }
}

fn main() {}
