use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    use std::sync::atomic::{AtomicU32, Ordering};

    static STEPS: AtomicU32 = AtomicU32::new(0);

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    fn count(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        STEPS.fetch_add(1, Ordering::Relaxed);
        s.memset_zeros(x)
    }
}

fn main() {}
