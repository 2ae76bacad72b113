use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[per_branch]
        pub lanes: [DeviceBuffer<f32>; 2],
        #[per_branch]
        pub out: [DeviceBuffer<f32>; 2],
    }

    #[stream(branch[d])]
    fn lane(s: &CaptureStream<'_>, d: usize, lanes: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = d;
        s.memset_zeros(lanes)
    }

    // Replica 1 would wait for replica 0's stream: the group would not run side by side.
    #[stream(branch[d])]
    #[join(branch[0])]
    fn next(s: &CaptureStream<'_>, d: usize, lanes: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = d;
        s.copy(lanes, out)
    }
}

fn main() {}
