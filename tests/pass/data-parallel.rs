//! Data parallel: each head's gradient bucket is all-reduced on a communication stream as
//! soon as the head's backward has written it, while the other heads' backward still
//! runs. The communicator is a buffer written by every collective, so the collectives
//! keep program order (NCCL needs every rank to issue them in the same order).
use stepgraph::{CaptureStream, Communicator, DeviceBuffer, ReduceOp, Result};

#[stepgraph::step(streams(main, aux_iqn, aux_attn, comm))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub features: DeviceBuffer<f32>,
        pub iqn_grad: DeviceBuffer<f32>,
        pub attn_grad: DeviceBuffer<f32>,
        pub trunk_grad: DeviceBuffer<f32>,
        pub comm: Communicator,
        pub params: DeviceBuffer<f32>,
    }

    fn trunk_forward(s: &CaptureStream<'_>, features: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(features)
    }

    #[stream(aux_iqn)]
    fn iqn_backward(s: &CaptureStream<'_>, features: &DeviceBuffer<f32>, iqn_grad: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(features, iqn_grad)
    }

    #[stream(aux_attn)]
    fn attn_backward(s: &CaptureStream<'_>, features: &DeviceBuffer<f32>, attn_grad: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(features, attn_grad)
    }

    // `&mut` reads and writes: the bucket's writer on another stream must be named, so
    // that the cross-stream hand-over is a decision, not an accident.
    #[stream(comm)]
    #[join(aux_iqn)]
    fn reduce_iqn(s: &CaptureStream<'_>, comm: &mut Communicator, iqn_grad: &mut DeviceBuffer<f32>) -> Result<()> {
        s.all_reduce(comm, &mut [iqn_grad], ReduceOp::Avg)
    }

    #[stream(comm)]
    #[join(aux_attn)]
    fn reduce_attn(s: &CaptureStream<'_>, comm: &mut Communicator, attn_grad: &mut DeviceBuffer<f32>) -> Result<()> {
        s.all_reduce(comm, &mut [attn_grad], ReduceOp::Avg)
    }

    fn trunk_backward(s: &CaptureStream<'_>, features: &DeviceBuffer<f32>, trunk_grad: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(features, trunk_grad)
    }

    #[stream(comm)]
    #[join(main)]
    fn reduce_trunk(s: &CaptureStream<'_>, comm: &mut Communicator, trunk_grad: &mut DeviceBuffer<f32>) -> Result<()> {
        s.all_reduce(comm, &mut [trunk_grad], ReduceOp::Avg)
    }

    fn adam(s: &CaptureStream<'_>, iqn_grad: &DeviceBuffer<f32>, attn_grad: &DeviceBuffer<f32>, trunk_grad: &DeviceBuffer<f32>, params: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(iqn_grad, params)?;
        s.copy(attn_grad, params)?;
        s.copy(trunk_grad, params)
    }
}

fn main() {
    let plan = step::Step::plan();
    // Every conflicting access ordered, nothing independent ordered, without a GPU.
    let audit = plan.audit().unwrap();
    assert!(audit.conflicts_ordered > 0, "{audit:?}");
    let op = |name: &str| plan.ops.iter().position(|o| o.name == name).unwrap();
    let stream_of = |name: &str| plan.streams[plan.ops[op(name)].stream.index()].name;
    for reduce in ["reduce_iqn", "reduce_attn", "reduce_trunk"] {
        assert_eq!(stream_of(reduce), "comm");
    }
    // Each all-reduce waits for the backward that wrote its bucket, and for nothing else
    // on another stream: the IQN bucket's reduction overlaps the attention backward.
    let waits_on = |name: &str| -> Vec<&str> {
        plan.ops[op(name)]
            .waits
            .iter()
            .filter_map(|e| plan.events[e.index()].after)
            .map(|o| plan.ops[o.index()].name)
            .collect()
    };
    assert_eq!(waits_on("reduce_iqn"), ["iqn_backward"]);
    assert_eq!(waits_on("reduce_attn"), ["attn_backward"]);
    assert_eq!(waits_on("reduce_trunk"), ["trunk_backward"]);
    // The trunk's backward does not wait for any all-reduce.
    assert!(!waits_on("trunk_backward").iter().any(|w| w.starts_with("reduce_")));
    println!("{plan}");
}
