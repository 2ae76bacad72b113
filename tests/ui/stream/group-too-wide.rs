//! A stream group wider than 1024 streams (here a typo that asks for four billion).
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[4000000000]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[per_branch]
        pub x: [DeviceBuffer<f32>; 4],
    }

    #[stream(branch[d])]
    fn work(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }
}

fn main() {}
