//! Two streams may each join the same op: every join is kept per pair of joining and
//! joined stream, so the second one still waits for it.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, a, b, c))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
        pub z: DeviceBuffer<f32>,
    }

    #[stream(a)]
    fn produce(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    // Shares no buffer with `produce`: the joins are the only orderings.
    #[stream(b)]
    #[join(a)]
    fn first(s: &CaptureStream<'_>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(y)
    }

    #[stream(c)]
    #[join(a)]
    fn second(s: &CaptureStream<'_>, z: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(z)
    }
}

fn main() {
    use stepgraph::plan::{EdgeKind, OpId};
    let plan = step::Step::plan();
    // Every conflicting access ordered, nothing independent ordered, without a GPU.
    let audit = plan.audit().unwrap();
    // No buffer is shared: the joins are the only orderings, and `first` and `second`
    // are the one independent pair.
    assert_eq!((audit.conflicts_ordered, audit.independent_pairs), (0, 1));
    plan.check().unwrap();
    // Both joiners wait on the event recorded after `produce`, and on nothing else.
    let after_produce = plan.ops[0].record.expect("produce records an event");
    assert_eq!(plan.ops[1].waits, [after_produce]);
    assert_eq!(plan.ops[2].waits, [after_produce]);
    // The joins are dependencies of the plan (what the verifier checks on the GPU)...
    let joins: Vec<(OpId, OpId)> = plan
        .edges
        .iter()
        .filter(|e| e.kind == EdgeKind::Join)
        .map(|e| (e.from, e.to))
        .collect();
    assert_eq!(joins, [(OpId(0), OpId(1)), (OpId(0), OpId(2))]);
    // ...and `first` and `second` stay independent of each other.
    let order = plan.schedule_edges();
    assert!(!order.contains(&(OpId(1), OpId(2))));
}
