use stepgraph::{CaptureStream, DeviceBuffer, Result, Span, ViewMut};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[scratch(per_stream)]
        pub tmp: DeviceBuffer<f32>,
        #[view(of = tmp)]
        pub part: Span,
    }

    fn fill(s: &CaptureStream<'_>, part: &mut ViewMut<'_, f32>) -> Result<()> {
        s.memset_zeros(part)
    }
}

fn main() {}
