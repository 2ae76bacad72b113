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

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub scale: f32,
    }

    #[stream(member[d])]
    fn forward(s: &CaptureStream<'_>, #[all_branches] scale: f32, input: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = scale;
        s.copy(input, out)
    }
}

fn main() {}
