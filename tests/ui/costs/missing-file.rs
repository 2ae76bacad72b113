//! A costs file that is not there: the planner places by the hints, with a warning (denied here, to see it).
#![deny(deprecated)]

use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, auto), costs = "no-such.costs")]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    fn fill(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    fn clear(s: &CaptureStream<'_>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(y)
    }
}

fn main() {}
