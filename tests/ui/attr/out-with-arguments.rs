use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[scratch(per_stream)]
        pub tmp: DeviceBuffer<f32>,
    }

    fn fill(s: &CaptureStream<'_>, #[out(all)] tmp: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(tmp)
    }
}

fn main() {}
