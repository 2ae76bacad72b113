//! A capture stream, a cuBLASLt handle and kernels under aliases declared outside the
//! module, which the macro cannot see: `#[op]` marks the `fn` as an op, and each such
//! parameter (a `&T` that names no buffer or config field and is no device memory) is
//! bound by its type.
use stepgraph::{Blas, CaptureStream, DeviceBuffer, Result};

/// The trainer's kernels (a stand-in).
#[derive(Debug)]
pub struct Kernels;

pub type Stream<'a> = CaptureStream<'a>;
pub type Lt<'a> = Blas<'a>;
pub type Ks = Kernels;

#[stepgraph::step(streams(main, side), kernels = Kernels)]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    #[op]
    fn clear(s: &Stream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    #[op]
    #[stream(side)]
    fn copy(stream: &Stream<'_>, lt: &Lt<'_>, kernels: &Ks, x: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = (lt, kernels);
        stream.copy(x, y)
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    let names: Vec<&str> = plan.ops.iter().map(|o| o.name).collect();
    assert_eq!(names, ["clear", "copy"]);
    // The aliased parameters are no buffers: `copy` reads x and writes y, nothing else.
    assert_eq!(plan.ops[1].accesses.len(), 2);
    assert_eq!(plan.ops[1].waits.len(), 1);
}
