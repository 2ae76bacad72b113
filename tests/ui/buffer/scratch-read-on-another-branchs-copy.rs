use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, branch[2]))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[scratch(per_branch)]
        pub tmp: DeviceBuffer<f32>,
        #[per_branch]
        pub out: [DeviceBuffer<f32>; 2],
    }

    #[stream(branch[0])]
    fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(tmp)
    }

    // Branch 1 reads its own copy of `tmp`; only branch 0's copy was written.
    #[stream(branch[d])]
    fn use_it(s: &CaptureStream<'_>, d: usize, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = d;
        s.copy(tmp, out)
    }
}

fn main() {}
