use stepgraph::{CaptureStream, DeviceBuffer, Result, Span, View, ViewMut};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub q_all: DeviceBuffer<f32>,
        #[view(of = q_all)]
        #[per_branch]
        pub q: [Span; 2],
        pub total: DeviceBuffer<f32>,
    }

    #[stream(branch[d])]
    fn fill(s: &CaptureStream<'_>, q: &mut ViewMut<'_, f32>) -> Result<()> {
        s.memset_zeros(q)
    }

    #[join(branch)]
    fn combine(s: &CaptureStream<'_>, q: &[View<'_, f32>; 2], total: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(&q[0], total)
    }
}

fn main() {}
