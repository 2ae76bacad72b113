use stepgraph::{CaptureStream, DeviceBuffer, Result, ViewMut};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub q_all: DeviceBuffer<f32>,
        #[view(of = q_all)]
        pub q: DeviceBuffer<f32>,
    }

    fn fill(s: &CaptureStream<'_>, q: &mut ViewMut<'_, f32>) -> Result<()> {
        s.memset_zeros(q)
    }
}

fn main() {}
