//! Generic ops: rustc infers their type and const parameters from the buffers and config
//! the step binds to them, so one op serves buffers of several element types and arrays
//! of any width.
use stepgraph::{CaptureStream, DeviceBuffer, DeviceRepr, Result};
use stepgraph::cudarc::driver::ValidAsZeroBits;

#[stepgraph::step(streams(main, lane[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub counts: DeviceBuffer<u32>,
        pub x: DeviceBuffer<f32>,
        #[per_branch]
        pub lanes: [DeviceBuffer<f32>; LANE_WIDTH],
        pub total: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub scale: f32,
    }

    fn clear<T: DeviceRepr + ValidAsZeroBits>(s: &CaptureStream<'_>, counts: &mut DeviceBuffer<T>) -> Result<()> {
        s.memset_zeros(counts)
    }

    fn seed<T: DeviceRepr + ValidAsZeroBits, S: Copy>(s: &CaptureStream<'_>, scale: S, x: &mut DeviceBuffer<T>) -> Result<()> {
        let _ = scale;
        s.memset_zeros(x)
    }

    #[stream(lane[d])]
    fn spread(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, lanes: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(x, lanes)
    }

    #[join(lane)]
    fn gather<const N: usize>(s: &CaptureStream<'_>, lanes: &[DeviceBuffer<f32>; N], total: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(&lanes[N - 1], total)
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    let names: Vec<&str> = plan.ops.iter().map(|o| o.name).collect();
    assert_eq!(names, ["clear", "seed", "spread[0]", "spread[1]", "gather"]);
}
