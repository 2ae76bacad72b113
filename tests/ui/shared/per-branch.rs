use stepgraph::{CaptureStream, DeviceBuffer, Result, Shared};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[shared]
        #[per_branch]
        pub heads: [Shared<DeviceBuffer<f32>>; 2],
    }

    #[stream(branch[d])]
    fn head(s: &CaptureStream<'_>, d: usize, heads: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = d;
        s.memset_zeros(heads)
    }
}

fn main() {}
