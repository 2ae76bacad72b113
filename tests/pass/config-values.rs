//! What a step's config may hold besides numbers: structs (one generic) and an enum that
//! derive `ConfigValue`, text, options, tuples and a matmul's description; the ops take them
//! by value.
use stepgraph::{Blas, CaptureStream, ConfigValue, DeviceBuffer, Matmul, MatmulArgs, Result};

/// The model's sizes.
#[derive(Clone, Copy, Debug, ConfigValue)]
pub struct Sizes {
    pub batch: usize,
    pub hidden: usize,
}

/// A range of values: a generic config value, bounded where it is used.
#[derive(Clone, Copy, Debug, ConfigValue)]
pub struct Range<T> {
    pub low: T,
    pub high: T,
}

/// How the output is cleared.
#[derive(Clone, Copy, Debug, ConfigValue)]
pub enum Clear {
    Zeros,
    Copy { from_input: bool },
}

#[stepgraph::step(streams(main, side))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub input: DeviceBuffer<f32>,
        pub w: DeviceBuffer<f32>,
        pub out: DeviceBuffer<f32>,
        pub side_out: DeviceBuffer<f32>,
    }

    #[config]
    pub struct Config {
        pub sizes: Sizes,
        pub clear: Clear,
        pub label: &'static str,
        pub limit: Option<u32>,
        pub range: (f32, f32),
        pub fc: Matmul,
        pub clip: Range<f32>,
    }

    fn forward(b: &Blas<'_>, input: &DeviceBuffer<f32>, w: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>, fc: Matmul, sizes: Sizes) -> Result<()> {
        assert_eq!(fc.m, sizes.batch);
        b.matmul(&fc, input, w, out, MatmulArgs::new())
    }

    #[stream(side)]
    fn side(s: &CaptureStream<'_>, input: &DeviceBuffer<f32>, side_out: &mut DeviceBuffer<f32>, clear: Clear, limit: Option<u32>, range: (f32, f32)) -> Result<()> {
        assert!(limit.is_none_or(|l| l > 0) && range.0 <= range.1);
        match clear {
            Clear::Zeros => s.memset_zeros(side_out),
            Clear::Copy { from_input: true } => s.copy(input, side_out),
            Clear::Copy { from_input: false } => Ok(()),
        }
    }
}

fn main() {
    let plan = step::Step::plan();
    plan.check().unwrap();
    assert_eq!(plan.ops.len(), 2);
    let config = step::Config {
        sizes: Sizes { batch: 8, hidden: 16 },
        clear: Clear::Copy { from_input: true },
        label: "net",
        limit: Some(4),
        range: (0.0, 1.0),
        fc: Matmul::new(8, 16, 4),
        clip: Range { low: -1.0, high: 1.0 },
    };
    println!("{:?} {:?} {}", config.sizes, config.clear, config.label);
}
