//! Scratch holds nothing between steps, so the first op to use each copy writes it whole
//! and says so with `#[out]`; later ops may read it, or accumulate into it with `&mut`.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        #[scratch(per_branch)]
        pub partial: DeviceBuffer<f32>,
        #[scratch(per_stream)]
        pub tmp: DeviceBuffer<f32>,
        #[per_branch]
        pub out: [DeviceBuffer<f32>; BRANCH_WIDTH],
        pub total: DeviceBuffer<f32>,
    }

    #[stream(branch[d])]
    fn first(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, #[out] partial: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(x, partial)
    }

    // Accumulates into what `first` wrote on the same branch.
    #[stream(branch[d])]
    fn accumulate(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, partial: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = x;
        s.memset_zeros(partial) // stands for `partial += x`
    }

    #[stream(branch[d])]
    fn finish(s: &CaptureStream<'_>, partial: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(partial, out)
    }

    #[join(branch)]
    fn total(s: &CaptureStream<'_>, out: &[DeviceBuffer<f32>; BRANCH_WIDTH], #[out] tmp: &mut DeviceBuffer<f32>, total: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(&out[0], tmp)?;
        s.copy(tmp, total)
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    assert_eq!(plan.ops.len(), 7);
}
