//! The SAC update step of MODEL.md as a stepgraph step: its buffers and its ops in
//! program order. The batch, the noise, the soft target and the Polyak updates' inputs
//! are on `main`; each critic on its own stream (`q1`, `q2`), for its update and for the
//! passes the actor's gradient takes through it; the actor and the temperature on `actor`.

use stepgraph::{CaptureStream, Device, DeviceBuffer, HostInput, Result, StepBuffer};
use stepgraph_kernels::{ADAM_SCALARS, AdamHyper, AdamSlot, ParamEntry, ParamTable};

use crate::kernels::{Buf, Kernels};
use crate::layers::{Mlp, MlpAct, MlpBack, MlpDims, Sizes, mlp_backward, mlp_forward};

/// One batch of transitions (MODEL.md's inputs), uploaded by the host.
#[derive(Debug, StepBuffer)]
pub struct Batch {
    /// `[B, S]`.
    pub s: Buf,
    /// `[B, A]`, in (−1, 1).
    pub a: Buf,
    /// `[B]`.
    pub r: Buf,
    /// `[B, S]`.
    pub s2: Buf,
    /// `[B]`, 0 or 1.
    pub done: Buf,
}

/// The counter-based generator's state and the step's normals.
#[derive(Debug, StepBuffer)]
pub struct Noise {
    /// `[1]`: moved on once per step.
    pub counter: DeviceBuffer<u64>,
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
/// backward to its input.
#[derive(Debug, StepBuffer)]
pub struct ActorCriticPass {
    pub act: MlpAct,
    pub back: MlpBack,
    /// `[B, C]`: the critic's input gradient.
    pub dx: Buf,
}

/// The actor loss's outputs.
#[derive(Debug, StepBuffer)]
pub struct ActorLoss {
    /// `∂L_π/∂q1 [B]`.
    pub dq1: Buf,
    /// `∂L_π/∂q2 [B]`.
    pub dq2: Buf,
    /// `[1]`: `L_π`.
    pub loss: Buf,
    /// `∂L_π/∂head [B, 2A]`.
    pub dhead: Buf,
    pub back: MlpBack,
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

/// The temperature's gradient, loss and optimizer (`log α` itself is a buffer of the
/// step, read by many ops).
#[derive(Debug, StepBuffer)]
pub struct Temperature {
    pub grad: Buf,
    pub loss: Buf,
    pub m: Buf,
    pub v: Buf,
    pub table: ParamTable,
    pub sq_norm: Buf,
    pub scratch: Buf,
}

/// lr and Adam's bias corrections: staged by the host before each replay and copied in
/// by the step's first op; every optimizer reads the copy.
#[derive(Debug, StepBuffer)]
pub struct Scalars {
    pub staged: HostInput<f32>,
    pub values: Buf,
}

/// The critics' activations at the next observations, under the target critics.
#[derive(Debug, StepBuffer)]
pub struct TargetPass {
    pub act: MlpAct,
}

/// One clipped Adam step over `params` from `grads`.
fn adam(
    stream: &CaptureStream<'_>,
    k: &Kernels,
    hyper: AdamHyper,
    scalars: &Buf,
    grads: &Mlp,
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
    let grads = grads.tensors();
    k.generic
        .grad_sq_norm(stream, table, &grads, scratch, sq_norm)?;
    let mut slots: Vec<AdamSlot<'_>> = params
        .tensors_mut()
        .into_iter()
        .zip(grads)
        .zip(m.tensors_mut().into_iter().zip(v.tensors_mut()))
        .map(|((param, grad), (m, v))| AdamSlot { param, grad, m, v })
        .collect();
    k.generic
        .adam_clip_update(stream, table, &mut slots, sq_norm, scalars, hyper)
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
/// `grads`.
#[allow(clippy::too_many_arguments)]
fn critic_pass(
    s: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    x: &Buf,
    y: &Buf,
    net: &Mlp,
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
    mlp_forward(&blas, d, x, net, act)?;
    k.mse_loss(s, &act.out, y, dq, loss)?;
    mlp_backward(&blas, s, k, d, net, x, act, dq, back, Some(grads), None)
}

/// The Polyak update `target ← τ θ + (1 − τ) target`.
fn polyak(s: &CaptureStream<'_>, k: &Kernels, tau: f32, net: &Mlp, target: &mut Mlp) -> Result<()> {
    for (p, t) in net.tensors().into_iter().zip(target.tensors_mut()) {
        k.generic.axpby(s, p, t, tau, 1.0 - tau)?;
    }
    Ok(())
}

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

/// A critic's pass for the actor: forward at the actor's sample, the backward of `dq`
/// to the input (no weight gradients).
#[allow(clippy::too_many_arguments)]
fn actor_critic_pass(
    s: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    x: &Buf,
    net: &Mlp,
    dq: Option<&Buf>,
    pass: &mut ActorCriticPass,
) -> Result<()> {
    let blas = s.blas();
    let ActorCriticPass { act, back, dx } = pass;
    match dq {
        None => mlp_forward(&blas, d, x, net, act),
        Some(dq) => mlp_backward(&blas, s, k, d, net, x, act, dq, back, None, Some(dx)),
    }
}

#[stepgraph::step(streams(main, q1, q2, actor), kernels = Kernels)]
pub mod sac {
    use super::*;

    #[buffers]
    #[derive(Debug)]
    pub struct Buffers {
        pub batch: Batch,
        pub noise: Noise,
        pub scalars: Scalars,
        /// `[B, C]`: `[s, a]`, the critics' training input.
        pub x_data: Buf,
        pub q1_net: Mlp,
        pub q2_net: Mlp,
        pub q1_target: Mlp,
        pub q2_target: Mlp,
        pub actor_net: Mlp,
        /// `[1]`.
        pub log_alpha: Buf,
        /// The actor's sample at `s2`, with `ε'`.
        pub next_pi: Policy,
        pub q1_next: TargetPass,
        pub q2_next: TargetPass,
        /// `[B]`: the soft target.
        pub y: Buf,
        pub q1_pass: CriticPass,
        pub q2_pass: CriticPass,
        pub q1_grad: Mlp,
        pub q2_grad: Mlp,
        pub q1_optim: Optim,
        pub q2_optim: Optim,
        /// The actor's sample at `s`, with `ε`.
        pub pi: Policy,
        pub q1_actor: ActorCriticPass,
        pub q2_actor: ActorCriticPass,
        pub actor_loss: ActorLoss,
        pub actor_grad: Mlp,
        pub actor_optim: Optim,
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
        /// The noise generator's seed.
        pub seed: u64,
    }

    /// lr and the bias corrections the host staged for this replay.
    fn begin(stream: &CaptureStream<'_>, scalars: &mut Scalars) -> Result<()> {
        let Scalars { staged, values } = scalars;
        stream.stage(staged, values)
    }

    /// This step's `ε'` and `ε`, then the generator's counter moves on.
    fn draw_noise(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        seed: u64,
        noise: &mut Noise,
    ) -> Result<()> {
        let Noise { counter, next, cur } = noise;
        k.draw_normals(stream, counter, next, cur, seed)?;
        k.advance_counter(stream, counter)
    }

    /// The critics' training input `[s, a]`.
    fn critic_input(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Batch,
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

    /// `a', log π'` from the actor before its update.
    #[stream(actor)]
    fn next_action(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Batch,
        noise: &Noise,
        actor_net: &Mlp,
        next_pi: &mut Policy,
    ) -> Result<()> {
        sample(stream, k, sizes, &batch.s2, &noise.next, actor_net, next_pi)
    }

    #[stream(q1)]
    fn q1_target_pass(
        stream: &CaptureStream<'_>,
        sizes: Sizes,
        next_pi: &Policy,
        q1_target: &Mlp,
        q1_next: &mut TargetPass,
    ) -> Result<()> {
        target_pass(stream, sizes.critic(), &next_pi.x, q1_target, q1_next)
    }

    #[stream(q2)]
    fn q2_target_pass(
        stream: &CaptureStream<'_>,
        sizes: Sizes,
        next_pi: &Policy,
        q2_target: &Mlp,
        q2_next: &mut TargetPass,
    ) -> Result<()> {
        target_pass(stream, sizes.critic(), &next_pi.x, q2_target, q2_next)
    }

    /// `y = r + γ (1 − done) (min(Q1', Q2') − α log π')`.
    #[allow(clippy::too_many_arguments)]
    fn soft_target(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        gamma: f32,
        batch: &Batch,
        next_pi: &Policy,
        q1_next: &TargetPass,
        q2_next: &TargetPass,
        log_alpha: &Buf,
        y: &mut Buf,
    ) -> Result<()> {
        k.soft_target(
            stream,
            &batch.r,
            &batch.done,
            &q1_next.act.out,
            &q2_next.act.out,
            &next_pi.logp,
            log_alpha,
            y,
            gamma,
        )
    }

    #[stream(q1)]
    #[allow(clippy::too_many_arguments)]
    fn q1_loss(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        x_data: &Buf,
        y: &Buf,
        q1_net: &Mlp,
        q1_pass: &mut CriticPass,
        q1_grad: &mut Mlp,
    ) -> Result<()> {
        critic_pass(
            stream,
            k,
            sizes.critic(),
            x_data,
            y,
            q1_net,
            q1_pass,
            q1_grad,
        )
    }

    #[stream(q2)]
    #[allow(clippy::too_many_arguments)]
    fn q2_loss(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        x_data: &Buf,
        y: &Buf,
        q2_net: &Mlp,
        q2_pass: &mut CriticPass,
        q2_grad: &mut Mlp,
    ) -> Result<()> {
        critic_pass(
            stream,
            k,
            sizes.critic(),
            x_data,
            y,
            q2_net,
            q2_pass,
            q2_grad,
        )
    }

    #[stream(q1)]
    fn q1_adam(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        hyper: AdamHyper,
        scalars: &Scalars,
        q1_grad: &Mlp,
        q1_net: &mut Mlp,
        q1_optim: &mut Optim,
    ) -> Result<()> {
        adam(stream, k, hyper, &scalars.values, q1_grad, q1_net, q1_optim)
    }

    #[stream(q2)]
    fn q2_adam(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        hyper: AdamHyper,
        scalars: &Scalars,
        q2_grad: &Mlp,
        q2_net: &mut Mlp,
        q2_optim: &mut Optim,
    ) -> Result<()> {
        adam(stream, k, hyper, &scalars.values, q2_grad, q2_net, q2_optim)
    }

    /// `â, log π` at `s` from the actor before its update: needs no critic, so it runs
    /// beside the critics' updates.
    #[stream(actor)]
    fn actor_sample(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Batch,
        noise: &Noise,
        actor_net: &Mlp,
        pi: &mut Policy,
    ) -> Result<()> {
        sample(stream, k, sizes, &batch.s, &noise.cur, actor_net, pi)
    }

    /// `Q1([s, â])` with Q1 as `q1_adam` left it.
    #[stream(q1)]
    fn q1_at_policy(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        pi: &Policy,
        q1_net: &Mlp,
        q1_actor: &mut ActorCriticPass,
    ) -> Result<()> {
        actor_critic_pass(stream, k, sizes.critic(), &pi.x, q1_net, None, q1_actor)
    }

    #[stream(q2)]
    fn q2_at_policy(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        pi: &Policy,
        q2_net: &Mlp,
        q2_actor: &mut ActorCriticPass,
    ) -> Result<()> {
        actor_critic_pass(stream, k, sizes.critic(), &pi.x, q2_net, None, q2_actor)
    }

    /// `L_π = mean(α log π − min(q1, q2))` and its gradients with respect to q1 and q2.
    #[stream(actor)]
    fn policy_loss(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        pi: &Policy,
        q1_actor: &ActorCriticPass,
        q2_actor: &ActorCriticPass,
        log_alpha: &Buf,
        actor_loss: &mut ActorLoss,
    ) -> Result<()> {
        let ActorLoss { dq1, dq2, loss, .. } = actor_loss;
        k.actor_loss(
            stream,
            &q1_actor.act.out,
            &q2_actor.act.out,
            &pi.logp,
            log_alpha,
            dq1,
            dq2,
            loss,
        )
    }

    /// `∂L_π/∂[s, â]` through Q1 (its weights get no gradient).
    #[stream(q1)]
    #[allow(clippy::too_many_arguments)]
    fn q1_input_grad(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        pi: &Policy,
        q1_net: &Mlp,
        actor_loss: &ActorLoss,
        q1_actor: &mut ActorCriticPass,
    ) -> Result<()> {
        actor_critic_pass(
            stream,
            k,
            sizes.critic(),
            &pi.x,
            q1_net,
            Some(&actor_loss.dq1),
            q1_actor,
        )
    }

    #[stream(q2)]
    #[allow(clippy::too_many_arguments)]
    fn q2_input_grad(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        pi: &Policy,
        q2_net: &Mlp,
        actor_loss: &ActorLoss,
        q2_actor: &mut ActorCriticPass,
    ) -> Result<()> {
        actor_critic_pass(
            stream,
            k,
            sizes.critic(),
            &pi.x,
            q2_net,
            Some(&actor_loss.dq2),
            q2_actor,
        )
    }

    /// The actor's gradients: through the tanh-Gaussian sample, then its MLP.
    #[stream(actor)]
    #[allow(clippy::too_many_arguments)]
    fn actor_backward(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        sizes: Sizes,
        batch: &Batch,
        noise: &Noise,
        pi: &Policy,
        q1_actor: &ActorCriticPass,
        q2_actor: &ActorCriticPass,
        log_alpha: &Buf,
        actor_net: &Mlp,
        actor_loss: &mut ActorLoss,
        actor_grad: &mut Mlp,
    ) -> Result<()> {
        let ActorLoss { dhead, back, .. } = actor_loss;
        k.tanh_gauss_backward(
            stream,
            &pi.act.out,
            &noise.cur,
            &pi.action,
            &q1_actor.dx,
            &q2_actor.dx,
            log_alpha,
            dhead,
            sizes.batch,
            sizes.action,
            sizes.obs,
        )?;
        let blas = stream.blas();
        mlp_backward(
            &blas,
            stream,
            k,
            sizes.actor(),
            actor_net,
            &batch.s,
            &pi.act,
            dhead,
            back,
            Some(actor_grad),
            None,
        )
    }

    #[stream(actor)]
    fn actor_adam(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        hyper: AdamHyper,
        scalars: &Scalars,
        actor_grad: &Mlp,
        actor_net: &mut Mlp,
        actor_optim: &mut Optim,
    ) -> Result<()> {
        adam(
            stream,
            k,
            hyper,
            &scalars.values,
            actor_grad,
            actor_net,
            actor_optim,
        )
    }

    /// `L_α` and one clipped Adam step on `log α`, after every op that reads `α`.
    #[stream(actor)]
    fn alpha_update(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        target_entropy: f32,
        hyper: AdamHyper,
        scalars: &Scalars,
        pi: &Policy,
        log_alpha: &mut Buf,
        temperature: &mut Temperature,
    ) -> Result<()> {
        let Temperature {
            grad,
            loss,
            m,
            v,
            table,
            sq_norm,
            scratch,
        } = temperature;
        k.alpha_grad(stream, &pi.logp, log_alpha, grad, loss, target_entropy)?;
        k.generic
            .grad_sq_norm(stream, table, &[&*grad], scratch, sq_norm)?;
        let mut slots = [AdamSlot {
            param: log_alpha,
            grad,
            m,
            v,
        }];
        k.generic
            .adam_clip_update(stream, table, &mut slots, sq_norm, &scalars.values, hyper)
    }

    #[stream(q1)]
    fn q1_polyak(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        tau: f32,
        q1_net: &Mlp,
        q1_target: &mut Mlp,
    ) -> Result<()> {
        polyak(stream, k, tau, q1_net, q1_target)
    }

    #[stream(q2)]
    fn q2_polyak(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        tau: f32,
        q2_net: &Mlp,
        q2_target: &mut Mlp,
    ) -> Result<()> {
        polyak(stream, k, tau, q2_net, q2_target)
    }
}

/// An optimizer's state for `params` and `grads`: zeroed moments and the table.
fn optim(device: &Device, d: MlpDims, name: &str, params: &Mlp, grads: &Mlp) -> Result<Optim> {
    let m = Mlp::zeros(device, d, &format!("{name}.adam_m"))?;
    let v = Mlp::zeros(device, d, &format!("{name}.adam_v"))?;
    let entries = params
        .tensors()
        .into_iter()
        .zip(grads.tensors())
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
        dx: device.alloc_zeros(&format!("{name}.dx"), s.batch * s.critic_in())?,
    })
}

/// Allocates every buffer of the step for `sizes`, zeroed: the caller uploads the
/// parameters, `log α` and the batch ([`crate::host::initial_buffers`] does).
pub fn allocate(device: &Device, s: &Sizes) -> Result<sac::Buffers> {
    s.check()?;
    let z = |what: &str, n: usize| device.alloc_zeros::<f32>(what, n);
    let (b, c) = (s.batch, s.critic_in());
    let (cd, ad) = (s.critic(), s.actor());
    let q1_net = Mlp::zeros(device, cd, "q1")?;
    let q2_net = Mlp::zeros(device, cd, "q2")?;
    let actor_net = Mlp::zeros(device, ad, "actor")?;
    let q1_grad = Mlp::zeros(device, cd, "q1.grad")?;
    let q2_grad = Mlp::zeros(device, cd, "q2.grad")?;
    let actor_grad = Mlp::zeros(device, ad, "actor.grad")?;
    let q1_optim = optim(device, cd, "q1", &q1_net, &q1_grad)?;
    let q2_optim = optim(device, cd, "q2", &q2_net, &q2_grad)?;
    let actor_optim = optim(device, ad, "actor", &actor_net, &actor_grad)?;
    let log_alpha = z("log_alpha", 1)?;
    let temperature = {
        let (grad, m, v) = (
            z("alpha.grad", 1)?,
            z("alpha.adam_m", 1)?,
            z("alpha.adam_v", 1)?,
        );
        let table = ParamTable::new(device, vec![ParamEntry::of(&log_alpha, &grad, &m, &v)?])?;
        Temperature {
            loss: z("alpha.loss", 1)?,
            sq_norm: z("alpha.sq_norm", 1)?,
            scratch: z("alpha.norm partials", table.blocks())?,
            grad,
            m,
            v,
            table,
        }
    };
    Ok(sac::Buffers {
        batch: Batch {
            s: z("s", b * s.obs)?,
            a: z("a", b * s.action)?,
            r: z("r", b)?,
            s2: z("s2", b * s.obs)?,
            done: z("done", b)?,
        },
        noise: Noise {
            counter: device.alloc_zeros("noise counter", 1)?,
            next: z("eps_next", b * s.action)?,
            cur: z("eps", b * s.action)?,
        },
        scalars: Scalars {
            staged: HostInput::new(device, "adam scalars (staged)", ADAM_SCALARS)?,
            values: z("adam scalars", ADAM_SCALARS)?,
        },
        x_data: z("x_data", b * c)?,
        q1_target: Mlp::zeros(device, cd, "q1_target")?,
        q2_target: Mlp::zeros(device, cd, "q2_target")?,
        q1_net,
        q2_net,
        actor_net,
        log_alpha,
        next_pi: policy(device, s, "next_pi")?,
        q1_next: TargetPass {
            act: MlpAct::zeros(device, cd, "q1_next")?,
        },
        q2_next: TargetPass {
            act: MlpAct::zeros(device, cd, "q2_next")?,
        },
        y: z("y", b)?,
        q1_pass: critic_pass_bufs(device, s, "q1_pass")?,
        q2_pass: critic_pass_bufs(device, s, "q2_pass")?,
        q1_grad,
        q2_grad,
        q1_optim,
        q2_optim,
        pi: policy(device, s, "pi")?,
        q1_actor: actor_critic_pass_bufs(device, s, "q1_actor")?,
        q2_actor: actor_critic_pass_bufs(device, s, "q2_actor")?,
        actor_loss: ActorLoss {
            dq1: z("actor.dq1", b)?,
            dq2: z("actor.dq2", b)?,
            loss: z("actor.loss", 1)?,
            dhead: z("actor.dhead", b * 2 * s.action)?,
            back: MlpBack::zeros(device, ad, "actor")?,
        },
        actor_grad,
        actor_optim,
        temperature,
    })
}

#[cfg(test)]
mod tests {
    use super::sac;

    fn op(name: &str) -> usize {
        sac::PLAN
            .ops
            .iter()
            .position(|o| o.name == name)
            .unwrap_or_else(|| panic!("no op {name}"))
    }

    fn stream(name: &str) -> &'static str {
        sac::PLAN.streams[sac::PLAN.ops[op(name)].stream.index()].name
    }

    #[test]
    fn the_plan_audits_clean() {
        assert_eq!(sac::PLAN.ops.len(), 22);
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
    /// that reads a critic for the actor comes after both critics' Adam steps, and the
    /// temperature's update after every op that reads `α`.
    #[test]
    fn the_actor_sees_both_updated_critics() {
        // Each critic's passes for the actor come after its own Adam step ...
        for (critic_op, pass) in [
            ("q1_adam", "q1_at_policy"),
            ("q1_adam", "q1_input_grad"),
            ("q2_adam", "q2_at_policy"),
            ("q2_adam", "q2_input_grad"),
        ] {
            assert!(before(op(critic_op), op(pass)), "{critic_op} before {pass}");
        }
        // ... and the actor's own ops, on its stream, after both.
        for actor_op in ["policy_loss", "actor_backward", "actor_adam"] {
            for critic_op in ["q1_adam", "q2_adam"] {
                assert!(
                    before(op(critic_op), op(actor_op)),
                    "{critic_op} is not ordered before {actor_op}"
                );
            }
        }
        // Q1's pass for the actor does not wait for Q2's update.
        assert!(!before(op("q2_adam"), op("q1_at_policy")));
        for reader in ["soft_target", "policy_loss", "actor_backward"] {
            assert!(before(op(reader), op("alpha_update")), "{reader}");
        }
        // The Polyak updates read the updated critics and write the targets after the
        // soft target's passes read them.
        for (adam, target, polyak) in [
            ("q1_adam", "q1_target_pass", "q1_polyak"),
            ("q2_adam", "q2_target_pass", "q2_polyak"),
        ] {
            assert!(before(op(adam), op(polyak)) && before(op(target), op(polyak)));
        }
        // The actor's sample needs no critic: nothing orders the critics' updates before it.
        assert!(!before(op("q1_adam"), op("actor_sample")));
        assert!(!before(op("q2_adam"), op("actor_sample")));
    }

    #[test]
    fn the_critics_run_on_streams_of_their_own() {
        for (a, b) in [
            ("q1_loss", "q2_loss"),
            ("q1_adam", "q2_adam"),
            ("q1_at_policy", "q2_at_policy"),
            ("q1_input_grad", "q2_input_grad"),
        ] {
            assert_ne!(stream(a), stream(b), "{a} and {b}");
            assert_ne!(stream(a), stream("actor_backward"));
        }
        assert_eq!(stream("q1_loss"), "q1");
        assert_eq!(stream("q2_loss"), "q2");
        assert_eq!(stream("actor_backward"), "actor");
    }
}
