//! Ops replicated over a stream group: one instance per branch, each with its own
//! per-branch buffer element and per-branch scratch copy.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[4]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub trunk_out: DeviceBuffer<f32>,
        #[per_branch]
        pub advantage: [DeviceBuffer<f32>; 4],
        #[scratch(per_branch)]
        pub glu: DeviceBuffer<f32>,
        pub q: DeviceBuffer<f32>,
    }

    fn trunk(s: &CaptureStream<'_>, trunk_out: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(trunk_out)
    }

    #[stream(branch[d])]
    fn glu_forward(s: &CaptureStream<'_>, d: usize, trunk_out: &DeviceBuffer<f32>, #[out] glu: &mut DeviceBuffer<f32>) -> Result<()> {
        assert!(d < 4);
        s.copy(trunk_out, glu)
    }

    #[stream(branch[d])]
    fn advantage_head(s: &CaptureStream<'_>, glu: &DeviceBuffer<f32>, advantage: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(glu, advantage)
    }

    #[join(branch)]
    fn combine(s: &CaptureStream<'_>, advantage: &[DeviceBuffer<f32>; 4], q: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(&advantage[3], q)
    }
}

fn main() {
    let plan = step::Step::plan();
    // Every conflicting access ordered, nothing independent ordered, without a GPU.
    let audit = plan.audit().unwrap();
    assert!(audit.conflicts_ordered > 0, "{audit:?}");
    // What the macro emits passes the executor's check of a plan.
    plan.check().unwrap();
    // trunk + 4 x 2 branch ops + combine
    assert_eq!(plan.ops.len(), 10);
    assert_eq!(plan.streams.len(), 5);
    // Each branch waits once on the trunk; combine waits once per branch; nothing else.
    assert_eq!(plan.wait_count(), 8);
    assert_eq!(plan.ops[1].name, "glu_forward[0]");
    println!("{plan}");
}
