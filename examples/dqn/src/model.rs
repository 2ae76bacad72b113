//! The DQN step of MODEL.md as a stepgraph step: its buffers and its ops in program
//! order. The trunk and the losses run on `main`; the four branches on `branch[d]`; the
//! next-state forward passes on `ddqn`; IQN and Attention each on their own stream.

use stepgraph::{
    CaptureStream, Communicator, Device, DeviceBuffer, Epilogue, HostInput, HostOutput, MatmulArgs,
    ReduceOp, Result, SmTarget, StepBuffer,
};
use stepgraph_kernels::{
    ADAM_SCALARS, AdamHyper, AdamSlot, ParamEntry, ParamTable, column_sums_scratch_len,
};

use crate::kernels::{
    AttentionKernel, AttnFusedDims, AttnFusedGrads, AttnFusedInputs, AttnFusedWeights,
    AttnPoolInputs, AttnPoolOutputs, BranchHeadInputs, BranchHeadOutputs, DdqnTargetInputs,
    DuelingCoefficients, DuelingDims, DuelingInputs, DuelingOutputs, Expectile,
    ExpectileHeadInputs, ExpectileHeadOutputs, IqnFusedDims, IqnFusedInputs, IqnFusedKernel,
    IqnFusedOutputs, IqnInputs, IqnOutputs, Kernels, LOSS_SLOTS, TrunkDims, TrunkGrads,
    TrunkJoinOutputs, TrunkL1Inputs, TrunkL1Outputs, expectile_head_scratch_len,
    trunk_grad_join_scratch_len, trunk_l1_grad_scratch_len,
};

use crate::kernels::{TransitionRows, TransitionRowsMut, Watch};
use crate::replay::{BatchSource, Sampler};

use crate::layers::{
    Branch, BranchAct, BranchBack, Buf, D, Linear, Sizes, Trunk, TrunkAct, forward,
    input_grad_spec, linear_spec, mask1_len, param_grads, param_grads_wide, trunk_forward,
    weight_only_grad_spec,
};

/// The expectile (IQL) value heads, high then low: `we[1, H]`.
#[derive(Debug, StepBuffer)]
pub struct Iql {
    pub hi: Linear,
    pub lo: Linear,
}

/// The IQN head: the cosine embedding `wphi[H, C]` and the quantile output `wq[1, H]`.
#[derive(Debug, StepBuffer)]
pub struct Iqn {
    pub phi: Linear,
    pub q: Linear,
}

/// The attention head: embedding `wemb[E, S]`, fused `wqkv[3E, E]`, output `wo[E, E]`,
/// prediction `wp[1, E]`.
#[derive(Debug, StepBuffer)]
pub struct Attn {
    pub emb: Linear,
    pub qkv: Buf,
    pub o: Buf,
    pub p: Linear,
}

/// Every online parameter; also the shape of the gradients and of Adam's moments.
#[derive(Debug, StepBuffer)]
pub struct Model {
    pub trunk: Trunk,
    pub branch: [Branch; D],
    pub iql: Iql,
    pub iqn: Iqn,
    pub attn: Attn,
}

impl Iql {
    pub fn zeros(device: &Device, s: &Sizes, name: &str) -> Result<Iql> {
        Ok(Iql {
            hi: Linear::zeros(device, &format!("{name}.e_hi"), 1, s.hidden)?,
            lo: Linear::zeros(device, &format!("{name}.e_lo"), 1, s.hidden)?,
        })
    }
}

impl Iqn {
    pub fn zeros(device: &Device, s: &Sizes, name: &str) -> Result<Iqn> {
        Ok(Iqn {
            phi: Linear::zeros(device, &format!("{name}.phi"), s.hidden, s.cosines)?,
            q: Linear::zeros(device, &format!("{name}.q"), 1, s.hidden)?,
        })
    }
}

impl Attn {
    /// These parameters with the windows `win` and rewards `r`: what
    /// [`Kernels::attention_fused_tiles`] reads.
    pub fn fused_inputs<'a>(&'a self, win: &'a Buf, r: &'a Buf) -> AttnFusedInputs<'a> {
        AttnFusedInputs {
            win,
            weights: self.fused_weights(),
            bp: &self.p.b,
            r,
        }
    }

    /// The weights [`Kernels::attention_fused_finish`] reads (all but `bp`).
    pub fn fused_weights(&self) -> AttnFusedWeights<'_> {
        AttnFusedWeights {
            wemb: &self.emb.w,
            bemb: &self.emb.b,
            wqkv: &self.qkv,
            wo: &self.o,
            wp: &self.p.w,
        }
    }

    /// These gradients with the loss buffer `losses`: what
    /// [`Kernels::attention_fused_finish`] writes.
    pub fn fused_grads<'a>(&'a mut self, losses: &'a mut Buf) -> AttnFusedGrads<'a> {
        let Attn { emb, qkv, o, p } = self;
        AttnFusedGrads {
            dwemb: &mut emb.w,
            dbemb: &mut emb.b,
            dwqkv: qkv,
            dwo: o,
            dwp: &mut p.w,
            dbp: &mut p.b,
            losses,
        }
    }

    pub fn zeros(device: &Device, s: &Sizes, name: &str) -> Result<Attn> {
        Ok(Attn {
            emb: Linear::zeros(device, &format!("{name}.emb"), s.width, s.state)?,
            qkv: device.alloc_zeros(&format!("{name}.wqkv"), 3 * s.width * s.width)?,
            o: device.alloc_zeros(&format!("{name}.wo"), s.width * s.width)?,
            p: Linear::zeros(device, &format!("{name}.p"), 1, s.width)?,
        })
    }
}

/// The four branches' parameters (or gradients).
fn branches(device: &Device, s: &Sizes, name: &str) -> Result<[Branch; D]> {
    Ok([
        Branch::zeros(device, s, &format!("{name}.branch0"))?,
        Branch::zeros(device, s, &format!("{name}.branch1"))?,
        Branch::zeros(device, s, &format!("{name}.branch2"))?,
        Branch::zeros(device, s, &format!("{name}.branch3"))?,
    ])
}

impl Model {
    pub fn zeros(device: &Device, s: &Sizes, name: &str) -> Result<Model> {
        Ok(Model {
            trunk: Trunk::zeros(device, s, &format!("{name}.trunk"))?,
            branch: branches(device, s, name)?,
            iql: Iql::zeros(device, s, name)?,
            iqn: Iqn::zeros(device, s, name)?,
            attn: Attn::zeros(device, s, name)?,
        })
    }

    /// Every tensor with its name in MODEL.md (and in reference.py's files), in one
    /// fixed order.
    pub fn named(&self) -> Vec<(String, &Buf)> {
        named(&self.trunk, &self.branch, &self.iql, &self.iqn, &self.attn)
    }

    /// The same, writable.
    pub fn named_mut(&mut self) -> Vec<(String, &mut Buf)> {
        let Model {
            trunk,
            branch,
            iql,
            iqn,
            attn,
        } = self;
        tensors!(trunk, branch, iql, iqn, attn, mut)
    }
}

/// The model's tensors with their MODEL.md names, in one fixed order, borrowed shared or
/// (with a trailing `mut`) exclusive: one list, so the parameters, gradients and Adam
/// moments always line up.
macro_rules! tensors {
    ($trunk:ident, $branch:ident, $iql:ident, $iqn:ident, $attn:ident $(, $m:tt)?) => {{
        let mut out = vec![
            ("w1".to_string(), &$($m)? $trunk.l1.w),
            ("b1".to_string(), &$($m)? $trunk.l1.b),
            ("w2".to_string(), &$($m)? $trunk.l2.w),
            ("b2".to_string(), &$($m)? $trunk.l2.b),
            ("wv".to_string(), &$($m)? $trunk.v.w),
            ("bv".to_string(), &$($m)? $trunk.v.b),
        ];
        for (d, br) in $branch.into_iter().enumerate() {
            out.push((format!("wg.{d}"), &$($m)? br.gate.w));
            out.push((format!("bg.{d}"), &$($m)? br.gate.b));
            out.push((format!("wa.{d}"), &$($m)? br.adv.w));
            out.push((format!("ba.{d}"), &$($m)? br.adv.b));
        }
        out.extend([
            ("we_hi".to_string(), &$($m)? $iql.hi.w),
            ("be_hi".to_string(), &$($m)? $iql.hi.b),
            ("we_lo".to_string(), &$($m)? $iql.lo.w),
            ("be_lo".to_string(), &$($m)? $iql.lo.b),
            ("wphi".to_string(), &$($m)? $iqn.phi.w),
            ("bphi".to_string(), &$($m)? $iqn.phi.b),
            ("wq".to_string(), &$($m)? $iqn.q.w),
            ("bq".to_string(), &$($m)? $iqn.q.b),
            ("wemb".to_string(), &$($m)? $attn.emb.w),
            ("bemb".to_string(), &$($m)? $attn.emb.b),
            ("wqkv".to_string(), &$($m)? $attn.qkv),
            ("wo".to_string(), &$($m)? $attn.o),
            ("wp".to_string(), &$($m)? $attn.p.w),
            ("bp".to_string(), &$($m)? $attn.p.b),
        ]);
        out
    }};
}
use tensors;

/// The named tensors of a model held in parts (the gradients are split by the stream
/// that writes them).
pub fn named<'a>(
    trunk: &'a Trunk,
    branch: &'a [Branch; D],
    iql: &'a Iql,
    iqn: &'a Iqn,
    attn: &'a Attn,
) -> Vec<(String, &'a Buf)> {
    tensors!(trunk, branch, iql, iqn, attn)
}

/// One batch of transitions (MODEL.md's inputs) but the window of past states, which is
/// a buffer of its own (`win`): only the attention head reads it, so its gather runs on
/// the attention head's stream.
#[derive(Debug, StepBuffer)]
pub struct Batch {
    pub s: Buf,
    pub s2: Buf,
    pub act: DeviceBuffer<i32>,
    pub r: Buf,
    pub done: Buf,
    pub tau: Buf,
}

/// Scratch of a branch's next-state forward passes (online, then target).
#[derive(Debug, StepBuffer)]
pub struct GluTmp {
    /// `[B, 2G]`, the gate layer's output.
    pub u: Buf,
    /// `[B, G]` on the GEMM path; one element where `branch_head_forward` skips `g`.
    pub g: Buf,
}

impl stepgraph::AllocLike for GluTmp {
    fn alloc_like(&self, device: &Device, what: &str) -> Result<Self> {
        Ok(GluTmp {
            u: self.u.alloc_like(device, what)?,
            g: self.g.alloc_like(device, what)?,
        })
    }
}

/// The double-DQN targets `[B, D]` and their mean `[B]` (IQN's target).
#[derive(Debug, StepBuffer)]
pub struct Targets {
    pub y: Buf,
    pub ybar: Buf,
}

/// From the dueling losses: dL/dv `[B]` and the mean taken Q `[B]` (IQL's target).
#[derive(Debug, StepBuffer)]
pub struct Dueling {
    pub dv: Buf,
    pub qbar: Buf,
}

/// The IQL heads' outputs and their gradients, `[B]` each.
#[derive(Debug, StepBuffer)]
pub struct IqlAct {
    pub e_hi: Buf,
    pub e_lo: Buf,
    pub de_hi: Buf,
    pub de_lo: Buf,
    /// Partial sums of a head's gradients and loss ([`Kernels::expectile_head`], or the
    /// GEMM path's bias-gradient column sums): one head at a time, on one stream.
    pub scratch: Buf,
}

/// The IQN head's activations. `cosf`, `phi` and `dphi_pre` (`[B N, C]`, `[B N, H]`,
/// `[B N, H]`) are used only by the unfused path, for sizes the fused kernel does not take
/// ([`IqnFusedDims::supported`]); with the fused kernel they are one-element stand-ins.
#[derive(Debug, StepBuffer)]
pub struct IqnAct {
    pub cosf: Buf,
    pub phi: Buf,
    pub dphi_pre: Buf,
    pub dh: Buf,
    pub scratch: Buf,
}

/// The attention head's activations.
#[derive(Debug, StepBuffer)]
pub struct AttnAct {
    pub emb: Buf,
    pub qkv: Buf,
    pub probs: Buf,
    pub att: Buf,
    pub o: Buf,
    pub pred: Buf,
    pub d_o: Buf,
    pub datt: Buf,
    pub dqkv: Buf,
    pub demb: Buf,
    pub scratch: Buf,
    /// Partial sums of the embedding's bias gradient.
    pub bias_scratch: Buf,
}

/// The optimizer's state: Adam's moments, the pointer table, the norm, and lr and the
/// bias corrections: staged by the host before each replay (`scalars_in`, pinned and
/// double-buffered, so setting the next step's count never waits for the replay in
/// flight) and copied to `scalars` inside the graph.
#[derive(Debug, StepBuffer)]
pub struct Optim {
    pub m: Model,
    pub v: Model,
    pub table: ParamTable,
    pub sq_norm: Buf,
    pub scratch: Buf,
    pub scalars_in: HostInput<f32>,
    pub scalars: Buf,
}

/// The step's health (`Kernels::watch_step`): the watch words on the device, updated at
/// every replay, and their read-back, which the host reads a few replays late.
#[derive(Debug, StepBuffer)]
pub struct Health {
    pub watch: DeviceBuffer<u32>,
    pub watch_out: HostOutput<u32>,
}

/// Every buffer of one gradient bucket, for one all-reduce (an NCCL group) over it.
fn bucket<'a>(parts: impl IntoIterator<Item = &'a mut Linear>) -> Vec<&'a mut Buf> {
    parts
        .into_iter()
        .flat_map(|l| [&mut l.w, &mut l.b])
        .collect()
}

// With the fused head, attention holds its ATTENTION_HEAD_SMS from its start; at equal
// priority the step is a little faster. Measured on the H200 (attention on 66 SMs, IQN on
// 116): 0.855 ms at normal priority, 0.861 ms high, 0.927 ms low. On the H100 with the
// unfused head (PERF.md), high had paid: 1.686 ms against 1.706 ms. The unfused path
// (sizes the fused kernel does not take) was not measured again.
//
// `ddqn` is high priority: with each branch's target pass ahead of its online pass on the
// branch's stream, the double-DQN target, which IQN waits for, is ready earlier. Two rounds
// in one call on the H200: (c) 0.806, 0.807 ms before; `begin` on `ddqn` and `report` on
// `comm` 0.800, 0.801; then the target passes first 0.783, 0.782; with `ddqn` high 0.779,
// 0.780. In the next call 0.775, 0.773 against 0.801, 0.800; `main` high too 0.786, 0.785;
// `aux_attn` high too 0.778, 0.777; IQN on 112 or 108 SMs, or attention on 77, within
// 0.005 of it.
#[stepgraph::step(
    streams(main, branch[4], ddqn(high), aux_iqn, aux_attn, attn_wgrad(low), comm),
    kernels = Kernels,
    compare(auto),
    costs = "dqn.costs"
)]
pub mod dqn {
    use super::*;

    #[buffers]
    #[derive(Debug)]
    pub struct Buffers {
        /// The replay buffer the batch is drawn from, or the batch the host uploaded.
        pub source: BatchSource,
        pub sampler: Sampler,
        pub batch: Batch,
        /// `[B, W, S]`, the batch's windows of past states.
        pub win: Buf,
        pub params: Model,
        pub target: Model,
        pub act: TrunkAct,
        pub mask1: DeviceBuffer<u8>,
        pub next: TrunkAct,
        pub target_next: TrunkAct,
        #[per_branch]
        pub branch_act: [BranchAct; 4],
        #[per_branch]
        pub next_adv: [Buf; 4],
        #[per_branch]
        pub target_adv: [Buf; 4],
        #[scratch(per_branch)]
        pub glu_tmp: GluTmp,
        // Separate components, so that IQN waits only for the targets it reads.
        pub targets: Targets,
        pub dueling: Dueling,
        pub iql_act: IqlAct,
        #[per_branch]
        pub dadv: [Buf; 4],
        #[scratch(per_branch)]
        pub branch_back: BranchBack,
        #[per_branch]
        pub dh_branch: [Buf; 4],
        pub iqn_act: IqnAct,
        pub attn_act: AttnAct,
        pub dz2: Buf,
        pub dz1: Buf,
        /// Partial sums of the trunk's gradient join.
        pub trunk_scratch: Buf,
        pub trunk_grad: Trunk,
        #[per_branch]
        pub branch_grad: [Branch; 4],
        pub iql_grad: Iql,
        pub iqn_grad: Iqn,
        pub attn_grad: Attn,
        /// Loss slots (`LossSlot` in the kernels), one buffer per stream that adds into
        /// them: a buffer written from two streams would order them.
        pub losses: Buf,
        pub iqn_losses: Buf,
        pub attn_losses: Buf,
        /// Data parallel: the ranks' gradients are averaged bucket by bucket on the `comm`
        /// stream ([`Communicator::single`] when one process trains alone).
        pub comm: Communicator,
        pub optim: Optim,
        pub health: Health,
    }

    #[config]
    #[derive(Clone, Copy, Debug)]
    pub struct Config {
        pub sizes: Sizes,
        pub gamma: f32,
        pub hyper: AdamHyper,
        /// The replay buffer's generator: the seed of every draw.
        pub replay_seed: u64,
        /// K: the target network is updated at every K-th replay (K, 2K, ...).
        pub target_sync: u32,
        /// τ of the Polyak update `θ⁻ ← (1 − τ) θ⁻ + τ θ`, in (0, 1]; 0 copies `θ`.
        pub polyak: f32,
        /// The SMs each branch's matmuls are planned for: the whole GPU, or its share
        /// beside the other branches (`SmTarget::Share(BRANCH_WIDTH)`).
        pub branch_sms: SmTarget,
        /// The kernel of the fused IQN head; `None` takes what
        /// [`Kernels::iqn_fused_kernel`] picks for the sizes and the GPU.
        pub iqn_kernel: Option<IqnFusedKernel>,
        /// How the attention head runs; `None` takes what [`Kernels::attention_kernel`]
        /// picks for the sizes and the GPU.
        pub attention_kernel: Option<AttentionKernel>,
    }

    /// Zero the main losses and copy in lr and the bias corrections the host staged. On
    /// `ddqn`, whose first op waits for the batch anyway: on `main` it held the batch's
    /// draw, at the head of the critical path, back by its memset and copy.
    #[stream(ddqn)]
    fn begin(stream: &CaptureStream<'_>, losses: &mut Buf, optim: &mut Optim) -> Result<()> {
        stream.memset_zeros(losses)?;
        stream.stage(&optim.scalars_in, &mut optim.scalars)
    }

    /// The rows of this replay's batch and IQN's fractions, drawn inside the graph from
    /// the replay buffer's generator, which then moves its counter on. A host-fed batch
    /// has no rows to draw: the indices are zeroed, so nothing reads stale ones.
    fn draw_sample(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        replay_seed: u64,
        source: &BatchSource,
        sampler: &mut Sampler,
        batch: &mut Batch,
    ) -> Result<()> {
        match source {
            BatchSource::Replay(replay) => {
                let Sampler { counter, idx } = sampler;
                k.replay_draw(
                    stream,
                    counter,
                    idx,
                    &mut batch.tau,
                    replay_seed,
                    replay.capacity(),
                )?;
                k.replay_advance(stream, counter)
            }
            BatchSource::Host(_) => stream.memset_zeros(&mut sampler.idx),
        }
    }

    /// The batch's per-row tensors: the drawn rows of the replay buffer, or the host's
    /// batch (with its fractions) from the staging slots it filled last.
    fn load_batch(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        source: &BatchSource,
        sampler: &Sampler,
        batch: &mut Batch,
    ) -> Result<()> {
        match source {
            BatchSource::Replay(replay) => {
                let src = TransitionRows {
                    s: &replay.s,
                    s2: &replay.s2,
                    act: &replay.act,
                    r: &replay.r,
                    done: &replay.done,
                };
                let Batch {
                    s,
                    s2,
                    act,
                    r,
                    done,
                    tau: _,
                } = batch;
                let dst = TransitionRowsMut {
                    s,
                    s2,
                    act,
                    r,
                    done,
                };
                k.replay_gather(stream, &sampler.idx, src, dst, sizes.state, D)
            }
            BatchSource::Host(host) => {
                stream.stage(&host.s, &mut batch.s)?;
                stream.stage(&host.s2, &mut batch.s2)?;
                stream.stage(&host.act, &mut batch.act)?;
                stream.stage(&host.r, &mut batch.r)?;
                stream.stage(&host.done, &mut batch.done)?;
                stream.stage(&host.tau, &mut batch.tau)
            }
        }
    }

    /// The windows of past states, on the attention head's stream (only it reads them):
    /// the largest gather runs beside the trunk instead of before it.
    #[stream(aux_attn)]
    fn load_window(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        source: &BatchSource,
        sampler: &Sampler,
        win: &mut Buf,
    ) -> Result<()> {
        match source {
            BatchSource::Replay(replay) => k.replay_gather_rows(
                stream,
                &sampler.idx,
                &replay.win,
                win,
                sizes.window * sizes.state,
            ),
            BatchSource::Host(host) => stream.stage(&host.win, win),
        }
    }

    #[cost(3.0)]
    fn trunk_forward_s(
        stream: &CaptureStream<'_>,
        sizes: Sizes,
        batch: &Batch,
        params: &Model,
        act: &mut TrunkAct,
        mask1: &mut DeviceBuffer<u8>,
    ) -> Result<()> {
        trunk_forward(
            &stream.blas(),
            &sizes,
            &batch.s,
            &params.trunk,
            act,
            Some(mask1),
        )
    }

    /// The next state through the online and the target trunk, for the double-DQN target.
    #[stream(ddqn)]
    #[cost(6.0)]
    fn trunk_forward_next(
        stream: &CaptureStream<'_>,
        sizes: Sizes,
        batch: &Batch,
        params: &Model,
        target: &Model,
        next: &mut TrunkAct,
        target_next: &mut TrunkAct,
    ) -> Result<()> {
        let blas = stream.blas();
        trunk_forward(&blas, &sizes, &batch.s2, &params.trunk, next, None)?;
        trunk_forward(&blas, &sizes, &batch.s2, &target.trunk, target_next, None)
    }

    #[stream(branch[d])]
    #[cost(2.0)]
    fn branch_forward_next(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        d: usize,
        sizes: Sizes,
        branch_sms: SmTarget,
        params: &Model,
        target: &Model,
        next: &TrunkAct,
        target_next: &TrunkAct,
        #[out] glu_tmp: &mut GluTmp,
        next_adv: &mut Buf,
        target_adv: &mut Buf,
    ) -> Result<()> {
        branch_pass(
            stream,
            k,
            &sizes,
            branch_sms,
            &params.branch[d],
            &next.h,
            &mut glu_tmp.u,
            GluOut::Scratch(&mut glu_tmp.g),
            next_adv,
        )?;
        branch_pass(
            stream,
            k,
            &sizes,
            branch_sms,
            &target.branch[d],
            &target_next.h,
            &mut glu_tmp.u,
            GluOut::Scratch(&mut glu_tmp.g),
            target_adv,
        )
    }

    #[stream(branch[d])]
    #[cost(2.0)]
    #[allow(clippy::too_many_arguments)]
    fn branch_forward(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        d: usize,
        sizes: Sizes,
        branch_sms: SmTarget,
        params: &Model,
        act: &TrunkAct,
        branch_act: &mut BranchAct,
    ) -> Result<()> {
        branch_pass(
            stream,
            k,
            &sizes,
            branch_sms,
            &params.branch[d],
            &act.h,
            &mut branch_act.u,
            GluOut::Keep(&mut branch_act.g),
            &mut branch_act.adv,
        )
    }

    fn double_dqn_target(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        gamma: f32,
        batch: &Batch,
        next: &TrunkAct,
        target_next: &TrunkAct,
        next_adv: &[Buf; 4],
        target_adv: &[Buf; 4],
        targets: &mut Targets,
    ) -> Result<()> {
        let inputs = DdqnTargetInputs {
            v2: &next.v,
            adv2: next_adv,
            vt: &target_next.v,
            advt: target_adv,
            r: &batch.r,
            done: &batch.done,
        };
        k.ddqn_target(
            stream,
            dueling_dims(&sizes),
            &inputs,
            gamma,
            &mut targets.y,
            &mut targets.ybar,
        )
    }

    /// TD, CQL and agreement losses with their gradients in one kernel. CQL and the
    /// agreement term are functions of q like TD, so they are fused here: the branches'
    /// backward then starts without waiting for the auxiliary heads.
    fn dueling_losses(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Batch,
        act: &TrunkAct,
        branch_act: &[BranchAct; 4],
        targets: &Targets,
        dueling: &mut Dueling,
        dadv: &mut [Buf; 4],
        losses: &mut Buf,
    ) -> Result<()> {
        let adv = advantages(branch_act);
        let inputs = DuelingInputs {
            v: &act.v,
            adv: &adv,
            act: &batch.act,
            y: &targets.y,
        };
        let out = DuelingOutputs {
            dv: &mut dueling.dv,
            dadv,
            qbar: &mut dueling.qbar,
            losses,
        };
        k.dueling_losses(
            stream,
            dueling_dims(&sizes),
            &inputs,
            DuelingCoefficients::default(),
            out,
        )
    }

    #[stream(branch[d])]
    #[cost(3.0)]
    fn branch_backward(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        d: usize,
        sizes: Sizes,
        branch_sms: SmTarget,
        params: &Model,
        branch_act: &BranchAct,
        dadv: &Buf,
        #[out] branch_back: &mut BranchBack,
        branch_grad: &mut Branch,
        dh_branch: &mut Buf,
    ) -> Result<()> {
        let s = sizes;
        let blas = stream.blas().planned_for(branch_sms);
        let p = &params.branch[d];
        let head = s.branch_head();
        if head.supported() {
            // The advantage layer, the GLU and the gate layer's bias gradient in one pass
            // over the rows: two kernels where cuBLASLt took six, four of them one- to
            // eight-block reductions that ran long on the branch's critical path.
            let inputs = BranchHeadInputs {
                dadv,
                u: &branch_act.u,
                g: &branch_act.g,
                wa: &p.adv.w,
            };
            let out = BranchHeadOutputs {
                du: &mut branch_back.du,
                dwa: &mut branch_grad.adv.w,
                dba: &mut branch_grad.adv.b,
                dbg: &mut branch_grad.gate.b,
            };
            k.branch_head_backward(stream, head, &inputs, out, &mut branch_back.partials)?;
        } else {
            // Advantage head: dwa, dba, then dg = dadv wa.
            param_grads(
                &blas,
                dadv,
                &branch_act.g,
                &mut branch_grad.adv,
                s.batch,
                s.glu,
                s.actions,
            )?;
            let spec = input_grad_spec(s.batch, s.glu, s.actions, Epilogue::Default);
            blas.matmul(
                &spec,
                dadv,
                &p.adv.w,
                &mut branch_back.dg,
                MatmulArgs::new(),
            )?;
            // GLU; the gate layer's gradients are branch_wgrad's.
            k.glu_backward(
                stream,
                &branch_act.u,
                &branch_back.dg,
                &mut branch_back.du,
                s.batch,
                s.glu,
            )?;
        }
        // The branch's part of dh.
        let spec = input_grad_spec(s.batch, s.hidden, 2 * s.glu, Epilogue::Default);
        blas.matmul(
            &spec,
            &branch_back.du,
            &p.gate.w,
            dh_branch,
            MatmulArgs::new(),
        )
    }

    /// The gate layer's weight gradient (and, where the fused head did not write it, its
    /// bias gradient), after `branch_backward` on the branch's stream. An op of its own so
    /// that the trunk's backward, which needs only `dh_branch`, does not wait for it: while
    /// IQN holds most SMs, the branches' kernels run on the few left, and this product
    /// (a split-K GEMM and its reduction) had kept the trunk's backward waiting after IQN
    /// had ended.
    #[stream(branch[d])]
    fn branch_wgrad(
        stream: &CaptureStream<'_>,
        sizes: Sizes,
        branch_sms: SmTarget,
        act: &TrunkAct,
        branch_back: &BranchBack,
        branch_grad: &mut Branch,
    ) -> Result<()> {
        let s = sizes;
        let blas = stream.blas().planned_for(branch_sms);
        if s.branch_head().supported() {
            let spec = weight_only_grad_spec(s.batch, s.hidden, 2 * s.glu);
            blas.matmul(
                &spec,
                &branch_back.du,
                &act.h,
                &mut branch_grad.gate.w,
                MatmulArgs::new(),
            )
        } else {
            param_grads(
                &blas,
                &branch_back.du,
                &act.h,
                &mut branch_grad.gate,
                s.batch,
                s.hidden,
                2 * s.glu,
            )
        }
    }

    /// Data parallel: the branches' gradients, averaged over the ranks as soon as the
    /// four branches' `branch_wgrad` (the last to write them) are done.
    #[stream(comm)]
    #[join(branch)]
    fn reduce_branches(
        stream: &CaptureStream<'_>,
        comm: &mut Communicator,
        branch_grad: &mut [Branch; 4],
    ) -> Result<()> {
        let mut bufs = bucket(
            branch_grad
                .iter_mut()
                .flat_map(|b| [&mut b.gate, &mut b.adv]),
        );
        stream.all_reduce(comm, &mut bufs, ReduceOp::Avg)
    }

    /// The high expectile head (τ = 0.7), then the low one on the same stream.
    fn iql_high(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        params: &Model,
        act: &TrunkAct,
        dueling: &Dueling,
        iql_act: &mut IqlAct,
        iql_grad: &mut Iql,
        losses: &mut Buf,
    ) -> Result<()> {
        let head = ExpectileHead {
            layer: &params.iql.hi,
            expectile: Expectile::HIGH,
            e: &mut iql_act.e_hi,
            de: &mut iql_act.de_hi,
            grad: &mut iql_grad.hi,
            scratch: &mut iql_act.scratch,
        };
        expectile_head(stream, k, &sizes, &act.h, &dueling.qbar, head, losses)
    }

    fn iql_low(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        params: &Model,
        act: &TrunkAct,
        dueling: &Dueling,
        iql_act: &mut IqlAct,
        iql_grad: &mut Iql,
        losses: &mut Buf,
    ) -> Result<()> {
        let head = ExpectileHead {
            layer: &params.iql.lo,
            expectile: Expectile::LOW,
            e: &mut iql_act.e_lo,
            de: &mut iql_act.de_lo,
            grad: &mut iql_grad.lo,
            scratch: &mut iql_act.scratch,
        };
        expectile_head(stream, k, &sizes, &act.h, &dueling.qbar, head, losses)
    }

    /// Data parallel: the IQL heads' gradients.
    #[stream(comm)]
    #[join(main)]
    fn reduce_iql(
        stream: &CaptureStream<'_>,
        comm: &mut Communicator,
        iql_grad: &mut Iql,
    ) -> Result<()> {
        let mut bufs = bucket([&mut iql_grad.hi, &mut iql_grad.lo]);
        stream.all_reduce(comm, &mut bufs, ReduceOp::Avg)
    }

    /// IQN: cosine embedding, quantile Huber loss against ȳ, and the gradients: one fused
    /// kernel where the sizes allow, else the features, two GEMMs and the fused loss kernel.
    #[stream(aux_iqn)]
    #[cost(8.0)]
    fn iqn_head(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Batch,
        params: &Model,
        act: &TrunkAct,
        targets: &Targets,
        iqn_act: &mut IqnAct,
        iqn_grad: &mut Iqn,
        iqn_losses: &mut Buf,
        iqn_kernel: Option<IqnFusedKernel>,
    ) -> Result<()> {
        let s = sizes;
        stream.memset_zeros(iqn_losses)?;
        let fused = iqn_fused_dims(&s);
        if fused.supported() {
            let inputs = IqnFusedInputs {
                h: &act.h,
                tau: &batch.tau,
                ybar: &targets.ybar,
                wphi: &params.iqn.phi.w,
                bphi: &params.iqn.phi.b,
                wq: &params.iqn.q.w,
                bq: &params.iqn.q.b,
            };
            let out = IqnFusedOutputs {
                dh: &mut iqn_act.dh,
                dwphi: &mut iqn_grad.phi.w,
                dbphi: &mut iqn_grad.phi.b,
                dwq: &mut iqn_grad.q.w,
                dbq: &mut iqn_grad.q.b,
                losses: iqn_losses,
            };
            let kernel = iqn_kernel.unwrap_or_else(|| k.iqn_fused_kernel(fused));
            return k.iqn_fused_with(
                kernel,
                stream,
                fused,
                &inputs,
                0.5,
                out,
                &mut iqn_act.scratch,
            );
        }
        let blas = stream.blas();
        let rows = s.batch * s.quantiles;
        k.iqn_cos_features(stream, &batch.tau, &mut iqn_act.cosf, s.cosines)?;
        forward(
            &blas,
            &iqn_act.cosf,
            &params.iqn.phi,
            &mut iqn_act.phi,
            rows,
            s.cosines,
            s.hidden,
            Epilogue::ReluBias,
        )?;
        let inputs = IqnInputs {
            h: &act.h,
            phi: &iqn_act.phi,
            wq: &params.iqn.q.w,
            bq: &params.iqn.q.b,
            ybar: &targets.ybar,
            tau: &batch.tau,
        };
        let out = IqnOutputs {
            dphi_pre: &mut iqn_act.dphi_pre,
            dh: &mut iqn_act.dh,
            dwq: &mut iqn_grad.q.w,
            dbphi: &mut iqn_grad.phi.b,
            dbq: &mut iqn_grad.q.b,
            losses: iqn_losses,
        };
        k.iqn_forward_backward(
            stream,
            fused.unfused(),
            &inputs,
            0.5,
            out,
            &mut iqn_act.scratch,
        )?;
        // dwphi = dphi_preᵀ cosf (the kernel summed dbphi itself).
        let spec = weight_only_grad_spec(rows, s.cosines, s.hidden);
        blas.matmul(
            &spec,
            &iqn_act.dphi_pre,
            &iqn_act.cosf,
            &mut iqn_grad.phi.w,
            MatmulArgs::new(),
        )
    }

    /// Data parallel: the IQN head's gradients, while attention and the trunk's backward
    /// still run.
    #[stream(comm)]
    #[join(aux_iqn)]
    fn reduce_iqn(
        stream: &CaptureStream<'_>,
        comm: &mut Communicator,
        iqn_grad: &mut Iqn,
    ) -> Result<()> {
        let mut bufs = bucket([&mut iqn_grad.phi, &mut iqn_grad.q]);
        stream.all_reduce(comm, &mut bufs, ReduceOp::Avg)
    }

    /// Multi-head self-attention over the window of past states, predicting the reward.
    /// At the step's sizes on Hopper, the weights folded (`attention_fused_fold`) and one
    /// kernel (`attention_fused`) run the whole head, forward and backward, leaving the
    /// fold and each block's partial sums in the scratch for `attention_wgrad` to make the
    /// gradients from; elsewhere, the unfused path of GEMMs and attention kernels.
    #[stream(aux_attn)]
    #[cost(4.0)]
    fn attention_head(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Batch,
        win: &Buf,
        params: &Model,
        attn_act: &mut AttnAct,
        attn_grad: &mut Attn,
        attn_losses: &mut Buf,
        attention_kernel: Option<AttentionKernel>,
    ) -> Result<()> {
        let s = sizes;
        let a = &params.attn;
        let x = attn_act;
        stream.memset_zeros(attn_losses)?;
        let fused = attn_fused_dims(&s);
        if attention_path(k, &s, attention_kernel) == AttentionKernel::Fused {
            let inputs = a.fused_inputs(win, &batch.r);
            // The gradients and the loss: attention_fused_finish, in attention_wgrad.
            return k.attention_fused_tiles(
                stream,
                fused,
                &inputs,
                ATTN_LOSS_COEF,
                &mut x.pred,
                &mut x.scratch,
            );
        }
        attention_unfused_head(
            stream,
            k,
            fused,
            win,
            &batch.r,
            a,
            x,
            &mut attn_grad.p,
            attn_losses,
        )
    }

    /// The attention head's weight gradients: long-K GEMMs whose grids fill half the GPU,
    /// needed only by the update at the end of the step. On a low-priority stream of their
    /// own they fill what the trunk's backward and the heads leave idle instead of
    /// lengthening the forward phase, where attention runs beside the chain. On the fused
    /// path, the finish that adds `attention_fused`'s partial rows into the gradients and
    /// the loss.
    #[stream(attn_wgrad)]
    #[join(aux_attn)]
    #[cost(2.0)]
    fn attention_wgrad(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        win: &Buf,
        params: &Model,
        attn_act: &mut AttnAct,
        attn_grad: &mut Attn,
        attn_losses: &mut Buf,
        attention_kernel: Option<AttentionKernel>,
    ) -> Result<()> {
        let s = sizes;
        let fused = attn_fused_dims(&s);
        if attention_path(k, &s, attention_kernel) == AttentionKernel::Fused {
            // The partial rows attention_head's kernel left in the scratch.
            let grads = attn_grad.fused_grads(attn_losses);
            return k.attention_fused_finish(
                stream,
                fused,
                &params.attn.fused_weights(),
                ATTN_LOSS_COEF,
                grads,
                &mut attn_act.scratch,
            );
        }
        attention_unfused_wgrad(stream, k, fused, win, attn_act, attn_grad)
    }

    /// Data parallel: the attention head's gradients.
    #[stream(comm)]
    #[join(attn_wgrad)]
    fn reduce_attention(
        stream: &CaptureStream<'_>,
        comm: &mut Communicator,
        attn_grad: &mut Attn,
    ) -> Result<()> {
        let Attn { emb, qkv, o, p } = attn_grad;
        let mut bufs = bucket([emb, p]);
        bufs.extend([qkv, o]);
        stream.all_reduce(comm, &mut bufs, ReduceOp::Avg)
    }

    /// The trunk's backward: every head's part of dh through the last ReLU, then the two
    /// layers (layer 1's ReLU through the mask its forward saved).
    #[cost(4.0)]
    fn trunk_backward(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Batch,
        params: &Model,
        act: &TrunkAct,
        mask1: &DeviceBuffer<u8>,
        dueling: &Dueling,
        iql_act: &IqlAct,
        dh_branch: &[Buf; 4],
        iqn_act: &IqnAct,
        dz2: &mut Buf,
        dz1: &mut Buf,
        trunk_scratch: &mut Buf,
        trunk_grad: &mut Trunk,
    ) -> Result<()> {
        let s = sizes;
        let blas = stream.blas();
        let grads = TrunkGrads {
            h_out: &act.h,
            dv: &dueling.dv,
            wv: &params.trunk.v.w,
            dh_branch,
            de_hi: &iql_act.de_hi,
            we_hi: &params.iql.hi.w,
            de_lo: &iql_act.de_lo,
            we_lo: &params.iql.lo.w,
            dh_iqn: &iqn_act.dh,
        };
        let dims = TrunkDims {
            batch: s.batch,
            hidden: s.hidden,
            branches: D,
        };
        // dz2 and, from the same reads, layer 2's bias gradient and the value head's
        // gradients: two kernels where the serial tail had five (the old join, and
        // cuBLASLt's gemv, split-K reduction and two bias-gradient epilogues).
        let out = TrunkJoinOutputs {
            db2: &mut trunk_grad.l2.b,
            dwv: &mut trunk_grad.v.w,
            dbv: &mut trunk_grad.v.b,
        };
        k.trunk_grad_join(stream, dims, &grads, dz2, trunk_scratch, out)?;
        let spec = weight_only_grad_spec(s.batch, s.hidden, s.hidden);
        blas.matmul(&spec, dz2, &act.h1, &mut trunk_grad.l2.w, MatmulArgs::new())?;
        if s.trunk_l1().supported() {
            // dh1 = dz2 w2 as a plain GEMM, then one kernel for the ReLU, dw1 and db1:
            // three kernels where cuBLASLt ran the GEMM's ReLU-mask epilogue as a kernel
            // of its own (writing dz1), the dw1 GEMM and its split-K reduction.
            let spec = input_grad_spec(s.batch, s.hidden, s.hidden, Epilogue::Default);
            let dh1 = dz1;
            blas.matmul(&spec, dz2, &params.trunk.l2.w, dh1, MatmulArgs::new())?;
            let inputs = TrunkL1Inputs {
                dh1,
                h1: &act.h1,
                s: &batch.s,
            };
            let out = TrunkL1Outputs {
                dw1: &mut trunk_grad.l1.w,
                db1: &mut trunk_grad.l1.b,
            };
            return k.trunk_l1_grad(stream, s.trunk_l1(), &inputs, trunk_scratch, out);
        }
        let spec = input_grad_spec(s.batch, s.hidden, s.hidden, Epilogue::DReluBgrad);
        blas.matmul(
            &spec,
            dz2,
            &params.trunk.l2.w,
            dz1,
            MatmulArgs::new()
                .relu_mask(mask1)
                .bias_grad(&mut trunk_grad.l1.b),
        )?;
        let spec = weight_only_grad_spec(s.batch, s.state, s.hidden);
        blas.matmul(
            &spec,
            dz1,
            &batch.s,
            &mut trunk_grad.l1.w,
            MatmulArgs::new(),
        )
    }

    /// Data parallel: the trunk's gradients, last (every head's backward feeds them).
    #[stream(comm)]
    #[join(main)]
    fn reduce_trunk(
        stream: &CaptureStream<'_>,
        comm: &mut Communicator,
        trunk_grad: &mut Trunk,
    ) -> Result<()> {
        let mut bufs = bucket([&mut trunk_grad.l1, &mut trunk_grad.l2, &mut trunk_grad.v]);
        stream.all_reduce(comm, &mut bufs, ReduceOp::Avg)
    }

    /// Global-norm clipping and Adam over every parameter, with the step's watch in
    /// between: a replay whose losses or gradients are not finite is latched for the host,
    /// and neither it nor any later replay is applied.
    #[cost(2.0)]
    #[allow(clippy::too_many_arguments)]
    fn clip_and_adam(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        hyper: AdamHyper,
        trunk_grad: &Trunk,
        branch_grad: &[Branch; 4],
        iql_grad: &Iql,
        iqn_grad: &Iqn,
        attn_grad: &Attn,
        losses: &Buf,
        iqn_losses: &Buf,
        attn_losses: &Buf,
        params: &mut Model,
        optim: &mut Optim,
        health: &mut Health,
    ) -> Result<()> {
        let grads = named(trunk_grad, branch_grad, iql_grad, iqn_grad, attn_grad);
        let grad_refs: Vec<&Buf> = grads.iter().map(|(_, g)| *g).collect();
        let Optim {
            m,
            v,
            table,
            sq_norm,
            scratch,
            scalars_in: _,
            scalars,
        } = optim;
        k.generic
            .grad_sq_norm(stream, table, &grad_refs, scratch, sq_norm)?;
        k.watch_step(
            stream,
            table,
            [losses, iqn_losses, attn_losses],
            sq_norm,
            &mut health.watch,
        )?;
        let mut slots: Vec<AdamSlot<'_>> = params
            .named_mut()
            .into_iter()
            .zip(grad_refs)
            .zip(m.named_mut().into_iter().zip(v.named_mut()))
            .map(|(((_, param), grad), ((_, m), (_, v)))| AdamSlot { param, grad, m, v })
            .collect();
        k.generic
            .adam_clip_update(stream, table, &mut slots, sq_norm, scalars, hyper)
    }

    /// The watch back to the host, into the next of its pinned slots: the host reads it
    /// every few replays without waiting for the GPU. On `comm`, whose reductions are
    /// done by then, so that it runs beside the target's update instead of after it;
    /// it writes `health` as `clip_and_adam` does (the watch words, then their slot), so
    /// it joins `main` after that op, which comes before `update_target` here.
    #[stream(comm)]
    #[join(main)]
    fn report(stream: &CaptureStream<'_>, health: &mut Health) -> Result<()> {
        let Health { watch, watch_out } = health;
        stream.read_back(&*watch, watch_out)
    }

    /// The target network from the online one, at every `target_sync`-th replay (a
    /// conditional node): a copy of every tensor, or with `polyak = τ` the Polyak update
    /// `θ⁻ ← (1 − τ) θ⁻ + τ θ` (`fmaf(τ, θ, (1 − τ) θ⁻)`, `axpby`).
    #[every(target_sync)]
    fn update_target(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        polyak: f32,
        params: &Model,
        target: &mut Model,
    ) -> Result<()> {
        for ((_, p), (_, t)) in params.named().into_iter().zip(target.named_mut()) {
            if polyak == 0.0 {
                stream.copy(p, t)?;
            } else {
                k.generic.axpby(stream, p, t, polyak, 1.0 - polyak)?;
            }
        }
        Ok(())
    }
}

/// Where a branch pass puts the GLU's output `g[B, G]`.
enum GluOut<'a> {
    /// The backward reads it: written on every path.
    Keep(&'a mut Buf),
    /// Only `adv` is needed (the next-state passes): the fused kernel skips `g`, the GEMM
    /// path writes it here on its way.
    Scratch(&'a mut Buf),
}

/// `u = h wgᵀ + bg`, `g = glu(u)`, `adv = g waᵀ + ba`: the gate layer's GEMM, then the GLU
/// and the advantage layer in one kernel where the sizes allow; the matmuls planned for
/// `sms`.
#[allow(clippy::too_many_arguments)]
fn branch_pass(
    stream: &CaptureStream<'_>,
    k: &Kernels,
    s: &Sizes,
    sms: SmTarget,
    p: &Branch,
    h: &Buf,
    u: &mut Buf,
    g: GluOut<'_>,
    adv: &mut Buf,
) -> Result<()> {
    let blas = stream.blas().planned_for(sms);
    forward(
        &blas,
        h,
        &p.gate,
        u,
        s.batch,
        s.hidden,
        2 * s.glu,
        Epilogue::Bias,
    )?;
    let head = s.branch_head();
    if head.supported() {
        let keep = match g {
            GluOut::Keep(g) => Some(g),
            GluOut::Scratch(_) => None,
        };
        return k.branch_head_forward(stream, head, u, &p.adv.w, &p.adv.b, keep, adv);
    }
    let (GluOut::Keep(g) | GluOut::Scratch(g)) = g;
    k.glu_forward(stream, u, g, s.batch, s.glu)?;
    forward(
        &blas,
        g,
        &p.adv,
        adv,
        s.batch,
        s.glu,
        s.actions,
        Epilogue::Bias,
    )
}

/// One IQL head's parameters, outputs and gradients.
struct ExpectileHead<'a> {
    layer: &'a Linear,
    expectile: Expectile,
    e: &'a mut Buf,
    de: &'a mut Buf,
    grad: &'a mut Linear,
    /// The fused kernel's partial sums, or the GEMM path's bias-gradient partials.
    scratch: &'a mut Buf,
}

/// `e = h weᵀ + be`, the expectile loss against q̄ and its gradient, and the head's
/// parameter gradients (its part of dh is folded into the trunk join): one pass over `h`
/// where the sizes allow, else cuBLASLt's GEMMs around the loss kernel.
fn expectile_head(
    stream: &CaptureStream<'_>,
    k: &Kernels,
    s: &Sizes,
    h: &Buf,
    qbar: &Buf,
    head: ExpectileHead<'_>,
    losses: &mut Buf,
) -> Result<()> {
    let dims = s.expectile_head();
    if dims.supported() {
        let inputs = ExpectileHeadInputs {
            h,
            we: &head.layer.w,
            be: &head.layer.b,
            qbar,
        };
        let out = ExpectileHeadOutputs {
            e: head.e,
            de: head.de,
            dwe: &mut head.grad.w,
            dbe: &mut head.grad.b,
            losses,
        };
        return k.expectile_head(stream, dims, &inputs, head.expectile, out, head.scratch);
    }
    let blas = stream.blas();
    forward(
        &blas,
        h,
        head.layer,
        head.e,
        s.batch,
        s.hidden,
        1,
        Epilogue::Bias,
    )?;
    k.expectile_loss(stream, head.e, qbar, head.expectile, head.de, losses)?;
    param_grads_wide(
        &blas,
        stream,
        k,
        head.de,
        h,
        head.grad,
        s.batch,
        s.hidden,
        1,
        head.scratch,
    )
}

/// The weight of `L_attn` in the step's loss (MODEL.md: `0.1 L_attn`). The fused head's
/// two kernels must be given the same one, and the unfused head's pool takes it too.
pub const ATTN_LOSS_COEF: f32 = 0.1;

/// The unfused attention head's forward, pooled loss and data gradients on `stream`: the
/// embedding and QKV GEMMs, [`Kernels::attention_forward`], the output GEMM,
/// [`Kernels::attn_pool_loss`] (`pred`, `d_o`, `grad_p`, `L_attn` added into `losses`),
/// then back through the output GEMM, [`Kernels::attention_backward`] and the QKV GEMM to
/// `demb`, each into `x`. The other weight gradients are [`attention_unfused_wgrad`]'s.
#[allow(clippy::too_many_arguments)] // the head's inputs and outputs, one each
pub fn attention_unfused_head(
    stream: &CaptureStream<'_>,
    k: &Kernels,
    dims: AttnFusedDims,
    win: &Buf,
    r: &Buf,
    a: &Attn,
    x: &mut AttnAct,
    grad_p: &mut Linear,
    losses: &mut Buf,
) -> Result<()> {
    let blas = stream.blas();
    let (rows, e) = (dims.batch * dims.window, dims.width);
    forward(
        &blas,
        win,
        &a.emb,
        &mut x.emb,
        rows,
        dims.state,
        e,
        Epilogue::Bias,
    )?;
    let qkv = linear_spec(rows, e, 3 * e, Epilogue::Default);
    blas.matmul(&qkv, &x.emb, &a.qkv, &mut x.qkv, MatmulArgs::new())?;
    k.attention_forward(stream, dims.attention(), &x.qkv, &mut x.att, &mut x.probs)?;
    let out = linear_spec(rows, e, e, Epilogue::Default);
    blas.matmul(&out, &x.att, &a.o, &mut x.o, MatmulArgs::new())?;
    let inputs = AttnPoolInputs {
        o: &x.o,
        wp: &a.p.w,
        bp: &a.p.b,
        r,
    };
    let outputs = AttnPoolOutputs {
        pred: &mut x.pred,
        d_o: &mut x.d_o,
        dwp: &mut grad_p.w,
        dbp: &mut grad_p.b,
        losses,
    };
    k.attn_pool_loss(
        stream,
        dims.pool(),
        &inputs,
        ATTN_LOSS_COEF,
        outputs,
        &mut x.scratch,
    )?;
    let back = input_grad_spec(rows, e, e, Epilogue::Default);
    blas.matmul(&back, &x.d_o, &a.o, &mut x.datt, MatmulArgs::new())?;
    k.attention_backward(
        stream,
        dims.attention(),
        &x.qkv,
        &x.probs,
        &x.datt,
        &mut x.dqkv,
    )?;
    let back = input_grad_spec(rows, e, 3 * e, Epilogue::Default);
    blas.matmul(&back, &x.dqkv, &a.qkv, &mut x.demb, MatmulArgs::new())
}

/// The unfused attention head's weight gradients from [`attention_unfused_head`]'s
/// activations: `dwo`, `dwqkv`, and the embedding's weight and bias gradients, into
/// `grad` (whose `p` the head wrote).
pub fn attention_unfused_wgrad(
    stream: &CaptureStream<'_>,
    k: &Kernels,
    dims: AttnFusedDims,
    win: &Buf,
    x: &mut AttnAct,
    grad: &mut Attn,
) -> Result<()> {
    let blas = stream.blas();
    let (rows, e) = (dims.batch * dims.window, dims.width);
    let wgrad = |out, inp| weight_only_grad_spec(rows, inp, out);
    blas.matmul(&wgrad(e, e), &x.d_o, &x.att, &mut grad.o, MatmulArgs::new())?;
    blas.matmul(
        &wgrad(3 * e, e),
        &x.dqkv,
        &x.emb,
        &mut grad.qkv,
        MatmulArgs::new(),
    )?;
    param_grads_wide(
        &blas,
        stream,
        k,
        &x.demb,
        win,
        &mut grad.emb,
        rows,
        dims.state,
        e,
        &mut x.bias_scratch,
    )
}

/// How the step's attention head runs: `choice` (`Config::attention_kernel`), or where it
/// is `None`, what [`Kernels::attention_kernel`] picks for the sizes and the GPU. The ops
/// and [`allocate`]'s callers resolve it here, so that the buffers fit the path.
pub fn attention_path(k: &Kernels, s: &Sizes, choice: Option<AttentionKernel>) -> AttentionKernel {
    choice.unwrap_or_else(|| k.attention_kernel(attn_fused_dims(s)))
}

// The two persistent heads hold whole SMs (a block of each takes most of an SM's shared
// memory), so the SMs they are given are SMs the rest of the step waits for. Measured in
// one call on the H200 (PERF.md, "Streams, priorities and SMs"; (c) ms): attention on 132 / 88 /
// 66 / 44 SMs 0.902 / 0.871 / 0.871 / 0.926, and with attention on 66, IQN on 132 / 116 /
// 100 / 88 SMs 0.871 / 0.861 / 0.858 / 0.895.

/// The SMs the step gives the fused attention head: half the GPU. It runs beside the
/// forward chain (trunk and branches, then the double-DQN target), which keeps the other
/// half; on the whole GPU it takes 0.17 ms alone but leaves the chain waiting for SMs.
pub const ATTENTION_HEAD_SMS: u32 = 66;

/// The SMs the step gives `iqn_wgmma`: all but 16, which the four branches' backward and
/// the IQL heads fill while IQN runs, so that the trunk's backward can start when IQN ends.
pub const IQN_HEAD_SMS: u32 = 116;

/// The sizes of the step's fused attention head, on [`ATTENTION_HEAD_SMS`].
fn attn_fused_dims(s: &Sizes) -> AttnFusedDims {
    AttnFusedDims {
        batch: s.batch,
        state: s.state,
        window: s.window,
        width: s.width,
        heads: s.heads,
        sms: ATTENTION_HEAD_SMS,
    }
}

/// The sizes of the step's fused IQN head, on [`IQN_HEAD_SMS`].
fn iqn_fused_dims(s: &Sizes) -> IqnFusedDims {
    IqnFusedDims {
        batch: s.batch,
        quantiles: s.quantiles,
        hidden: s.hidden,
        cosines: s.cosines,
        sms: IQN_HEAD_SMS,
    }
}

fn dueling_dims(s: &Sizes) -> DuelingDims {
    DuelingDims {
        batch: s.batch,
        branches: D,
        actions: s.actions,
    }
}

/// The four branches' advantage buffers side by side, for kernels that take one buffer
/// per branch.
fn advantages(branch_act: &[BranchAct; 4]) -> [&Buf; 4] {
    [
        &branch_act[0].adv,
        &branch_act[1].adv,
        &branch_act[2].adv,
        &branch_act[3].adv,
    ]
}

impl dqn::Buffers {
    /// The state a step starts from, by kind (`param`, `adam_m`, `adam_v`: the names of
    /// `reference.py`'s directories) and MODEL.md name: every parameter and both of
    /// Adam's moments.
    pub fn state(&self) -> [(&'static str, Vec<(String, &Buf)>); 3] {
        [
            ("param", self.params.named()),
            ("adam_m", self.optim.m.named()),
            ("adam_v", self.optim.v.named()),
        ]
    }

    /// Every gradient with its MODEL.md name, in the parameters' order.
    pub fn grads(&self) -> Vec<(String, &Buf)> {
        named(
            &self.trunk_grad,
            &self.branch_grad,
            &self.iql_grad,
            &self.iqn_grad,
            &self.attn_grad,
        )
    }
}

/// Allocates every buffer of the step for `sizes`, with parameters zeroed (the caller
/// uploads initial values), drawing its batches from `source`; `comm` is this rank's
/// place among the data-parallel ranks. `attention` is the path the attention head will
/// run ([`attention_path`] of the step's `Config::attention_kernel`): the fused head keeps
/// its activations on chip, so the unfused head's `[B W, ·]` tensors (about 420 MB at the
/// default sizes) are allocated only for [`AttentionKernel::Unfused`]. A step allocated
/// for the fused head but configured to run the unfused one fails at capture, naming the
/// buffer that is too short.
pub fn allocate(
    device: &Device,
    s: &Sizes,
    source: BatchSource,
    comm: Communicator,
    attention: AttentionKernel,
) -> Result<dqn::Buffers> {
    let z = |what: &str, n: usize| device.alloc_zeros::<f32>(what, n);
    let (b, h) = (s.batch, s.hidden);
    let bw = b * s.window;
    let params = Model::zeros(device, s, "params")?;
    let m = Model::zeros(device, s, "adam.m")?;
    let v = Model::zeros(device, s, "adam.v")?;
    let trunk_grad = Trunk::zeros(device, s, "grad.trunk")?;
    let branch_grad = branches(device, s, "grad")?;
    let iql_grad = Iql::zeros(device, s, "grad")?;
    let iqn_grad = Iqn::zeros(device, s, "grad")?;
    let attn_grad = Attn::zeros(device, s, "grad")?;
    let entries = {
        let grads = named(&trunk_grad, &branch_grad, &iql_grad, &iqn_grad, &attn_grad);
        params
            .named()
            .into_iter()
            .zip(grads)
            .zip(m.named().into_iter().zip(v.named()))
            .map(|(((_, p), (_, g)), ((_, m), (_, v)))| ParamEntry::of(p, g, m, v))
            .collect::<Result<Vec<_>>>()?
    };
    let table = ParamTable::new(device, entries)?;
    let tensors = table.entries().len();
    let scratch = z("grad norm partials", table.blocks())?;
    let iqn = iqn_fused_dims(s);
    // The fused kernel keeps cosf, phi and dphi_pre on chip: the unfused path's [B N, ·]
    // tensors (1.2 GB at the default sizes) are allocated only when it runs.
    let (iqn_rows, iqn_scratch) = if iqn.supported() {
        (0, iqn.scratch_len())
    } else {
        (b * s.quantiles, iqn.unfused().scratch_len())
    };
    // A path's tensor where it does not run is one float: cuMemAlloc refuses 0 bytes.
    let at_least_one = |what: &str, n: usize| z(what, n.max(1));
    // Likewise the unfused attention head's activations (a float each for the fused head).
    let (attn_samples, attn_rows) = match attention {
        AttentionKernel::Fused => (0, 0),
        AttentionKernel::Unfused => (b, bw),
    };
    let attn = attn_fused_dims(s);
    let branch_act = |d: usize| BranchAct::zeros(device, s, &format!("branch{d}"));
    Ok(dqn::Buffers {
        source,
        sampler: Sampler::new(device, b)?,
        batch: Batch {
            s: z("s", b * s.state)?,
            s2: z("s2", b * s.state)?,
            act: device.alloc_zeros("act", b * D)?,
            r: z("r", b)?,
            done: z("done", b)?,
            tau: z("tau", b * s.quantiles)?,
        },
        win: z("win", bw * s.state)?,
        target: Model::zeros(device, s, "target")?,
        params,
        act: TrunkAct::zeros(device, s, "act")?,
        mask1: device.alloc_zeros("relu mask of layer 1", mask1_len(s))?,
        next: TrunkAct::zeros(device, s, "next")?,
        target_next: TrunkAct::zeros(device, s, "target_next")?,
        branch_act: [
            branch_act(0)?,
            branch_act(1)?,
            branch_act(2)?,
            branch_act(3)?,
        ],
        next_adv: [
            z("next_adv", b * s.actions)?,
            z("next_adv", b * s.actions)?,
            z("next_adv", b * s.actions)?,
            z("next_adv", b * s.actions)?,
        ],
        target_adv: [
            z("target_adv", b * s.actions)?,
            z("target_adv", b * s.actions)?,
            z("target_adv", b * s.actions)?,
            z("target_adv", b * s.actions)?,
        ],
        glu_tmp: GluTmp {
            u: z("glu_tmp.u", b * 2 * s.glu)?,
            // Written only on the GEMM path (branch_head_forward skips g where it is not
            // kept): a one-element stand-in otherwise.
            g: z(
                "glu_tmp.g",
                if s.branch_head().supported() {
                    1
                } else {
                    b * s.glu
                },
            )?,
        },
        targets: Targets {
            y: z("y", b * D)?,
            ybar: z("ybar", b)?,
        },
        dueling: Dueling {
            dv: z("dv", b)?,
            qbar: z("qbar", b)?,
        },
        iql_act: IqlAct {
            e_hi: z("e_hi", b)?,
            e_lo: z("e_lo", b)?,
            de_hi: z("de_hi", b)?,
            de_lo: z("de_lo", b)?,
            scratch: z(
                "iql partial sums",
                expectile_head_scratch_len(s.expectile_head()).max(column_sums_scratch_len(b, 1)),
            )?,
        },
        dadv: [
            z("dadv", b * s.actions)?,
            z("dadv", b * s.actions)?,
            z("dadv", b * s.actions)?,
            z("dadv", b * s.actions)?,
        ],
        branch_back: BranchBack::zeros(device, s)?,
        dh_branch: [
            z("dh_branch", b * h)?,
            z("dh_branch", b * h)?,
            z("dh_branch", b * h)?,
            z("dh_branch", b * h)?,
        ],
        iqn_act: IqnAct {
            cosf: at_least_one("iqn cosf", iqn_rows * s.cosines)?,
            phi: at_least_one("iqn phi", iqn_rows * h)?,
            dphi_pre: at_least_one("iqn dphi", iqn_rows * h)?,
            dh: z("iqn dh", b * h)?,
            scratch: at_least_one("iqn scratch", iqn_scratch)?,
        },
        attn_act: AttnAct {
            emb: at_least_one("attn emb", attn_rows * s.width)?,
            qkv: at_least_one("attn qkv", attn_rows * 3 * s.width)?,
            probs: at_least_one("attn probs", attn_samples * s.heads * s.window * s.window)?,
            att: at_least_one("attn att", attn_rows * s.width)?,
            o: at_least_one("attn o", attn_rows * s.width)?,
            pred: z("attn pred", b)?,
            d_o: at_least_one("attn d_o", attn_rows * s.width)?,
            datt: at_least_one("attn datt", attn_rows * s.width)?,
            dqkv: at_least_one("attn dqkv", attn_rows * 3 * s.width)?,
            demb: at_least_one("attn demb", attn_rows * s.width)?,
            // Either path's partial rows: a step allocated for the unfused head runs the
            // fused one too.
            scratch: z(
                "attn scratch",
                attn.pool().scratch_len().max(attn.scratch_len()),
            )?,
            // For the fused head (no rows), one chunk's partials: 64 floats.
            bias_scratch: z(
                "attn bias-gradient partials",
                column_sums_scratch_len(attn_rows, s.width),
            )?,
        },
        dz2: z("dz2", b * h)?,
        dz1: z("dz1", b * h)?,
        // The join's partials, then (the same op, later on its stream) layer 1's.
        trunk_scratch: z(
            "trunk gradient partials",
            trunk_grad_join_scratch_len(b, h).max(trunk_l1_grad_scratch_len(s.trunk_l1())),
        )?,
        trunk_grad,
        branch_grad,
        iql_grad,
        iqn_grad,
        attn_grad,
        losses: z("losses", LOSS_SLOTS)?,
        iqn_losses: z("iqn losses", LOSS_SLOTS)?,
        attn_losses: z("attn losses", LOSS_SLOTS)?,
        comm,
        optim: Optim {
            m,
            v,
            table,
            sq_norm: z("grad sq norm", 1)?,
            scratch,
            scalars_in: HostInput::new(device, "adam scalars (staged)", ADAM_SCALARS)?,
            scalars: z("adam scalars", ADAM_SCALARS)?,
        },
        health: Health {
            watch: device.alloc_zeros("watch", Watch::words(tensors))?,
            watch_out: HostOutput::new(device, "watch (read back)", Watch::words(tensors))?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::dqn;

    /// The step's plan, checked without a GPU: every conflicting access of the 38 ops
    /// ordered, nothing independent ordered.
    #[test]
    fn the_plan_orders_every_conflict_and_nothing_else() {
        assert_eq!(dqn::PLAN.ops.len(), 38);
        let audit = dqn::PLAN.audit().unwrap();
        assert!(audit.conflicts_ordered > 0, "{audit:?}");
        assert!(audit.independent_pairs > 0, "{audit:?}");
    }

    /// Every pair the planner orders only by a shared `&mut` buffer is one the step means
    /// to order: `begin` zeroes the losses the others add to, the two expectile heads
    /// share one stream and their scratch, and the collectives keep their order on one
    /// communicator (the report, which reads the health flags after Adam's step wrote
    /// them, says so with its `#[join(main)]`). A new pair here would be a scratch buffer
    /// shared by accident.
    #[test]
    fn every_pair_ordered_only_by_a_shared_buffer_is_meant() {
        let plan = &dqn::PLAN;
        let found: Vec<(&str, &str, &str)> = plan
            .shared_writes()
            .iter()
            .map(|w| {
                (
                    plan.ops[w.first.index()].name,
                    plan.ops[w.second.index()].name,
                    plan.buffer_name(w.buf),
                )
            })
            .collect();
        assert_eq!(
            found,
            [
                ("begin", "dueling_losses", "losses"),
                ("iql_high", "iql_low", "iql_act"),
                ("reduce_branches", "reduce_iql", "comm"),
                ("reduce_iql", "reduce_iqn", "comm"),
                ("reduce_iqn", "reduce_attention", "comm"),
                ("reduce_attention", "reduce_trunk", "comm"),
            ]
        );
    }

    fn op(name: &str) -> &'static stepgraph::plan::OpDesc {
        dqn::PLAN
            .ops
            .iter()
            .find(|o| o.name == name)
            .unwrap_or_else(|| panic!("no op {name}"))
    }

    /// The batch is drawn and loaded first, the window on the attention head's stream,
    /// and `begin` on another stream than the draw, which it would hold back; the target
    /// passes come before the online ones on each branch's stream (the double-DQN target,
    /// and IQN after it, wait for them); the watch's read-back and the target update,
    /// conditional on `target_sync`, come after Adam, side by side.
    #[test]
    fn the_batch_is_loaded_first_and_the_target_updated_last() {
        let names: Vec<&str> = dqn::PLAN.ops.iter().map(|o| o.name).collect();
        assert_eq!(
            names[..5],
            [
                "begin",
                "draw_sample",
                "load_batch",
                "load_window",
                "trunk_forward_s"
            ]
        );
        assert_eq!(
            names[names.len() - 3..],
            ["clip_and_adam", "report", "update_target"]
        );
        let stream = |o: &str| dqn::PLAN.streams[op(o).stream.index()].name;
        assert_eq!(stream("load_window"), stream("attention_head"));
        assert_eq!(stream("load_batch"), stream("trunk_forward_s"));
        assert_ne!(stream("begin"), stream("draw_sample"));
        assert_ne!(stream("report"), stream("update_target"));
        let at = |o: &str| names.iter().position(|n| *n == o).unwrap();
        for d in 0..4 {
            assert!(at(&format!("branch_forward_next[{d}]")) < at(&format!("branch_forward[{d}]")));
        }
        assert!(op("update_target").every.is_some());
        assert!(dqn::PLAN.ops.iter().filter(|o| o.every.is_some()).count() == 1);
    }
}
