use stepgraph::{CaptureStream, DeviceBuffer, Result, Span, ViewMut};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub all: DeviceBuffer<f32>,
        #[shared]
        #[view(of = all)]
        pub part: Span,
    }

    fn fill(s: &CaptureStream<'_>, part: &mut ViewMut<'_, f32>) -> Result<()> {
        s.memset_zeros(part)
    }
}

fn main() {}
