use stepgraph::{CaptureStream, DeviceBuffer, Result};

pub struct Settings {
    pub scale: f32,
}

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    fn clear(s: &CaptureStream<'_>, settings: &Settings, x: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = settings;
        s.memset_zeros(x)
    }
}

fn main() {}
