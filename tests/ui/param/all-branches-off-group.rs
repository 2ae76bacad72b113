use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, member[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub input: DeviceBuffer<f32>,
        #[per_branch]
        pub out: [DeviceBuffer<f32>; 2],
        pub total: DeviceBuffer<f32>,
    }

    #[stream(member[d])]
    fn forward(s: &CaptureStream<'_>, input: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(input, out)
    }

    #[join(member)]
    fn combine(s: &CaptureStream<'_>, #[all_branches] out: &[DeviceBuffer<f32>; 2], total: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(&out[1], total)
    }
}

fn main() {}
