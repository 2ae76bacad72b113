//! Scratch written under a condition is read under the same one: the two ops run at the
//! same replays, so the reader always finds what the writer wrote that replay.
use stepgraph::{CaptureStream, DeviceBuffer, DeviceFlag, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub params: DeviceBuffer<f32>,
        pub loss: DeviceBuffer<f32>,
        pub diverged: DeviceFlag,
        #[scratch(per_stream)]
        pub summary: DeviceBuffer<f32>,
        pub log: DeviceBuffer<f32>,
        #[scratch(per_stream)]
        pub snapshot: DeviceBuffer<f32>,
        pub report: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub log_every: u32,
    }

    fn check(s: &CaptureStream<'_>, loss: &DeviceBuffer<f32>, diverged: &mut DeviceFlag) -> Result<()> {
        s.set_flag(diverged, loss.is_empty())
    }

    #[every(log_every)]
    fn summarise(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>, #[out] summary: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(params, summary)
    }

    #[every(log_every)]
    fn log(s: &CaptureStream<'_>, summary: &DeviceBuffer<f32>, log: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(summary, log)
    }

    #[when(diverged)]
    fn capture(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>, #[out] snapshot: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(params, snapshot)
    }

    #[when(diverged)]
    fn describe(s: &CaptureStream<'_>, snapshot: &DeviceBuffer<f32>, report: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(snapshot, report)
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    assert_eq!(plan.ops[2].every, Some("log_every"));
    assert!(plan.ops[4].when.is_some());
}
