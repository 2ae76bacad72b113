//! A step whose buffers include a component (a head with its own buffers), read and
//! written as one unit.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

/// A head with its own buffers.
#[derive(stepgraph::StepBuffer)]
pub struct Head {
    pub weights: DeviceBuffer<f32>,
    pub out: DeviceBuffer<f32>,
}

fn head_forward(stream: &CaptureStream<'_>, input: &DeviceBuffer<f32>, head: &mut Head) -> Result<()> {
    stream.copy(input, &mut head.out)
}

#[stepgraph::step(streams(main, aux))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub input: DeviceBuffer<f32>,
        pub head: Head,
        pub total: DeviceBuffer<f32>,
    }

    #[config]
    pub struct Config {
        pub n: usize,
    }

    fn prepare(stream: &CaptureStream<'_>, input: &mut DeviceBuffer<f32>) -> Result<()> {
        stream.memset_zeros(input)
    }

    #[stream(aux)]
    fn head(stream: &CaptureStream<'_>, input: &DeviceBuffer<f32>, head: &mut Head) -> Result<()> {
        head_forward(stream, input, head)
    }

    #[join(aux)]
    fn total(stream: &CaptureStream<'_>, head: &Head, total: &mut DeviceBuffer<f32>, n: usize) -> Result<()> {
        assert_eq!(head.out.len(), n);
        stream.copy(&head.out, total)
    }
}

fn main() {
    let plan = step::Step::plan();
    // Every conflicting access ordered, nothing independent ordered, without a GPU.
    let audit = plan.audit().unwrap();
    assert!(audit.conflicts_ordered > 0, "{audit:?}");
    assert_eq!(plan.ops.len(), 3);
    assert_eq!(plan.streams.len(), 2);
    println!("{plan}");
}
