use stepgraph::{CaptureStream, DeviceBuffer, DeviceFlag, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub a: DeviceFlag,
        pub b: DeviceFlag,
    }

    fn check(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, a: &mut DeviceFlag, b: &mut DeviceFlag) -> Result<()> {
        s.set_flag(a, x.is_empty())?;
        s.set_flag(b, x.is_empty())
    }

    #[when(a, b)]
    fn clear(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }
}

fn main() {}
