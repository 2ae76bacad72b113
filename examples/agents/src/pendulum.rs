//! The Pendulum agent as a whole training loop on the device: three steps over shared
//! buffers, each captured once.
//!
//! - [`train`]: one iteration of rejax's SAC `train_iteration` for every agent: act, step
//!   the environments, store (the replay, the observation statistics, the counters),
//!   `epochs` fused updates and the target critics' Polyak step. [`Agent::train`] runs it `n`
//!   times in one launch ([`stepgraph::Step::replay_loop`]).
//! - [`eval_reset`] and [`eval_run`]: rejax's evaluation, one episode in each of
//!   `eval_envs` environments per agent, sampling the policy; `eval_run` loops 200 times
//!   (Pendulum's time limit), so every environment finishes its first episode.
//!
//! The networks and the observation statistics are [`Shared`] between `train` (which
//! writes them) and `eval_run` (which reads the actor and the statistics), and the
//! evaluation's environments between `eval_reset` and `eval_run`: launches run in the
//! order the host makes them, so an evaluation sees the state of the iterations launched
//! before it, and the next training launch waits for it on the device, with no host wait
//! between.

use std::sync::Arc;

use stepgraph::{CaptureStream, Device, DeviceBuffer, HostOutput, Result, Shared};
use stepgraph_envs::{Pendulum, Transitions};

use crate::agent::Algorithm;
use crate::kernels::counters;
use crate::sac::{
    ActorLayout, SacAdam, SacConfig, SacNetworks, SacReplay, init_actor, init_critics, rms_buffer,
};

pub use crate::agent::{AgentKernels, EVAL_EPISODES};

/// An evaluation's environments, `eval_envs` per agent, and what it records.
pub type Evaluation = crate::agent::Evaluation<Pendulum, f32>;

/// One training iteration of every agent.
#[stepgraph::step(streams(main), kernels = AgentKernels)]
pub mod train {
    use super::*;

    /// The agents' whole training state.
    #[buffers]
    #[derive(Debug)]
    pub struct Buffers {
        /// The actors, critics, target critics and temperatures: `eval_run` acts with the
        /// actors.
        #[shared]
        pub nets: Shared<SacNetworks>,
        /// `[A, RMS_FLOATS]`: the observation statistics, shared with `eval_run`.
        #[shared]
        pub rms: Shared<DeviceBuffer<f32>>,
        /// The optimisers' moments and step counts.
        pub adam: SacAdam,
        /// Each agent's replay ring.
        pub replay: SacReplay,
        /// The step, the ring's position and size ([`crate::Counter`]).
        pub counters: DeviceBuffer<u32>,
        /// `A E` environments, agent `a`'s rows `a E .. (a + 1) E`.
        pub env: Pendulum,
        /// `[A, E, SAC_OBS]`: the observations the actions are chosen for (the
        /// environments' step overwrites `out.obs`; the store copies them here after).
        pub obs: DeviceBuffer<f32>,
        /// `[A, E]`: the torques.
        pub actions: DeviceBuffer<f32>,
        /// What the environments' step writes.
        pub out: Transitions,
        /// `[A, 3]`: each agent's last actor, critic and temperature losses.
        pub losses: DeviceBuffer<f32>,
        /// Each environment's last finished episode return, read without a wait.
        pub returns: HostOutput<f32>,
    }

    /// The hyperparameters.
    #[config]
    #[derive(Clone, Copy, Debug)]
    pub struct Config {
        /// rejax's configuration, with this run's seed.
        pub cfg: SacConfig,
    }

    fn act(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: SacConfig,
        nets: &SacNetworks,
        rms: &DeviceBuffer<f32>,
        obs: &DeviceBuffer<f32>,
        counters: &DeviceBuffer<u32>,
        actions: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.agents
            .sac_act(s, &cfg, &nets.actor, rms, obs, counters, actions)
    }

    fn env_step(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        actions: &DeviceBuffer<f32>,
        env: &mut Pendulum,
        out: &mut Transitions,
    ) -> Result<()> {
        k.envs.pendulum_step(s, env, actions, out)
    }

    /// The transitions into the rings, the statistics' update, the next observations into
    /// `obs` for the next iteration's act, and the counters moved on.
    #[allow(clippy::too_many_arguments)]
    fn store(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: SacConfig,
        obs: &mut DeviceBuffer<f32>,
        actions: &DeviceBuffer<f32>,
        out: &Transitions,
        counters: &mut DeviceBuffer<u32>,
        rms: &mut DeviceBuffer<f32>,
        replay: &mut SacReplay,
    ) -> Result<()> {
        k.agents
            .sac_store(s, &cfg, obs, actions, out, counters, rms, replay)
    }

    /// The updates and the target critics' Polyak step, fused.
    #[allow(clippy::too_many_arguments)]
    fn update(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: SacConfig,
        nets: &mut SacNetworks,
        adam: &mut SacAdam,
        counters: &DeviceBuffer<u32>,
        rms: &DeviceBuffer<f32>,
        replay: &SacReplay,
        losses: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.agents
            .sac_update(s, &cfg, nets, adam, counters, rms, replay, losses)
    }

    fn stats(s: &CaptureStream<'_>, env: &Pendulum, returns: &mut HostOutput<f32>) -> Result<()> {
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
        k.envs.pendulum_reset(s, &mut eval.env, &mut eval.out)?;
        k.agents.first_returns_clear(s, &mut eval.first)
    }
}

/// One step of an evaluation's environments, sampling the policy.
#[stepgraph::step(streams(main), kernels = AgentKernels)]
pub mod eval_run {
    use super::*;

    /// The networks and statistics `train` writes, and the evaluation's environments.
    #[buffers]
    #[derive(Debug)]
    pub struct Buffers {
        /// The networks, shared with `train` (the actor is read).
        #[shared]
        pub nets: Shared<SacNetworks>,
        /// The observation statistics, shared with `train`.
        #[shared]
        pub rms: Shared<DeviceBuffer<f32>>,
        /// The evaluation's environments and records, shared with `eval_reset`.
        #[shared]
        pub eval: Shared<Evaluation>,
    }

    /// The hyperparameters.
    #[config]
    #[derive(Clone, Copy, Debug)]
    pub struct Config {
        /// rejax's configuration (the seed).
        pub cfg: SacConfig,
    }

    fn act(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: SacConfig,
        nets: &SacNetworks,
        rms: &DeviceBuffer<f32>,
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
            .sac_act_eval(s, &cfg, &nets.actor, rms, &out.obs, clock, actions, *envs)
    }

    fn env_step(s: &CaptureStream<'_>, k: &AgentKernels, eval: &mut Evaluation) -> Result<()> {
        let Evaluation {
            env, out, actions, ..
        } = eval;
        k.envs.pendulum_step(s, env, actions, out)
    }

    fn record(s: &CaptureStream<'_>, k: &AgentKernels, eval: &mut Evaluation) -> Result<()> {
        k.agents
            .first_returns(s, &eval.env.stats, &mut eval.first)?;
        k.agents.eval_tick(s, &mut eval.clock)
    }
}

/// SAC on Pendulum-v1: the steps above, as an [`Algorithm`].
#[derive(Debug)]
pub enum PendulumSac {}

impl Algorithm for PendulumSac {
    const TASK: &'static str = "Pendulum-v1";
    const NAME: &'static str = "SAC";
    const EPISODE_STEPS: u32 = Pendulum::MAX_EPISODE_STEPS;
    type Train = train::Spec;
    type EvalReset = eval_reset::Spec;
    type EvalRun = eval_run::Spec;
    type Env = Pendulum;
    type Action = f32;
    /// The actors, critics, target critics and temperatures.
    type Networks = Shared<SacNetworks>;

    fn returns(buffers: &train::Buffers) -> &HostOutput<f32> {
        &buffers.returns
    }
}

/// `A` SAC agents of one configuration on Pendulum-v1, side by side.
pub type Agent = crate::agent::Agent<PendulumSac>;

impl Agent {
    /// `agents` agents (agent `a` draws from `(cfg.seed, a)`), `cfg.num_envs` training
    /// environments and `eval_envs` evaluation environments each; every step captured.
    pub fn new(
        device: &Device,
        kernels: Arc<AgentKernels>,
        cfg: SacConfig,
        agents: usize,
        eval_envs: usize,
    ) -> Result<Agent> {
        let actor: Vec<f32> = (0..agents)
            .flat_map(|a| init_actor(cfg.seed, a as u32))
            .collect();
        let critics: Vec<f32> = (0..agents)
            .flat_map(|a| init_critics(cfg.seed, a as u32))
            .collect();
        let log_alpha = vec![cfg.init_log_alpha; agents];
        let nets = Shared::new(
            "networks",
            SacNetworks::new(device, &actor, &critics, &log_alpha)?,
        );
        let rms = Shared::new("observation statistics", rms_buffer(device, agents)?);
        let n = agents * cfg.num_envs;
        let mut env = Pendulum::new(device, n, cfg.seed)?;
        let mut out = Transitions::new(device, n, Pendulum::OBS)?;
        stepgraph::exec::run_once(device, |s| {
            kernels.envs.pendulum_reset(s, &mut env, &mut out)
        })?;
        let mut obs = device.alloc_zeros("acted-on observations", n * Pendulum::OBS)?;
        stepgraph::exec::run_once(device, |s| s.copy(&out.obs, &mut obs))?;
        let train_buffers = train::Buffers {
            nets: nets.clone(),
            rms: rms.clone(),
            adam: SacAdam::new(device, agents)?,
            replay: SacReplay::new(device, agents, cfg.buffer_size)?,
            counters: counters(device)?,
            env,
            obs,
            actions: device.alloc_zeros("actions", n)?,
            out,
            losses: device.alloc_zeros("losses", 3 * agents)?,
            returns: HostOutput::new(device, "training returns", n)?,
        };
        let eval = Shared::new(
            "evaluation",
            Evaluation::new(
                device,
                Pendulum::new,
                Pendulum::OBS,
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
                nets: nets.clone(),
                rms,
                eval: eval.clone(),
            },
            eval_run::Config { cfg },
        )?;
        Ok(Agent::from_steps(
            train,
            eval_reset,
            eval_run,
            nets,
            eval,
            cfg.num_envs,
            agents,
        ))
    }

    /// The actors of every agent (`[A, PARAMS]`), after everything launched.
    pub fn params(&self) -> Result<Vec<f32>> {
        let nets = self.nets.host()?;
        self.device().download(&nets.actor)
    }

    /// Floats of one agent's actor.
    pub const PARAMS: usize = ActorLayout::PARAMS;
}
