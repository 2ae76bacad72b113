use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub scale: f32,
    }

    fn fill(s: &CaptureStream<'_>, #[out] scale: f32, x: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = scale;
        s.memset_zeros(x)
    }
}

fn main() {}
