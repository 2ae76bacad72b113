// A struct of sizes in the config is a config value only with `#[derive(ConfigValue)]`,
// which checks each of its fields.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[derive(Clone, Copy)]
pub struct Sizes {
    pub batch: usize,
    pub hidden: usize,
}

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    #[config]
    pub struct Config {
        pub sizes: Sizes,
    }

    fn clear(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }
}

fn main() {}
