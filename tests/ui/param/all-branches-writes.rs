use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, member[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub input: DeviceBuffer<f32>,
        #[per_branch]
        pub out: [DeviceBuffer<f32>; 2],
    }

    #[stream(member[d])]
    fn forward(s: &CaptureStream<'_>, input: &DeviceBuffer<f32>, #[all_branches] out: &mut [DeviceBuffer<f32>; 2]) -> Result<()> {
        s.copy(input, &mut out[0])
    }
}

fn main() {}
