use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, aux))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        #[scratch(per_stream)]
        pub sum: DeviceBuffer<f32>,
    }

    fn fill(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, #[out] sum: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(x, sum)
    }

    #[stream(aux)]
    fn accumulate(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, sum: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(x, sum)
    }
}

fn main() {}
