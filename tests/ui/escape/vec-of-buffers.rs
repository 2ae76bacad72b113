// A `Vec` of buffers can be pushed to or swapped inside an op (an allocation the graph
// would keep after it was freed); a fixed array of buffers is a step buffer.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub xs: Vec<DeviceBuffer<f32>>,
    }

    fn clear(s: &CaptureStream<'_>, xs: &mut Vec<DeviceBuffer<f32>>) -> Result<()> {
        s.memset_zeros(&mut xs[0])
    }
}

fn main() {}
