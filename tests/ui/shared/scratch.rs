use stepgraph::{CaptureStream, DeviceBuffer, Result, Shared};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[shared]
        #[scratch(per_stream)]
        pub tmp: Shared<DeviceBuffer<f32>>,
    }

    fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(tmp)
    }
}

fn main() {}
