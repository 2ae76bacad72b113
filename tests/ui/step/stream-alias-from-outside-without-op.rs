use stepgraph::{CaptureStream, DeviceBuffer, Result};

pub type Stream<'a> = CaptureStream<'a>;

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    fn clear(s: &Stream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }
}

fn main() {}
