use stepgraph::{CaptureStream, DeviceBuffer, HostOutput, Result};

#[stepgraph::step(streams(main))]
mod watch {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub loss: DeviceBuffer<f32>,
        pub loss_out: HostOutput<f32>,
    }

    fn report(s: &CaptureStream<'_>, loss: &DeviceBuffer<f32>, loss_out: &mut HostOutput<f32>) -> Result<()> {
        s.read_back(loss, loss_out)
    }
}

// A read-back borrows the step: replaying while it lives would let the GPU overwrite
// the slot it shows.
fn train(step: &mut watch::Step) -> Result<f32> {
    let loss = step.read_back(|b| &b.loss_out)?.expect("a finished replay");
    step.replay()?;
    Ok(loss[0])
}

fn main() {}
