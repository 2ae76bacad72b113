//! The shape of the motivating DQN trainer: a trunk, four dueling branches on four
//! streams with per-branch GLU scratch, the double-DQN target and TD loss, IQL on the
//! origin stream, then IQN and Attention in parallel on their own streams, joined before
//! CQL and Adam.
use stepgraph::{CaptureStream, DeviceBuffer, Result};

type B = DeviceBuffer<f32>;

#[stepgraph::step(streams(main, branch[4], aux_iqn, aux_attn))]
mod dqn {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub state: B,
        pub trunk_act: B,
        #[per_branch]
        pub branch_adv: [B; 4],
        #[scratch(per_branch)]
        pub glu: B,
        pub q: B,
        pub target_q: B,
        pub td_loss: B,
        pub iql_value: B,
        pub iqn_loss: B,
        pub attn_loss: B,
        pub d_trunk_main: B,
        pub d_trunk_iqn: B,
        pub d_trunk_attn: B,
        #[per_branch]
        pub d_branch: [B; 4],
        pub cql: B,
        pub params: B,
    }

    #[cost(4.0)]
    fn trunk_forward(s: &CaptureStream<'_>, state: &B, params: &B, trunk_act: &mut B) -> Result<()> {
        let _ = params;
        s.copy(state, trunk_act)
    }
    #[stream(branch[d])]
    #[cost(2.0)]
    fn branch_forward(s: &CaptureStream<'_>, trunk_act: &B, #[out] glu: &mut B, branch_adv: &mut B) -> Result<()> {
        s.copy(trunk_act, glu)?;
        s.copy(glu, branch_adv)
    }
    #[join(branch)]
    fn dueling_combine(s: &CaptureStream<'_>, branch_adv: &[B; 4], q: &mut B) -> Result<()> {
        s.copy(&branch_adv[0], q)
    }
    #[cost(3.0)]
    fn double_dqn_target(s: &CaptureStream<'_>, state: &B, params: &B, target_q: &mut B) -> Result<()> {
        let _ = params;
        s.copy(state, target_q)
    }
    fn td_huber_loss(s: &CaptureStream<'_>, q: &B, target_q: &B, td_loss: &mut B) -> Result<()> {
        let _ = target_q;
        s.copy(q, td_loss)
    }
    #[stream(branch[d])]
    #[cost(2.0)]
    fn branch_backward(s: &CaptureStream<'_>, td_loss: &B, glu: &mut B, d_branch: &mut B) -> Result<()> {
        s.copy(td_loss, glu)?;
        s.copy(glu, d_branch)
    }
    fn iql_expectile_high(s: &CaptureStream<'_>, trunk_act: &B, iql_value: &mut B) -> Result<()> {
        s.copy(trunk_act, iql_value)
    }
    fn iql_expectile_low(s: &CaptureStream<'_>, trunk_act: &B, iql_value: &mut B) -> Result<()> {
        s.copy(trunk_act, iql_value)
    }
    #[stream(aux_iqn)]
    #[cost(6.0)]
    fn iqn_head(s: &CaptureStream<'_>, trunk_act: &B, iqn_loss: &mut B, d_trunk_iqn: &mut B) -> Result<()> {
        s.copy(trunk_act, iqn_loss)?;
        s.copy(trunk_act, d_trunk_iqn)
    }
    #[stream(aux_attn)]
    #[cost(5.0)]
    fn attention_head(s: &CaptureStream<'_>, state: &B, attn_loss: &mut B, d_trunk_attn: &mut B) -> Result<()> {
        s.copy(state, attn_loss)?;
        s.copy(state, d_trunk_attn)
    }
    #[join(aux_iqn, aux_attn)]
    fn cql_regulariser(s: &CaptureStream<'_>, q: &B, iqn_loss: &B, attn_loss: &B, cql: &mut B) -> Result<()> {
        let _ = (iqn_loss, attn_loss);
        s.copy(q, cql)
    }
    #[join(branch)]
    fn trunk_backward(s: &CaptureStream<'_>, d_branch: &[B; 4], d_trunk_iqn: &B, d_trunk_attn: &B, d_trunk_main: &mut B) -> Result<()> {
        let _ = (d_trunk_iqn, d_trunk_attn);
        s.copy(&d_branch[0], d_trunk_main)
    }
    #[cost(2.0)]
    fn clip_and_adam(s: &CaptureStream<'_>, d_trunk_main: &B, cql: &B, iql_value: &B, params: &mut B) -> Result<()> {
        let _ = (cql, iql_value);
        s.copy(d_trunk_main, params)
    }
}

fn main() {
    let plan = dqn::Step::plan();
    // Every conflicting access ordered, nothing independent ordered, without a GPU.
    let audit = plan.audit().unwrap();
    assert!(audit.conflicts_ordered > 0, "{audit:?}");
    // What the macro emits passes the executor's check of a plan.
    plan.check().unwrap();
    let op = |name: &str| plan.ops.iter().position(|o| o.name == name).unwrap();
    let iqn = op("iqn_head");
    let attn = op("attention_head");
    // IQN and Attention each wait only for the trunk, not for each other.
    assert_eq!(plan.ops[iqn].waits.len(), 1);
    assert_eq!(plan.ops[attn].waits.len(), 1);
    assert_ne!(plan.ops[iqn].stream, plan.ops[attn].stream);
    println!("{plan}");
}
