//! A stream group's width, written once: the module defines `NAME_WIDTH` for each group
//! `name[N]`, for the `#[per_branch]` arrays' types and for code outside the step; a
//! module that defines an item of that name itself keeps its own.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, critic[3], head[2]))]
mod step {
    use super::*;

    /// The module's own item of the generated name: the macro leaves it alone.
    pub const HEAD_WIDTH: usize = 2;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        #[per_branch]
        pub q: [DeviceBuffer<f32>; CRITIC_WIDTH],
        #[per_branch]
        pub h: [DeviceBuffer<f32>; HEAD_WIDTH],
    }

    fn input(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    #[stream(critic[d])]
    fn critic(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, q: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(x, q)
    }

    #[stream(head[d])]
    fn head(s: &CaptureStream<'_>, x: &DeviceBuffer<f32>, h: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(x, h)
    }
}

fn main() {
    const _: () = assert!(step::CRITIC_WIDTH == 3 && step::HEAD_WIDTH == 2);
    let plan = step::Step::plan();
    // input + 3 critics + 2 heads
    assert_eq!(plan.ops.len(), 1 + step::CRITIC_WIDTH + step::HEAD_WIDTH);
    plan.check().unwrap();
}
