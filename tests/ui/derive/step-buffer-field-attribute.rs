// `#[derive(StepBuffer)]` takes no field attributes: nothing of a step buffer can be
// skipped, since an op is handed all of it.
use stepgraph::{Device, DeviceBuffer, StepBuffer};

#[derive(StepBuffer)]
pub struct Head {
    pub w: DeviceBuffer<f32>,
    #[step_buffer(skip)]
    pub device: Device,
}

fn main() {}
