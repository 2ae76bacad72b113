use stepgraph::{CaptureStream, DeviceBuffer, Result, Span, View, ViewMut};

#[stepgraph::step(streams(main, member[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub input: DeviceBuffer<f32>,
        pub out_all: DeviceBuffer<f32>,
        #[view(of = out_all)]
        #[per_branch]
        pub out: [Span; 2],
        #[per_branch]
        pub target: [DeviceBuffer<f32>; 2],
    }

    #[stream(member[d])]
    fn forward(s: &CaptureStream<'_>, input: &DeviceBuffer<f32>, out: &mut ViewMut<'_, f32>) -> Result<()> {
        s.copy(&input.view(..out.len())?, out)
    }

    #[stream(member[d])]
    fn ensemble(s: &CaptureStream<'_>, #[all_branches] out: &View<'_, f32>, target: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(out, &mut target.view_mut(..out.len())?)
    }
}

fn main() {}
