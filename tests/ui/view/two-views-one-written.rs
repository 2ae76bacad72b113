use stepgraph::{CaptureStream, DeviceBuffer, Result, Span, View, ViewMut};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub q_all: DeviceBuffer<f32>,
        #[view(of = q_all)]
        pub a: Span,
        #[view(of = q_all)]
        pub b: Span,
    }

    fn copy_over(s: &CaptureStream<'_>, a: &View<'_, f32>, b: &mut ViewMut<'_, f32>) -> Result<()> {
        s.copy(a, b)
    }
}

fn main() {}
