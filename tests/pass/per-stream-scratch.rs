//! Two heads on side streams sharing one scratch declaration: each stream gets its own
//! copy, so they run in parallel instead of being serialised through one buffer.
use stepgraph::{Blas, CaptureStream, DeviceBuffer, Result};

#[stepgraph::step(streams(main, aux_iqn, aux_attn))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub features: DeviceBuffer<f32>,
        #[scratch(per_stream)]
        pub tmp: DeviceBuffer<f32>,
        pub iqn: DeviceBuffer<f32>,
        pub attn: DeviceBuffer<f32>,
    }

    fn trunk(s: &CaptureStream<'_>, features: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(features)
    }

    #[stream(aux_iqn)]
    #[cost(3.0)]
    fn iqn_head(s: &CaptureStream<'_>, blas: &Blas<'_>, features: &DeviceBuffer<f32>, #[out] tmp: &mut DeviceBuffer<f32>, iqn: &mut DeviceBuffer<f32>) -> Result<()> {
        let _ = blas;
        s.copy(features, tmp)?;
        s.copy(tmp, iqn)
    }

    #[stream(aux_attn)]
    fn attn_head(s: &CaptureStream<'_>, features: &DeviceBuffer<f32>, #[out] tmp: &mut DeviceBuffer<f32>, attn: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(features, tmp)?;
        s.copy(tmp, attn)
    }
}

fn main() {
    let plan = step::Step::plan();
    // Every conflicting access ordered, nothing independent ordered, without a GPU.
    let audit = plan.audit().unwrap();
    assert!(audit.conflicts_ordered > 0, "{audit:?}");
    // What the macro emits passes the executor's check of a plan.
    plan.check().unwrap();
    // The two heads write different copies of `tmp`.
    let copies: Vec<u16> = plan.ops[1..].iter().map(|o| o.accesses[1].copy).collect();
    assert_eq!(copies, [0, 1]);
    // Both side streams are joined back at the end.
    assert_eq!(plan.final_waits.len(), 2);
    assert_eq!(plan.critical_path_by_cost.len(), 2);
    println!("{plan}");
}
