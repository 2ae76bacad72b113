//! The host's side of the step: the seeded initial parameters and replay buffer, uploaded
//! into the step's buffers once, and [`Trainer`], which replays the step. Nothing is
//! staged per step: the step draws its batch and noise and advances Adam's clock itself.

use stepgraph::{Device, Result, Schedule, SmTarget};
use stepgraph_kernels::AdamHyper;
use stepgraph_testkit::Rng;

use crate::kernels::{Buf, Kernels};
use crate::layers::{Mlp, Sizes};
use crate::model::{allocate, sac};

/// Every optimizer's learning rate (MODEL.md).
pub const LR: f32 = 3e-4;
/// `γ`.
pub const GAMMA: f32 = 0.99;
/// `τ` of the Polyak update.
pub const TAU: f32 = 0.005;
/// `log α` at the start: `α = 1`.
pub const INITIAL_LOG_ALPHA: f32 = 0.0;
/// Transitions in the replay buffer unless `--replay` says otherwise.
pub const DEFAULT_REPLAY: usize = 1 << 18;

/// The step's config for `sizes`: MODEL.md's constants, every matmul planned for the
/// whole GPU.
pub fn config(sizes: Sizes) -> sac::Config {
    sac::Config {
        sizes,
        gamma: GAMMA,
        tau: TAU,
        target_entropy: -(sizes.action as f32),
        hyper: AdamHyper::default(),
        lr: LR,
        critic_sms: SmTarget::Whole,
    }
}

/// PyTorch's default initialisation of a linear layer: weights and biases uniform in
/// `±1/√in`.
fn init_mlp(device: &Device, rng: &mut Rng, net: &mut Mlp) -> Result<()> {
    for layer in [&mut net.l1, &mut net.l2, &mut net.l3] {
        let inp = layer.w.len() / layer.b.len();
        let bound = 1.0 / (inp as f32).sqrt();
        let w = rng.vec(layer.w.len(), -bound, bound);
        let b = rng.vec(layer.b.len(), -bound, bound);
        device.upload(&mut layer.w, &w)?;
        device.upload(&mut layer.b, &b)?;
    }
    Ok(())
}

/// Copies `src` into `dst` through the host (setup only).
fn copy_mlp(device: &Device, src: &Mlp, dst: &mut Mlp) -> Result<()> {
    for (s, d) in src.tensors().into_iter().zip(dst.tensors_mut()) {
        let v = device.download(s)?;
        device.upload(d, &v)?;
    }
    Ok(())
}

/// A generated replay buffer: observations uniform in [−1, 1), actions in (−0.99, 0.99),
/// rewards in [−1, 1), `done = 1` with probability 0.1.
pub fn upload_replay(
    device: &Device,
    rng: &mut Rng,
    s: &Sizes,
    replay: &mut crate::model::Transitions,
) -> Result<()> {
    let (n, o, a) = (replay.r.len(), s.obs, s.action);
    let up = |buf: &mut Buf, v: Vec<f32>| device.upload(buf, &v);
    up(&mut replay.s, rng.vec(n * o, -1.0, 1.0))?;
    up(&mut replay.a, rng.vec(n * a, -0.99, 0.99))?;
    up(&mut replay.r, rng.vec(n, -1.0, 1.0))?;
    up(&mut replay.s2, rng.vec(n * o, -1.0, 1.0))?;
    let done = (0..n)
        .map(|_| if rng.next_f32() < 0.1 { 1.0 } else { 0.0 })
        .collect();
    up(&mut replay.done, done)
}

/// The step's buffers for `sizes`, seeded: the networks initialised from `seed`, the
/// target critics copies of the critics, `log α = 0`, a generated replay buffer of
/// `replay` transitions, the device generator of `seed`.
pub fn initial_buffers(
    device: &Device,
    sizes: &Sizes,
    replay: usize,
    seed: u64,
) -> Result<sac::Buffers> {
    let mut b = allocate(device, sizes, replay, seed)?;
    let mut rng = Rng::new(seed);
    for critic in &mut b.critic {
        init_mlp(device, &mut rng, critic)?;
    }
    init_mlp(device, &mut rng, &mut b.actor_net)?;
    for (critic, target) in b.critic.iter().zip(&mut b.critic_target) {
        copy_mlp(device, critic, target)?;
    }
    device.upload(&mut b.log_alpha, &[INITIAL_LOG_ALPHA])?;
    upload_replay(device, &mut rng, sizes, &mut b.replay)?;
    device.synchronize()?;
    Ok(b)
}

/// The captured step.
#[derive(Debug)]
pub struct Trainer {
    /// The step.
    pub step: sac::Step,
}

impl Trainer {
    /// The seeded step for `sizes` with a replay buffer of [`DEFAULT_REPLAY`]
    /// transitions, captured with `schedule`.
    pub fn new(
        device: &Device,
        kernels: std::sync::Arc<Kernels>,
        sizes: Sizes,
        seed: u64,
        schedule: Schedule,
    ) -> Result<Trainer> {
        Trainer::with_replay(device, kernels, sizes, DEFAULT_REPLAY, seed, schedule)
    }

    /// The same with a replay buffer of `replay` transitions.
    pub fn with_replay(
        device: &Device,
        kernels: std::sync::Arc<Kernels>,
        sizes: Sizes,
        replay: usize,
        seed: u64,
        schedule: Schedule,
    ) -> Result<Trainer> {
        Trainer::with_config(device, kernels, config(sizes), replay, seed, schedule)
    }

    /// The same with a configuration of its own (`config` gives the default one).
    pub fn with_config(
        device: &Device,
        kernels: std::sync::Arc<Kernels>,
        config: sac::Config,
        replay: usize,
        seed: u64,
        schedule: Schedule,
    ) -> Result<Trainer> {
        let buffers = initial_buffers(device, &config.sizes, replay, seed)?;
        let step = sac::Step::with_schedule(device, kernels, buffers, config, schedule)?;
        Ok(Trainer { step })
    }

    /// One update: one replay of the graph (it draws its batch and noise and advances
    /// Adam's clock itself).
    pub fn update(&mut self) -> Result<()> {
        self.step.replay()
    }

    /// The same update run eagerly: every op issued to its stream, no graph (for
    /// comparison with the replay).
    pub fn update_eager(&mut self) -> Result<()> {
        self.step.run_eager()
    }

    /// Every network of the step, named: the critics, their targets, the actor.
    pub fn networks(b: &sac::Buffers) -> Vec<(String, &Mlp)> {
        let critics = b.critic.iter().enumerate();
        let targets = b.critic_target.iter().enumerate();
        critics
            .map(|(i, n)| (format!("critic{i}"), n))
            .chain(targets.map(|(i, n)| (format!("critic{i}_target"), n)))
            .chain([("actor".to_string(), &b.actor_net)])
            .collect()
    }

    /// Every parameter after the last finished replay (waits for it): the critics, their
    /// targets, the actor ([`Trainer::networks`]'s order), each as its `tensors()`, then
    /// `log α`.
    pub fn parameters(&self) -> Result<Vec<Vec<f32>>> {
        self.step.download_many(|b| {
            let nets = Self::networks(b)
                .into_iter()
                .flat_map(|(_, net)| net.tensors());
            nets.chain([&b.log_alpha]).collect()
        })
    }

    /// The losses of the last finished replay (waits for it): each critic's `L_Qi`, then
    /// `L_π` and `L_α`.
    pub fn losses(&self) -> Result<Vec<f32>> {
        let all = self.step.download_many(|b| {
            let critics = b.critic_pass.iter().map(|p| &p.loss);
            critics
                .chain([&b.actor_loss.loss, &b.alpha_grad.loss])
                .collect()
        })?;
        Ok(all.iter().map(|l| l[0]).collect())
    }
}

/// `L_Q1 .. L_QN L_pi L_alpha` with their values, as [`Trainer::losses`] orders them.
pub fn losses_line(losses: &[f32]) -> String {
    let n = losses.len().saturating_sub(2);
    let names = (1..=n)
        .map(|i| format!("L_Q{i}"))
        .chain(["L_pi".into(), "L_alpha".into()]);
    names
        .zip(losses)
        .map(|(name, l)| format!("{name} {l:.6}"))
        .collect::<Vec<_>>()
        .join(" ")
}
