//! A replicated op that reads every branch's element of a `#[per_branch]` array
//! (`#[all_branches]`): an ensemble's members each need the minimum over all members'
//! outputs. Each replica waits for the other branches' writers, on its own stream, with
//! no op on another stream between; a fixed member may take the array whole too.
use stepgraph::plan::OpId;
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, member[3]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub input: DeviceBuffer<f32>,
        #[per_branch]
        pub out: [DeviceBuffer<f32>; 3],
        #[per_branch]
        pub target: [DeviceBuffer<f32>; 3],
        pub report: DeviceBuffer<f32>,
    }

    fn load(s: &CaptureStream<'_>, input: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(input)
    }

    #[stream(member[d])]
    fn forward(s: &CaptureStream<'_>, input: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(input, out)
    }

    /// Every member's target from all members' outputs: replicated, reading `out` whole.
    #[stream(member[d])]
    fn ensemble_target(
        s: &CaptureStream<'_>,
        d: usize,
        #[all_branches] out: &[DeviceBuffer<f32>; 3],
        target: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(&out[(d + 1) % 3], target)
    }

    /// One member reads every output whole and writes a shared report.
    #[stream(member[0])]
    fn summarise(s: &CaptureStream<'_>, #[all_branches] out: &[DeviceBuffer<f32>; 3], report: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(&out[2], report)
    }

    /// One member (not a replicated op) may write the array whole; as for any op that
    /// writes what ops on other streams wrote, without reading it, a join orders them.
    #[stream(member[0])]
    #[join(member[1], member[2])]
    fn reset_targets(s: &CaptureStream<'_>, #[all_branches] target: &mut [DeviceBuffer<f32>; 3]) -> Result<()> {
        for t in target.iter_mut() {
            s.memset_zeros(t)?;
        }
        Ok(())
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    let audit = plan.audit().unwrap();
    assert!(audit.conflicts_ordered > 0, "{audit:?}");
    // load, 3 forward, 3 ensemble_target, summarise, reset_targets
    assert_eq!(plan.ops.len(), 9);
    let id = |name: &str| OpId(plan.ops.iter().position(|o| o.name == name).unwrap() as u32);
    for d in 0..3 {
        let target = id(&format!("ensemble_target[{d}]"));
        // Each replica reads every branch's output: ordered after every forward, on its
        // own stream, and not after any other replica.
        for k in 0..3 {
            assert!(plan.orders(id(&format!("forward[{k}]")), target), "forward[{k}] before {d}");
            if k != d {
                let other = id(&format!("ensemble_target[{k}]"));
                assert!(!plan.orders(other, target) && !plan.orders(target, other), "{d} and {k} independent");
            }
        }
        assert_eq!(plan.ops[target.0 as usize].stream, plan.ops[id(&format!("forward[{d}]")).0 as usize].stream);
    }
    assert!(plan.orders(id("forward[2]"), id("summarise[0]")));
    for d in 0..3 {
        assert!(plan.orders(id(&format!("ensemble_target[{d}]")), id("reset_targets[0]")));
    }
    // Three waits on `load` and two per replica on the other members' forwards; none
    // for summarise, whose stream's replica waited for them already; two for the reset,
    // on the other replicas that wrote the targets; then the end's joins.
    let inside = plan.wait_count() - plan.final_waits.len();
    assert_eq!(inside, 3 + 3 * 2 + 2, "{plan}");
    println!("{plan}");
}
