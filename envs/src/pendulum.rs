//! Pendulum-v1 (`cuda/pendulum.cu`): its batch of device state and its reset and step.

use stepgraph::{CaptureStream, Device, DeviceBuffer, Result, StepBuffer};

use crate::{EpisodeStats, Kernels, Transitions, batch_buffers};

/// `N` Pendulum-v1 environments on the device: the state, the statistics and the seed
/// of their reset states.
///
/// A new batch is all zeros, not a valid start: reset it ([`Kernels::pendulum_reset`])
/// before the first step.
#[derive(Debug, StepBuffer)]
pub struct Pendulum {
    /// `[N, 2]` `f64`, row-major: `theta`, `theta_dot` of each environment.
    pub state: DeviceBuffer<f64>,
    /// Each environment's episode bookkeeping.
    pub stats: EpisodeStats,
    seed: u64,
    max_steps: u32,
}

impl Pendulum {
    /// Floats in an observation: `[cos theta, sin theta, theta_dot]`.
    pub const OBS: usize = 3;
    /// `f64`s in a state: `theta`, `theta_dot`.
    pub const STATE: usize = 2;
    /// Pendulum-v1's time limit.
    pub const MAX_EPISODE_STEPS: u32 = 200;

    /// Allocates `n` environments (at least 1) whose episodes draw their reset states
    /// from `seed`, with Pendulum-v1's time limit of 200 steps.
    pub fn new(device: &Device, n: usize, seed: u64) -> Result<Pendulum> {
        Self::with_max_steps(device, n, seed, Self::MAX_EPISODE_STEPS)
    }

    /// The same with a time limit of `max_steps` (gymnasium's `max_episode_steps`): an
    /// episode is truncated by the step that brings its length to `max_steps`, and every
    /// step truncates when it is 0 or 1.
    pub fn with_max_steps(
        device: &Device,
        n: usize,
        seed: u64,
        max_steps: u32,
    ) -> Result<Pendulum> {
        let (state, stats) = batch_buffers(device, "Pendulum", n, Self::STATE)?;
        Ok(Pendulum {
            state,
            stats,
            seed,
            max_steps,
        })
    }

    /// The seed of the reset states.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The time limit.
    pub fn max_steps(&self) -> u32 {
        self.max_steps
    }

    /// The number of environments.
    pub fn len(&self) -> usize {
        self.stats.length.len()
    }

    /// Whether the batch has no environments (never: [`Pendulum::new`] refuses 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Kernels {
    /// Starts episode 0 of every environment of `env`: the state drawn from the batch's
    /// seed, `out.obs` its observation, the statistics zeroed. The other outputs are
    /// left as they are.
    ///
    /// Buffers of other lengths than `env`'s `N` (`out.obs` `[N, 3]`) are
    /// `Error::LengthMismatch`, and nothing is launched.
    pub fn pendulum_reset(
        &self,
        stream: &CaptureStream<'_>,
        env: &mut Pendulum,
        out: &mut Transitions,
    ) -> Result<()> {
        let n = env.len();
        let s = &mut env.stats;
        self.raw.pendulum_reset_checked(
            stream,
            &mut env.state,
            &mut s.length,
            &mut s.ret,
            &mut s.episodes,
            &mut s.last_return,
            &mut s.last_length,
            &mut out.obs,
            n,
            env.seed,
        )
    }

    /// One step of every environment: the torque `actions[i]`, clipped to `[-2, 2]`
    /// (a NaN passes, see the crate docs), moves environment `i`, and `out` receives the
    /// transition, with the auto-reset of every episode that ended (the crate docs say
    /// what each output holds then). `out.terminated` is always 0.
    ///
    /// `actions` has one element per environment; buffers of other lengths are
    /// `Error::LengthMismatch`, and nothing is launched.
    pub fn pendulum_step(
        &self,
        stream: &CaptureStream<'_>,
        env: &mut Pendulum,
        actions: &DeviceBuffer<f32>,
        out: &mut Transitions,
    ) -> Result<()> {
        let n = env.len();
        let s = &mut env.stats;
        self.raw.pendulum_step_checked(
            stream,
            actions,
            &mut env.state,
            &mut s.length,
            &mut s.ret,
            &mut s.episodes,
            &mut s.last_return,
            &mut s.last_length,
            &mut out.obs,
            &mut out.final_obs,
            &mut out.reward,
            &mut out.terminated,
            &mut out.truncated,
            n,
            env.max_steps,
            env.seed,
        )
    }
}
