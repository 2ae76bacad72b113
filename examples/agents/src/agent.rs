//! What both agents' whole training loops share: three steps over shared buffers, each
//! captured once, and how the host launches them.
//!
//! - `train`: one iteration of rejax's `train_iteration` for every agent;
//!   [`Agent::train`] runs it `n` times in one launch ([`stepgraph::Step::replay_loop`]).
//! - `eval_reset` and `eval_run`: rejax's evaluation, one episode in each of `eval_envs`
//!   environments per agent; [`Agent::evaluate`] loops `eval_run` over the environment's
//!   time limit, so every environment finishes its first episode.
//!
//! Launches run in the order the host makes them, so an evaluation sees the networks of
//! the iterations launched before it, and the next training launch waits for it on the
//! device, with no host wait between. An [`Algorithm`] names an agent's steps; the agent
//! itself is [`Agent<A>`](Agent) ([`crate::cartpole::Agent`], [`crate::pendulum::Agent`]).

use std::fmt::Debug;

use stepgraph::cudarc::driver::ValidAsZeroBits;
use stepgraph::{
    Device, DeviceBuffer, DeviceRepr, HostOutput, PlanDesc, Result, Shared, Step, StepBuffer,
    StepSpec,
};
use stepgraph_envs::Transitions;
use stepgraph_picture::{Launch, Program, Repeat};

/// rejax evaluates over this many episodes.
pub const EVAL_EPISODES: usize = 128;

/// The kernels the steps of either agent take: the environments' and the agents'.
#[derive(Debug)]
pub struct AgentKernels {
    /// The environments' resets and steps.
    pub envs: stepgraph_envs::Kernels,
    /// Acting, the replay, the updates, the targets, evaluation.
    pub agents: crate::Kernels,
}

impl AgentKernels {
    /// Loads both into `device`'s context.
    pub fn load(device: &Device) -> Result<AgentKernels> {
        Ok(AgentKernels {
            envs: stepgraph_envs::Kernels::load(device)?,
            agents: crate::Kernels::load(device)?,
        })
    }
}

/// An agent's training loop: its three steps, what its evaluation runs, and what it
/// names in pictures and records.
pub trait Algorithm: Debug + 'static {
    /// The task, as gymnax names it: `CartPole-v1`.
    const TASK: &'static str;
    /// The algorithm: `DQN`.
    const NAME: &'static str;
    /// The environment's time limit: an evaluation loops `eval_run` this many times.
    const EPISODE_STEPS: u32;
    /// One training iteration of every agent.
    type Train: StepSpec;
    /// The start of an evaluation: fresh episodes, nothing recorded.
    type EvalReset: StepSpec;
    /// One step of an evaluation's environments.
    type EvalRun: StepSpec;
    /// The environments, as a batch of `A envs`.
    type Env: StepBuffer + Debug;
    /// Their actions' element type.
    type Action: DeviceRepr + ValidAsZeroBits + Debug;
    /// The networks `train` writes and `eval_run` reads (what [`Agent`]'s `params` reads).
    type Networks: Debug;

    /// The training environments' last finished episode returns among `train`'s buffers.
    fn returns(buffers: &<Self::Train as StepSpec>::Buffers) -> &HostOutput<f32>;
}

/// An evaluation's environments, `envs` per agent, and what it records.
#[derive(Debug, StepBuffer)]
pub struct Evaluation<Env, T> {
    /// `A envs` environments, agent `a`'s rows `a envs .. (a + 1) envs`.
    pub env: Env,
    /// What each evaluation step writes; `obs` is what the next one acts on.
    pub out: Transitions,
    /// The evaluation's actions.
    pub actions: DeviceBuffer<T>,
    /// Moves the evaluation's draws on, one step at a time.
    pub clock: DeviceBuffer<u32>,
    /// `[A, envs]`: each environment's first episode return; NaN until it ends.
    pub first: DeviceBuffer<f32>,
    /// Evaluation environments per agent.
    pub envs: usize,
}

impl<Env, T: DeviceRepr + ValidAsZeroBits> Evaluation<Env, T> {
    /// `envs` evaluation environments for each of `agents` agents, with observations of
    /// `obs` floats, made by `new_env(device, agents * envs, seed)` with another seed than
    /// training's `seed`, so the evaluation's episodes start elsewhere.
    pub fn new(
        device: &Device,
        new_env: impl FnOnce(&Device, usize, u64) -> Result<Env>,
        obs: usize,
        seed: u64,
        agents: usize,
        envs: usize,
    ) -> Result<Evaluation<Env, T>> {
        let m = agents * envs;
        Ok(Evaluation {
            env: new_env(device, m, seed ^ 0x5eed_e7a1)?,
            out: Transitions::new(device, m, obs)?,
            actions: device.alloc_zeros("evaluation actions", m)?,
            clock: device.alloc_zeros("evaluation clock", 1)?,
            first: device.alloc_zeros("first episode returns", m)?,
            envs,
        })
    }
}

/// `A` agents of one configuration, side by side: their steps and shared buffers.
#[derive(Debug)]
pub struct Agent<A: Algorithm> {
    train: Step<A::Train>,
    eval_reset: Step<A::EvalReset>,
    eval_run: Step<A::EvalRun>,
    pub(crate) nets: A::Networks,
    eval: Shared<Evaluation<A::Env, A::Action>>,
    /// Training environments per agent.
    envs: usize,
    agents: usize,
    /// Environment steps each agent has taken.
    steps: u64,
}

impl<A: Algorithm> Agent<A> {
    /// The agent of the captured steps: `agents` agents with `envs` training environments
    /// each, `eval` shared between `eval_reset` and `eval_run`, and `nets` between `train`
    /// and `eval_run`.
    pub(crate) fn from_steps(
        train: Step<A::Train>,
        eval_reset: Step<A::EvalReset>,
        eval_run: Step<A::EvalRun>,
        nets: A::Networks,
        eval: Shared<Evaluation<A::Env, A::Action>>,
        envs: usize,
        agents: usize,
    ) -> Agent<A> {
        Agent {
            train,
            eval_reset,
            eval_run,
            nets,
            eval,
            envs,
            agents,
            steps: 0,
        }
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
        self.steps += u64::from(iterations) * self.envs as u64;
        Ok(())
    }

    /// Launches an evaluation of the networks the training launched so far reaches: a
    /// reset, then a device loop of the environment's time limit
    /// ([`Algorithm::EPISODE_STEPS`]), after which every evaluation environment has
    /// finished its first episode. Returns once it is queued; [`Agent::eval_returns`]
    /// waits for it.
    pub fn evaluate(&mut self) -> Result<()> {
        self.eval_reset.replay()?;
        self.eval_run.replay_loop(A::EPISODE_STEPS)
    }

    /// Each agent's mean first-episode return over its evaluation environments, once the
    /// last evaluation has finished (this waits for it, not for training launched after).
    pub fn eval_returns(&self) -> Result<Vec<f64>> {
        self.eval_run.wait()?;
        let first = {
            let eval = self.eval.host()?;
            self.device().download(&eval.first)?
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
        Ok(self.train.read_back(A::returns)?.map(|r| r.to_vec()))
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

    /// The device the steps run on.
    pub(crate) fn device(&self) -> &Device {
        self.train.executor().device()
    }

    /// The steps' plans, for a reader without a GPU.
    pub fn plans() -> [&'static PlanDesc; 3] {
        [
            Step::<A::Train>::plan(),
            Step::<A::EvalReset>::plan(),
            Step::<A::EvalRun>::plan(),
        ]
    }

    /// The training loop as a picture ([`stepgraph_picture::program_svg`]): `train` looped
    /// `iterations` times per launch, then an evaluation (`eval_reset` once, `eval_run`
    /// looped over the environment's time limit), the sequence repeated `rounds` times,
    /// and the shared buffers between them.
    pub fn program(iterations: u32, rounds: u64) -> Program<'static> {
        let looped = |n: u32| Repeat::Loop {
            iterations: n.to_string(),
        };
        let [train, eval_reset, eval_run] = Self::plans();
        Program {
            title: format!("{} {}: the training loop", A::TASK, A::NAME),
            launches: vec![
                Launch {
                    plan: train,
                    repeat: looped(iterations),
                },
                Launch {
                    plan: eval_reset,
                    repeat: Repeat::Once,
                },
                Launch {
                    plan: eval_run,
                    repeat: looped(A::EPISODE_STEPS),
                },
            ],
            rounds: Some(format!("{rounds} times")),
        }
    }
}
