//! The device kernels of a SAC agent for Pendulum-v1 that trains as rejax 0.1.3's `SAC`
//! does (`configs/gymnax/pendulum.yaml`), for `A` independent agents side by side, each
//! with `E` environments of its own (rows `a E .. (a + 1) E` of a
//! `stepgraph_envs::Pendulum` batch of `A E`).
//!
//! One iteration of rejax's `train_iteration`, as ops of a step:
//!
//! 1. [`sac_act`](crate::Kernels::sac_act): a sample of each agent's policy on its
//!    observations, normalised with its running statistics;
//! 2. the environments' step (`stepgraph_envs::Kernels::pendulum_step`);
//! 3. [`sac_store`](crate::Kernels::sac_store): the transitions into each agent's ring,
//!    the statistics' update, the next observations into the acted-on buffer, and the
//!    counters moved on by `E`, in one block;
//! 4. [`sac_update`](crate::Kernels::sac_update): `epochs` fused SAC updates per agent
//!    (actor, critics, temperature), a cluster of 8 blocks each on compute capability 9.0
//!    (one block elsewhere), if the step is past `fill_buffer`, then the Polyak step of
//!    the target critics, every iteration.
//!
//! Evaluation acts with [`sac_act_eval`](crate::Kernels::sac_act_eval) (a sample of the
//! policy, as rejax's does) on environments of its own and moves its clock with
//! [`eval_tick`](crate::Kernels::eval_tick). [`crate::pendulum`] runs it all as steps.
//!
//! - [`layout`]: the networks' sizes and flat parameters ([`ActorLayout`],
//!   [`CriticLayout`]), the statistics' layout and flax's initialisation;
//! - [`config`]: the hyperparameters ([`SacConfig::rejax_pendulum`]);
//! - [`kernels`]: the launchers and the buffers ([`SacReplay`], [`SacNetworks`],
//!   [`SacAdam`]);
//! - [`launch`]: the update's block, shared memory and blocks per agent;
//! - [`reference`](mod@reference): every kernel on the CPU.
//!
//! Where this differs from rejax: the random numbers (the crate's counter-based
//! generator, normals by Box-Muller), `done` as a choice
//! ([`SacConfig::truncation_is_terminal`]) and the order of f32 sums, as for DQN (see the
//! crate's docs).

pub mod config;
pub mod kernels;
pub mod launch;
pub mod layout;
pub mod reference;

pub use config::SacConfig;
pub use kernels::{SacAdam, SacNetworks, SacReplay, rms_buffer};
pub use launch::{
    SAC_CHUNK, SAC_CLUSTER, SAC_MAX_BATCH, SAC_UPDATE_THREADS, sac_update_smem_bytes,
};
pub use layout::{
    ActorLayout, CriticLayout, NUM_CRITICS, RMS_FLOATS, SAC_IN, SAC_OBS, init_actor, init_critics,
    initial_rms,
};
