use stepgraph::{CaptureStream, DeviceBuffer, DeviceFlag, Result};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[per_branch]
        pub diverged: [DeviceFlag; 2],
        pub params: DeviceBuffer<f32>,
        pub backup: DeviceBuffer<f32>,
    }

    #[stream(branch[d])]
    fn check(s: &CaptureStream<'_>, d: usize, diverged: &mut DeviceFlag) -> Result<()> {
        s.set_flag(diverged, d == 0)
    }

    #[when(diverged)]
    fn restore(s: &CaptureStream<'_>, backup: &DeviceBuffer<f32>, params: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(backup, params)
    }
}

fn main() {}
