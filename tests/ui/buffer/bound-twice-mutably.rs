use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    fn a(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>, #[buf(x)] also_x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)?;
        s.memset_zeros(also_x)
    }
}

fn main() {}
