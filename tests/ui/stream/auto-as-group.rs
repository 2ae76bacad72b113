use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, aux, auto[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    #[stream(aux)]
    fn a(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }
}

fn main() {}
