use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    fn clear<const N: usize>(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = N;
        s.memset_zeros(x)
    }
}

fn main() {}
