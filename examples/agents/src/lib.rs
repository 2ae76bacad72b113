//! The device kernels of two agents that train as rejax 0.1.3 trains them, for many
//! independent agents side by side, each with environments of its own: a DQN agent for
//! CartPole-v1 (this module's root) and a SAC agent for Pendulum-v1 ([`sac`]). Each has
//! its kernels behind methods of the one registry [`Kernels`], CPU references of every
//! kernel, and a whole training loop on the device ([`cartpole`], [`pendulum`]) with its
//! trainer binary. Both loops are one generic [`agent::Agent`] over the agent's steps,
//! and both trainers one driver, [`trainer`].
//!
//! # DQN on CartPole-v1
//!
//! rejax's `DQN` (`configs/gymnax/cartpole.yaml`) for `A` agents, each with `E`
//! environments of its own (rows `a E .. (a + 1) E` of a `stepgraph_envs::CartPole` batch
//! of `A E`). One iteration of rejax's `train_iteration`, as ops of a step:
//!
//! 1. [`Kernels::dqn_act`]: epsilon-greedy actions (uniform before `fill_buffer`);
//! 2. the environments' step (`stepgraph_envs::Kernels::cartpole_step`);
//! 3. [`Kernels::replay_insert`]: the transitions into each agent's ring;
//! 4. [`Kernels::dqn_count`]: the counters move on by `E`;
//! 5. [`Kernels::dqn_update`]: `epochs` fused double-DQN updates per agent, one block each,
//!    if the iteration's starting step is past `fill_buffer`;
//! 6. [`Kernels::polyak`]: the target networks, every iteration.
//!
//! Evaluation acts with [`Kernels::dqn_act_eval`] (epsilon 0.005) on environments of its
//! own and moves its clock with [`Kernels::eval_tick`].
//!
//! - [`layout`]: the network's sizes, one agent's flat parameters ([`DuelingLayout`]),
//!   the counters ([`Counter`]) and flax's initialisation ([`init_params`]);
//! - [`config`]: the hyperparameters ([`DqnConfig::rejax_cartpole`]);
//! - [`rng`]: the counter-based generator the kernels of both agents draw from;
//! - [`reference`](mod@reference): every kernel on the CPU.
//!
//! # SAC on Pendulum-v1
//!
//! rejax's `SAC` (`configs/gymnax/pendulum.yaml`) in four kernels an iteration:
//! [`Kernels::sac_act`], the environments' step, [`Kernels::sac_store`] (the ring, the
//! observation statistics, the counters), and [`Kernels::sac_update`] (actor, critics and
//! temperature, an 8-block cluster per agent on compute capability 9.0, then the target
//! critics' Polyak step). The [`sac`] module says more.
//!
//! # Where this differs from rejax
//!
//! - Random numbers: a counter-based hash (stepgraph-kernels' splitmix) keyed by seed,
//!   agent, purpose and step instead of JAX's threefry splits, so a seed gives other
//!   numbers than rejax's with the same distributions: the initial weights
//!   (`lecun_normal`, truncated), the uniform and epsilon-greedy actions, SAC's normals
//!   (Box-Muller), and the batches (distinct slots uniform over the filled ring, as
//!   `jax.random.choice(..., replace=False)` draws them).
//! - `done` is a choice ([`DqnConfig::truncation_is_terminal`],
//!   [`sac::SacConfig::truncation_is_terminal`]): rejax, through gymnax, stores time-limit
//!   truncations as done; `false` bootstraps them from their final observation instead.
//! - Arithmetic: f32 throughout, sums in the kernels' fixed order; XLA's order and fusion
//!   differ, so results agree with a JAX run to rounding, not bit for bit.

#![warn(missing_docs)]

pub mod agent;
pub mod cartpole;
pub mod config;
pub mod kernels;
pub mod layout;
pub mod pendulum;
pub mod reference;
pub mod rng;
pub mod sac;
pub mod trainer;

pub use config::DqnConfig;
pub use kernels::{
    AdamState, KernelId, Kernels, MAX_BATCH, ModuleId, Replay, ReplayRings, UPDATE_THREADS,
    counters, update_smem_bytes,
};
pub use layout::{ACTIONS, COUNTERS, Counter, DuelingLayout, HIDDEN, OBS, Tensor, init_params};
