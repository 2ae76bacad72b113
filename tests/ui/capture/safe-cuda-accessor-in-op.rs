use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    fn clear(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = x.as_cuda_slice();
        s.memset_zeros(x)
    }
}

fn main() {}
