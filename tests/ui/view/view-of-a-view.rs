use stepgraph::{CaptureStream, DeviceBuffer, Result, Span, ViewMut};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub q_all: DeviceBuffer<f32>,
        #[view(of = q_all)]
        pub q: Span,
        #[view(of = q)]
        pub head: Span,
    }

    fn fill(s: &CaptureStream<'_>, head: &mut ViewMut<'_, f32>) -> Result<()> {
        s.memset_zeros(head)
    }
}

fn main() {}
