use stepgraph::{CaptureStream, DeviceBuffer, DeviceFlag, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub params: DeviceBuffer<f32>,
        pub diverged: DeviceFlag,
        #[scratch(per_stream)]
        pub snapshot: DeviceBuffer<f32>,
        pub log: DeviceBuffer<f32>,
    }

    fn check(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>, diverged: &mut DeviceFlag) -> Result<()> {
        s.set_flag(diverged, params.is_empty())
    }

    #[when(diverged)]
    fn snapshot(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>, #[out] snapshot: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(params, snapshot)
    }

    fn recheck(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>, diverged: &mut DeviceFlag) -> Result<()> {
        s.set_flag(diverged, params.is_empty())
    }

    #[when(diverged)]
    fn log(s: &CaptureStream<'_>, snapshot: &DeviceBuffer<f32>, log: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(snapshot, log)
    }
}

fn main() {}
