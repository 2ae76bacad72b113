use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[3]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[per_branch]
        pub lanes: [DeviceBuffer<f32>; 3],
        pub y: DeviceBuffer<f32>,
    }

    #[stream(branch[d])]
    fn lane(s: &CaptureStream<'_>, d: usize, lanes: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = d;
        s.memset_zeros(lanes)
    }

    // `branch[1]` is in `branch`: the join names its own stream.
    #[stream(branch[1])]
    #[join(branch)]
    fn gather(s: &CaptureStream<'_>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(y)
    }
}

fn main() {}
