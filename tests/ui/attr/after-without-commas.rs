use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
        pub z: DeviceBuffer<f32>,
    }

    fn fill_x(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    fn fill_y(s: &CaptureStream<'_>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(y)
    }

    #[after(fill_x fill_y)]
    fn fill_z(s: &CaptureStream<'_>, z: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(z)
    }
}

fn main() {}
