use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[4]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[per_branch]
        pub lanes: [DeviceBuffer<f32>; 4],
        #[per_branch]
        pub out: [DeviceBuffer<f32>; 4],
    }

    #[stream(branch[d])]
    fn lane(s: &CaptureStream<'_>, d: usize, lanes: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = d;
        s.memset_zeros(lanes)
    }

    // Each replica would wait for the replicas before it: the group would run serially.
    #[stream(branch[d])]
    #[join(branch)]
    fn next(s: &CaptureStream<'_>, d: usize, lanes: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = d;
        s.copy(lanes, out)
    }
}

fn main() {}
