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

use stepgraph::{CaptureStream, Device, DeviceBuffer, HostOutput, Result, Shared, StepBuffer};
use stepgraph_envs::{Pendulum, Transitions};

use crate::kernels::counters;
use crate::sac::{
    ActorLayout, SacAdam, SacConfig, SacNetworks, SacReplay, init_actor, init_critics, rms_buffer,
};

/// The kernels the steps take: the environments' and the agent's.
#[derive(Debug)]
pub struct AgentKernels {
    /// Pendulum's reset and step.
    pub envs: stepgraph_envs::Kernels,
    /// Acting, the replay, the update, evaluation.
    pub sac: crate::Kernels,
}

impl AgentKernels {
    /// Loads both into `device`'s context.
    pub fn load(device: &Device) -> Result<AgentKernels> {
        Ok(AgentKernels {
            envs: stepgraph_envs::Kernels::load(device)?,
            sac: crate::Kernels::load(device)?,
        })
    }
}

/// rejax evaluates over this many episodes.
pub const EVAL_EPISODES: usize = 128;

/// An evaluation's environments, `eval_envs` per agent, and what it records.
#[derive(Debug, StepBuffer)]
pub struct Evaluation {
    /// `A envs` environments, agent `a`'s rows `a envs .. (a + 1) envs`.
    pub env: Pendulum,
    /// What each evaluation step writes; `obs` is what the next one acts on.
    pub out: Transitions,
    /// The evaluation's torques.
    pub actions: DeviceBuffer<f32>,
    /// Moves the evaluation's draws on, one step at a time.
    pub clock: DeviceBuffer<u32>,
    /// `[A, envs]`: each environment's first episode return; NaN until it ends.
    pub first: DeviceBuffer<f32>,
    /// Evaluation environments per agent.
    pub envs: usize,
}

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
        k.sac
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
        k.sac
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
        k.sac
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
        k.sac.first_returns_clear(s, &mut eval.first)
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
        k.sac
            .sac_act_eval(s, &cfg, &nets.actor, rms, &out.obs, clock, actions, *envs)
    }

    fn env_step(s: &CaptureStream<'_>, k: &AgentKernels, eval: &mut Evaluation) -> Result<()> {
        let Evaluation {
            env, out, actions, ..
        } = eval;
        k.envs.pendulum_step(s, env, actions, out)
    }

    fn record(s: &CaptureStream<'_>, k: &AgentKernels, eval: &mut Evaluation) -> Result<()> {
        k.sac.first_returns(s, &eval.env.stats, &mut eval.first)?;
        k.sac.eval_tick(s, &mut eval.clock)
    }
}

/// `A` agents of one configuration, side by side: their steps and shared buffers.
#[derive(Debug)]
pub struct Agent {
    train: train::Step,
    eval_reset: eval_reset::Step,
    eval_run: eval_run::Step,
    nets: Shared<SacNetworks>,
    eval: Shared<Evaluation>,
    cfg: SacConfig,
    agents: usize,
    /// Environment steps each agent has taken.
    steps: u64,
}

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
        let m = agents * eval_envs;
        // Another seed than training's: the evaluation's episodes start elsewhere.
        let eval = Shared::new(
            "evaluation",
            Evaluation {
                env: Pendulum::new(device, m, cfg.seed ^ 0x5eed_e7a1)?,
                out: Transitions::new(device, m, Pendulum::OBS)?,
                actions: device.alloc_zeros("evaluation actions", m)?,
                clock: device.alloc_zeros("evaluation clock", 1)?,
                first: device.alloc_zeros("first episode returns", m)?,
                envs: eval_envs,
            },
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
        Ok(Agent {
            train,
            eval_reset,
            eval_run,
            nets,
            eval,
            cfg,
            agents,
            steps: 0,
        })
    }

    /// Agents side by side.
    pub fn agents(&self) -> usize {
        self.agents
    }

    /// Environment steps each agent has taken (launched; the device may still be on them).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Launches `iterations` training iterations (`cfg.num_envs` steps of each agent's
    /// environments, its updates and its target critics each) as one device loop; returns
    /// once it is queued.
    pub fn train(&mut self, iterations: u32) -> Result<()> {
        self.train.replay_loop(iterations)?;
        self.steps += u64::from(iterations) * self.cfg.num_envs as u64;
        Ok(())
    }

    /// Launches an evaluation of the networks the training launched so far reaches: a
    /// reset, then a device loop of Pendulum's 200-step time limit, after which every
    /// evaluation environment has finished its first episode. Returns once it is queued;
    /// [`Agent::eval_returns`] waits for it.
    pub fn evaluate(&mut self) -> Result<()> {
        self.eval_reset.replay()?;
        self.eval_run.replay_loop(Pendulum::MAX_EPISODE_STEPS)
    }

    /// Each agent's mean first-episode return over its evaluation environments, once the
    /// last evaluation has finished (this waits for it, not for training launched after).
    pub fn eval_returns(&self) -> Result<Vec<f64>> {
        self.eval_run.wait()?;
        let first = {
            let eval = self.eval.host()?;
            self.train.executor().device().download(&eval.first)?
        };
        let per_agent = first.len() / self.agents.max(1);
        Ok(first
            .chunks(per_agent.max(1))
            .map(|c| c.iter().map(|&r| f64::from(r)).sum::<f64>() / c.len() as f64)
            .collect())
    }

    /// The training environments' last finished episode returns, from the newest finished
    /// launch, without waiting; `None` before one has finished.
    pub fn training_returns(&self) -> Result<Option<Vec<f32>>> {
        Ok(self.train.read_back(|b| &b.returns)?.map(|r| r.to_vec()))
    }

    /// The training step's timeline: each op's GPU time, the median over `replays`
    /// replays of a graph captured with events between the ops. Each replay trains, as a
    /// launch of one iteration would.
    pub fn profile(&mut self, replays: usize) -> Result<stepgraph::Profile> {
        self.train.profile(replays)
    }

    /// Waits for everything launched.
    pub fn wait(&self) -> Result<()> {
        self.train.wait()?;
        self.eval_run.wait()
    }

    /// The actors of every agent (`[A, PARAMS]`), after everything launched.
    pub fn params(&self) -> Result<Vec<f32>> {
        let nets = self.nets.host()?;
        self.train.executor().device().download(&nets.actor)
    }

    /// The steps' plans, for a reader without a GPU.
    pub fn plans() -> [&'static stepgraph::PlanDesc; 3] {
        [
            train::Step::plan(),
            eval_reset::Step::plan(),
            eval_run::Step::plan(),
        ]
    }

    /// Floats of one agent's actor.
    pub const PARAMS: usize = ActorLayout::PARAMS;
}
