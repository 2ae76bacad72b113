use stepgraph::{CaptureStream, DeviceBuffer, DeviceScalars, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub lr: DeviceScalars<f32>,
        pub x: DeviceBuffer<f32>,
    }

    fn scale(s: &CaptureStream<'_>, lr: &DeviceScalars<f32>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        if lr.get(0)? > 0.0 {
            s.memset_zeros(x)?;
        }
        Ok(())
    }
}

fn main() {}
