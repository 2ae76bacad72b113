use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[per_branch]
        pub out: [DeviceBuffer<f32>; 2],
        #[per_branch]
        pub target: [DeviceBuffer<f32>; 2],
    }

    #[stream(branch[d])]
    fn fill(s: &CaptureStream<'_>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(out)
    }

    #[stream(branch[d])]
    fn read(s: &CaptureStream<'_>, #[all_branches] #[all_branches] out: &[DeviceBuffer<f32>; 2], target: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(&out[0], target)
    }
}

fn main() {}
