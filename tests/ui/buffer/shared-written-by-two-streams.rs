use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, aux_iqn, aux_attn))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub features: DeviceBuffer<f32>,
        pub tmp: DeviceBuffer<f32>,
        pub iqn: DeviceBuffer<f32>,
        pub attn: DeviceBuffer<f32>,
    }

    fn trunk(s: &CaptureStream<'_>, features: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(features)
    }

    #[stream(aux_iqn)]
    fn iqn_head(s: &CaptureStream<'_>, features: &DeviceBuffer<f32>, tmp: &mut DeviceBuffer<f32>, iqn: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(features, tmp)?;
        s.copy(tmp, iqn)
    }

    #[stream(aux_attn)]
    fn attn_head(s: &CaptureStream<'_>, features: &DeviceBuffer<f32>, tmp: &mut DeviceBuffer<f32>, attn: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(features, tmp)?;
        s.copy(tmp, attn)
    }
}

fn main() {}
