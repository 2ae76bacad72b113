use stepgraph::{CaptureStream, Communicator, DeviceBuffer, ReduceOp, Result};

#[stepgraph::step(streams(main, a, b))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub comm: Communicator,
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    #[stream(a)]
    fn reduce_x(s: &CaptureStream<'_>, comm: &mut Communicator, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.all_reduce(comm, &mut [x], ReduceOp::Sum)
    }

    // Copies of a communicator would be wrong: the advice is to order the collectives.
    #[stream(b)]
    fn reduce_y(s: &CaptureStream<'_>, comm: &mut Communicator, y: &mut DeviceBuffer<f32>) -> Result<()> {
        s.all_reduce(comm, &mut [y], ReduceOp::Sum)
    }
}

fn main() {}
