// A size beside the buffers is plain data; a `Device` is neither a buffer nor plain data,
// and is reported at its field.
use stepgraph::{Device, DeviceBuffer, StepBuffer};

#[derive(StepBuffer)]
pub struct Head {
    pub w: DeviceBuffer<f32>,
    pub len: usize,
    pub device: Device,
}

fn main() {}
