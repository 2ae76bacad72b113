//! The SAC update step of MODEL.md as a stepgraph step: its buffers and its ops in
//! program order. Adam's clock, the batch drawn from the replay buffer, the noise and the
//! soft target are on `main`; each critic on its own stream of the group `critic[N]`, for
//! its update, the passes the actor's gradient takes through it and its Polyak update;
//! the actor and the temperature on `actor`.

use stepgraph::{CaptureStream, Device, DeviceBuffer, Result, SmTarget, StepBuffer};
use stepgraph_kernels::{
    AdamClock, AdamHyper, AdamSlot, DeviceRng, GatherTable, PairTable, ParamEntry, ParamTable,
    Substream,
};

use crate::kernels::{Buf, Kernels, MIN_CRITICS};
use crate::layers::{
    Linear, Mlp, MlpAct, MlpBack, MlpDims, Sizes, hidden_backward, hidden_forward, linear_grads,
    linear_grads_summed, mlp_backward, mlp_forward, relu_hidden_grad, relu_input_grad,
};

/// Transitions, row-major, `n` of them: both the replay buffer (`R` rows on the device,
/// filled before training) and each step's batch (MODEL.md's inputs, `B` rows gathered
/// from it).
#[derive(Debug, StepBuffer)]
pub struct Transitions {
    /// `[n, S]`.
    pub s: Buf,
    /// `[n, A]`, in (−1, 1).
    pub a: Buf,
    /// `[n]`.
    pub r: Buf,
    /// `[n, S]`.
    pub s2: Buf,
    /// `[n]`, 0 or 1.
    pub done: Buf,
}

impl Transitions {
    /// `rows` zeroed transitions for `sizes`, each field named `name.field`.
    pub fn zeros(device: &Device, name: &str, rows: usize, sizes: &Sizes) -> Result<Transitions> {
        let z = |field: &str, width: usize| {
            device.alloc_zeros::<f32>(&format!("{name}.{field}"), rows * width)
        };
        Ok(Transitions {
            s: z("s", sizes.obs)?,
            a: z("a", sizes.action)?,
            r: z("r", 1)?,
            s2: z("s2", sizes.obs)?,
            done: z("done", 1)?,
        })
    }

    /// Every field with its row length, in one order (`s, a, r, s2, done`).
    pub fn fields(&self, sizes: &Sizes) -> [(&Buf, usize); 5] {
        let (o, a) = (sizes.obs, sizes.action);
        [
            (&self.s, o),
            (&self.a, a),
            (&self.r, 1),
            (&self.s2, o),
            (&self.done, 1),
        ]
    }

    /// The same fields, writable.
    pub fn fields_mut(&mut self) -> [&mut Buf; 5] {
        let Transitions { s, a, r, s2, done } = self;
        [s, a, r, s2, done]
    }
}

/// The step's normals.
#[derive(Debug, StepBuffer)]
pub struct Noise {
    /// `ε' [B, A]`, for the next observations.
    pub next: Buf,
    /// `ε [B, A]`, for the current ones.
    pub cur: Buf,
}

/// A sample of the actor: its forward pass, the squashed action, its log-probability and
/// the critics' input `[obs, action]`.
#[derive(Debug, StepBuffer)]
pub struct Policy {
    /// The MLP's activations; `out` is the head `[B, 2A]` (mean, raw log_std).
    pub act: MlpAct,
    /// `â [B, A]`.
    pub action: Buf,
    /// `log π [B]`.
    pub logp: Buf,
    /// `[B, C]`: `[s, â]`.
    pub x: Buf,
}

/// A critic's training pass: forward at the batch, the loss and its gradient, the
/// backward's scratch.
#[derive(Debug, StepBuffer)]
pub struct CriticPass {
    pub act: MlpAct,
    /// `∂L_Q/∂Q [B]`.
    pub dq: Buf,
    pub back: MlpBack,
    /// `[1]`: `L_Q`.
    pub loss: Buf,
}

/// A critic's pass for the actor's gradient: forward at the actor's sample, then the
/// backward to its input of `−q / B`, the actor loss's gradient where this critic is the
/// smallest, at every row: the actor's backward takes each row from the smallest critic,
/// so that no critic's pass waits for the minimum over all of them.
#[derive(Debug, StepBuffer)]
pub struct ActorCriticPass {
    pub act: MlpAct,
    pub back: MlpBack,
    /// `[B, A]`: `∂(−q/B)/∂â`, the critic's input gradient at the action's columns (the
    /// actor needs no other).
    pub da: Buf,
}

/// The minimum over the critics' outputs and which critic gave it, per row.
#[derive(Debug, StepBuffer)]
pub struct CriticMin {
    /// `[B]`.
    pub q: Buf,
    /// `[B]`: the index of the smallest critic (the lowest on a tie).
    pub argmin: DeviceBuffer<u32>,
}

/// The actor loss: the critics' minimum at the actor's sample and `L_π`.
#[derive(Debug, StepBuffer)]
pub struct ActorLoss {
    pub min: CriticMin,
    /// `[1]`: `L_π`.
    pub loss: Buf,
}

/// The actor's backward at its head: the loss's gradient with respect to the action and
/// the head.
#[derive(Debug, StepBuffer)]
pub struct ActorBack {
    /// `∂L_π/∂â [B, A]` through the smallest critic, for more critics than
    /// [`MIN_CRITICS`] (fewer take it in the backward's launch).
    pub da: Buf,
    /// `[B]`: the running minimum beside `da`, for more critics than [`MIN_CRITICS`].
    pub qmin: Buf,
    /// `∂L_π/∂head [B, 2A]`.
    pub dhead: Buf,
}

/// One optimizer's state: Adam's moments, its parameter table, the norm and its partials.
#[derive(Debug, StepBuffer)]
pub struct Optim {
    pub m: Mlp,
    pub v: Mlp,
    pub table: ParamTable,
    pub sq_norm: Buf,
    pub scratch: Buf,
}

/// The temperature's loss, gradient and its norm, and the table its optimizer reads
/// (`log α` itself is a buffer of the step, read by many ops).
#[derive(Debug, StepBuffer)]
pub struct AlphaGrad {
    pub grad: Buf,
    pub loss: Buf,
    pub table: ParamTable,
    pub sq_norm: Buf,
    pub scratch: Buf,
}

/// The temperature's Adam moments.
#[derive(Debug, StepBuffer)]
pub struct Temperature {
    pub m: Buf,
    pub v: Buf,
}

/// The critics' activations at the next observations, under the target critics.
#[derive(Debug, StepBuffer)]
pub struct TargetPass {
    pub act: MlpAct,
}

/// Three layers' tensors in [`Mlp::tensors`]' order: `w1, b1, w2, b2, w3, b3`.
pub fn layer_tensors([l1, l2, l3]: [&Linear; 3]) -> [&Buf; 6] {
    [&l1.w, &l1.b, &l2.w, &l2.b, &l3.w, &l3.b]
}

/// One clipped Adam step over `params` from `grads` ([`Mlp::tensors`]' order).
fn adam(
    stream: &CaptureStream<'_>,
    k: &Kernels,
    hyper: AdamHyper,
    scalars: &DeviceBuffer<f32>,
    grads: [&Buf; 6],
    params: &mut Mlp,
    optim: &mut Optim,
) -> Result<()> {
    let Optim {
        m,
        v,
        table,
        sq_norm,
        scratch,
    } = optim;
    let mut slots: Vec<AdamSlot<'_>> = params
        .tensors_mut()
        .into_iter()
        .zip(grads)
        .zip(m.tensors_mut().into_iter().zip(v.tensors_mut()))
        .map(|((param, grad), (m, v))| AdamSlot { param, grad, m, v })
        .collect();
    // The norm finished in the update's blocks: one launch fewer on the chains that end
    // in an optimizer step.
    k.generic
        .grad_norm_adam(stream, table, &mut slots, scratch, sq_norm, scalars, hyper)
}

/// A critic's target pass at `[s2, a']`.
fn target_pass(
    s: &CaptureStream<'_>,
    d: MlpDims,
    x: &Buf,
    net: &Mlp,
    out: &mut TargetPass,
) -> Result<()> {
    mlp_forward(&s.blas(), d, x, net, &mut out.act)
}

/// A critic's training pass: forward at `[s, a]`, the MSE against `y`, the backward into
/// `grads` (`w2t`: `net`'s second layer's weights transposed).
#[allow(clippy::too_many_arguments)]
fn train_critic(
    s: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    x: &Buf,
    y: &Buf,
    net: &Mlp,
    w2t: &Buf,
    pass: &mut CriticPass,
    grads: &mut Mlp,
) -> Result<()> {
    let blas = s.blas();
    let CriticPass {
        act,
        dq,
        back,
        loss,
    } = pass;
    if !d.fused_head() {
        mlp_forward(&blas, d, x, net, act)?;
        k.mse_loss(s, &act.out, y, dq, loss)?;
        return mlp_backward(
            &blas,
            s,
            k,
            d,
            net,
            w2t,
            x,
            act,
            dq,
            back,
            Some(grads),
            None,
        );
    }
    // The output layer, the loss and their backward in one pass over h2 (PERF.md).
    hidden_forward(&blas, d, x, net, act)?;
    let MlpAct { h2, out, .. } = act;
    let Linear { w: gw, b: gb } = &mut grads.l3;
    k.critic_head(
        s,
        h2,
        &net.l3.w,
        &net.l3.b,
        y,
        out,
        dq,
        &mut back.dz2,
        &mut back.sums,
        gw,
        gb,
        loss,
        &mut grads.l2.b,
    )?;
    hidden_backward(&blas, s, k, d, net, w2t, x, act, back, Some(grads), None)
}

/// The Polyak update `target ← τ θ + (1 − τ) target` over the whole network in one
/// launch (`table` pairs `net`'s tensors with `target`'s).
fn polyak(
    s: &CaptureStream<'_>,
    k: &Kernels,
    tau: f32,
    table: &PairTable,
    net: &Mlp,
    target: &mut Mlp,
) -> Result<()> {
    let mut targets = target.tensors_mut();
    k.generic
        .axpby_table(s, table, &net.tensors(), &mut targets, tau, 1.0 - tau)
}

/// `w2t ← net.l2.wᵀ`: the second layer's weights in the layout of its input gradient's
/// matmul ([`relu_hidden_grad`]). Derived in the graph at every replay, from the weights
/// as they are then, not kept beside them: the host uploads the parameters after the
/// buffers are allocated and may upload them again between replays, and a stale copy
/// would train on weights the step no longer has.
fn transpose_l2(s: &CaptureStream<'_>, k: &Kernels, net: &Mlp, w2t: &mut Buf) -> Result<()> {
    let (out, inp) = (net.l2.b.len(), net.l2.w.len() / net.l2.b.len().max(1));
    k.transpose(s, &net.l2.w, w2t, out, inp)
}

/// The noise's and the batch's substreams of the step's generator: different, so that
/// the draws of one step are unrelated.
pub const NOISE_NEXT: Substream = Substream(0);
pub const NOISE_CUR: Substream = Substream(1);
pub const BATCH_ROWS: Substream = Substream(2);

/// The actor's sample at `obs` with `eps`, into `out`.
fn sample(
    s: &CaptureStream<'_>,
    k: &Kernels,
    sizes: Sizes,
    obs: &Buf,
    eps: &Buf,
    actor: &Mlp,
    out: &mut Policy,
) -> Result<()> {
    let Policy {
        act,
        action,
        logp,
        x,
    } = out;
    mlp_forward(&s.blas(), sizes.actor(), obs, actor, act)?;
    k.tanh_gauss_sample(s, &act.out, eps, action, logp, sizes.batch, sizes.action)?;
    k.concat_cols(s, obs, action, x, sizes.batch, sizes.obs, sizes.action)
}

/// A critic's pass for the actor: forward at the actor's sample, then the backward of
/// `dq` (`−1/B` at every row) to the action's columns of its input (no weight gradients;
/// `w2t`: `net`'s second layer's weights transposed).
#[allow(clippy::too_many_arguments)]
fn actor_critic_pass(
    s: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    x: &Buf,
    net: &Mlp,
    w2t: &Buf,
    dq: &Buf,
    pass: &mut ActorCriticPass,
) -> Result<()> {
    let blas = s.blas();
    let ActorCriticPass { act, back, da } = pass;
    hidden_forward(&blas, d, x, net, act)?;
    // The output layer and the gradient through the last ReLU in one pass over h2: `dq`
    // is given, so the gradient does not wait for the output (PERF.md).
    let MlpAct { h2, out, .. } = act;
    k.critic_q_relu_grad(s, h2, &net.l3.w, &net.l3.b, dq, out, &mut back.dz2)?;
    // The action is the input's last `A` columns, after the observation's `S`.
    let obs = d.inp - da.len() / d.rows;
    hidden_backward(
        &blas,
        s,
        k,
        d,
        net,
        w2t,
        x,
        act,
        back,
        None,
        Some((da, obs)),
    )
}

/// How many critics the step trains: one stream each (`critic[0]`, `critic[1]`, ...), the
/// soft target and the actor loss over their minimum. The width of the stream group
/// `critic[N]` in `streams(..)` below, the one place it is written (the macro defines
/// `sac::CRITIC_WIDTH`, which the `#[per_branch]` arrays' types use).
pub const CRITICS: usize = sac::CRITIC_WIDTH;

// The actor's stream runs at low priority: its sample at `s` has slack until the policy
// loss, and at equal priority takes the GPU from the critics' target passes and losses on
// the critical path (`sac --bench` measures the step both ways, (c) and (c')). Its
// head's gradients run on `main` beside the chain through its layers; its input layer's
// follow that chain on `actor`, its hidden layer's on `actor_grads` beside them.
#[stepgraph::step(
    streams(main, critic[2], actor(low), actor_grads(low)),
    kernels = Kernels,
    compare(auto),
    costs = "sac.costs"
)]
pub mod sac {
    use super::*;

    #[buffers]
    #[derive(Debug)]
    pub struct Buffers {
        /// Adam's step count and the bias corrections, advanced in the graph.
        pub clock: AdamClock,
        /// The step's random generator: the batch's rows and the noise.
        pub rng: DeviceRng,
        pub replay: Transitions,
        /// The replay buffer's fields paired with the batch's, for one gather of all five.
        pub batch_table: GatherTable,
        /// `[B]`: the replay rows of this step's batch.
        pub batch_rows: DeviceBuffer<u32>,
        pub batch: Transitions,
        pub noise: Noise,
        /// `[B, C]`: `[s, a]`, the critics' training input.
        pub x_data: Buf,
        /// The critics `Qi`.
        #[per_branch]
        pub critic: [Mlp; CRITIC_WIDTH],
        /// Each critic's second layer's weights transposed, for its input gradient's matmul
        /// (`relu_hidden_grad`): before its Adam step, then after it.
        #[per_branch]
        pub critic_w2t: [Buf; CRITIC_WIDTH],
        /// The target critics `Qi'`.
        #[per_branch]
        pub critic_target: [Mlp; CRITIC_WIDTH],
        pub actor_net: Mlp,
        /// The actor's second layer's weights transposed, for `actor_dz1`.
        pub actor_w2t: Buf,
        /// `[1]`.
        pub log_alpha: Buf,
        /// The actor's sample at `s2`, with `ε'`.
        pub next_pi: Policy,
        /// Each target critic at `[s2, a']`.
        #[per_branch]
        pub critic_next: [TargetPass; CRITIC_WIDTH],
        /// The target critics' minimum.
        pub next_min: CriticMin,
        /// `[B]`: the soft target.
        pub y: Buf,
        #[per_branch]
        pub critic_pass: [CriticPass; CRITIC_WIDTH],
        #[per_branch]
        pub critic_grad: [Mlp; CRITIC_WIDTH],
        #[per_branch]
        pub critic_optim: [Optim; CRITIC_WIDTH],
        /// Each critic's tensors paired with its target's, for the Polyak update.
        #[per_branch]
        pub polyak_table: [PairTable; CRITIC_WIDTH],
        /// The actor's sample at `s`, with `ε`.
        pub pi: Policy,
        /// `[B]`, `−1/B` at every row (set when built, read only): the gradient of the actor
        /// loss's `−mean(q)` with respect to a critic's output, where it is the smallest.
        pub policy_dq: Buf,
        /// Each critic's passes for the actor's gradient.
        #[per_branch]
        pub critic_actor: [ActorCriticPass; CRITIC_WIDTH],
        pub actor_loss: ActorLoss,
        pub actor_back: ActorBack,
        /// `[B, H]`: the gradients at the actor's hidden layers' pre-activations.
        pub actor_dz2: Buf,
        pub actor_dz1: Buf,
        /// The actor's parameter gradients, a buffer per layer, so that each layer's op
        /// is independent of the others and of the chain through the hidden layers.
        pub actor_grad_l1: Linear,
        pub actor_grad_l2: Linear,
        pub actor_grad_l3: Linear,
        /// The column sums' scratch of each layer's bias gradient: one each, so that the
        /// three layers' ops can run side by side.
        pub actor_sums_l1: Buf,
        pub actor_sums_l2: Buf,
        pub actor_sums_l3: Buf,
        pub actor_optim: Optim,
        pub alpha_grad: AlphaGrad,
        pub temperature: Temperature,
    }

    #[config]
    #[derive(Clone, Copy, Debug)]
    pub struct Config {
        pub sizes: Sizes,
        /// `γ`.
        pub gamma: f32,
        /// `τ` of the Polyak update.
        pub tau: f32,
        /// `H̄ = −A`.
        pub target_entropy: f32,
        pub hyper: AdamHyper,
        /// Every optimizer's learning rate.
        pub lr: f32,
        /// The SMs each critic's matmuls are planned for: the whole GPU, or its share
        /// beside the other critics (`SmTarget::Share(CRITIC_WIDTH)`, PERF.md).
        pub critic_sms: SmTarget,
    }

    /// This step's batch: `B` rows drawn uniformly from the replay buffer, all five fields
    /// gathered in one launch.
    fn draw_batch(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        rng: &DeviceRng,
        replay: &Transitions,
        batch_table: &GatherTable,
        batch_rows: &mut DeviceBuffer<u32>,
        batch: &mut Transitions,
    ) -> Result<()> {
        let g = &k.generic;
        g.rng_indices(stream, rng, BATCH_ROWS, batch_table.rows(), batch_rows)?;
        let srcs = replay.fields(&sizes).map(|(f, _)| f);
        g.gather_rows_table(
            stream,
            batch_table,
            &*batch_rows,
            &srcs,
            &mut batch.fields_mut(),
        )
    }

    /// Adam's step count moves on and the bias corrections of the new step are written,
    /// in the graph: no host work per step. After the batch's draw on `main`, which heads
    /// the critical path, since only the optimizers read it.
    fn tick(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        lr: f32,
        hyper: AdamHyper,
        clock: &mut AdamClock,
    ) -> Result<()> {
        k.generic.adam_tick(stream, clock, lr, hyper)
    }

    /// This step's `ε'` and `ε`, on the actor's stream, which uses them first: beside the
    /// batch's draw on `main`, since both only read the generator's counter.
    #[stream(actor)]
    fn draw_noise(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        rng: &DeviceRng,
        noise: &mut Noise,
    ) -> Result<()> {
        let g = &k.generic;
        g.rng_normal(stream, rng, NOISE_NEXT, &mut noise.next)?;
        g.rng_normal(stream, rng, NOISE_CUR, &mut noise.cur)
    }

    /// The critics' training input `[s, a]`.
    fn critic_input(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Transitions,
        x_data: &mut Buf,
    ) -> Result<()> {
        k.concat_cols(
            stream,
            &batch.s,
            &batch.a,
            x_data,
            sizes.batch,
            sizes.obs,
            sizes.action,
        )
    }

    /// The generator moves on once both draws have read this step's counter: the next
    /// step draws a new batch and new noise. Off the critical path, on `main` while the
    /// target passes run.
    fn advance_rng(stream: &CaptureStream<'_>, k: &Kernels, rng: &mut DeviceRng) -> Result<()> {
        k.generic.rng_advance(stream, rng)
    }

    /// `a', log π'` from the actor before its update.
    #[stream(actor)]
    fn next_action(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Transitions,
        noise: &Noise,
        actor_net: &Mlp,
        next_pi: &mut Policy,
    ) -> Result<()> {
        sample(stream, k, sizes, &batch.s2, &noise.next, actor_net, next_pi)
    }

    /// The actor's second layer's weights transposed for its backward at the end of the
    /// step, on the actor's stream after the next action (on the critical path: the
    /// target passes wait for it), before the sample at `s`, which has slack.
    #[stream(actor)]
    fn actor_transpose(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        actor_net: &Mlp,
        actor_w2t: &mut Buf,
    ) -> Result<()> {
        transpose_l2(stream, k, actor_net, actor_w2t)
    }

    /// Target critic `d` at `[s2, a']`, on critic `d`'s stream.
    #[stream(critic[d])]
    fn critic_target_pass(
        stream: &CaptureStream<'_>,
        sizes: Sizes,
        critic_sms: SmTarget,
        next_pi: &Policy,
        critic_target: &Mlp,
        critic_next: &mut TargetPass,
    ) -> Result<()> {
        target_pass(
            stream,
            sizes.critic().planned_for(critic_sms),
            &next_pi.x,
            critic_target,
            critic_next,
        )
    }

    /// Critic `d`'s second layer's weights transposed for its training pass, after its
    /// target pass, while `main` waits for the other critics' passes before the soft
    /// target: at the head of the critic's stream it ran beside the next action, on the
    /// critical path, and slowed it (PERF.md).
    #[stream(critic[d])]
    fn critic_transpose(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        critic: &Mlp,
        critic_w2t: &mut Buf,
    ) -> Result<()> {
        transpose_l2(stream, k, critic, critic_w2t)
    }

    /// `y = r + γ (1 − done) (minᵢ Qi'(s2, a') − α log π')`, after every target pass.
    #[join(critic)]
    #[allow(clippy::too_many_arguments)]
    fn soft_target(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        gamma: f32,
        batch: &Transitions,
        next_pi: &Policy,
        critic_next: &[TargetPass; CRITIC_WIDTH],
        log_alpha: &Buf,
        next_min: &mut CriticMin,
        y: &mut Buf,
    ) -> Result<()> {
        let CriticMin { q, argmin } = next_min;
        let outs: Vec<&Buf> = critic_next.iter().map(|p| &p.act.out).collect();
        if outs.len() <= MIN_CRITICS {
            // The minimum and the target in one launch (PERF.md).
            return k.min_soft_target(
                stream,
                &outs,
                &batch.r,
                &batch.done,
                &next_pi.logp,
                log_alpha,
                q,
                argmin,
                y,
                gamma,
            );
        }
        for (i, out) in outs.into_iter().enumerate() {
            k.critic_min(stream, out, q, argmin, i)?;
        }
        k.soft_target(
            stream,
            &batch.r,
            &batch.done,
            q,
            &next_pi.logp,
            log_alpha,
            y,
            gamma,
        )
    }

    /// Critic `d`'s loss against `y` and its gradient.
    #[stream(critic[d])]
    #[allow(clippy::too_many_arguments)]
    fn critic_loss(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        critic_sms: SmTarget,
        x_data: &Buf,
        y: &Buf,
        critic: &Mlp,
        critic_w2t: &Buf,
        critic_pass: &mut CriticPass,
        critic_grad: &mut Mlp,
    ) -> Result<()> {
        train_critic(
            stream,
            k,
            sizes.critic().planned_for(critic_sms),
            x_data,
            y,
            critic,
            critic_w2t,
            critic_pass,
            critic_grad,
        )
    }

    /// Critic `d`'s clipped Adam step, with an optimizer of its own.
    #[stream(critic[d])]
    fn critic_adam(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        hyper: AdamHyper,
        clock: &AdamClock,
        critic_grad: &Mlp,
        critic: &mut Mlp,
        critic_optim: &mut Optim,
    ) -> Result<()> {
        adam(
            stream,
            k,
            hyper,
            clock.scalars(),
            critic_grad.tensors(),
            critic,
            critic_optim,
        )
    }

    /// `â, log π` at `s` from the actor before its update: needs no critic, so it runs
    /// beside the critics' updates.
    #[stream(actor)]
    fn actor_sample(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Transitions,
        noise: &Noise,
        actor_net: &Mlp,
        pi: &mut Policy,
    ) -> Result<()> {
        sample(stream, k, sizes, &batch.s, &noise.cur, actor_net, pi)
    }

    /// `L_α` and its gradient (with its norm for the clipping), from the sample at `s`:
    /// early, while the actor's stream waits for the critics, so that only Adam's step on
    /// `log α` is left for the end of the step.
    #[stream(actor)]
    fn alpha_loss(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        target_entropy: f32,
        pi: &Policy,
        log_alpha: &Buf,
        alpha_grad: &mut AlphaGrad,
    ) -> Result<()> {
        let AlphaGrad {
            grad,
            loss,
            table,
            sq_norm,
            scratch,
        } = alpha_grad;
        k.alpha_grad(stream, &pi.logp, log_alpha, grad, loss, target_entropy)?;
        k.generic
            .grad_sq_norm(stream, table, &[&*grad], scratch, sq_norm)
    }

    /// `Qd([s, â])` with critic `d` as its Adam step left it, and the gradient of `−Qd/B`
    /// at the action through it, at every row: the actor's backward takes each row's from
    /// the smallest critic, so this pass does not wait for the other critics. Its second
    /// layer's weights are transposed again first, as updated.
    #[stream(critic[d])]
    #[allow(clippy::too_many_arguments)]
    fn critic_at_policy(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        critic_sms: SmTarget,
        pi: &Policy,
        critic: &Mlp,
        policy_dq: &Buf,
        critic_w2t: &mut Buf,
        critic_actor: &mut ActorCriticPass,
    ) -> Result<()> {
        let dims = sizes.critic().planned_for(critic_sms);
        transpose_l2(stream, k, critic, critic_w2t)?;
        actor_critic_pass(
            stream,
            k,
            dims,
            &pi.x,
            critic,
            critic_w2t,
            policy_dq,
            critic_actor,
        )
    }

    /// `L_π = mean(α log π − minᵢ qᵢ)`, after every critic's pass at the sample: on
    /// `main`, off the chain to the actor's update, which takes its minimum itself.
    #[join(critic)]
    fn policy_loss(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        pi: &Policy,
        critic_actor: &[ActorCriticPass; CRITIC_WIDTH],
        log_alpha: &Buf,
        actor_loss: &mut ActorLoss,
    ) -> Result<()> {
        let ActorLoss { min, loss } = actor_loss;
        let outs: Vec<&Buf> = critic_actor.iter().map(|p| &p.act.out).collect();
        if outs.len() <= MIN_CRITICS {
            return k.min_actor_loss(
                stream,
                &outs,
                &pi.logp,
                log_alpha,
                &mut min.q,
                &mut min.argmin,
                loss,
            );
        }
        for (i, out) in outs.into_iter().enumerate() {
            k.critic_min(stream, out, &mut min.q, &mut min.argmin, i)?;
        }
        k.actor_loss(stream, &min.q, &pi.logp, log_alpha, loss)
    }

    /// The actor loss's gradient at the actor's head: each row's gradient at the action
    /// from the critic smallest there, through the tanh-Gaussian sample.
    #[stream(actor)]
    #[join(critic)]
    #[allow(clippy::too_many_arguments)]
    fn actor_backward(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        noise: &Noise,
        pi: &Policy,
        critic_actor: &[ActorCriticPass; CRITIC_WIDTH],
        log_alpha: &Buf,
        actor_back: &mut ActorBack,
    ) -> Result<()> {
        let ActorBack { da, qmin, dhead } = actor_back;
        let (rows, dims) = (sizes.batch, sizes.action);
        let qs: Vec<&Buf> = critic_actor.iter().map(|p| &p.act.out).collect();
        let das: Vec<&Buf> = critic_actor.iter().map(|p| &p.da).collect();
        if qs.len() <= MIN_CRITICS {
            // The minimum and the backward in one launch.
            return k.tanh_gauss_backward_min(
                stream,
                &pi.act.out,
                &noise.cur,
                &pi.action,
                &qs,
                &das,
                log_alpha,
                dhead,
                rows,
                dims,
            );
        }
        for (i, (q, d)) in qs.into_iter().zip(das).enumerate() {
            k.critic_min_select(stream, q, d, qmin, da, i, dims)?;
        }
        k.tanh_gauss_backward(
            stream,
            &pi.act.out,
            &noise.cur,
            &pi.action,
            da,
            log_alpha,
            dhead,
            rows,
            dims,
        )
    }

    /// `dz2 = (dhead w3) ⊙ (h2 > 0)`, the chain through the actor's layers going on while
    /// the head's gradients are formed beside it.
    #[stream(actor)]
    fn actor_dz2(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        pi: &Policy,
        actor_net: &Mlp,
        actor_back: &ActorBack,
        actor_dz2: &mut Buf,
    ) -> Result<()> {
        let (blas, h2) = (stream.blas(), &pi.act.h2);
        let (w3, dhead) = (&actor_net.l3.w, &actor_back.dhead);
        relu_input_grad(&blas, stream, k, sizes.actor(), dhead, w3, h2, actor_dz2)
    }

    /// `dz1 = (dz2 w2) ⊙ (h1 > 0)`, and the first pass of the first layer's bias gradient
    /// as ReLU's backward writes `dz1`.
    #[stream(actor)]
    #[allow(clippy::too_many_arguments)]
    fn actor_dz1(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        pi: &Policy,
        actor_w2t: &Buf,
        actor_dz2: &Buf,
        actor_dz1: &mut Buf,
        actor_sums_l1: &mut Buf,
    ) -> Result<()> {
        let (blas, h1) = (stream.blas(), &pi.act.h1);
        relu_hidden_grad(
            &blas,
            stream,
            k,
            sizes.actor(),
            actor_dz2,
            actor_w2t,
            h1,
            actor_dz1,
            Some(actor_sums_l1),
        )
    }

    /// The head's weight and bias gradients, from `dhead` and `h2`: on `main`, idle at
    /// the end of the step, beside the chain through the hidden layers.
    fn actor_grad_head(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        pi: &Policy,
        actor_back: &ActorBack,
        actor_grad_l3: &mut Linear,
        actor_sums_l3: &mut Buf,
    ) -> Result<()> {
        let (blas, dims, dhead) = (stream.blas(), sizes.actor(), &actor_back.dhead);
        linear_grads(
            &blas,
            stream,
            k,
            dims,
            dhead,
            &pi.act.h2,
            actor_grad_l3,
            actor_sums_l3,
        )
    }

    /// The second layer's gradients, from `dz2` and `h1`, after `dz1`: beside `dz1`'s
    /// matmul, which fills the GPU, they slowed the chain; beside the input layer's
    /// gradients and the head's, small grids, they fill what those leave (PERF.md).
    #[stream(actor_grads)]
    #[after(actor_dz1)]
    fn actor_grad_hidden(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        pi: &Policy,
        actor_dz2: &Buf,
        actor_grad_l2: &mut Linear,
        actor_sums_l2: &mut Buf,
    ) -> Result<()> {
        let (blas, dims) = (stream.blas(), sizes.actor());
        linear_grads(
            &blas,
            stream,
            k,
            dims,
            actor_dz2,
            &pi.act.h1,
            actor_grad_l2,
            actor_sums_l2,
        )
    }

    /// The first layer's gradients, from `dz1` and the observations (the bias's from the
    /// first pass `actor_dz1` formed): next on the chain, on the actor's stream, not
    /// behind the other layers' gradients.
    #[stream(actor)]
    fn actor_grad_input(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Transitions,
        actor_dz1: &Buf,
        actor_sums_l1: &Buf,
        actor_grad_l1: &mut Linear,
    ) -> Result<()> {
        let (blas, dims) = (stream.blas(), sizes.actor());
        linear_grads_summed(
            &blas,
            stream,
            k,
            dims,
            actor_dz1,
            &batch.s,
            actor_grad_l1,
            actor_sums_l1,
        )
    }

    #[stream(actor)]
    #[allow(clippy::too_many_arguments)]
    fn actor_adam(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        hyper: AdamHyper,
        clock: &AdamClock,
        actor_grad_l1: &Linear,
        actor_grad_l2: &Linear,
        actor_grad_l3: &Linear,
        actor_net: &mut Mlp,
        actor_optim: &mut Optim,
    ) -> Result<()> {
        let grads = layer_tensors([actor_grad_l1, actor_grad_l2, actor_grad_l3]);
        adam(
            stream,
            k,
            hyper,
            clock.scalars(),
            grads,
            actor_net,
            actor_optim,
        )
    }

    /// One clipped Adam step on `log α`, after every op that reads `α`; on `main`, beside
    /// the actor's Adam step.
    fn alpha_update(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        hyper: AdamHyper,
        clock: &AdamClock,
        alpha_grad: &AlphaGrad,
        log_alpha: &mut Buf,
        temperature: &mut Temperature,
    ) -> Result<()> {
        let Temperature { m, v } = temperature;
        let g = alpha_grad;
        let mut slots = [AdamSlot {
            param: log_alpha,
            grad: &g.grad,
            m,
            v,
        }];
        k.generic.adam_clip_update(
            stream,
            &g.table,
            &mut slots,
            &g.sq_norm,
            clock.scalars(),
            hyper,
        )
    }

    /// Target critic `d` toward critic `d` as updated in this step.
    #[stream(critic[d])]
    fn critic_polyak(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        tau: f32,
        polyak_table: &PairTable,
        critic: &Mlp,
        critic_target: &mut Mlp,
    ) -> Result<()> {
        polyak(stream, k, tau, polyak_table, critic, critic_target)
    }
}

/// An optimizer's state for `params` and `grads`: zeroed moments and the table.
fn optim(device: &Device, d: MlpDims, name: &str, params: &Mlp, grads: [&Buf; 6]) -> Result<Optim> {
    let m = Mlp::zeros(device, d, &format!("{name}.adam_m"))?;
    let v = Mlp::zeros(device, d, &format!("{name}.adam_v"))?;
    let entries = params
        .tensors()
        .into_iter()
        .zip(grads)
        .zip(m.tensors().into_iter().zip(v.tensors()))
        .map(|((p, g), (m, v))| ParamEntry::of(p, g, m, v))
        .collect::<Result<Vec<_>>>()?;
    let table = ParamTable::new(device, entries)?;
    let scratch = device.alloc_zeros(&format!("{name}.norm partials"), table.blocks())?;
    Ok(Optim {
        m,
        v,
        table,
        sq_norm: device.alloc_zeros(&format!("{name}.sq_norm"), 1)?,
        scratch,
    })
}

fn policy(device: &Device, s: &Sizes, name: &str) -> Result<Policy> {
    let (b, a) = (s.batch, s.action);
    Ok(Policy {
        act: MlpAct::zeros(device, s.actor(), name)?,
        action: device.alloc_zeros(&format!("{name}.action"), b * a)?,
        logp: device.alloc_zeros(&format!("{name}.logp"), b)?,
        x: device.alloc_zeros(&format!("{name}.x"), b * s.critic_in())?,
    })
}

fn critic_pass_bufs(device: &Device, s: &Sizes, name: &str) -> Result<CriticPass> {
    Ok(CriticPass {
        act: MlpAct::zeros(device, s.critic(), name)?,
        dq: device.alloc_zeros(&format!("{name}.dq"), s.batch)?,
        back: MlpBack::zeros(device, s.critic(), name)?,
        loss: device.alloc_zeros(&format!("{name}.loss"), 1)?,
    })
}

fn actor_critic_pass_bufs(device: &Device, s: &Sizes, name: &str) -> Result<ActorCriticPass> {
    Ok(ActorCriticPass {
        act: MlpAct::zeros(device, s.critic(), name)?,
        back: MlpBack::zeros(device, s.critic(), name)?,
        da: device.alloc_zeros(&format!("{name}.da"), s.batch * s.action)?,
    })
}

/// The critics' minimum, `[B]` each.
fn critic_min(device: &Device, s: &Sizes, name: &str) -> Result<CriticMin> {
    Ok(CriticMin {
        q: device.alloc_zeros(&format!("{name}.q"), s.batch)?,
        argmin: device.alloc_zeros(&format!("{name}.argmin"), s.batch)?,
    })
}

/// One buffer per critic, `critic{i}` in each name.
fn per_critic<T>(
    mut make: impl FnMut(usize, String) -> Result<T>,
    what: &str,
) -> Result<[T; CRITICS]> {
    let all = (0..CRITICS)
        .map(|i| make(i, format!("critic{i}{what}")))
        .collect::<Result<Vec<T>>>()?;
    all.try_into()
        .map_err(|_| stepgraph::Error::Invalid(format!("expected {CRITICS} critics")))
}

/// Allocates every buffer of the step for `sizes`, zeroed but for the constant
/// `policy_dq` (`−1/B`), with a replay buffer of
/// `replay` rows and the generator of `seed`: the caller uploads the parameters (the
/// targets the critics' copies), `log α` and the replay buffer
/// ([`crate::host::initial_buffers`] does).
pub fn allocate(device: &Device, s: &Sizes, replay: usize, seed: u64) -> Result<sac::Buffers> {
    s.check()?;
    let z = |what: &str, n: usize| device.alloc_zeros::<f32>(what, n);
    let (b, c) = (s.batch, s.critic_in());
    let (cd, ad) = (s.critic(), s.actor());
    let critic = per_critic(|_, name| Mlp::zeros(device, cd, &name), "")?;
    let critic_grad = per_critic(|_, name| Mlp::zeros(device, cd, &name), ".grad")?;
    let critic_optim = per_critic(
        |i, name| optim(device, cd, &name, &critic[i], critic_grad[i].tensors()),
        "",
    )?;
    let critic_target = per_critic(|_, name| Mlp::zeros(device, cd, &name), "_target")?;
    let polyak_table = per_critic(
        |i, _| {
            let pairs: Vec<_> = critic[i]
                .tensors()
                .into_iter()
                .zip(critic_target[i].tensors())
                .collect();
            PairTable::new(device, &pairs)
        },
        "",
    )?;
    if replay == 0 {
        return Err(stepgraph::Error::Invalid(
            "the replay buffer must hold at least 1 transition, found 0".into(),
        ));
    }
    let actor_net = Mlp::zeros(device, ad, "actor")?;
    let Mlp {
        l1: actor_grad_l1,
        l2: actor_grad_l2,
        l3: actor_grad_l3,
    } = Mlp::zeros(device, ad, "actor.grad")?;
    let actor_grads = layer_tensors([&actor_grad_l1, &actor_grad_l2, &actor_grad_l3]);
    let actor_optim = optim(device, ad, "actor", &actor_net, actor_grads)?;
    let MlpBack {
        dz2: actor_dz2,
        dz1: actor_dz1,
        sums: actor_sums_l1,
    } = MlpBack::zeros(device, ad, "actor")?;
    let (actor_sums_l2, actor_sums_l3) = (
        z("actor.l2 bias sums", actor_sums_l1.len())?,
        z("actor.l3 bias sums", actor_sums_l1.len())?,
    );
    let log_alpha = z("log_alpha", 1)?;
    let (alpha_grad, temperature) = {
        let (grad, m, v) = (
            z("alpha.grad", 1)?,
            z("alpha.adam_m", 1)?,
            z("alpha.adam_v", 1)?,
        );
        let table = ParamTable::new(device, vec![ParamEntry::of(&log_alpha, &grad, &m, &v)?])?;
        let alpha_grad = AlphaGrad {
            loss: z("alpha.loss", 1)?,
            sq_norm: z("alpha.sq_norm", 1)?,
            scratch: z("alpha.norm partials", table.blocks())?,
            grad,
            table,
        };
        (alpha_grad, Temperature { m, v })
    };
    let replay_buf = Transitions::zeros(device, "replay", replay, s)?;
    let batch = Transitions::zeros(device, "batch", b, s)?;
    let entries: Vec<_> = replay_buf
        .fields(s)
        .into_iter()
        .zip(batch.fields(s))
        .map(|((src, row_len), (dst, _))| (src, dst, row_len))
        .collect();
    let batch_table = GatherTable::new(device, replay, b, &entries)?;
    Ok(sac::Buffers {
        clock: AdamClock::new(device, 0)?,
        rng: DeviceRng::new(device, seed)?,
        replay: replay_buf,
        batch_table,
        batch_rows: device.alloc_zeros("batch rows", b)?,
        batch,
        noise: Noise {
            next: z("eps_next", b * s.action)?,
            cur: z("eps", b * s.action)?,
        },
        x_data: z("x_data", b * c)?,
        critic_target,
        polyak_table,
        critic_w2t: per_critic(|_, name| z(&name, s.hidden * s.hidden), ".w2t")?,
        critic,
        actor_w2t: z("actor.w2t", s.hidden * s.hidden)?,
        actor_net,
        log_alpha,
        next_pi: policy(device, s, "next_pi")?,
        critic_next: per_critic(
            |_, name| {
                Ok(TargetPass {
                    act: MlpAct::zeros(device, cd, &name)?,
                })
            },
            "_next",
        )?,
        next_min: critic_min(device, s, "next_min")?,
        y: z("y", b)?,
        critic_pass: per_critic(|_, name| critic_pass_bufs(device, s, &name), "_pass")?,
        critic_grad,
        critic_optim,
        pi: policy(device, s, "pi")?,
        policy_dq: device.upload_new("policy dq", &vec![-1.0 / b as f32; b])?,
        critic_actor: per_critic(|_, name| actor_critic_pass_bufs(device, s, &name), "_actor")?,
        actor_loss: ActorLoss {
            min: critic_min(device, s, "actor.min")?,
            loss: z("actor.loss", 1)?,
        },
        actor_back: ActorBack {
            da: z("actor.da", b * s.action)?,
            qmin: z("actor.qmin", b)?,
            dhead: z("actor.dhead", b * 2 * s.action)?,
        },
        actor_dz2,
        actor_dz1,
        actor_grad_l1,
        actor_grad_l2,
        actor_grad_l3,
        actor_sums_l1,
        actor_sums_l2,
        actor_sums_l3,
        actor_optim,
        alpha_grad,
        temperature,
    })
}

#[cfg(test)]
mod tests {
    use super::{CRITICS, sac};

    fn op(name: &str) -> usize {
        sac::PLAN
            .ops
            .iter()
            .position(|o| o.name == name)
            .unwrap_or_else(|| panic!("no op {name}"))
    }

    /// Critic `i`'s replica of the replicated op `func`.
    fn critic_op(func: &str, i: usize) -> usize {
        op(&format!("{func}[{i}]"))
    }

    fn stream_of(op: usize) -> &'static str {
        sac::PLAN.streams[sac::PLAN.ops[op].stream.index()].name
    }

    #[test]
    fn the_plan_audits_clean() {
        assert_eq!(sac::PLAN.ops.len(), 19 + 6 * CRITICS);
        let audit = sac::PLAN.audit().unwrap();
        assert!(audit.conflicts_ordered > 0, "{audit:?}");
        assert!(audit.independent_pairs > 0, "{audit:?}");
    }

    /// Whether the schedule orders op `a` before op `b`: by stream order, or by a chain of
    /// waits on events recorded after earlier ops (`PlanDesc::orders`).
    fn before(a: usize, b: usize) -> bool {
        use stepgraph::plan::OpId;
        sac::PLAN.orders(OpId(a as u32), OpId(b as u32))
    }

    /// The actor's gradient goes through the critics as updated in this step: every op
    /// that reads a critic for the actor comes after that critic's Adam step, the actor's
    /// own ops after every critic's, and the temperature's update after every op that
    /// reads `α`.
    #[test]
    fn the_actor_sees_every_updated_critic() {
        for i in 0..CRITICS {
            let adam = critic_op("critic_adam", i);
            for pass in ["critic_at_policy", "critic_polyak"] {
                assert!(
                    before(adam, critic_op(pass, i)),
                    "critic {i}: adam before {pass}"
                );
            }
            for actor_op in ["policy_loss", "actor_backward", "actor_adam"] {
                assert!(
                    before(adam, op(actor_op)),
                    "critic {i}'s Adam step is not ordered before {actor_op}"
                );
            }
            // No critic's pass for the actor waits for another critic's update, nor for
            // the actor loss's minimum (the backward takes each row's from the smallest).
            for j in (0..CRITICS).filter(|&j| j != i) {
                assert!(!before(adam, critic_op("critic_at_policy", j)), "{i} {j}");
            }
            assert!(!before(op("policy_loss"), critic_op("critic_at_policy", i)));
            assert!(!before(op("policy_loss"), op("actor_backward")));
            // The Polyak update writes the target after the soft target's pass read it.
            let target = critic_op("critic_target_pass", i);
            assert!(before(target, critic_op("critic_polyak", i)));
            // The actor's sample needs no critic: nothing orders an update before it.
            assert!(!before(adam, op("actor_sample")));
        }
        for reader in ["soft_target", "policy_loss", "actor_backward"] {
            assert!(before(op(reader), op("alpha_update")), "{reader}");
        }
    }

    /// The batch and the noise are drawn side by side (both read the generator's counter),
    /// and the counter moves on only after both; the next action waits for both draws.
    #[test]
    fn both_draws_read_this_steps_counter_side_by_side() {
        let (batch, noise, advance) = (op("draw_batch"), op("draw_noise"), op("advance_rng"));
        assert!(!before(batch, noise) && !before(noise, batch));
        assert_ne!(stream_of(batch), stream_of(noise));
        assert!(before(batch, advance) && before(noise, advance));
        for draw in [batch, noise] {
            assert!(before(draw, op("next_action")));
        }
    }

    /// The head's gradients run beside the chain through the layers below, the hidden
    /// layer's after `dz1` (whose matmul fills the GPU) beside the input layer's, which
    /// follow the chain on the actor's stream; each on a stream of its own; Adam waits for
    /// all three.
    #[test]
    fn the_actor_layers_gradients_run_beside_its_backward_chain() {
        for (grads, beside) in [
            ("actor_grad_head", "actor_dz2"),
            ("actor_grad_head", "actor_dz1"),
            ("actor_grad_hidden", "actor_grad_input"),
        ] {
            let (g, c) = (op(grads), op(beside));
            assert!(!before(g, c) && !before(c, g), "{grads} and {beside}");
        }
        assert!(before(op("actor_dz1"), op("actor_grad_hidden")));
        for (grads, stream) in [
            ("actor_grad_head", "main"),
            ("actor_grad_hidden", "actor_grads"),
            ("actor_grad_input", "actor"),
        ] {
            assert_eq!(stream_of(op(grads)), stream, "{grads}");
            assert!(before(op(grads), op("actor_adam")), "{grads}");
        }
        let (head, hidden) = (op("actor_grad_head"), op("actor_grad_hidden"));
        assert!(!before(head, hidden) && !before(hidden, head));
        assert!(before(op("actor_dz1"), op("actor_grad_input")));
        assert!(before(op("actor_backward"), op("actor_grad_head")));
    }

    /// No two ops are ordered only because both take `&mut` of one buffer: the actor's
    /// layer gradients shared their column sums' scratch once, which kept them in turn.
    #[test]
    fn no_ops_are_ordered_only_by_a_shared_buffer() {
        let shared: Vec<String> = sac::PLAN
            .shared_writes()
            .iter()
            .map(|w| {
                format!(
                    "{} -> {}",
                    sac::PLAN.ops[w.first.index()].name,
                    sac::PLAN.ops[w.second.index()].name
                )
            })
            .collect();
        assert!(shared.is_empty(), "{shared:?}");
    }

    /// `third-critic.diff` still applies (the line it changes is in this file), changes
    /// nothing but the group's width, and is the one the README shows.
    #[test]
    fn the_third_critic_diff_applies_to_this_file() {
        let diff = include_str!("../third-critic.diff");
        let here = include_str!("model.rs");
        let readme = include_str!("../README.md");
        assert!(
            readme.contains(diff),
            "the README shows another diff than third-critic.diff"
        );
        let removed: Vec<&str> = diff
            .lines()
            .filter(|l| l.starts_with('-') && !l.starts_with("---"))
            .map(|l| &l[1..])
            .collect();
        let added = diff
            .lines()
            .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
            .count();
        assert_eq!((removed.len(), added), (1, 1), "{diff}");
        // The hunk's old side (its context and the removed line, in order) is a run of
        // consecutive lines of this file, so that `git apply` finds it.
        let old_side: Vec<&str> = diff
            .lines()
            .skip_while(|l| !l.starts_with("@@"))
            .skip(1)
            .filter(|l| !l.starts_with('+'))
            .map(|l| l.get(1..).unwrap_or(""))
            .collect();
        let lines: Vec<&str> = here.lines().collect();
        assert!(
            lines
                .windows(old_side.len())
                .any(|w| w == old_side.as_slice()),
            "the diff's context is not in model.rs:\n{}",
            old_side.join("\n")
        );
    }

    #[test]
    fn the_critics_run_on_streams_of_their_own() {
        for func in [
            "critic_target_pass",
            "critic_loss",
            "critic_adam",
            "critic_at_policy",
            "critic_polyak",
        ] {
            for i in 0..CRITICS {
                assert_eq!(
                    stream_of(critic_op(func, i)),
                    format!("critic[{i}]"),
                    "{func}"
                );
            }
        }
        assert_eq!(stream_of(op("actor_backward")), "actor");
        assert_eq!(stream_of(op("policy_loss")), "main");
    }
}
