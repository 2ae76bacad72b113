use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[scratch(per_stream)]
        pub tmp: DeviceBuffer<f32>,
        pub out: DeviceBuffer<f32>,
    }

    fn a(s: &CaptureStream<'_>, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(tmp, out)
    }
}

fn main() {}
