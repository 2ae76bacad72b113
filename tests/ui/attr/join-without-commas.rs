use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, a, b))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
        pub z: DeviceBuffer<f32>,
    }

    #[stream(a)]
    fn fill_x(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    #[stream(b)]
    fn fill_y(s: &CaptureStream<'_>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(y)
    }

    #[join(a b)]
    fn fill_z(s: &CaptureStream<'_>, z: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(z)
    }
}

fn main() {}
