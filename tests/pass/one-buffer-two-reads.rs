//! One buffer bound to two `&` parameters of an op (by name and by `#[buf(..)]`) is one
//! read: the op may read it under two names.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    fn seed(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    /// `y = x ⊙ x`, written against a kernel that takes its two factors apart.
    fn square(s: &CaptureStream<'_>, #[buf(x)] a: &DeviceBuffer<f32>, #[buf(x)] b: &DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = b;
        s.copy(a, y)
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    // One read of `x`, one write of `y`.
    assert_eq!(plan.ops[1].accesses.len(), 2);
    assert!(plan.to_string().contains("square  reads x  writes y"), "{plan}");
}
