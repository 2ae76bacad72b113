//! A step fed by the host every replay and read back without waiting: the staged input
//! and the read-back are ops like any other, planned by what they read and write.

use stepgraph::{CaptureStream, DeviceBuffer, HostInput, HostOutput, Result};

#[stepgraph::step(streams(main, side))]
mod feed {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub obs_in: HostInput<f32>,
        pub obs: DeviceBuffer<f32>,
        pub reward_in: HostInput<f32>,
        pub reward: DeviceBuffer<f32>,
        pub stats: DeviceBuffer<f32>,
        pub stats_out: HostOutput<f32>,
    }

    fn load_obs(s: &CaptureStream<'_>, obs_in: &HostInput<f32>, obs: &mut DeviceBuffer<f32>) -> Result<()> {
        s.stage(obs_in, obs)
    }

    #[stream(side)]
    fn load_reward(
        s: &CaptureStream<'_>,
        reward_in: &HostInput<f32>,
        reward: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.stage(reward_in, reward)
    }

    #[join(side)]
    fn summarise(
        s: &CaptureStream<'_>,
        obs: &DeviceBuffer<f32>,
        reward: &DeviceBuffer<f32>,
        stats: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let _ = (obs, reward);
        s.memset_zeros(stats)
    }

    fn report(s: &CaptureStream<'_>, stats: &DeviceBuffer<f32>, stats_out: &mut HostOutput<f32>) -> Result<()> {
        s.read_back(stats, stats_out)
    }
}

fn main() {
    let plan = &feed::PLAN;
    assert_eq!(plan.ops.len(), 4);
    plan.audit().unwrap();
}
