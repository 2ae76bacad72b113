use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[per_branch]
        pub lanes: [DeviceBuffer<f32>; 2],
        pub y: DeviceBuffer<f32>,
    }

    #[stream(branch[d])]
    fn lane(s: &CaptureStream<'_>, d: usize, lanes: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = d;
        s.memset_zeros(lanes)
    }

    #[stream(branch[0])]
    #[join(branch[0])]
    fn again(s: &CaptureStream<'_>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(y)
    }
}

fn main() {}
