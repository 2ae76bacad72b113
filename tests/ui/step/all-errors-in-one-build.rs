use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, aux, idle))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    #[stream(auxx)]
    fn a(s: &CaptureStream<'_>, xx: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(xx)
    }

    #[stream(aux)]
    #[join(main)]
    fn b(s: &CaptureStream<'_>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(y)
    }

    #[after(c)]
    fn c(s: &CaptureStream<'_>, y: &DeviceBuffer<f32>, #[buf(y)] z: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = (s, y, z);
        Ok(())
    }
}

fn main() {}
