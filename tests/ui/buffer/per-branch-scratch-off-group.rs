use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[scratch(per_branch)]
        pub glu: DeviceBuffer<f32>,
    }

    fn a(s: &CaptureStream<'_>, #[out] glu: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(glu)
    }
}

fn main() {}
