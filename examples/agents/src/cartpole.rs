//! The CartPole agent as a whole training loop on the device: three steps over shared
//! buffers, each captured once.
//!
//! - [`train`]: one iteration of rejax's `train_iteration` for every agent: act, step the
//!   environments, insert into the replay, count, `epochs` fused updates, the Polyak
//!   target. [`Agent::train`] runs it `n` times in one launch
//!   ([`stepgraph::Step::replay_loop`]).
//! - [`eval_reset`] and [`eval_run`]: rejax's evaluation, one episode in each of
//!   `eval_envs` environments per agent, acting with epsilon 0.005; `eval_run` loops 500
//!   times (CartPole's time limit), so every environment finishes its first episode.
//!
//! The online parameters are [`Shared`] between `train` (which writes them) and `eval_run`
//! (which reads them), and the evaluation's environments between `eval_reset` and
//! `eval_run`: launches run in the order the host makes them, so an evaluation sees the
//! parameters of the iterations launched before it, and the next training launch waits for
//! it on the device, with no host wait between.

use std::sync::Arc;

use stepgraph::{CaptureStream, Device, DeviceBuffer, HostOutput, Result, Shared};
use stepgraph_envs::{CartPole, Transitions};

use crate::agent::Algorithm;
use crate::config::DqnConfig;
use crate::kernels::{AdamState, Replay, counters};
use crate::layout::{DuelingLayout, init_params};

pub use crate::agent::{AgentKernels, EVAL_EPISODES};

/// An evaluation's environments, `eval_envs` per agent, and what it records.
pub type Evaluation = crate::agent::Evaluation<CartPole, i32>;

/// One training iteration of every agent.
#[stepgraph::step(streams(main), kernels = AgentKernels)]
pub mod train {
    use super::*;

    /// The agents' whole training state.
    #[buffers]
    #[derive(Debug)]
    pub struct Buffers {
        /// `[A, PARAMS]`: what `eval_run` acts with.
        #[shared]
        pub online: Shared<DeviceBuffer<f32>>,
        /// `[A, PARAMS]`: the target networks.
        pub target: DeviceBuffer<f32>,
        /// The optimiser's moments and step counts.
        pub adam: AdamState,
        /// Each agent's replay ring.
        pub replay: Replay,
        /// The step, the ring's position and size ([`crate::Counter`]).
        pub counters: DeviceBuffer<u32>,
        /// `A E` environments, agent `a`'s rows `a E .. (a + 1) E`.
        pub env: CartPole,
        /// `[A, E, OBS]`: the observations the actions are chosen for (the environments'
        /// step overwrites `out.obs`).
        pub obs: DeviceBuffer<f32>,
        /// `[A, E]`: the actions.
        pub actions: DeviceBuffer<i32>,
        /// What the environments' step writes.
        pub out: Transitions,
        /// `[A]`: each agent's last loss.
        pub loss: DeviceBuffer<f32>,
        /// Each environment's last finished episode return, read without a wait.
        pub returns: HostOutput<f32>,
    }

    /// The hyperparameters.
    #[config]
    #[derive(Clone, Copy, Debug)]
    pub struct Config {
        /// rejax's configuration, with this run's seed.
        pub cfg: DqnConfig,
    }

    fn act(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: DqnConfig,
        online: &DeviceBuffer<f32>,
        obs: &DeviceBuffer<f32>,
        counters: &DeviceBuffer<u32>,
        actions: &mut DeviceBuffer<i32>,
    ) -> Result<()> {
        k.agents.dqn_act(s, &cfg, online, obs, counters, actions)
    }

    fn env_step(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        actions: &DeviceBuffer<i32>,
        env: &mut CartPole,
        out: &mut Transitions,
    ) -> Result<()> {
        k.envs.cartpole_step(s, env, actions, out)
    }

    fn insert(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: DqnConfig,
        obs: &DeviceBuffer<f32>,
        actions: &DeviceBuffer<i32>,
        out: &Transitions,
        counters: &DeviceBuffer<u32>,
        replay: &mut Replay,
    ) -> Result<()> {
        k.agents
            .replay_insert(s, &cfg, obs, actions, out, counters, replay)
    }

    /// The next iteration acts on the observations the step reached (after any reset).
    fn next_obs(
        s: &CaptureStream<'_>,
        out: &Transitions,
        obs: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(&out.obs, obs)
    }

    fn count(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: DqnConfig,
        counters: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        k.agents.dqn_count(s, &cfg, counters)
    }

    fn update(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: DqnConfig,
        online: &mut DeviceBuffer<f32>,
        target: &DeviceBuffer<f32>,
        adam: &mut AdamState,
        counters: &DeviceBuffer<u32>,
        replay: &Replay,
        loss: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.agents
            .dqn_update(s, &cfg, online, target, adam, counters, replay, loss)
    }

    fn sync_target(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: DqnConfig,
        online: &DeviceBuffer<f32>,
        target: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.agents.polyak(s, &cfg, online, target)
    }

    fn stats(s: &CaptureStream<'_>, env: &CartPole, returns: &mut HostOutput<f32>) -> Result<()> {
        s.read_back(&env.stats.last_return, returns)
    }
}

/// The start of an evaluation: fresh episodes, nothing recorded.
#[stepgraph::step(streams(main), kernels = AgentKernels)]
pub mod eval_reset {
    use super::*;

    /// The evaluation's environments, shared with `eval_run`.
    #[buffers]
    #[derive(Debug)]
    pub struct Buffers {
        /// The evaluation's environments and records.
        #[shared]
        pub eval: Shared<Evaluation>,
    }

    fn reset(s: &CaptureStream<'_>, k: &AgentKernels, eval: &mut Evaluation) -> Result<()> {
        k.envs.cartpole_reset(s, &mut eval.env, &mut eval.out)?;
        k.agents.first_returns_clear(s, &mut eval.first)
    }
}

/// One step of an evaluation's environments, acting with epsilon 0.005.
#[stepgraph::step(streams(main), kernels = AgentKernels)]
pub mod eval_run {
    use super::*;

    /// The parameters `train` writes, and the evaluation's environments.
    #[buffers]
    #[derive(Debug)]
    pub struct Buffers {
        /// `[A, PARAMS]`: the online parameters, shared with `train`.
        #[shared]
        pub online: Shared<DeviceBuffer<f32>>,
        /// The evaluation's environments and records, shared with `eval_reset`.
        #[shared]
        pub eval: Shared<Evaluation>,
    }

    /// The hyperparameters.
    #[config]
    #[derive(Clone, Copy, Debug)]
    pub struct Config {
        /// rejax's configuration (its evaluation epsilon, the seed).
        pub cfg: DqnConfig,
    }

    fn act(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: DqnConfig,
        online: &DeviceBuffer<f32>,
        eval: &mut Evaluation,
    ) -> Result<()> {
        let Evaluation {
            out,
            clock,
            actions,
            envs,
            ..
        } = eval;
        k.agents
            .dqn_act_eval(s, &cfg, online, &out.obs, clock, actions, *envs)
    }

    fn env_step(s: &CaptureStream<'_>, k: &AgentKernels, eval: &mut Evaluation) -> Result<()> {
        let Evaluation {
            env, out, actions, ..
        } = eval;
        k.envs.cartpole_step(s, env, actions, out)
    }

    fn record(s: &CaptureStream<'_>, k: &AgentKernels, eval: &mut Evaluation) -> Result<()> {
        k.agents
            .first_returns(s, &eval.env.stats, &mut eval.first)?;
        k.agents.eval_tick(s, &mut eval.clock)
    }
}

/// DQN on CartPole-v1: the steps above, as an [`Algorithm`].
#[derive(Debug)]
pub enum CartPoleDqn {}

impl Algorithm for CartPoleDqn {
    const TASK: &'static str = "CartPole-v1";
    const NAME: &'static str = "DQN";
    const EPISODE_STEPS: u32 = CartPole::MAX_EPISODE_STEPS;
    type Train = train::Spec;
    type EvalReset = eval_reset::Spec;
    type EvalRun = eval_run::Spec;
    type Env = CartPole;
    type Action = i32;
    /// `[A, PARAMS]`: the online parameters.
    type Networks = Shared<DeviceBuffer<f32>>;

    fn returns(buffers: &train::Buffers) -> &HostOutput<f32> {
        &buffers.returns
    }
}

/// `A` DQN agents of one configuration on CartPole-v1, side by side.
pub type Agent = crate::agent::Agent<CartPoleDqn>;

impl Agent {
    /// `agents` agents (agent `a` draws from `(cfg.seed, a)`), `cfg.num_envs` training
    /// environments and `eval_envs` evaluation environments each; every step captured.
    pub fn new(
        device: &Device,
        kernels: Arc<AgentKernels>,
        cfg: DqnConfig,
        agents: usize,
        eval_envs: usize,
    ) -> Result<Agent> {
        let params: Vec<f32> = (0..agents)
            .flat_map(|a| init_params(cfg.seed, a as u32))
            .collect();
        let online = Shared::new("online parameters", device.upload_new("online", &params)?);
        let n = agents * cfg.num_envs;
        let mut env = CartPole::new(device, n, cfg.seed)?;
        let mut out = Transitions::new(device, n, CartPole::OBS)?;
        stepgraph::exec::run_once(device, |s| {
            kernels.envs.cartpole_reset(s, &mut env, &mut out)
        })?;
        let obs = device.alloc_zeros("acted-on observations", n * CartPole::OBS)?;
        let mut train_buffers = train::Buffers {
            online: online.clone(),
            target: device.upload_new("target", &params)?,
            adam: AdamState::new(device, agents)?,
            replay: Replay::new(device, agents, cfg.buffer_size)?,
            counters: counters(device)?,
            env,
            obs,
            actions: device.alloc_zeros("actions", n)?,
            out,
            loss: device.alloc_zeros("losses", agents)?,
            returns: HostOutput::new(device, "training returns", n)?,
        };
        stepgraph::exec::run_once(device, |s| {
            s.copy(&train_buffers.out.obs, &mut train_buffers.obs)
        })?;
        let eval = Shared::new(
            "evaluation",
            Evaluation::new(
                device,
                CartPole::new,
                CartPole::OBS,
                cfg.seed,
                agents,
                eval_envs,
            )?,
        );
        let train = train::Step::new(
            device,
            kernels.clone(),
            train_buffers,
            train::Config { cfg },
        )?;
        let eval_reset = eval_reset::Step::new(
            device,
            kernels.clone(),
            eval_reset::Buffers { eval: eval.clone() },
            eval_reset::Config {},
        )?;
        let eval_run = eval_run::Step::new(
            device,
            kernels,
            eval_run::Buffers {
                online: online.clone(),
                eval: eval.clone(),
            },
            eval_run::Config { cfg },
        )?;
        Ok(Agent::from_steps(
            train,
            eval_reset,
            eval_run,
            online,
            eval,
            cfg.num_envs,
            agents,
        ))
    }

    /// The online parameters of every agent (`[A, PARAMS]`), after everything launched.
    pub fn params(&self) -> Result<Vec<f32>> {
        let online = self.nets.host()?;
        self.device().download(&*online)
    }

    /// Floats of one agent's parameters.
    pub const PARAMS: usize = DuelingLayout::PARAMS;
}
