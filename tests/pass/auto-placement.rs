//! Automatic placement: with `auto` in `streams(..)`, the planner places the ops without
//! a `#[stream]` (here four independent chains of two ops and a sum) and keeps each
//! hand-placed op where it is; `compare(auto)` adds `AUTO_PLAN`, the same step with every
//! op placed by the planner, which `Schedule::Automatic` captures over the same buffers.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, side, auto))]
mod chains {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub seed: DeviceBuffer<f32>,
        pub a: DeviceBuffer<f32>,
        pub b: DeviceBuffer<f32>,
        pub c: DeviceBuffer<f32>,
        pub d: DeviceBuffer<f32>,
        pub e: DeviceBuffer<f32>,
        pub total: DeviceBuffer<f32>,
    }

    fn seed(s: &CaptureStream<'_>, seed: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(seed)
    }

    #[cost(4.0)]
    fn a(s: &CaptureStream<'_>, seed: &DeviceBuffer<f32>, a: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(seed, a)
    }

    #[cost(4.0)]
    fn b(s: &CaptureStream<'_>, seed: &DeviceBuffer<f32>, b: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(seed, b)
    }

    #[cost(4.0)]
    fn c(s: &CaptureStream<'_>, seed: &DeviceBuffer<f32>, c: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(seed, c)
    }

    /// Placed by hand: never moved.
    #[stream(side)]
    #[cost(4.0)]
    fn d(s: &CaptureStream<'_>, seed: &DeviceBuffer<f32>, d: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(seed, d)
    }

    /// Reads `a` again: a chain the planner keeps on `a`'s stream.
    fn e(s: &CaptureStream<'_>, a: &DeviceBuffer<f32>, e: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(a, e)
    }

    fn sum(
        s: &CaptureStream<'_>,
        b: &DeviceBuffer<f32>,
        c: &DeviceBuffer<f32>,
        d: &DeviceBuffer<f32>,
        e: &DeviceBuffer<f32>,
        total: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(b, total)?;
        s.copy(c, total)?;
        s.copy(d, total)?;
        s.copy(e, total)
    }
}

#[stepgraph::step(streams(main, branch[3]), compare(auto))]
mod branches {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        #[per_branch]
        pub y: [DeviceBuffer<f32>; BRANCH_WIDTH],
        #[scratch(per_stream)]
        pub tmp: DeviceBuffer<f32>,
    }

    fn input(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    #[stream(branch[d])]
    fn branch(
        s: &CaptureStream<'_>,
        x: &DeviceBuffer<f32>,
        #[out] tmp: &mut DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(x, tmp)?;
        s.copy(tmp, y)
    }

    #[join(branch)]
    fn done(s: &CaptureStream<'_>, y: &[DeviceBuffer<f32>; 3]) -> Result<()> {
        let _ = (s, y);
        Ok(())
    }
}

fn main() {
    let plan = chains::Step::plan();
    plan.check().unwrap();
    let stream_of = |name: &str| {
        let op = plan.ops.iter().find(|o| o.name == name).unwrap();
        (plan.streams[op.stream.index()].name, op.automatic)
    };
    // The hand-placed op stays; the others are the planner's.
    assert_eq!(stream_of("d"), ("side", false));
    assert!(stream_of("a").1 && stream_of("sum").1);
    // Three parallel copies beside `d`: on three different streams, none of them `side`.
    let mut three = vec![stream_of("a").0, stream_of("b").0, stream_of("c").0];
    assert!(!three.contains(&"side"));
    three.sort_unstable();
    three.dedup();
    assert_eq!(three.len(), 3, "{plan}");
    // A chain stays on its stream.
    assert_eq!(stream_of("e").0, stream_of("a").0, "{plan}");
    assert!(plan.streams.iter().any(|s| s.automatic));
    assert!(plan.placement.is_some());
    assert!(plan.to_string().contains("placed by the planner"), "{plan}");

    // The twin: the same ops in the same order, each placed by the planner.
    let (hand, auto) = (branches::Step::plan(), branches::Step::auto_plan().unwrap());
    // A const: the same plan by value, wherever it is named.
    assert_eq!(auto.ops.len(), branches::AUTO_PLAN.ops.len());
    auto.check().unwrap();
    assert!(chains::Step::auto_plan().is_none());
    assert_eq!(hand.ops.len(), auto.ops.len());
    for (h, a) in hand.ops.iter().zip(auto.ops) {
        assert_eq!(h.name, a.name);
        assert!(a.automatic && !h.automatic);
    }
    assert!(auto.streams.iter().skip(1).all(|s| s.automatic), "{auto}");
    // The branches still run side by side.
    let branch_streams: Vec<_> = auto.ops[1..4].iter().map(|o| o.stream).collect();
    assert!(branch_streams.windows(2).all(|w| w[0] != w[1]), "{auto}");
}
