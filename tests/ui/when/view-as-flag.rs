use stepgraph::{CaptureStream, DeviceBuffer, Result, Span};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub loss: DeviceBuffer<u32>,
        #[view(of = loss)]
        pub diverged: Span,
        pub params: DeviceBuffer<f32>,
        pub backup: DeviceBuffer<f32>,
    }

    fn check(s: &CaptureStream<'_>, loss: &mut DeviceBuffer<u32>) -> Result<()> {
        s.memset_zeros(loss)
    }

    #[when(diverged)]
    fn restore(s: &CaptureStream<'_>, backup: &DeviceBuffer<f32>, params: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(backup, params)
    }
}

fn main() {}
