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

// The slot lives only inside the closure: kept past it, the host could write it while a
// replay copies it.
fn train(step: &mut feed::Step) -> Result<()> {
    let slot: &mut [f32] = step.fill(|b| &b.batch_in, |slot| slot)?;
    step.replay()?;
    slot[0] = 1.0;
    Ok(())
}

fn main() {}
