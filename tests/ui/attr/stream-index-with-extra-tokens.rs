use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[per_branch]
        pub lanes: [DeviceBuffer<f32>; 2],
    }

    #[stream(branch[d + 1])]
    fn clear(s: &CaptureStream<'_>, lanes: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(lanes)
    }
}

fn main() {}
