//! Reinforcement-learning environments as ops of a [stepgraph] step:
//! CartPole-v1 and Pendulum-v1, `N` of them per kernel launch, one GPU thread each, with
//! gymnasium's dynamics, rewards, termination, time limits, reset distributions and
//! observations.
//!
//! An environment batch ([`CartPole`], [`Pendulum`]) is a struct of device buffers (its
//! state and per-environment [`EpisodeStats`]), so a step holds it like any other buffer
//! and its ops reset and step it with [`Kernels`]. A step writes [`Transitions`]: the
//! observation to act on next, the reward, `terminated` and `truncated`, and the final
//! observation of the transition. Acting, stepping the environments and inserting into a
//! replay buffer can so be one CUDA graph, with no copy to the host.
//!
//! ```no_run
//! use stepgraph::{CaptureStream, Device, DeviceBuffer, Result};
//! use stepgraph_envs::{CartPole, Kernels, Transitions};
//!
//! #[stepgraph::step(streams(main), kernels = Kernels)]
//! mod rollout {
//!     use super::*;
//!
//!     #[buffers]
//!     pub struct Buffers {
//!         pub env: CartPole,
//!         /// `[N]`: the actions a policy chose for `out.obs`.
//!         pub actions: DeviceBuffer<i32>,
//!         pub out: Transitions,
//!     }
//!
//!     fn act(stream: &CaptureStream<'_>, out: &Transitions,
//!            actions: &mut DeviceBuffer<i32>) -> Result<()> {
//!         // A policy reads `out.obs` ([N, 4]) and writes one action per environment.
//!         stream.memset_zeros(actions)
//!     }
//!
//!     fn env_step(stream: &CaptureStream<'_>, k: &Kernels, actions: &DeviceBuffer<i32>,
//!                 env: &mut CartPole, out: &mut Transitions) -> Result<()> {
//!         k.cartpole_step(stream, env, actions, out)
//!     }
//! }
//!
//! # fn main() -> Result<()> {
//! let device = Device::new(0)?;
//! let kernels = Kernels::load(&device)?;
//! let n = 4096;
//! let mut env = CartPole::new(&device, n, 7)?;
//! let mut out = Transitions::new(&device, n, CartPole::OBS)?;
//! // The first observations, outside the graph.
//! stepgraph::exec::run_once(&device, |s| kernels.cartpole_reset(s, &mut env, &mut out))?;
//! let actions = device.alloc_zeros("actions", n)?;
//! let buffers = rollout::Buffers { env, actions, out };
//! let mut step = rollout::Step::new(&device, kernels, buffers, rollout::Config {})?;
//! for _ in 0..1000 {
//!     step.replay()?; // act, then 4096 environments one step on, auto-reset included
//! }
//! let returns = step.download(|b| &b.env.stats.last_return)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Rules, as gymnasium 1.2.3 has them
//!
//! The environments are gymnasium's `CartPole-v1` and `Pendulum-v1` as `gymnasium.make`
//! builds them (the environment under a `TimeLimit`), checked against gymnasium itself
//! by this crate's tests:
//!
//! - **CartPole-v1**: Euler integration of cartpole.py's equations (gravity 9.8, cart 1,
//!   pole 0.1 of half-length 0.5, force ±10, tau 0.02); action `0` pushes left, `1`
//!   right; terminated when `|x| > 2.4` or `|theta| > 12°`; reward 1 every step, the
//!   terminating one included; truncated when the episode's length reaches 500; reset
//!   state uniform in `[-0.05, 0.05)` for all four components; observation
//!   `[x, x_dot, theta, theta_dot]`.
//! - **Pendulum-v1**: g = 10, m = l = 1, dt = 0.05; the torque clipped to `[-2, 2]`;
//!   `theta_dot` clipped to `[-8, 8]`; reward `-(angle_normalize(theta)^2 + 0.1
//!   theta_dot^2 + 0.001 u^2)` of the state the step starts from; never terminated;
//!   truncated at 200; reset `theta` uniform in `[-pi, pi)`, `theta_dot` in `[-1, 1)`;
//!   observation `[cos theta, sin theta, theta_dot]`.
//!
//! Where an action is out of its range: CartPole's (gymnasium asserts `0` or `1`) makes
//! the state NaN and ends the episode as terminated, so the transition's reward, final
//! observation and the episode's return are NaN, for a finite check to find, and the
//! environment starts a new episode; Pendulum's torque is clipped, and a NaN torque
//! passes the clip as `np.clip` lets it, so the state stays NaN until the time limit
//! resets it.
//!
//! # Precision
//!
//! The state is `f64`, as gymnasium keeps it, and every operation is the one numpy
//! performs, in its order and rounded once (the kernels spell out `__dmul_rn` and
//! friends, as nvcc would otherwise fuse a multiply and an add); observations are the
//! state rounded to `f32`, as gymnasium returns them. An `f32` state would leave
//! gymnasium's trajectory: CartPole's upright pole is unstable, and over a long
//! balanced episode its rounding error of 1e-7 a step grows until termination, which
//! is decided on the state, comes at another step than gymnasium's. By the count of operations the doubles cost little beside
//! the step's memory traffic: a few dozen per environment, `sin` and `cos` the
//! largest, against 100 to 150 bytes read and written; more on a GPU with a low double
//! rate. What still differs from gymnasium is `sin` and `cos`, which CUDA computes
//! within 2 ulp of the exact value, not always as the host's libm rounds it.
//!
//! # Auto-reset and statistics
//!
//! A step resets, in the same launch, every environment whose episode ended
//! (terminated or truncated), as gymnax and gymnasium's "same-step" vector mode do:
//! that step's `reward`, `terminated` and `truncated` describe the finished transition,
//! [`Transitions::final_obs`] is the observation it reached (the next state a replay
//! stores), and [`Transitions::obs`] the first observation of the new episode. Where no
//! episode ended, the two are equal. [`EpisodeStats`] keeps each environment's running
//! return and length, and the return and length of its last finished episode.
//!
//! Reset states come from a counter-based generator: a hash of the batch's seed, the
//! environment's index and the number of episodes it has finished, so a seed gives the
//! same episodes on every GPU and in [`reference`](mod@reference), with no generator
//! state to keep.

#![warn(missing_docs)]
pub mod reference;

mod cartpole;
mod pendulum;

pub use cartpole::CartPole;
pub use pendulum::Pendulum;

use stepgraph::{Device, DeviceBuffer, Error, Result, StepBuffer};

/// The registry stepgraph-build generated from `cuda/*.cu`.
mod raw {
    stepgraph::include_kernels!();
}
pub use raw::{KernelId, ModuleId};

/// The environments' kernels, loaded once per device (before any capture).
#[derive(Debug)]
pub struct Kernels {
    raw: raw::Kernels,
}

impl Kernels {
    /// Loads this crate's modules into `device`'s context; each kernel's parameter list
    /// is checked against its CUDA signature.
    pub fn load(device: &Device) -> Result<Kernels> {
        Ok(Kernels {
            raw: raw::Kernels::load(device)?,
        })
    }

    /// A kernel of this crate, for launches without a wrapper (checked against its
    /// parameter list when launched).
    pub fn kernel(&self, id: KernelId) -> &stepgraph::Kernel {
        self.raw.kernel(id)
    }
}

/// Each environment's episode bookkeeping, `[N]` arrays that a step updates: the running
/// episode's length and return, and the length and return of the last episode that
/// ended (0 until one has).
#[derive(Debug, StepBuffer)]
pub struct EpisodeStats {
    /// Steps taken in the running episode; the time limit truncates it when a step
    /// brings it to the batch's `max_steps`.
    pub length: DeviceBuffer<u32>,
    /// The sum of the running episode's rewards (`f32`, summed in step order).
    pub ret: DeviceBuffer<f32>,
    /// Episodes finished since the reset; also the number of the running episode, which
    /// picks its reset state.
    pub episodes: DeviceBuffer<u32>,
    /// The return of the last finished episode.
    pub last_return: DeviceBuffer<f32>,
    /// The length of the last finished episode.
    pub last_length: DeviceBuffer<u32>,
}

impl EpisodeStats {
    /// Zeroed statistics of `n` environments.
    pub fn new(device: &Device, n: usize) -> Result<EpisodeStats> {
        Ok(EpisodeStats {
            length: device.alloc_zeros("episode lengths", n)?,
            ret: device.alloc_zeros("episode returns", n)?,
            episodes: device.alloc_zeros("episode counts", n)?,
            last_return: device.alloc_zeros("last episode returns", n)?,
            last_length: device.alloc_zeros("last episode lengths", n)?,
        })
    }
}

/// What a step of `N` environments writes, row-major: observations `[N, obs]` `f32`,
/// the rest `[N]`. A reset writes only `obs`.
#[derive(Debug, StepBuffer)]
pub struct Transitions {
    /// The observation to act on next: after an episode ended, the new episode's first.
    pub obs: DeviceBuffer<f32>,
    /// The observation the step reached, before any reset: the transition's next state
    /// for a replay buffer.
    pub final_obs: DeviceBuffer<f32>,
    /// The step's reward.
    pub reward: DeviceBuffer<f32>,
    /// 1 where the step reached a terminal state (the value of what follows is 0), else 0.
    pub terminated: DeviceBuffer<u8>,
    /// 1 where the time limit ended the episode, else 0. Both flags can be 1.
    pub truncated: DeviceBuffer<u8>,
}

impl Transitions {
    /// Zeroed outputs of `n` environments with observations of `obs` floats
    /// ([`CartPole::OBS`], [`Pendulum::OBS`]).
    pub fn new(device: &Device, n: usize, obs: usize) -> Result<Transitions> {
        let obs_len = n.checked_mul(obs).ok_or_else(|| Error::Argument {
            what: "Transitions::new: n * obs".into(),
            expected: "a product that fits usize".into(),
            found: format!("{n} * {obs}"),
        })?;
        Ok(Transitions {
            obs: device.alloc_zeros("observations", obs_len)?,
            final_obs: device.alloc_zeros("final observations", obs_len)?,
            reward: device.alloc_zeros("rewards", n)?,
            terminated: device.alloc_zeros("terminated flags", n)?,
            truncated: device.alloc_zeros("truncated flags", n)?,
        })
    }
}

/// The state (`state` doubles an environment) and the statistics of a new batch of `n`
/// environments of `name` (`CartPole`), refused when `n` is 0 (nothing to allocate or
/// launch) or the state's length overflows.
fn batch_buffers(
    device: &Device,
    name: &str,
    n: usize,
    state: usize,
) -> Result<(DeviceBuffer<f64>, EpisodeStats)> {
    let what = || format!("{name}::new: the number of environments");
    if n == 0 {
        return Err(Error::Argument {
            what: what(),
            expected: "at least 1".into(),
            found: "0".into(),
        });
    }
    let state_len = n.checked_mul(state).ok_or_else(|| Error::Argument {
        what: what(),
        expected: format!("at most {}", usize::MAX / state),
        found: n.to_string(),
    })?;
    Ok((
        device.alloc_zeros(&format!("{name} states"), state_len)?,
        EpisodeStats::new(device, n)?,
    ))
}
