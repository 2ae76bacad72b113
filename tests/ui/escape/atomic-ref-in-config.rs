// A reference to an atomic in the config would be counted through at capture time only:
// the graph replays the ops without it.
use std::sync::atomic::AtomicU32;
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    #[config]
    pub struct Config {
        pub calls: &'static AtomicU32,
    }

    fn clear(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }
}

fn main() {}
