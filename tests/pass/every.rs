//! An op that runs at every k-th replay: a target network synced from the online one,
//! as a conditional node of the one graph.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, side))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub online: DeviceBuffer<f32>,
        pub target: DeviceBuffer<f32>,
        pub log: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub target_sync: u32,
    }

    fn train(s: &CaptureStream<'_>, target: &DeviceBuffer<f32>, online: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(target, online)
    }

    #[every(target_sync)]
    fn sync(s: &CaptureStream<'_>, online: &DeviceBuffer<f32>, target: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(online, target)
    }

    #[stream(side)]
    #[every(100)]
    fn report(s: &CaptureStream<'_>, online: &DeviceBuffer<f32>, log: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(online, log)
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    plan.audit().unwrap();
    assert_eq!(plan.ops[0].every, None);
    assert_eq!(plan.ops[1].every, Some("target_sync"));
    assert_eq!(plan.ops[2].every, Some("100"));
    // A conditional op is ordered like any other: `report` waits for `train`.
    assert_eq!(plan.ops[2].waits.len(), 1);
    let text = plan.to_string();
    assert!(text.contains("every target_sync replays"), "{text}");
    println!("{plan}");
}
