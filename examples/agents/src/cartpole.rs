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

use stepgraph::{CaptureStream, Device, DeviceBuffer, HostOutput, Result, Shared, StepBuffer};
use stepgraph_envs::{CartPole, Transitions};

use crate::config::DqnConfig;
use crate::kernels::{AdamState, Replay, counters};
use crate::layout::{DuelingLayout, init_params};

/// The kernels the steps take: the environments' and the agent's.
#[derive(Debug)]
pub struct AgentKernels {
    /// CartPole's reset and step.
    pub envs: stepgraph_envs::Kernels,
    /// Acting, the replay, the update, the target, evaluation.
    pub dqn: crate::Kernels,
}

impl AgentKernels {
    /// Loads both into `device`'s context.
    pub fn load(device: &Device) -> Result<AgentKernels> {
        Ok(AgentKernels {
            envs: stepgraph_envs::Kernels::load(device)?,
            dqn: crate::Kernels::load(device)?,
        })
    }
}

/// rejax evaluates over this many episodes.
pub const EVAL_EPISODES: usize = 128;

/// An evaluation's environments, `eval_envs` per agent, and what it records.
#[derive(Debug, StepBuffer)]
pub struct Evaluation {
    /// `A envs` environments, agent `a`'s rows `a envs .. (a + 1) envs`.
    pub env: CartPole,
    /// What each evaluation step writes; `obs` is what the next one acts on.
    pub out: Transitions,
    /// The evaluation's actions.
    pub actions: DeviceBuffer<i32>,
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
        k.dqn.dqn_act(s, &cfg, online, obs, counters, actions)
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
        k.dqn
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
        k.dqn.dqn_count(s, &cfg, counters)
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
        k.dqn
            .dqn_update(s, &cfg, online, target, adam, counters, replay, loss)
    }

    fn sync_target(
        s: &CaptureStream<'_>,
        k: &AgentKernels,
        cfg: DqnConfig,
        online: &DeviceBuffer<f32>,
        target: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.dqn.polyak(s, &cfg, online, target)
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
        k.dqn.first_returns_clear(s, &mut eval.first)
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
        k.dqn
            .dqn_act_eval(s, &cfg, online, &out.obs, clock, actions, *envs)
    }

    fn env_step(s: &CaptureStream<'_>, k: &AgentKernels, eval: &mut Evaluation) -> Result<()> {
        let Evaluation {
            env, out, actions, ..
        } = eval;
        k.envs.cartpole_step(s, env, actions, out)
    }

    fn record(s: &CaptureStream<'_>, k: &AgentKernels, eval: &mut Evaluation) -> Result<()> {
        k.dqn.first_returns(s, &eval.env.stats, &mut eval.first)?;
        k.dqn.eval_tick(s, &mut eval.clock)
    }
}

/// `A` agents of one configuration, side by side: their steps and shared buffers.
#[derive(Debug)]
pub struct Agent {
    train: train::Step,
    eval_reset: eval_reset::Step,
    eval_run: eval_run::Step,
    online: Shared<DeviceBuffer<f32>>,
    eval: Shared<Evaluation>,
    cfg: DqnConfig,
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
        let m = agents * eval_envs;
        // Another seed than training's: the evaluation's episodes start elsewhere.
        let eval = Shared::new(
            "evaluation",
            Evaluation {
                env: CartPole::new(device, m, cfg.seed ^ 0x5eed_e7a1)?,
                out: Transitions::new(device, m, CartPole::OBS)?,
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
                online: online.clone(),
                eval: eval.clone(),
            },
            eval_run::Config { cfg },
        )?;
        Ok(Agent {
            train,
            eval_reset,
            eval_run,
            online,
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
    /// environments, its updates and its target each) as one device loop; returns once it
    /// is queued.
    pub fn train(&mut self, iterations: u32) -> Result<()> {
        self.train.replay_loop(iterations)?;
        self.steps += u64::from(iterations) * self.cfg.num_envs as u64;
        Ok(())
    }

    /// Launches an evaluation of the parameters the training launched so far reaches: a
    /// reset, then a device loop of CartPole's 500-step time limit, after which every
    /// evaluation environment has finished its first episode. Returns once it is queued;
    /// [`Agent::eval_returns`] waits for it.
    pub fn evaluate(&mut self) -> Result<()> {
        self.eval_reset.replay()?;
        self.eval_run.replay_loop(CartPole::MAX_EPISODE_STEPS)
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

    /// The online parameters of every agent (`[A, PARAMS]`), after everything launched.
    pub fn params(&self) -> Result<Vec<f32>> {
        let online = self.online.host()?;
        self.train.executor().device().download(&*online)
    }

    /// The steps' plans, for a reader without a GPU.
    pub fn plans() -> [&'static stepgraph::PlanDesc; 3] {
        [
            train::Step::plan(),
            eval_reset::Step::plan(),
            eval_run::Step::plan(),
        ]
    }

    /// The training loop as a picture ([`stepgraph_picture::program_svg`]): `train` looped
    /// `iterations` times per launch, then an evaluation (`eval_reset` once, `eval_run`
    /// looped over CartPole's time limit), the sequence repeated `rounds` times, and the
    /// shared buffers between them.
    pub fn program(iterations: u32, rounds: u64) -> stepgraph_picture::Program<'static> {
        use stepgraph_picture::{Launch, Program, Repeat};
        let looped = |n: u32| Repeat::Loop {
            iterations: n.to_string(),
        };
        Program {
            title: "CartPole-v1 DQN: the training loop".into(),
            launches: vec![
                Launch {
                    plan: train::Step::plan(),
                    repeat: looped(iterations),
                },
                Launch {
                    plan: eval_reset::Step::plan(),
                    repeat: Repeat::Once,
                },
                Launch {
                    plan: eval_run::Step::plan(),
                    repeat: looped(CartPole::MAX_EPISODE_STEPS),
                },
            ],
            rounds: Some(format!("{rounds} times")),
        }
    }

    /// Floats of one agent's parameters.
    pub const PARAMS: usize = DuelingLayout::PARAMS;
}
