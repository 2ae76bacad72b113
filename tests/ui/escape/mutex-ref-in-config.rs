// A reference to a `Mutex` in the config would let an op read or change host state at
// capture time only: the graph replays the ops without it.
use std::sync::Mutex;
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
        pub losses: &'static Mutex<Vec<f32>>,
    }

    fn clear(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }
}

fn main() {}
