//! A costs file that does not parse: the warning names its line (denied here, to see it).
#![deny(deprecated)]

use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, auto), costs = "malformed-file.costs")]
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
