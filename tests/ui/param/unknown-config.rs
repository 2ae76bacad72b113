use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    #[config]
    pub struct Config {
        pub batch: usize,
    }

    fn a(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>, bach: usize) -> Result<()> {
        let _ = bach;
        s.memset_zeros(x)
    }
}

fn main() {}
