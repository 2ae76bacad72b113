use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod s {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    // The expansion defines `Spec` (what `Step` runs) in this module.
    pub struct Spec;

    fn clear(stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        stream.memset_zeros(x)
    }
}

fn main() {}
