use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        #[scratch(per_stream)]
        pub sum: DeviceBuffer<f32>,
    }

    // `&mut` may read: an accumulation into what the last step left.
    fn accumulate(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, sum: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(x, sum)
    }
}

fn main() {}
