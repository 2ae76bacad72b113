use stepgraph::{CaptureStream, DeviceBuffer, Result, Span, ViewMut};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub q_all: DeviceBuffer<f32>,
        #[view(of = q_all, rows)]
        pub q: Span,
    }

    fn fill(s: &CaptureStream<'_>, q: &mut ViewMut<'_, f32>) -> Result<()> {
        s.memset_zeros(q)
    }
}

fn main() {}
