use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    fn a(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>) -> Result<()> {
        let host: Vec<f32> = s.download(x)?;
        let _ = host;
        Ok(())
    }
}

fn main() {}
