use stepgraph::{CaptureStream, DeviceBuffer, Result, Shared};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub params: Shared<DeviceBuffer<f32>>,
    }

    fn update(s: &CaptureStream<'_>, params: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(params)
    }
}

fn main() {}
