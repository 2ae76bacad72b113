//! A crate that re-exports stepgraph under another path points the expansion at it with
//! `crate = path`: the generated code then names the runtime only through that path.

/// A crate's own facade over stepgraph (here a module, for the test).
mod facade {
    pub use stepgraph::*;
}

// No `stepgraph` in scope under that name: were the expansion to name `::stepgraph`, it
// would still resolve (it is a dependency), so the test also checks the step's own types.
use facade::{CaptureStream, DeviceBuffer, Result};

#[facade::step(streams(main, side), crate = crate::facade)]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    fn first(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    #[stream(side)]
    fn second(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(x, y)
    }
}

fn main() {
    // The step's type is the facade's generic `Step` run by the module's spec.
    let _: fn(&facade::Device, (), step::Buffers, step::Config) -> Result<step::Step> =
        |d, k, b, c| facade::Step::<step::Spec>::new(d, k, b, c);
    let plan = step::Step::plan();
    // Every conflicting access ordered, nothing independent ordered, without a GPU.
    let audit = plan.audit().unwrap();
    assert!(audit.conflicts_ordered > 0, "{audit:?}");
    plan.check().unwrap();
    // `second` reads what `first` wrote on another stream: one wait, one final join.
    assert_eq!(plan.ops[1].waits.len(), 1);
    assert_eq!(plan.final_waits.len(), 1);
}
