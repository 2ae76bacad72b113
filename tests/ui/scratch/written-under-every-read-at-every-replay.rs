use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub params: DeviceBuffer<f32>,
        #[scratch(per_stream)]
        pub summary: DeviceBuffer<f32>,
        pub log: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub log_every: u32,
    }

    #[every(log_every)]
    fn summarise(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>, #[out] summary: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(params, summary)
    }

    fn log(s: &CaptureStream<'_>, summary: &DeviceBuffer<f32>, log: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(summary, log)
    }
}

fn main() {}
