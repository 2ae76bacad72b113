use stepgraph::{CaptureStream, Communicator, DeviceBuffer, Result};

#[stepgraph::step(streams(main))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub grad: DeviceBuffer<f32>,
        pub comm: Communicator,
    }

    #[every(10)]
    fn reduce(s: &CaptureStream<'_>, comm: &mut Communicator, grad: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = (s, comm, grad);
        Ok(())
    }
}

fn main() {}
