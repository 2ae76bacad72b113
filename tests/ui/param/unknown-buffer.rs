use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub q_values: DeviceBuffer<f32>,
    }

    fn a(s: &CaptureStream<'_>, q_value: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(q_value)
    }
}

fn main() {}
