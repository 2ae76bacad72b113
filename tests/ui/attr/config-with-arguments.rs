use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    #[config = "defaults"]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub scale: f32,
    }

    fn clear(s: &CaptureStream<'_>, scale: f32, x: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = scale;
        s.memset_zeros(x)
    }
}

fn main() {}
