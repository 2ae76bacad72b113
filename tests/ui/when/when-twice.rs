use stepgraph::{CaptureStream, DeviceBuffer, DeviceFlag, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub loss: DeviceBuffer<f32>,
        pub diverged: DeviceFlag,
        pub params: DeviceBuffer<f32>,
        pub backup: DeviceBuffer<f32>,
    }

    fn check(s: &CaptureStream<'_>, loss: &DeviceBuffer<f32>, diverged: &mut DeviceFlag) -> Result<()> {
        s.set_flag(diverged, loss.is_empty())
    }

    #[when(diverged)]
    #[when(diverged)]
    fn restore(s: &CaptureStream<'_>, backup: &DeviceBuffer<f32>, params: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(backup, params)
    }
}

fn main() {}
