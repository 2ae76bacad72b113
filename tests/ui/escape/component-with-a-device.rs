// A component struct is checked at its fields: the `Device` is reported here, not where
// the component is used.
use stepgraph::{Device, DeviceBuffer, StepBuffer};

#[derive(StepBuffer)]
pub struct Head {
    pub w: DeviceBuffer<f32>,
    pub device: Device,
}

fn main() {}
