use stepgraph::{CaptureStream, DeviceBuffer, Result, Shared};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[shared(with = update)]
        pub params: Shared<DeviceBuffer<f32>>,
    }

    fn act(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>) -> Result<()> {
        let _ = (s, params);
        Ok(())
    }
}

fn main() {}
