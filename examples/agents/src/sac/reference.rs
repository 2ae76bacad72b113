//! The SAC kernels on the CPU, for tests: the networks' forward and backward passes in
//! f64, the squashed Gaussian, the three losses and their gradients, Adam, acting, the
//! replay rings and the observation statistics, and a whole update. The generator's
//! integers (slots drawn) are the kernels' exactly; the floats are f64 where the kernels
//! compute f32, except the statistics, the normalisation and Polyak on f32 data, which
//! mirror the kernels' f32 operations and match them bit for bit.

use crate::layout::{COUNTERS, Counter, HIDDEN, Tensor};
use crate::reference::{sample_slots, swish, swish_grad, widen};
use crate::rng::{
    PURPOSE_SAC_ACT, PURPOSE_SAC_ACTOR, PURPOSE_SAC_EVAL, PURPOSE_SAC_SAMPLE, PURPOSE_SAC_TARGET,
    agent_key, key_bits, unit24,
};
use crate::sac::config::SacConfig;
use crate::sac::layout::{
    ACTION_SCALE, ActorLayout as AL, CriticLayout as CL, LOG_STD_RANGE, NUM_CRITICS, RMS_COUNT,
    RMS_FLOATS, RMS_MEAN, RMS_VAR, SAC_IN, SAC_OBS,
};

/// The standard normal of words `2 i`, `2 i + 1` of `key`, Box-Muller as the kernels draw
/// it (`u1 = 1 - unit24`, `u2 = unit24`, `sqrt(-2 ln u1) cos(2 pi u2)`), in f64.
pub fn normal(key: u64, i: u32) -> f64 {
    let u1 = 1.0 - f64::from(unit24(key_bits(key, 2 * i)));
    let u2 = f64::from(unit24(key_bits(key, 2 * i + 1)));
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// `log(1 + exp(x))`.
pub fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// One draw of the squashed Gaussian (`cuda/sac.cuh`'s `squash`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Squashed {
    /// `tanh(u) ACTION_SCALE`.
    pub action: f64,
    /// `log N(u; mu, sigma) - 2 (log 2 - u - softplus(-2 u))`.
    pub logp: f64,
    /// `tanh(u)`.
    pub t: f64,
    /// `exp(ls)`, `ls` the clipped log-std.
    pub sigma: f64,
    /// `d ls / d ls_raw`: 1 inside the range, 0 outside, 1/2 at its ends.
    pub clip: f64,
}

/// rejax's `SquashedGaussianPolicy.__call__` for one action from its mean, raw log-std
/// and standard normal `eps`.
pub fn squash(mu: f64, ls_raw: f64, eps: f64) -> Squashed {
    let (lo, hi) = (f64::from(LOG_STD_RANGE.0), f64::from(LOG_STD_RANGE.1));
    let ls = ls_raw.clamp(lo, hi);
    let clip = if ls_raw > lo && ls_raw < hi {
        1.0
    } else if ls_raw == lo || ls_raw == hi {
        0.5
    } else {
        0.0
    };
    let sigma = ls.exp();
    let u = mu + sigma * eps;
    let t = u.tanh();
    let log_det = 2.0 * (std::f64::consts::LN_2 - u - softplus(-2.0 * u));
    let logp = -0.5 * eps * eps - ls - 0.5 * (2.0 * std::f64::consts::PI).ln() - log_det;
    Squashed {
        action: t * f64::from(ACTION_SCALE),
        logp,
        t,
        sigma,
        clip,
    }
}

fn dense(x: &[f64], rows: usize, k: usize, n: usize, w: &[f64], b: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; rows * n];
    for i in 0..rows {
        for j in 0..n {
            out[i * n + j] = b[j] + (0..k).map(|c| x[i * k + c] * w[c * n + j]).sum::<f64>();
        }
    }
    out
}

/// The two hidden layers of a network on `rows` inputs of `k` floats.
#[derive(Clone, Debug)]
pub struct Hidden {
    /// `x W1 + b1`, `[rows, HIDDEN]`.
    pub z1: Vec<f64>,
    /// `swish(z1)`.
    pub h1: Vec<f64>,
    /// `h1 W2 + b2`.
    pub z2: Vec<f64>,
    /// `swish(z2)`.
    pub h2: Vec<f64>,
}

fn hidden(
    p: &[f64],
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
    x: &[f64],
    rows: usize,
) -> Hidden {
    let k = w1.shape[0];
    let z1 = dense(x, rows, k, HIDDEN, &p[w1.range()], &p[b1.range()]);
    let h1: Vec<f64> = z1.iter().map(|&z| swish(z)).collect();
    let z2 = dense(&h1, rows, HIDDEN, HIDDEN, &p[w2.range()], &p[b2.range()]);
    let h2: Vec<f64> = z2.iter().map(|&z| swish(z)).collect();
    Hidden { z1, h1, z2, h2 }
}

fn head(p: &[f64], w: Tensor, b: Tensor, h2: &[f64], rows: usize) -> Vec<f64> {
    dense(h2, rows, HIDDEN, 1, &p[w.range()], &p[b.range()])
}

/// The actor (`[ActorLayout::PARAMS]`) on `rows` normalised observations
/// (`[rows, SAC_OBS]`): its hidden layers, means and raw log-stds.
pub fn actor_forward(p: &[f64], x: &[f64], rows: usize) -> (Hidden, Vec<f64>, Vec<f64>) {
    let h = hidden(p, AL::W1, AL::B1, AL::W2, AL::B2, x, rows);
    let mu = head(p, AL::WMU, AL::BMU, &h.h2, rows);
    let ls = head(p, AL::WLS, AL::BLS, &h.h2, rows);
    (h, mu, ls)
}

/// A critic (`[CriticLayout::PARAMS]`) on `rows` inputs `[obs, action]` (`[rows, SAC_IN]`).
pub fn critic_forward(p: &[f64], xa: &[f64], rows: usize) -> (Hidden, Vec<f64>) {
    let h = hidden(p, CL::W1, CL::B1, CL::W2, CL::B2, xa, rows);
    let q = head(p, CL::WQ, CL::BQ, &h.h2, rows);
    (h, q)
}

/// Backward through the hidden layers of `p`: given d loss / d h2 (`[rows, HIDDEN]`),
/// adds the gradients of W1, b1, W2, b2 into `grad` and returns d loss / d x.
#[allow(clippy::too_many_arguments)]
fn hidden_backward(
    p: &[f64],
    (w1, b1, w2, b2): (Tensor, Tensor, Tensor, Tensor),
    h: &Hidden,
    x: &[f64],
    rows: usize,
    gh2: &[f64],
    grad: &mut [f64],
) -> Vec<f64> {
    let k = w1.shape[0];
    let mut g1 = vec![0.0; rows * HIDDEN];
    for i in 0..rows {
        for n in 0..HIDDEN {
            let g = gh2[i * HIDDEN + n] * swish_grad(h.z2[i * HIDDEN + n]);
            grad[b2.offset + n] += g;
            for j in 0..HIDDEN {
                grad[w2.offset + j * HIDDEN + n] += h.h1[i * HIDDEN + j] * g;
                g1[i * HIDDEN + j] += g * p[w2.offset + j * HIDDEN + n];
            }
        }
    }
    let mut gx = vec![0.0; rows * k];
    for i in 0..rows {
        for j in 0..HIDDEN {
            let g = g1[i * HIDDEN + j] * swish_grad(h.z1[i * HIDDEN + j]);
            grad[b1.offset + j] += g;
            for c in 0..k {
                grad[w1.offset + c * HIDDEN + j] += x[i * k + c] * g;
                gx[i * k + c] += g * p[w1.offset + c * HIDDEN + j];
            }
        }
    }
    gx
}

const CRITIC_HIDDEN: (Tensor, Tensor, Tensor, Tensor) = (CL::W1, CL::B1, CL::W2, CL::B2);
const ACTOR_HIDDEN: (Tensor, Tensor, Tensor, Tensor) = (AL::W1, AL::B1, AL::W2, AL::B2);

/// `d Q / d action` of a critic at each of `rows` inputs.
pub fn critic_action_grad(p: &[f64], xa: &[f64], rows: usize) -> Vec<f64> {
    let (h, _) = critic_forward(p, xa, rows);
    let gh2: Vec<f64> = (0..rows * HIDDEN)
        .map(|e| p[CL::WQ.offset + e % HIDDEN])
        .collect();
    let mut scratch = vec![0.0; CL::PARAMS];
    let gx = hidden_backward(p, CRITIC_HIDDEN, &h, xa, rows, &gh2, &mut scratch);
    (0..rows).map(|i| gx[i * SAC_IN + SAC_OBS]).collect()
}

/// The observations with each row's action: `[rows, SAC_IN]`.
pub fn with_actions(x: &[f64], actions: &[f64]) -> Vec<f64> {
    actions
        .iter()
        .enumerate()
        .flat_map(|(i, &a)| x[i * SAC_OBS..(i + 1) * SAC_OBS].iter().copied().chain([a]))
        .collect()
}

/// What the actor's loss computed besides its gradient.
#[derive(Clone, Debug)]
pub struct ActorLoss {
    /// `mean(alpha logp - min_k Q_k(s, a))`.
    pub loss: f64,
    /// The gradient with respect to the actor.
    pub grad: Vec<f64>,
    /// Each row's `logp`, for the temperature's loss.
    pub logp: Vec<f64>,
    /// The smallest `|Q_0 - Q_1|` over the rows: where it is within the f32 kernel's
    /// rounding the kernel may take the other critic's gradient.
    pub min_critic_gap: f64,
}

/// rejax's `actor_loss_fn` on `rows` normalised observations `x` with noise `eps`, the
/// critics `[NUM_CRITICS, CriticLayout::PARAMS]` and `alpha`, and its gradient
/// (`jnp.min`'s gradient splits a tie evenly).
pub fn actor_loss_and_grad(
    actor: &[f64],
    critics: &[f64],
    x: &[f64],
    eps: &[f64],
    alpha: f64,
) -> ActorLoss {
    let rows = eps.len();
    let (h, mu, ls) = actor_forward(actor, x, rows);
    let s: Vec<Squashed> = (0..rows).map(|i| squash(mu[i], ls[i], eps[i])).collect();
    let xa = with_actions(x, &s.iter().map(|s| s.action).collect::<Vec<_>>());
    let critic = |k: usize| &critics[k * CL::PARAMS..(k + 1) * CL::PARAMS];
    let q: Vec<Vec<f64>> = (0..NUM_CRITICS)
        .map(|k| critic_forward(critic(k), &xa, rows).1)
        .collect();
    let dq: Vec<Vec<f64>> = (0..NUM_CRITICS)
        .map(|k| critic_action_grad(critic(k), &xa, rows))
        .collect();
    let inv_b = 1.0 / rows as f64;
    let mut loss = 0.0;
    let mut min_gap = f64::INFINITY;
    let mut gmu = vec![0.0; rows];
    let mut gls = vec![0.0; rows];
    for i in 0..rows {
        let (q0, q1) = (q[0][i], q[1][i]);
        min_gap = min_gap.min((q0 - q1).abs());
        let dmin = if q0 < q1 {
            dq[0][i]
        } else if q1 < q0 {
            dq[1][i]
        } else {
            0.5 * (dq[0][i] + dq[1][i])
        };
        loss += alpha * s[i].logp - q0.min(q1);
        let t = s[i].t;
        let gu = (alpha * 2.0 * t - dmin * f64::from(ACTION_SCALE) * (1.0 - t * t)) * inv_b;
        gmu[i] = gu;
        gls[i] = (gu * s[i].sigma * eps[i] - alpha * inv_b) * s[i].clip;
    }
    let mut grad = vec![0.0; AL::PARAMS];
    let mut gh2 = vec![0.0; rows * HIDDEN];
    for i in 0..rows {
        grad[AL::BMU.offset] += gmu[i];
        grad[AL::BLS.offset] += gls[i];
        for n in 0..HIDDEN {
            let h2 = h.h2[i * HIDDEN + n];
            grad[AL::WMU.offset + n] += h2 * gmu[i];
            grad[AL::WLS.offset + n] += h2 * gls[i];
            gh2[i * HIDDEN + n] =
                actor[AL::WMU.offset + n] * gmu[i] + actor[AL::WLS.offset + n] * gls[i];
        }
    }
    hidden_backward(actor, ACTOR_HIDDEN, &h, x, rows, &gh2, &mut grad);
    ActorLoss {
        loss: loss * inv_b,
        grad,
        logp: s.iter().map(|s| s.logp).collect(),
        min_critic_gap: min_gap,
    }
}

/// The critic targets `r + gamma (1 - done) (min_k Qtarget_k(s', a') - alpha logp')`,
/// `a'` the actor's sample on `next_x` with noise `eps`.
#[allow(clippy::too_many_arguments)]
pub fn critic_targets(
    actor: &[f64],
    targets: &[f64],
    next_x: &[f64],
    eps: &[f64],
    reward: &[f64],
    done: &[f64],
    alpha: f64,
    gamma: f64,
) -> Vec<f64> {
    let rows = eps.len();
    let (_, mu, ls) = actor_forward(actor, next_x, rows);
    let s: Vec<Squashed> = (0..rows).map(|i| squash(mu[i], ls[i], eps[i])).collect();
    let xa = with_actions(next_x, &s.iter().map(|s| s.action).collect::<Vec<_>>());
    let q: Vec<Vec<f64>> = (0..NUM_CRITICS)
        .map(|k| critic_forward(&targets[k * CL::PARAMS..(k + 1) * CL::PARAMS], &xa, rows).1)
        .collect();
    (0..rows)
        .map(|i| reward[i] + gamma * (1.0 - done[i]) * (q[0][i].min(q[1][i]) - alpha * s[i].logp))
        .collect()
}

/// rejax's `critic_loss_fn`, `sum_k mean_i 0.5 (Q_k(s_i, a_i) - y_i)^2`, on inputs `xa`
/// (`[rows, SAC_IN]`), and its gradient with respect to both critics.
pub fn critic_loss_and_grad(critics: &[f64], xa: &[f64], y: &[f64]) -> (f64, Vec<f64>) {
    let rows = y.len();
    let inv_b = 1.0 / rows as f64;
    let mut loss = 0.0;
    let mut grad = vec![0.0; NUM_CRITICS * CL::PARAMS];
    for k in 0..NUM_CRITICS {
        let p = &critics[k * CL::PARAMS..(k + 1) * CL::PARAMS];
        let g = &mut grad[k * CL::PARAMS..(k + 1) * CL::PARAMS];
        let (h, q) = critic_forward(p, xa, rows);
        let mut gh2 = vec![0.0; rows * HIDDEN];
        for i in 0..rows {
            let d = q[i] - y[i];
            loss += 0.5 * d * d * inv_b;
            let dq = d * inv_b;
            g[CL::BQ.offset] += dq;
            for n in 0..HIDDEN {
                g[CL::WQ.offset + n] += h.h2[i * HIDDEN + n] * dq;
                gh2[i * HIDDEN + n] = p[CL::WQ.offset + n] * dq;
            }
        }
        hidden_backward(p, CRITIC_HIDDEN, &h, xa, rows, &gh2, g);
    }
    (loss, grad)
}

/// rejax's `alpha_loss_fn`, `mean(-exp(log_alpha) (logp + target_entropy))`, and its
/// derivative in `log_alpha`.
pub fn alpha_loss_and_grad(log_alpha: f64, logp: &[f64], target_entropy: f64) -> (f64, f64) {
    let mean = logp.iter().map(|&l| l + target_entropy).sum::<f64>() / logp.len() as f64;
    let loss = -log_alpha.exp() * mean;
    (loss, loss)
}

/// One Adam step (optax's `clip` then `adam`; `t` the count after it) of `params` with
/// the kernel's f32 hyperparameters, widened.
pub fn adam_step(
    params: &mut [f64],
    grad: &[f64],
    m: &mut [f64],
    v: &mut [f64],
    t: u32,
    cfg: &SacConfig,
) {
    let (b1, c1, b2, c2) = (
        f64::from(cfg.b1()),
        f64::from(cfg.c1()),
        f64::from(cfg.b2()),
        f64::from(cfg.c2()),
    );
    let bc1 = 1.0 - b1.powi(t as i32);
    let bc2 = 1.0 - b2.powi(t as i32);
    let (lr, eps, clip) = (
        f64::from(cfg.learning_rate),
        f64::from(cfg.adam_eps),
        f64::from(cfg.max_grad),
    );
    for (((p, &g), m), v) in params
        .iter_mut()
        .zip(grad)
        .zip(m.iter_mut())
        .zip(v.iter_mut())
    {
        let g = g.clamp(-clip, clip);
        *m = c1 * g + b1 * *m;
        *v = c2 * g * g + b2 * *v;
        *p += -lr * ((*m / bc1) / ((*v / bc2).sqrt() + eps));
    }
}

/// rejax's `normalize_obs` as the kernels compute it in f32.
pub fn normalize(x: f32, mean: f32, var: f32) -> f32 {
    (x - mean) / (var + 1e-8).sqrt()
}

/// The observations `obs` (`[rows, SAC_OBS]`) normalised with one agent's statistics.
pub fn normalize_rows(obs: &[f32], rms: &[f32]) -> Vec<f64> {
    obs.iter()
        .enumerate()
        .map(|(e, &x)| {
            let c = e % SAC_OBS;
            f64::from(normalize(x, rms[RMS_MEAN + c], rms[RMS_VAR + c]))
        })
        .collect()
}

/// rejax's `update_rms` of one agent's statistics with a batch of `envs` observations
/// (`[envs, SAC_OBS]`), in f32 as `sac_store` computes it.
pub fn update_rms(rms: &mut [f32], batch: &[f32], envs: usize) {
    let n = envs as f32;
    let count = rms[RMS_COUNT];
    for c in 0..SAC_OBS {
        let x = |e: usize| batch[e * SAC_OBS + c];
        let bm = (0..envs).fold(0.0f32, |s, e| s + x(e)) / n;
        let bv = (0..envs).fold(0.0f32, |s, e| {
            let d = x(e) - bm;
            s + d * d
        }) / n;
        let (mean, var) = (rms[RMS_MEAN + c], rms[RMS_VAR + c]);
        let delta = bm - mean;
        let tot = count + n;
        let cross = delta * delta * count * n / tot;
        rms[RMS_MEAN + c] = mean + delta * n / tot;
        rms[RMS_VAR + c] = (var * count + bv * n + cross) / tot;
    }
    rms[RMS_COUNT] = count + n;
}

/// `sac_act` (`eval == None`: drawing at `counters[Step]`) or `sac_act_eval`
/// (`eval == Some(clock)`): the actions of `agents` agents for their `envs` observations
/// each (`[A, envs, SAC_OBS]`), with the actors `[A, ActorLayout::PARAMS]` and statistics
/// `[A, RMS_FLOATS]`.
#[allow(clippy::too_many_arguments)]
pub fn act(
    cfg: &SacConfig,
    actor: &[f32],
    rms: &[f32],
    obs: &[f32],
    agents: usize,
    envs: usize,
    counters: &[u32; COUNTERS],
    eval: Option<u32>,
) -> Vec<f64> {
    let (purpose, clock) = match eval {
        Some(clock) => (PURPOSE_SAC_EVAL, clock),
        None => (PURPOSE_SAC_ACT, counters[Counter::Step.index()]),
    };
    let mut actions = Vec::with_capacity(agents * envs);
    for a in 0..agents {
        let p = widen(&actor[a * AL::PARAMS..(a + 1) * AL::PARAMS]);
        let x = normalize_rows(
            &obs[a * envs * SAC_OBS..(a + 1) * envs * SAC_OBS],
            &rms[a * RMS_FLOATS..(a + 1) * RMS_FLOATS],
        );
        let (_, mu, ls) = actor_forward(&p, &x, envs);
        let key = agent_key(cfg.seed, a as u32, purpose, u64::from(clock));
        for e in 0..envs {
            actions.push(squash(mu[e], ls[e], normal(key, e as u32)).action);
        }
    }
    actions
}

/// SAC's replay rings on the host: Pendulum's observations and torques.
pub type HostSacReplay = crate::reference::HostRings<f32>;

/// One environment step of every agent (`[A, E, ...]`), as `stepgraph_envs::Transitions`
/// holds it, with the actions taken.
#[derive(Clone, Debug)]
pub struct HostSacStep<'a> {
    /// The observations after the step (reset ones where an episode ended).
    pub next_obs: &'a [f32],
    /// The observations reached (before any reset).
    pub final_obs: &'a [f32],
    /// The actions.
    pub actions: &'a [f32],
    /// The rewards.
    pub reward: &'a [f32],
    /// Terminated flags.
    pub terminated: &'a [u8],
    /// Truncated flags.
    pub truncated: &'a [u8],
}

/// `sac_store`: the transitions at slots `(pos + e) % C`, the statistics' update with
/// `step.next_obs`, `obs = step.next_obs`, then the counters moved on
/// ([`crate::reference::dqn_count`]).
pub fn store(
    replay: &mut HostSacReplay,
    rms: &mut [f32],
    obs: &mut [f32],
    step: &HostSacStep<'_>,
    envs: usize,
    counters: &mut [u32; COUNTERS],
    truncation_is_terminal: bool,
) {
    let c = replay.capacity;
    let pos = counters[Counter::Pos.index()] as usize % c;
    for a in 0..replay.agents {
        let rows = a * envs * SAC_OBS..(a + 1) * envs * SAC_OBS;
        update_rms(
            &mut rms[a * RMS_FLOATS..(a + 1) * RMS_FLOATS],
            &step.next_obs[rows],
            envs,
        );
        for e in 0..envs {
            let i = a * envs + e;
            let row = a * c + (pos + e) % c;
            let (src, dst) = (
                i * SAC_OBS..(i + 1) * SAC_OBS,
                row * SAC_OBS..(row + 1) * SAC_OBS,
            );
            replay.obs[dst.clone()].copy_from_slice(&obs[src.clone()]);
            replay.next_obs[dst].copy_from_slice(&step.final_obs[src.clone()]);
            obs[src.clone()].copy_from_slice(&step.next_obs[src]);
            replay.action[row] = step.actions[i];
            replay.reward[row] = step.reward[i];
            replay.done[row] = u8::from(
                step.terminated[i] != 0 || (truncation_is_terminal && step.truncated[i] != 0),
            );
        }
    }
    crate::reference::dqn_count(counters, envs as u32, c as u32);
}

/// One agent's SAC state on the host, f64.
#[derive(Clone, Debug, PartialEq)]
pub struct SacAgentState {
    /// `[ActorLayout::PARAMS]`.
    pub actor: Vec<f64>,
    /// `[NUM_CRITICS, CriticLayout::PARAMS]`.
    pub critics: Vec<f64>,
    /// The target critics.
    pub targets: Vec<f64>,
    /// The temperature's logarithm.
    pub log_alpha: f64,
    /// The actor's Adam moments.
    pub actor_m: Vec<f64>,
    /// The actor's second moment.
    pub actor_v: Vec<f64>,
    /// The critics' first moment.
    pub critic_m: Vec<f64>,
    /// The critics' second moment.
    pub critic_v: Vec<f64>,
    /// `log_alpha`'s first moment.
    pub alpha_m: f64,
    /// `log_alpha`'s second moment.
    pub alpha_v: f64,
    /// Updates taken.
    pub t: u32,
}

/// What [`sac_update`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SacReport {
    /// The last update's actor, critic and temperature losses.
    pub losses: [f64; 3],
    /// The smallest `|Q_0 - Q_1|` in the actor's losses (see [`ActorLoss::min_critic_gap`]).
    pub min_critic_gap: f64,
}

/// `sac_update` for agent `agent` with its statistics `rms` (`[RMS_FLOATS]`): `epochs`
/// updates if the iteration trains (`counters[Step] > fill_buffer`) and the ring holds a
/// batch (`None` where none ran), then the Polyak step of the targets (always).
pub fn sac_update(
    cfg: &SacConfig,
    agent: u32,
    state: &mut SacAgentState,
    counters: &[u32; COUNTERS],
    rms: &[f32],
    replay: &HostSacReplay,
    epochs: u32,
) -> Option<SacReport> {
    let report = train(cfg, agent, state, counters, rms, replay, epochs);
    let (keep, mix) = cfg.polyak_coefficients();
    for (t, &c) in state.targets.iter_mut().zip(&state.critics) {
        *t = *t * f64::from(keep) + c * f64::from(mix);
    }
    report
}

fn train(
    cfg: &SacConfig,
    agent: u32,
    state: &mut SacAgentState,
    counters: &[u32; COUNTERS],
    rms: &[f32],
    replay: &HostSacReplay,
    epochs: u32,
) -> Option<SacReport> {
    let c = replay.capacity;
    let size = (counters[Counter::Size.index()] as usize).min(c);
    let b = cfg.batch_size;
    if counters[Counter::Step.index()] <= cfg.fill_buffer || size < b || epochs == 0 {
        return None;
    }
    let mut report = SacReport {
        losses: [0.0; 3],
        min_critic_gap: f64::INFINITY,
    };
    for _ in 0..epochs {
        let t = state.t;
        let key = |purpose| agent_key(cfg.seed, agent, purpose, u64::from(t));
        let slots = sample_slots(key(PURPOSE_SAC_SAMPLE), size as u32, b as u32);
        let rows: Vec<usize> = slots
            .iter()
            .map(|&s| agent as usize * c + s as usize)
            .collect();
        let gather = |src: &[f32]| -> Vec<f64> {
            let raw: Vec<f32> = rows
                .iter()
                .flat_map(|&r| src[r * SAC_OBS..(r + 1) * SAC_OBS].iter().copied())
                .collect();
            normalize_rows(&raw, rms)
        };
        let (x, next_x) = (gather(&replay.obs), gather(&replay.next_obs));
        let action: Vec<f64> = rows.iter().map(|&r| f64::from(replay.action[r])).collect();
        let reward: Vec<f64> = rows.iter().map(|&r| f64::from(replay.reward[r])).collect();
        let done: Vec<f64> = rows
            .iter()
            .map(|&r| f64::from(replay.done[r] != 0))
            .collect();
        let alpha = state.log_alpha.exp();
        let noise =
            |purpose| -> Vec<f64> { (0..b as u32).map(|i| normal(key(purpose), i)).collect() };

        let actor = actor_loss_and_grad(
            &state.actor,
            &state.critics,
            &x,
            &noise(PURPOSE_SAC_ACTOR),
            alpha,
        );
        report.min_critic_gap = report.min_critic_gap.min(actor.min_critic_gap);
        adam_step(
            &mut state.actor,
            &actor.grad,
            &mut state.actor_m,
            &mut state.actor_v,
            t + 1,
            cfg,
        );

        let y = critic_targets(
            &state.actor,
            &state.targets,
            &next_x,
            &noise(PURPOSE_SAC_TARGET),
            &reward,
            &done,
            alpha,
            f64::from(cfg.gamma),
        );
        let (critic_loss, grad) =
            critic_loss_and_grad(&state.critics, &with_actions(&x, &action), &y);
        adam_step(
            &mut state.critics,
            &grad,
            &mut state.critic_m,
            &mut state.critic_v,
            t + 1,
            cfg,
        );

        let (alpha_loss, g) =
            alpha_loss_and_grad(state.log_alpha, &actor.logp, f64::from(cfg.target_entropy));
        let mut la = [state.log_alpha];
        let (mut m, mut v) = ([state.alpha_m], [state.alpha_v]);
        adam_step(&mut la, &[g], &mut m, &mut v, t + 1, cfg);
        (state.log_alpha, state.alpha_m, state.alpha_v) = (la[0], m[0], v[0]);
        state.t = t + 1;
        report.losses = [actor.loss, critic_loss, alpha_loss];
    }
    Some(report)
}

#[cfg(test)]
mod tests;
