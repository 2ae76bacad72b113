use stepgraph::{CaptureStream, DeviceBuffer, HostInput, Result};

#[stepgraph::step(streams(main))]
mod feed {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub batch_in: HostInput<f32>,
        pub batch: DeviceBuffer<f32>,
    }

    fn load(s: &CaptureStream<'_>, batch_in: &HostInput<f32>, batch: &mut DeviceBuffer<f32>) -> Result<()> {
        s.stage(batch_in, batch)
    }
}

// A slot is written while the step is borrowed: no replay can start, and so read it,
// half-written.
fn train(step: &mut feed::Step) -> Result<()> {
    step.fill(|b| &b.batch_in, |slot| {
        slot[0] = 1.0;
        step.replay()
    })?
}

fn main() {}
