//! The environments on the CPU: the kernels' computation in plain Rust, operation for
//! operation (`cuda/envs.cuh`, `cuda/cartpole.cu`, `cuda/pendulum.cu`), for tests and
//! for checking a GPU run.
//!
//! [`Batch`] is a batch of environments with the kernels' same-step auto-reset and
//! statistics; [`CartPole`] and [`Pendulum`] are the two environments' [`Physics`]: a
//! reset state, a step of the dynamics and the observation, the same as the kernels'
//! bit for bit except where the GPU's `sin` and `cos` round differently from the host's
//! libm (within 2 ulp).
//!
//! ```
//! use stepgraph_envs::reference::{Batch, CartPole};
//!
//! let mut envs = Batch::<CartPole>::new(3, 7);
//! let first = envs.reset();
//! assert_eq!(first.len(), 3 * 4);
//! let out = envs.step(&[0, 1, 1])?;
//! assert_eq!(out.reward, [1.0; 3]);
//! # Ok::<(), stepgraph::Error>(())
//! ```

use std::fmt::Debug;

use stepgraph::{Error, Result};

/// splitmix64's increment.
pub use stepgraph_kernels::RNG_GAMMA as GAMMA;
/// splitmix64's output function of `z` + [`GAMMA`]: stepgraph-kernels' generator's
/// mixing step (`rng_splitmix` in `stepgraph/random.cuh`), which the kernels use too.
pub use stepgraph_kernels::splitmix as mix;

/// The key of episode `episode` of environment `env` under `seed`.
pub fn episode_key(seed: u64, env: u64, episode: u64) -> u64 {
    mix(mix(mix(seed) ^ env) ^ episode)
}

/// Draw `d` of the episode with key `key`, uniform in `[low, high)`: 53 random bits as
/// `u` in `[0, 1)`, then `low + (high - low) u` (numpy's `Generator.uniform`).
pub fn episode_uniform(key: u64, d: u32, low: f64, high: f64) -> f64 {
    let bits = mix(key.wrapping_add(u64::from(d).wrapping_mul(GAMMA)));
    let u = (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    low + (high - low) * u
}

/// An environment's rules: what [`Batch`] runs and the kernels compute.
pub trait Physics {
    /// The state, `f64`s.
    type State: Copy + Debug + PartialEq + AsRef<[f64]>;
    /// One environment's action.
    type Action: Copy + Debug;
    /// Floats in an observation.
    const OBS: usize;
    /// The time limit `gymnasium.make` sets.
    const MAX_EPISODE_STEPS: u32;

    /// The first state of episode `episode` of environment `env` under `seed`.
    fn reset_state(seed: u64, env: u64, episode: u64) -> Self::State;

    /// One step of the dynamics from `state`: the state it reaches, the reward and
    /// whether it is terminal.
    fn step(state: Self::State, action: Self::Action) -> (Self::State, f32, bool);

    /// The observation of `state`, written into `obs` (`OBS` floats).
    fn observe(state: &Self::State, obs: &mut [f32]);
}

/// CartPole-v1's rules (`cuda/cartpole.cu`).
#[derive(Clone, Copy, Debug)]
pub struct CartPole;

/// gymnasium's CartPole constants, computed as cartpole.py computes them.
pub mod cartpole {
    /// m/s².
    pub const GRAVITY: f64 = 9.8;
    /// The cart's mass.
    pub const MASSCART: f64 = 1.0;
    /// The pole's mass.
    pub const MASSPOLE: f64 = 0.1;
    /// Cart and pole.
    pub const TOTAL_MASS: f64 = MASSPOLE + MASSCART;
    /// Half the pole's length.
    pub const LENGTH: f64 = 0.5;
    /// The pole's mass times its half-length.
    pub const POLEMASS_LENGTH: f64 = MASSPOLE * LENGTH;
    /// The push of either action.
    pub const FORCE_MAG: f64 = 10.0;
    /// Seconds between state updates.
    pub const TAU: f64 = 0.02;
    /// 12 degrees: `12 * 2 * math.pi / 360`.
    pub const THETA_THRESHOLD: f64 = 24.0 * std::f64::consts::PI / 360.0;
    /// The cart's position past which an episode terminates.
    pub const X_THRESHOLD: f64 = 2.4;
    /// Reset states are uniform in `[-RESET_BOUND, RESET_BOUND)`.
    pub const RESET_BOUND: f64 = 0.05;
}

impl Physics for CartPole {
    /// `[x, x_dot, theta, theta_dot]`.
    type State = [f64; 4];
    /// `0` pushes left, `1` right; any other value makes the state NaN and terminates.
    type Action = i32;
    const OBS: usize = 4;
    const MAX_EPISODE_STEPS: u32 = 500;

    fn reset_state(seed: u64, env: u64, episode: u64) -> [f64; 4] {
        let key = episode_key(seed, env, episode);
        let b = cartpole::RESET_BOUND;
        std::array::from_fn(|d| episode_uniform(key, d as u32, -b, b))
    }

    fn step(state: [f64; 4], action: i32) -> ([f64; 4], f32, bool) {
        use cartpole::*;
        if action != 0 && action != 1 {
            return ([f64::NAN; 4], f32::NAN, true);
        }
        let [x, x_dot, theta, theta_dot] = state;
        let force = if action == 1 { FORCE_MAG } else { -FORCE_MAG };
        let costheta = theta.cos();
        let sintheta = theta.sin();
        let temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS;
        let thetaacc = (GRAVITY * sintheta - costheta * temp)
            / (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS));
        let xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
        let next = [
            x + TAU * x_dot,
            x_dot + TAU * xacc,
            theta + TAU * theta_dot,
            theta_dot + TAU * thetaacc,
        ];
        let terminated = next[0] < -X_THRESHOLD
            || next[0] > X_THRESHOLD
            || next[2] < -THETA_THRESHOLD
            || next[2] > THETA_THRESHOLD;
        // A NaN state (one uploaded so) gives a NaN reward, as in the kernel.
        let reward = if next[0].is_nan() { f32::NAN } else { 1.0 };
        (next, reward, terminated)
    }

    fn observe(state: &[f64; 4], obs: &mut [f32]) {
        for (o, s) in obs.iter_mut().zip(state) {
            *o = *s as f32;
        }
    }
}

/// Pendulum-v1's rules (`cuda/pendulum.cu`).
#[derive(Clone, Copy, Debug)]
pub struct Pendulum;

/// gymnasium's Pendulum constants (g = 10, m = l = 1).
pub mod pendulum {
    /// `theta_dot` is clipped to `[-MAX_SPEED, MAX_SPEED]`.
    pub const MAX_SPEED: f64 = 8.0;
    /// The torque is clipped to `[-MAX_TORQUE, MAX_TORQUE]`.
    pub const MAX_TORQUE: f32 = 2.0;
    /// Seconds between state updates.
    pub const DT: f64 = 0.05;
    /// `3 g / (2 l)`.
    pub const GRAVITY_TERM: f64 = 15.0;
    /// `3 / (m l^2)`, a float32 factor as pendulum.py applies it to the float32 torque.
    pub const TORQUE_TERM: f32 = 3.0;
    /// Reset `theta_dot` is uniform in `[-RESET_SPEED, RESET_SPEED)`.
    pub const RESET_SPEED: f64 = 1.0;
}

/// `((x + pi) % (2 pi)) - pi` with numpy's float64 `%`, whose result takes the divisor's
/// sign: an angle in `[-pi, pi)`.
pub fn angle_normalize(x: f64) -> f64 {
    use std::f64::consts::PI;
    let b = 2.0 * PI;
    // `%` is C's fmod, exact; numpy then moves a negative remainder up by the divisor.
    let mut m = (x + PI) % b;
    if m < 0.0 {
        m += b;
    }
    m - PI
}

impl Physics for Pendulum {
    /// `[theta, theta_dot]`.
    type State = [f64; 2];
    /// The torque, clipped to `[-2, 2]`; NaN passes the clip, as `np.clip` lets it.
    type Action = f32;
    const OBS: usize = 3;
    const MAX_EPISODE_STEPS: u32 = 200;

    fn reset_state(seed: u64, env: u64, episode: u64) -> [f64; 2] {
        use std::f64::consts::PI;
        let key = episode_key(seed, env, episode);
        let speed = pendulum::RESET_SPEED;
        [
            episode_uniform(key, 0, -PI, PI),
            episode_uniform(key, 1, -speed, speed),
        ]
    }

    fn step(state: [f64; 2], action: f32) -> ([f64; 2], f32, bool) {
        use pendulum::*;
        let [th, thdot] = state;
        // `clamp` lets NaN through, as np.clip does.
        let u = action.clamp(-MAX_TORQUE, MAX_TORQUE);
        let an = angle_normalize(th);
        // float32, as numpy computes `0.001 * (u**2)` for a float32 `u`.
        let torque_cost = 0.001f32 * (u * u);
        let costs = an * an + 0.1 * (thdot * thdot) + f64::from(torque_cost);
        let accel = GRAVITY_TERM * th.sin() + f64::from(TORQUE_TERM * u);
        let newthdot = (thdot + accel * DT).clamp(-MAX_SPEED, MAX_SPEED);
        ([th + newthdot * DT, newthdot], (-costs) as f32, false)
    }

    fn observe(state: &[f64; 2], obs: &mut [f32]) {
        obs[0] = state[0].cos() as f32;
        obs[1] = state[0].sin() as f32;
        obs[2] = state[1] as f32;
    }
}

/// What one environment's step gives (one row of the kernels' outputs).
#[derive(Clone, Debug, PartialEq)]
pub struct EnvStep {
    /// The observation to act on next (the new episode's first after an auto-reset).
    pub obs: Vec<f32>,
    /// The observation the step reached, before any reset.
    pub final_obs: Vec<f32>,
    /// The step's reward.
    pub reward: f32,
    /// Whether the step reached a terminal state.
    pub terminated: bool,
    /// Whether the time limit ended the episode.
    pub truncated: bool,
}

/// A step's outputs for the whole batch, laid out as the kernels write them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outputs {
    /// `[N, OBS]`.
    pub obs: Vec<f32>,
    /// `[N, OBS]`.
    pub final_obs: Vec<f32>,
    /// `[N]`.
    pub reward: Vec<f32>,
    /// 0 or 1.
    pub terminated: Vec<u8>,
    /// 0 or 1.
    pub truncated: Vec<u8>,
}

/// `N` environments of `P` with the kernels' bookkeeping: the fields mirror the device
/// buffers of [`crate::CartPole`] / [`crate::Pendulum`] and [`crate::EpisodeStats`].
#[derive(Clone, Debug)]
pub struct Batch<P: Physics> {
    /// Each environment's state.
    pub state: Vec<P::State>,
    /// Steps taken in the running episode.
    pub length: Vec<u32>,
    /// The running episode's return.
    pub ret: Vec<f32>,
    /// Episodes finished since the reset (the running episode's number).
    pub episodes: Vec<u32>,
    /// The last finished episode's return.
    pub last_return: Vec<f32>,
    /// The last finished episode's length.
    pub last_length: Vec<u32>,
    /// The seed of the reset states.
    pub seed: u64,
    /// The time limit.
    pub max_steps: u32,
}

impl<P: Physics> Batch<P> {
    /// `n` environments under `seed` with `P`'s time limit, reset.
    pub fn new(n: usize, seed: u64) -> Batch<P> {
        Self::with_max_steps(n, seed, P::MAX_EPISODE_STEPS)
    }

    /// The same with a time limit of `max_steps`.
    pub fn with_max_steps(n: usize, seed: u64, max_steps: u32) -> Batch<P> {
        let mut batch = Batch {
            state: Vec::with_capacity(n),
            length: vec![0; n],
            ret: vec![0.0; n],
            episodes: vec![0; n],
            last_return: vec![0.0; n],
            last_length: vec![0; n],
            seed,
            max_steps,
        };
        batch.state = (0..n as u64).map(|i| P::reset_state(seed, i, 0)).collect();
        batch
    }

    /// The number of environments.
    pub fn len(&self) -> usize {
        self.state.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    /// Starts episode 0 of every environment and zeroes the statistics, as the reset
    /// kernel does; returns the observations `[N, OBS]`.
    pub fn reset(&mut self) -> Vec<f32> {
        *self = Self::with_max_steps(self.len(), self.seed, self.max_steps);
        self.observations()
    }

    /// The observations of the current states, `[N, OBS]`.
    pub fn observations(&self) -> Vec<f32> {
        let mut obs = vec![0.0; self.len() * P::OBS];
        for (s, o) in self.state.iter().zip(obs.chunks_exact_mut(P::OBS)) {
            P::observe(s, o);
        }
        obs
    }

    /// One step of environment `i` with the same-step auto-reset.
    pub fn step_env(&mut self, i: usize, action: P::Action) -> EnvStep {
        let (next, reward, terminated) = P::step(self.state[i], action);
        let length = self.length[i].wrapping_add(1);
        let truncated = length >= self.max_steps;
        let mut final_obs = vec![0.0; P::OBS];
        P::observe(&next, &mut final_obs);
        let ret = self.ret[i] + reward;
        self.state[i] = next;
        if terminated || truncated {
            self.last_return[i] = ret;
            self.last_length[i] = length;
            self.episodes[i] += 1;
            self.length[i] = 0;
            self.ret[i] = 0.0;
            self.state[i] = P::reset_state(self.seed, i as u64, u64::from(self.episodes[i]));
        } else {
            self.length[i] = length;
            self.ret[i] = ret;
        }
        let mut obs = vec![0.0; P::OBS];
        P::observe(&self.state[i], &mut obs);
        EnvStep {
            obs,
            final_obs,
            reward,
            terminated,
            truncated,
        }
    }

    /// One step of every environment, `actions[i]` for environment `i`; actions of
    /// another length than the batch's are `Error::LengthMismatch`, and nothing moves.
    pub fn step(&mut self, actions: &[P::Action]) -> Result<Outputs> {
        if actions.len() != self.len() {
            return Err(Error::LengthMismatch {
                what: "reference::Batch::step: actions, one per environment".into(),
                expected: self.len(),
                found: actions.len(),
            });
        }
        let mut out = Outputs::default();
        for (i, &a) in actions.iter().enumerate() {
            let s = self.step_env(i, a);
            out.obs.extend(s.obs);
            out.final_obs.extend(s.final_obs);
            out.reward.push(s.reward);
            out.terminated.push(u8::from(s.terminated));
            out.truncated.push(u8::from(s.truncated));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
