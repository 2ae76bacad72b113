//! Buffers that several steps use: the act step reads the parameters (whole, and through
//! a view) and the update step writes them; a `#[when]` flag another step sets.
use stepgraph::{CaptureStream, DeviceBuffer, DeviceFlag, Result, Shared, Span, View};

#[stepgraph::step(streams(main, side))]
mod act {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[shared]
        pub params: Shared<DeviceBuffer<f32>>,
        #[view(of = params)]
        pub bias: Span,
        #[shared]
        pub explore: Shared<DeviceFlag>,
        pub actions: DeviceBuffer<f32>,
        pub noise: DeviceBuffer<f32>,
    }

    fn act(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>, actions: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(params, actions)
    }

    #[stream(side)]
    fn bias(s: &CaptureStream<'_>, bias: &View<'_, f32>, noise: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = bias;
        s.memset_zeros(noise)
    }

    #[when(explore)]
    fn explore(s: &CaptureStream<'_>, noise: &DeviceBuffer<f32>, actions: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(noise, actions)
    }
}

#[stepgraph::step(streams(main))]
mod update {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[shared]
        pub params: Shared<DeviceBuffer<f32>>,
        #[shared]
        pub explore: Shared<DeviceFlag>,
    }

    fn sgd(s: &CaptureStream<'_>, params: &mut DeviceBuffer<f32>, explore: &mut DeviceFlag) -> Result<()> {
        s.memset_zeros(explore)?;
        s.memset_zeros(params)
    }
}

fn main() {
    let plan = act::Step::plan();
    assert_eq!(plan.ops.len(), 3);
    let _ = update::Step::plan();
}
