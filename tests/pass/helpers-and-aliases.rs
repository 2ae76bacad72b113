//! A step module may hold helper functions: an op is a `fn` that takes the capture stream
//! or its cuBLASLt handle (or carries an op attribute); any other `fn` is kept as it is
//! for the ops to call. The stream and the handle are recognised through a `use .. as ..`
//! alias of the module too.
use stepgraph::{DeviceBuffer, Result};

#[stepgraph::step(streams(main, side))]
mod step {
    use super::*;
    use stepgraph::{Blas as Lt, CaptureStream as Stream};

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    /// A helper: no stream, no handle, no op attribute.
    fn halves(len: usize) -> (usize, usize) {
        (len / 2, len - len / 2)
    }

    fn clear(s: &Stream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        let (a, b) = halves(x.len());
        assert_eq!(a + b, x.len());
        s.memset_zeros(x)
    }

    #[stream(side)]
    fn copy(s: &Stream<'_>, blas: &Lt<'_>, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = blas;
        s.copy(x, y)
    }
}

fn main() {
    let plan = step::Step::plan();
    // Every conflicting access ordered, nothing independent ordered, without a GPU.
    let audit = plan.audit().unwrap();
    assert!(audit.conflicts_ordered > 0, "{audit:?}");
    plan.check().unwrap();
    // Two ops; the helper is not one of them.
    let names: Vec<&str> = plan.ops.iter().map(|o| o.name).collect();
    assert_eq!(names, ["clear", "copy"]);
    // `copy` reads what `clear` wrote: ordered across the streams by one wait.
    assert_eq!(plan.ops[1].waits.len(), 1);
    assert_eq!(plan.wait_count(), 2, "the wait and the final join");
}
