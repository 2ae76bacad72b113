//! Placement from measured costs: `costs = "auto-costs.costs"` (beside this file) gives
//! the planner each op's measured time, and the plan says so. By the hints (all 1.0) the
//! planner would continue `slow`'s chain on the origin; measured, `slow` is long and
//! `fast_a`, `fast_b` each short, so the chain that follows `fast_a` stays on its stream
//! and `slow` runs beside it. A warning (a stale or missing file) fails this build.
#![deny(deprecated)]

use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main), compare(auto), costs = "auto-costs.costs")]
mod measured {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub seed: DeviceBuffer<f32>,
        pub a: DeviceBuffer<f32>,
        pub b: DeviceBuffer<f32>,
        pub c: DeviceBuffer<f32>,
    }

    fn seed(s: &CaptureStream<'_>, seed: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(seed)
    }

    fn slow(s: &CaptureStream<'_>, seed: &DeviceBuffer<f32>, a: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(seed, a)
    }

    fn fast_a(s: &CaptureStream<'_>, seed: &DeviceBuffer<f32>, b: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(seed, b)
    }

    fn fast_b(s: &CaptureStream<'_>, b: &DeviceBuffer<f32>, c: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(b, c)
    }
}

fn main() {
    let plan = measured::Step::auto_plan().unwrap();
    plan.check().unwrap();
    let op = |name: &str| plan.ops.iter().find(|o| o.name == name).unwrap();
    // The placement line names the file and what measured it.
    let text = plan.to_string();
    assert!(text.contains("auto-costs.costs") && text.contains("Test GPU"), "{plan}");
    // The costs the planner used are the file's.
    assert_eq!(op("slow").cost, 40.0, "{plan}");
    assert_eq!(op("fast_b").cost, 3.0, "{plan}");
    // `slow` and the chain fast_a -> fast_b run side by side; the chain keeps one stream.
    assert_ne!(op("slow").stream, op("fast_a").stream, "{plan}");
    assert_eq!(op("fast_a").stream, op("fast_b").stream, "{plan}");
    // The hand plan (one stream) keeps its hints.
    assert_eq!(measured::PLAN.ops[1].cost, 1.0);
}
