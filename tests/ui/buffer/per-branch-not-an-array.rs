use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[per_branch]
        pub w: DeviceBuffer<f32>,
    }

    #[stream(branch[d])]
    fn a(s: &CaptureStream<'_>, d: usize, w: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = d;
        s.memset_zeros(w)
    }
}

fn main() {}
