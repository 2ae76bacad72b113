//! The kernels on the CPU, for tests: the network's forward and backward in f64, the
//! double-DQN targets, the loss, the clip, Adam, Polyak, the epsilon schedule, acting,
//! the replay rings and counters, the batch's sampling, and a whole update. The
//! generator's integers (actions explored, slots drawn) are the kernels' exactly; the
//! floats are f64 where the kernels compute f32, except the epsilon schedule and Polyak,
//! which mirror the kernels' f32 operations and match them bit for bit.

use crate::config::DqnConfig;
use crate::layout::{ACTIONS, COUNTERS, Counter, DuelingLayout as L, HIDDEN, OBS};
use crate::rng::{PURPOSE_ACT, PURPOSE_EVAL, PURPOSE_SAMPLE, agent_key, below, key_bits, unit24};

/// `z sigmoid(z)`.
pub fn swish(z: f64) -> f64 {
    z / (1.0 + (-z).exp())
}

/// `d swish / dz = s (1 + z (1 - s))`, `s = sigmoid(z)`.
pub fn swish_grad(z: f64) -> f64 {
    let s = 1.0 / (1.0 + (-z).exp());
    s * (1.0 + z * (1.0 - s))
}

/// The activations of a batch of `rows` observations (`[rows, OBS]`): pre- and
/// post-activation of both hidden layers (`[rows, HIDDEN]`) and Q (`[rows, ACTIONS]`).
#[derive(Clone, Debug)]
pub struct Forward {
    /// `obs W1 + b1`.
    pub z1: Vec<f64>,
    /// `swish(z1)`.
    pub h1: Vec<f64>,
    /// `h1 W2 + b2`.
    pub z2: Vec<f64>,
    /// `swish(z2)`.
    pub h2: Vec<f64>,
    /// `V + A - mean(A)`.
    pub q: Vec<f64>,
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

/// The network of `params` (one agent's, [`L::PARAMS`]) on `rows` observations.
pub fn forward(params: &[f64], obs: &[f64], rows: usize) -> Forward {
    let t = |t: crate::layout::Tensor| &params[t.range()];
    let z1 = dense(obs, rows, OBS, HIDDEN, t(L::W1), t(L::B1));
    let h1: Vec<f64> = z1.iter().map(|&z| swish(z)).collect();
    let z2 = dense(&h1, rows, HIDDEN, HIDDEN, t(L::W2), t(L::B2));
    let h2: Vec<f64> = z2.iter().map(|&z| swish(z)).collect();
    let v = dense(&h2, rows, HIDDEN, 1, t(L::WV), t(L::BV));
    let a = dense(&h2, rows, HIDDEN, ACTIONS, t(L::WA), t(L::BA));
    let mut q = vec![0.0; rows * ACTIONS];
    for i in 0..rows {
        let adv = &a[i * ACTIONS..(i + 1) * ACTIONS];
        let mean = adv.iter().sum::<f64>() / ACTIONS as f64;
        for j in 0..ACTIONS {
            q[i * ACTIONS + j] = v[i] + (adv[j] - mean);
        }
    }
    Forward { z1, h1, z2, h2, q }
}

/// The first of the largest values (`jnp.argmax`).
pub fn argmax_first(q: &[f64]) -> usize {
    (1..q.len()).fold(0, |best, j| if q[j] > q[best] { j } else { best })
}

/// The double-DQN targets `r + ((1 - done) gamma) Q_target(s', argmax_a Q_online(s', a))`
/// of `rows` transitions (`done` 0 or 1).
pub fn ddqn_targets(
    online: &[f64],
    target: &[f64],
    next_obs: &[f64],
    reward: &[f64],
    done: &[f64],
    gamma: f64,
) -> Vec<f64> {
    let rows = reward.len();
    let q_online = forward(online, next_obs, rows).q;
    let q_target = forward(target, next_obs, rows).q;
    (0..rows)
        .map(|i| {
            let best = argmax_first(&q_online[i * ACTIONS..(i + 1) * ACTIONS]);
            reward[i] + ((1.0 - done[i]) * gamma) * q_target[i * ACTIONS + best]
        })
        .collect()
}

/// rejax's loss, `mean_i 0.5 (Q(s_i, a_i) - y_i)^2`, and its gradient with respect to
/// `params` (same layout).
pub fn loss_and_grad(params: &[f64], obs: &[f64], actions: &[usize], y: &[f64]) -> (f64, Vec<f64>) {
    let rows = y.len();
    let f = forward(params, obs, rows);
    let mut grad = vec![0.0; L::PARAMS];
    let mut loss = 0.0;
    // dL/dV and dL/dA per row.
    let mut gv = vec![0.0; rows];
    let mut ga = vec![0.0; rows * ACTIONS];
    for i in 0..rows {
        let d = f.q[i * ACTIONS + actions[i]] - y[i];
        loss += 0.5 * d * d;
        let g = d / rows as f64;
        gv[i] = g;
        for j in 0..ACTIONS {
            let delta = if j == actions[i] { 1.0 } else { 0.0 };
            ga[i * ACTIONS + j] = g * (delta - 1.0 / ACTIONS as f64);
        }
    }
    loss /= rows as f64;
    // Heads.
    let mut g2 = vec![0.0; rows * HIDDEN];
    for i in 0..rows {
        grad[L::BV.offset] += gv[i];
        for j in 0..ACTIONS {
            grad[L::BA.offset + j] += ga[i * ACTIONS + j];
        }
        for n in 0..HIDDEN {
            let h = f.h2[i * HIDDEN + n];
            grad[L::WV.offset + n] += h * gv[i];
            let mut gh = params[L::WV.offset + n] * gv[i];
            for j in 0..ACTIONS {
                grad[L::WA.offset + n * ACTIONS + j] += h * ga[i * ACTIONS + j];
                gh += params[L::WA.offset + n * ACTIONS + j] * ga[i * ACTIONS + j];
            }
            g2[i * HIDDEN + n] = gh * swish_grad(f.z2[i * HIDDEN + n]);
        }
    }
    // Second layer.
    let mut g1 = vec![0.0; rows * HIDDEN];
    for i in 0..rows {
        for n in 0..HIDDEN {
            let g = g2[i * HIDDEN + n];
            grad[L::B2.offset + n] += g;
            for k in 0..HIDDEN {
                grad[L::W2.offset + k * HIDDEN + n] += f.h1[i * HIDDEN + k] * g;
                g1[i * HIDDEN + k] += g * params[L::W2.offset + k * HIDDEN + n];
            }
        }
    }
    // First layer.
    for i in 0..rows {
        for k in 0..HIDDEN {
            let g = g1[i * HIDDEN + k] * swish_grad(f.z1[i * HIDDEN + k]);
            grad[L::B1.offset + k] += g;
            for c in 0..OBS {
                grad[L::W1.offset + c * HIDDEN + k] += obs[i * OBS + c] * g;
            }
        }
    }
    (loss, grad)
}

/// `optax.clip(max_delta)`: each element into `[-max_delta, max_delta]`.
pub fn clip(grad: &mut [f64], max_delta: f64) {
    for g in grad {
        *g = g.clamp(-max_delta, max_delta);
    }
}

/// One agent's Adam state: the moments (layout of the parameters) and the step count.
#[derive(Clone, Debug, PartialEq)]
pub struct Adam {
    /// The first moment.
    pub m: Vec<f64>,
    /// The second moment.
    pub v: Vec<f64>,
    /// Steps taken.
    pub t: u32,
}

/// One Adam step, optax's `scale_by_adam` then `-lr`: with `t` the count after the step,
/// `m = c1 g + b1 m`, `v = c2 g^2 + b2 v`, `p += -lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t))
/// + eps)`. The hyperparameters are the f32 values the kernel takes, widened.
pub fn adam_step(params: &mut [f64], grad: &[f64], adam: &mut Adam, cfg: &DqnConfig) {
    adam.t += 1;
    let (b1, c1, b2, c2) = (
        f64::from(cfg.b1()),
        f64::from(cfg.c1()),
        f64::from(cfg.b2()),
        f64::from(cfg.c2()),
    );
    let bc1 = 1.0 - b1.powi(adam.t as i32);
    let bc2 = 1.0 - b2.powi(adam.t as i32);
    let (lr, eps) = (f64::from(cfg.learning_rate), f64::from(cfg.adam_eps));
    for (p, ((&g, m), v)) in params
        .iter_mut()
        .zip(grad.iter().zip(adam.m.iter_mut()).zip(adam.v.iter_mut()))
    {
        *m = c1 * g + b1 * *m;
        *v = c2 * g * g + b2 * *v;
        *p += -lr * ((*m / bc1) / ((*v / bc2).sqrt() + eps));
    }
}

/// `target = target keep + online mix`, each product and the sum rounded once in f32, as
/// the kernel computes it.
pub fn polyak(online: &[f32], target: &mut [f32], keep: f32, mix: f32) {
    for (t, &p) in target.iter_mut().zip(online) {
        *t = *t * keep + p * mix;
    }
}

/// `optax.linear_schedule(start, end, steps)` at `step`, in f32 as the kernel computes it.
pub fn epsilon_at(step: u32, start: f32, end: f32, steps: u32) -> f32 {
    let count = step.min(steps);
    let frac = 1.0 - count as f32 / steps as f32;
    (start - end) * frac + end
}

/// `distrax.EpsilonGreedy`'s draw with the kernels' words: explore (word `2 env` below
/// `eps`) with an action uniform over all, else the greedy one, uniform among exact ties.
pub fn epsilon_greedy(q: &[f64], eps: f32, key: u64, env: u32) -> usize {
    let explore = key_bits(key, 2 * env);
    let pick = key_bits(key, 2 * env + 1);
    if unit24(explore) < eps {
        return below(pick, ACTIONS as u32) as usize;
    }
    let best = q.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let ties: Vec<usize> = (0..q.len()).filter(|&j| q[j] == best).collect();
    let nth = if ties.len() > 1 {
        below(pick, ties.len() as u32) as usize
    } else {
        0
    };
    ties.get(nth).copied().unwrap_or(0)
}

/// What [`act`] chose and why, per environment.
#[derive(Clone, Debug)]
pub struct Acted {
    /// `[A, E]`.
    pub actions: Vec<i32>,
    /// `[A, E, ACTIONS]`: the Q values acted on.
    pub q: Vec<f64>,
    /// The epsilon used (2 where every action was uniform).
    pub epsilon: f32,
}

/// `dqn_act` (training, `eval == None`: the step is `counters[Step]`, uniform while at
/// most `fill_buffer`) or `dqn_act_eval` (`eval == Some((clock, epsilon))`) on
/// `params` `[A, PARAMS]` and `obs` `[A, E, OBS]`.
pub fn act(
    cfg: &DqnConfig,
    params: &[f32],
    obs: &[f32],
    agents: usize,
    envs: usize,
    counters: &[u32; COUNTERS],
    eval: Option<(u32, f32)>,
) -> Acted {
    let (purpose, clock, epsilon) = match eval {
        Some((clock, eps)) => (PURPOSE_EVAL, clock, eps),
        None => {
            let step = counters[Counter::Step.index()];
            let eps = if step <= cfg.fill_buffer {
                2.0
            } else {
                epsilon_at(step, cfg.eps_start, cfg.eps_end, cfg.exploration_steps)
            };
            (PURPOSE_ACT, step, eps)
        }
    };
    let mut actions = vec![0; agents * envs];
    let mut qs = vec![0.0; agents * envs * ACTIONS];
    for a in 0..agents {
        let p = widen(&params[a * L::PARAMS..(a + 1) * L::PARAMS]);
        let o = widen(&obs[a * envs * OBS..(a + 1) * envs * OBS]);
        let q = forward(&p, &o, envs).q;
        let key = agent_key(cfg.seed, a as u32, purpose, u64::from(clock));
        for e in 0..envs {
            let row = &q[e * ACTIONS..(e + 1) * ACTIONS];
            actions[a * envs + e] = epsilon_greedy(row, epsilon, key, e as u32) as i32;
        }
        qs[a * envs * ACTIONS..(a + 1) * envs * ACTIONS].copy_from_slice(&q);
    }
    Acted {
        actions,
        q: qs,
        epsilon,
    }
}

/// f32 values as f64.
pub fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// Replay rings on the host, in the layout of [`crate::ReplayRings`]: `[A, C, ...]`, with
/// actions of type `T`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostRings<T> {
    /// Agents.
    pub agents: usize,
    /// Slots per ring.
    pub capacity: usize,
    /// `[A, C, obs]`.
    pub obs: Vec<f32>,
    /// `[A, C]`.
    pub action: Vec<T>,
    /// `[A, C]`.
    pub reward: Vec<f32>,
    /// `[A, C, obs]`.
    pub next_obs: Vec<f32>,
    /// `[A, C]`, 0 or 1.
    pub done: Vec<u8>,
}

/// DQN's replay rings on the host: CartPole's observations and actions.
pub type HostReplay = HostRings<i32>;

/// One environment step's transitions of every agent (`[A, E, ...]`), as
/// `stepgraph_envs::Transitions` holds them, with the actions taken.
#[derive(Clone, Debug)]
pub struct HostTransitions<'a> {
    /// The observations acted on.
    pub obs: &'a [f32],
    /// The observations reached (before any reset).
    pub final_obs: &'a [f32],
    /// The actions.
    pub actions: &'a [i32],
    /// The rewards.
    pub reward: &'a [f32],
    /// Terminated flags.
    pub terminated: &'a [u8],
    /// Truncated flags.
    pub truncated: &'a [u8],
}

/// `replay_insert`: the E transitions of each agent at slots `(pos + e) % C`.
pub fn replay_insert(
    replay: &mut HostReplay,
    tr: &HostTransitions<'_>,
    envs: usize,
    counters: &[u32; COUNTERS],
    truncation_is_terminal: bool,
) {
    let c = replay.capacity;
    let pos = counters[Counter::Pos.index()] as usize % c;
    for a in 0..replay.agents {
        for e in 0..envs {
            let i = a * envs + e;
            let row = a * c + (pos + e) % c;
            replay.obs[row * OBS..(row + 1) * OBS].copy_from_slice(&tr.obs[i * OBS..(i + 1) * OBS]);
            replay.next_obs[row * OBS..(row + 1) * OBS]
                .copy_from_slice(&tr.final_obs[i * OBS..(i + 1) * OBS]);
            replay.action[row] = tr.actions[i];
            replay.reward[row] = tr.reward[i];
            replay.done[row] =
                u8::from(tr.terminated[i] != 0 || (truncation_is_terminal && tr.truncated[i] != 0));
        }
    }
}

/// `dqn_count`: the counters after a step of `envs` environments per agent.
pub fn dqn_count(counters: &mut [u32; COUNTERS], envs: u32, capacity: u32) {
    let step = counters[Counter::Step.index()];
    counters[Counter::StepBefore.index()] = step;
    counters[Counter::Step.index()] = step.wrapping_add(envs);
    counters[Counter::Pos.index()] = (counters[Counter::Pos.index()] % capacity + envs) % capacity;
    counters[Counter::Size.index()] = (u64::from(counters[Counter::Size.index()]) + u64::from(envs))
        .min(u64::from(capacity)) as u32;
}

/// `batch` distinct slots uniform in `[0, size)` by Floyd's algorithm with the kernel's
/// draws: for `j < batch`, `t` uniform in `[0, size - batch + j]` (word `j` of `key`);
/// take `t` unless already taken, then `size - batch + j`. `batch <= size`.
pub fn sample_slots(key: u64, size: u32, batch: u32) -> Vec<u32> {
    let base = size - batch;
    let mut taken = std::collections::HashSet::new();
    let mut slots = Vec::with_capacity(batch as usize);
    for j in 0..batch {
        let t = below(key_bits(key, j), base + j + 1);
        let s = if taken.contains(&t) { base + j } else { t };
        taken.insert(s);
        slots.push(s);
    }
    slots
}

/// An agent's training state on the host, f64.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentState {
    /// The online parameters.
    pub params: Vec<f64>,
    /// Adam's moments and count.
    pub adam: Adam,
}

/// What [`dqn_update`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UpdateReport {
    /// The last update's loss.
    pub loss: f64,
    /// The smallest gap between the online network's best and second-best Q value at a
    /// next observation, over every row of every update: where it is within the f32
    /// kernel's rounding, the kernel may pick the other action for the target, so a
    /// comparison with the kernel needs it well above that.
    pub min_argmax_gap: f64,
}

/// `dqn_update` for agent `agent`: `epochs` updates if the iteration trains
/// (`counters[StepBefore] > fill_buffer`) and the ring holds a batch; `None` where
/// nothing ran.
pub fn dqn_update(
    cfg: &DqnConfig,
    agent: u32,
    state: &mut AgentState,
    target: &[f64],
    counters: &[u32; COUNTERS],
    replay: &HostReplay,
    epochs: u32,
) -> Option<UpdateReport> {
    let c = replay.capacity;
    let size = (counters[Counter::Size.index()] as usize).min(c);
    let b = cfg.batch_size;
    if counters[Counter::StepBefore.index()] <= cfg.fill_buffer || size < b || epochs == 0 {
        return None;
    }
    let mut report = UpdateReport {
        loss: 0.0,
        min_argmax_gap: f64::INFINITY,
    };
    for _ in 0..epochs {
        let key = agent_key(cfg.seed, agent, PURPOSE_SAMPLE, u64::from(state.adam.t));
        let slots = sample_slots(key, size as u32, b as u32);
        let rows: Vec<usize> = slots
            .iter()
            .map(|&s| agent as usize * c + s as usize)
            .collect();
        let gather = |src: &[f32]| -> Vec<f64> {
            rows.iter()
                .flat_map(|&r| src[r * OBS..(r + 1) * OBS].iter().map(|&v| f64::from(v)))
                .collect()
        };
        let (obs, next_obs) = (gather(&replay.obs), gather(&replay.next_obs));
        let actions: Vec<usize> = rows
            .iter()
            .map(|&r| replay.action[r].clamp(0, ACTIONS as i32 - 1) as usize)
            .collect();
        let reward: Vec<f64> = rows.iter().map(|&r| f64::from(replay.reward[r])).collect();
        let done: Vec<f64> = rows
            .iter()
            .map(|&r| f64::from(replay.done[r] != 0))
            .collect();
        let q_next = forward(&state.params, &next_obs, b).q;
        for row in q_next.chunks(ACTIONS) {
            let best = argmax_first(row);
            let gap = (0..ACTIONS)
                .filter(|&j| j != best)
                .map(|j| row[best] - row[j])
                .fold(f64::INFINITY, f64::min);
            report.min_argmax_gap = report.min_argmax_gap.min(gap);
        }
        let y = ddqn_targets(
            &state.params,
            target,
            &next_obs,
            &reward,
            &done,
            f64::from(cfg.gamma),
        );
        let (l, mut grad) = loss_and_grad(&state.params, &obs, &actions, &y);
        report.loss = l;
        clip(&mut grad, f64::from(cfg.max_grad));
        adam_step(&mut state.params, &grad, &mut state.adam, cfg);
    }
    Some(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::init_params;
    use stepgraph_testkit::Rng;

    fn random_params(rng: &mut Rng, scale: f64) -> Vec<f64> {
        (0..L::PARAMS)
            .map(|_| (rng.next_f64() * 2.0 - 1.0) * scale)
            .collect()
    }

    #[test]
    fn the_backward_matches_finite_differences_of_the_forward() {
        let mut rng = Rng::new(11);
        let rows = 7;
        // Biases nonzero too, so every gradient term is exercised.
        let params = random_params(&mut rng, 0.3);
        let obs: Vec<f64> = (0..rows * OBS)
            .map(|_| rng.next_f64() * 2.0 - 1.0)
            .collect();
        let actions: Vec<usize> = (0..rows).map(|_| rng.below(ACTIONS)).collect();
        let y: Vec<f64> = (0..rows).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
        let (_, grad) = loss_and_grad(&params, &obs, &actions, &y);
        let loss = |p: &[f64]| loss_and_grad(p, &obs, &actions, &y).0;
        let h = 1e-6;
        let mut worst = 0.0f64;
        let scale = grad.iter().fold(0.0f64, |m, g| m.max(g.abs()));
        for p in 0..L::PARAMS {
            let (mut up, mut down) = (params.clone(), params.clone());
            up[p] += h;
            down[p] -= h;
            let fd = (loss(&up) - loss(&down)) / (2.0 * h);
            worst = worst.max((fd - grad[p]).abs() / scale);
        }
        // Central differences err by O(h^2) and the loss's rounding by 1e-16 / h: both far
        // below 1e-7 of the largest gradient.
        assert!(
            worst < 1e-7,
            "largest difference {worst:e} of the largest gradient"
        );
    }

    #[test]
    fn q_is_value_plus_centred_advantage() {
        let mut rng = Rng::new(2);
        let p = random_params(&mut rng, 0.2);
        let obs = [0.1, -0.2, 0.03, 0.4];
        let f = forward(&p, &obs, 1);
        let v = p[L::BV.offset]
            + (0..HIDDEN)
                .map(|n| f.h2[n] * p[L::WV.offset + n])
                .sum::<f64>();
        let a: Vec<f64> = (0..ACTIONS)
            .map(|j| {
                p[L::BA.offset + j]
                    + (0..HIDDEN)
                        .map(|n| f.h2[n] * p[L::WA.offset + n * ACTIONS + j])
                        .sum::<f64>()
            })
            .collect();
        let mean = a.iter().sum::<f64>() / ACTIONS as f64;
        for (q, a) in f.q.iter().zip(&a) {
            assert!((q - (v + a - mean)).abs() < 1e-12);
        }
        assert!(((f.q[0] + f.q[1]) / 2.0 - v).abs() < 1e-12);
    }

    #[test]
    fn adam_matches_a_hand_computed_step_after_the_clip() {
        let cfg = DqnConfig::rejax_cartpole(0);
        let mut params = vec![1.0, -2.0];
        let mut grad = vec![0.5, -30.0];
        clip(&mut grad, f64::from(cfg.max_grad));
        assert_eq!(grad, [0.5, -10.0]);
        let mut adam = Adam {
            m: vec![0.0; 2],
            v: vec![0.0; 2],
            t: 0,
        };
        adam_step(&mut params, &grad, &mut adam, &cfg);
        // Step 1: m = 0.1 g, v = 0.001 g^2; bias-corrected they are g and g^2, so the
        // step is lr g / (|g| + eps) = lr sign(g) up to eps.
        let (c1, c2) = (f64::from(cfg.c1()), f64::from(cfg.c2()));
        let lr = f64::from(cfg.learning_rate);
        let eps = f64::from(cfg.adam_eps);
        assert_eq!(adam.t, 1);
        assert!((adam.m[0] - c1 * 0.5).abs() < 1e-15);
        assert!((adam.v[1] - c2 * 100.0).abs() < 1e-15);
        let bc1 = 1.0 - f64::from(cfg.b1());
        let bc2 = 1.0 - f64::from(cfg.b2());
        let want0 = 1.0 - lr * (c1 * 0.5 / bc1) / ((c2 * 0.25 / bc2).sqrt() + eps);
        assert!((params[0] - want0).abs() < 1e-15, "{} {want0}", params[0]);
        // About lr sign(g): not exactly, as c1 = f32(0.1) is not 1 - f32(0.9) (nor c2 =
        // f32(0.001) 1 - f32(0.999)), which optax's f32 arithmetic shares; 1e-5 relative.
        assert!((params[0] - (1.0 - lr)).abs() < 1e-5 * lr);
        assert!((params[1] - (-2.0 + lr)).abs() < 1e-5 * lr);
        // Step 2 with g = -0.25 for the first: m = b1 m1 + c1 g, by hand.
        adam_step(&mut params, &[-0.25, 0.0], &mut adam, &cfg);
        let b1 = f64::from(cfg.b1());
        let b2 = f64::from(cfg.b2());
        let m = b1 * (c1 * 0.5) + c1 * -0.25;
        let v = b2 * (c2 * 0.25) + c2 * 0.0625;
        let step2 = lr * (m / (1.0 - b1 * b1)) / ((v / (1.0 - b2 * b2)).sqrt() + eps);
        assert!((params[0] - (want0 - step2)).abs() < 1e-15);
    }

    #[test]
    fn the_epsilon_schedule_is_optax_linear_schedule() {
        let cfg = DqnConfig::rejax_cartpole(0);
        let e = |s| epsilon_at(s, cfg.eps_start, cfg.eps_end, cfg.exploration_steps);
        assert_eq!(e(0), 1.0);
        assert_eq!(e(50_000), 0.05);
        assert_eq!(e(90_000), 0.05);
        assert!((e(25_000) - 0.525).abs() < 1e-6);
        assert!(e(10) < e(0) && e(10) > e(20));
    }

    /// The kernel's parallel form of Floyd's algorithm (cuda/update.cu, sample_slots),
    /// written out to check it against the sequential one.
    fn sample_slots_parallel(key: u64, size: u32, batch: u32) -> Vec<u32> {
        let base = size - batch;
        let t: Vec<u32> = (0..batch)
            .map(|j| below(key_bits(key, j), base + j + 1))
            .collect();
        let dup: Vec<bool> = (0..batch as usize)
            .map(|j| (0..j).any(|k| t[k] == t[j]))
            .collect();
        (0..batch as usize)
            .map(|j| {
                let mut c = j;
                let chosen = loop {
                    if dup[c] {
                        break true;
                    }
                    if t[c] < base || (t[c] - base) as usize >= c {
                        break false;
                    }
                    c = (t[c] - base) as usize;
                };
                if chosen { base + j as u32 } else { t[j] }
            })
            .collect()
    }

    #[test]
    fn sampling_draws_distinct_slots_and_the_kernels_parallel_form_agrees() {
        for (size, batch) in [
            (1, 1),
            (5, 5),
            (100, 100),
            (101, 100),
            (150, 100),
            (5000, 100),
            (50_000, 100),
            (7, 3),
        ] {
            for counter in 0..200u64 {
                let key = agent_key(9, 1, PURPOSE_SAMPLE, counter);
                let s = sample_slots(key, size, batch);
                assert_eq!(s.len(), batch as usize);
                let set: std::collections::HashSet<_> = s.iter().collect();
                assert_eq!(set.len(), s.len(), "duplicates at size {size}");
                assert!(s.iter().all(|&x| x < size));
                assert_eq!(
                    s,
                    sample_slots_parallel(key, size, batch),
                    "size {size} batch {batch}"
                );
            }
        }
    }

    #[test]
    fn sampling_is_uniform_over_slots() {
        // 3 of 10 slots, 20000 times: each slot is chosen with probability 0.3.
        let mut counts = [0u32; 10];
        for counter in 0..20_000 {
            for s in sample_slots(agent_key(1, 0, PURPOSE_SAMPLE, counter), 10, 3) {
                counts[s as usize] += 1;
            }
        }
        // Each about 6000 with a standard deviation of 65; 5 of them.
        assert!(counts.iter().all(|&c| c.abs_diff(6000) < 325), "{counts:?}");
    }

    #[test]
    fn counters_wrap_the_ring_and_saturate_the_size() {
        let mut c = [0u32; COUNTERS];
        for _ in 0..7 {
            dqn_count(&mut c, 10, 25);
        }
        assert_eq!(c, [70, 60, 70 % 25, 25]);
    }

    #[test]
    fn insert_writes_each_agents_ring_at_the_position_and_wraps() {
        let (agents, envs, capacity) = (2, 3, 4);
        let mut replay = HostReplay {
            agents,
            capacity,
            obs: vec![0.0; agents * capacity * OBS],
            action: vec![-1; agents * capacity],
            reward: vec![0.0; agents * capacity],
            next_obs: vec![0.0; agents * capacity * OBS],
            done: vec![0; agents * capacity],
        };
        let n = agents * envs;
        let obs: Vec<f32> = (0..n * OBS).map(|i| i as f32).collect();
        let final_obs: Vec<f32> = (0..n * OBS).map(|i| -(i as f32)).collect();
        let actions: Vec<i32> = (0..n as i32).collect();
        let reward: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let terminated = [0, 1, 0, 0, 0, 0];
        let truncated = [0, 0, 1, 0, 1, 1];
        let tr = HostTransitions {
            obs: &obs,
            final_obs: &final_obs,
            actions: &actions,
            reward: &reward,
            terminated: &terminated,
            truncated: &truncated,
        };
        let mut counters = [0, 0, 3, 0];
        replay_insert(&mut replay, &tr, envs, &counters, true);
        // Slots 3, 0, 1 of each ring.
        assert_eq!(replay.action, [1, 2, -1, 0, 4, 5, -1, 3]);
        assert_eq!(replay.done, [1, 1, 0, 0, 1, 1, 0, 0]);
        assert_eq!(&replay.next_obs[3 * OBS..4 * OBS], &final_obs[0..OBS]);
        counters[Counter::Pos.index()] = 3;
        replay_insert(&mut replay, &tr, envs, &counters, false);
        assert_eq!(replay.done, [1, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn an_update_lowers_the_loss_on_its_batch_and_is_gated_by_the_fill() {
        let cfg = DqnConfig {
            batch_size: 16,
            ..DqnConfig::rejax_cartpole(5)
        };
        let mut rng = Rng::new(4);
        let capacity = 16;
        let replay = HostReplay {
            agents: 1,
            capacity,
            obs: rng.vec(capacity * OBS, -1.0, 1.0),
            action: (0..capacity).map(|_| rng.below(2) as i32).collect(),
            reward: rng.vec(capacity, 0.0, 1.0),
            next_obs: rng.vec(capacity * OBS, -1.0, 1.0),
            done: (0..capacity).map(|_| rng.below(2) as u8).collect(),
        };
        let params = widen(&init_params(5, 0));
        let mut state = AgentState {
            params: params.clone(),
            adam: Adam {
                m: vec![0.0; L::PARAMS],
                v: vec![0.0; L::PARAMS],
                t: 0,
            },
        };
        let gated = [cfg.fill_buffer + 10, cfg.fill_buffer, 0, 16];
        assert_eq!(
            dqn_update(&cfg, 0, &mut state, &params, &gated, &replay, 5),
            None
        );
        assert_eq!(state.params, params);
        // The whole ring is the batch, so every update sees the same transitions.
        let counters = [cfg.fill_buffer + 10, cfg.fill_buffer + 1, 0, 16];
        let first = dqn_update(&cfg, 0, &mut state, &params, &counters, &replay, 1)
            .unwrap()
            .loss;
        let later = dqn_update(&cfg, 0, &mut state, &params, &counters, &replay, 20)
            .unwrap()
            .loss;
        assert!(later < first, "loss {first} then {later}");
        assert_eq!(state.adam.t, 21);
    }

    #[test]
    fn acting_is_uniform_before_the_fill_and_greedy_at_epsilon_zero() {
        let cfg = DqnConfig::rejax_cartpole(3);
        let (agents, envs) = (2, 50);
        let params: Vec<f32> = (0..agents as u32).flat_map(|a| init_params(3, a)).collect();
        let mut rng = Rng::new(8);
        let obs = rng.vec(agents * envs * OBS, -0.5, 0.5);
        let early = act(&cfg, &params, &obs, agents, envs, &[10, 0, 0, 0], None);
        assert_eq!(early.epsilon, 2.0);
        let greedy = act(
            &cfg,
            &params,
            &obs,
            agents,
            envs,
            &[0; COUNTERS],
            Some((0, 0.0)),
        );
        for i in 0..agents * envs {
            let q = &greedy.q[i * ACTIONS..(i + 1) * ACTIONS];
            assert_eq!(greedy.actions[i] as usize, argmax_first(q));
        }
        // Uniform actions disagree with the greedy ones about half the time.
        let differ = (0..agents * envs)
            .filter(|&i| early.actions[i] != greedy.actions[i])
            .count();
        assert!((20..80).contains(&differ), "{differ} of 100");
    }
}
