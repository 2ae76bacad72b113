//! The host's side of the step: the seeded initial parameters and batch, uploaded into
//! the step's buffers, and [`Trainer`], which stages Adam's step-dependent scalars before
//! each replay.

use stepgraph::{Device, Result, Schedule};
use stepgraph_kernels::{AdamHyper, AdamScalars};

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

/// The step's config for `sizes` and the noise `seed`: MODEL.md's constants.
pub fn config(sizes: Sizes, seed: u64) -> sac::Config {
    sac::Config {
        sizes,
        gamma: GAMMA,
        tau: TAU,
        target_entropy: -(sizes.action as f32),
        hyper: AdamHyper::default(),
        seed,
    }
}

/// xorshift64*: the same draws on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in [0, 1), 24 random bits.
    pub fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32
    }

    /// `n` values uniform in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * self.uniform()).collect()
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

/// A generated batch: observations uniform in [−1, 1), actions in (−0.99, 0.99),
/// rewards in [−1, 1), `done = 1` with probability 0.1.
pub fn upload_batch(
    device: &Device,
    rng: &mut Rng,
    s: &Sizes,
    batch: &mut crate::model::Batch,
) -> Result<()> {
    let (b, o, a) = (s.batch, s.obs, s.action);
    let up = |buf: &mut Buf, v: Vec<f32>| device.upload(buf, &v);
    up(&mut batch.s, rng.vec(b * o, -1.0, 1.0))?;
    up(&mut batch.a, rng.vec(b * a, -0.99, 0.99))?;
    up(&mut batch.r, rng.vec(b, -1.0, 1.0))?;
    up(&mut batch.s2, rng.vec(b * o, -1.0, 1.0))?;
    let done = (0..b)
        .map(|_| if rng.uniform() < 0.1 { 1.0 } else { 0.0 })
        .collect();
    up(&mut batch.done, done)
}

/// The step's buffers for `sizes`, seeded: the networks initialised from `seed`, the
/// target critics copies of the critics, `log α = 0`, a generated batch.
pub fn initial_buffers(device: &Device, sizes: &Sizes, seed: u64) -> Result<sac::Buffers> {
    let mut b = allocate(device, sizes)?;
    let mut rng = Rng::new(seed);
    for critic in &mut b.critic {
        init_mlp(device, &mut rng, critic)?;
    }
    init_mlp(device, &mut rng, &mut b.actor_net)?;
    for (critic, target) in b.critic.iter().zip(&mut b.critic_target) {
        copy_mlp(device, critic, target)?;
    }
    device.upload(&mut b.log_alpha, &[INITIAL_LOG_ALPHA])?;
    upload_batch(device, &mut rng, sizes, &mut b.batch)?;
    device.synchronize()?;
    Ok(b)
}

/// The captured step and the count of replays, for Adam's bias corrections.
#[derive(Debug)]
pub struct Trainer {
    /// The step.
    pub step: sac::Step,
    /// Replays so far.
    pub t: u32,
}

impl Trainer {
    /// The seeded step for `sizes`, captured with `schedule`.
    pub fn new(
        device: &Device,
        kernels: std::sync::Arc<Kernels>,
        sizes: Sizes,
        seed: u64,
        schedule: Schedule,
    ) -> Result<Trainer> {
        let buffers = initial_buffers(device, &sizes, seed)?;
        let step =
            sac::Step::with_schedule(device, kernels, buffers, config(sizes, seed), schedule)?;
        Ok(Trainer { step, t: 0 })
    }

    /// One update: stages lr and the bias corrections of step `t + 1`, then replays.
    pub fn update(&mut self) -> Result<()> {
        self.stage_next()?;
        self.step.replay()
    }

    /// The same update run eagerly: every op issued to its stream, no graph (for
    /// comparison with the replay).
    pub fn update_eager(&mut self) -> Result<()> {
        self.stage_next()?;
        self.step.run_eager()
    }

    /// Stages the scalars of step `t + 1`.
    fn stage_next(&mut self) -> Result<()> {
        self.t += 1;
        let hyper = self.step.config().hyper;
        let values = AdamScalars::at_step(LR, &hyper, self.t).values();
        self.step.stage(|b| &b.scalars.staged, &values)
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
        self.step.wait()?;
        let b = self.step.buffers();
        let mut out = Vec::new();
        for (_, net) in Self::networks(b) {
            for t in net.tensors() {
                out.push(self.step.download(|_| t)?);
            }
        }
        out.push(self.step.download(|b| &b.log_alpha)?);
        Ok(out)
    }

    /// The losses of the last finished replay (waits for it): each critic's `L_Qi`, then
    /// `L_π` and `L_α`.
    pub fn losses(&self) -> Result<Vec<f32>> {
        self.step.wait()?;
        let b = self.step.buffers();
        let critics = b.critic_pass.iter().map(|p| &p.loss);
        critics
            .chain([&b.actor_loss.loss, &b.temperature.loss])
            .map(|l| Ok(self.step.download(|_| l)?[0]))
            .collect()
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
