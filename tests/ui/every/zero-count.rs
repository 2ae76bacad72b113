use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub online: DeviceBuffer<f32>,
        pub target: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub target_sync: u32,
    }

    fn train(s: &CaptureStream<'_>, online: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(online)
    }

    #[every(0)]
    fn sync(s: &CaptureStream<'_>, online: &DeviceBuffer<f32>, target: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(online, target)
    }
}

fn main() {}
