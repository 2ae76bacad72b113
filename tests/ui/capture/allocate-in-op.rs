use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    fn a(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        let mut tmp: DeviceBuffer<f32> = s.alloc_zeros(x.len())?;
        s.copy(x, &mut tmp)?;
        s.copy(&tmp, y)
    }
}

fn main() {}
