use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, aux))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[scratch(per_stream)]
        pub tmp: DeviceBuffer<f32>,
        pub out: DeviceBuffer<f32>,
    }

    fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(tmp)
    }

    // `aux` has its own copy of `tmp`, which `fill` (on `main`) did not write.
    #[stream(aux)]
    #[join(main)]
    fn use_it(s: &CaptureStream<'_>, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(tmp, out)
    }
}

fn main() {}
