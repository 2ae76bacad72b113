use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[scratch(per_stream)]
        pub tmp: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(tmp)
    }

    fn read(s: &CaptureStream<'_>, #[out] tmp: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(tmp, y)
    }
}

fn main() {}
