//! The SAC kernels (`cuda/sac_*.cu`) behind methods of the crate's one registry,
//! [`Kernels`], each taking the run's [`SacConfig`] and checking every size before it
//! launches; and the device buffers they work on.

use stepgraph::{CaptureStream, Device, DeviceBuffer, Error, LaunchConfig, Result, StepBuffer};
use stepgraph_envs::Transitions;

use crate::kernels::{Kernels, ReplayRings, agents_of, positive_product};
use crate::sac::config::SacConfig;
use crate::sac::launch::{SAC_UPDATE_THREADS, sac_update_smem_bytes};
use crate::sac::layout::{ActorLayout, CriticLayout, NUM_CRITICS, RMS_FLOATS, SAC_OBS};

impl Kernels {
    /// Whether [`Kernels::sac_update`] can launch on this device: it needs 145 KiB of
    /// shared memory per block (H100, H200, A100).
    pub fn sac_update_ready(&self) -> bool {
        self.sac_update_blocks.is_some()
    }

    /// Blocks per agent of [`Kernels::sac_update`]:
    /// [`SAC_CLUSTER`](crate::sac::SAC_CLUSTER) (one thread-block cluster) on compute
    /// capability 9.0 and newer, 1 on older GPUs or where the module was loaded from
    /// portable PTX; `None` where it cannot launch.
    pub fn sac_update_blocks(&self) -> Option<u32> {
        self.sac_update_blocks
    }

    /// rejax's training act for every environment of every agent: `actions[a, e]`, a sample
    /// of agent `a`'s policy on `obs[a, e, :]` (`[A, E, SAC_OBS]`, E = `cfg.num_envs`)
    /// normalised with its statistics `rms` (`[A, RMS_FLOATS]`), drawn from the key of
    /// (seed, agent, step) with the step `counters[Counter::Step]` read when the kernel runs.
    #[allow(clippy::too_many_arguments)]
    pub fn sac_act(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &SacConfig,
        actor: &DeviceBuffer<f32>,
        rms: &DeviceBuffer<f32>,
        obs: &DeviceBuffer<f32>,
        counters: &DeviceBuffer<u32>,
        actions: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let agents = agents_of("sac_act", "actor", actor, ActorLayout::PARAMS)?;
        self.raw.sac_act_checked(
            stream,
            actor,
            rms,
            obs,
            counters,
            actions,
            agents,
            cfg.num_envs,
            cfg.seed,
        )
    }

    /// Evaluation's act (rejax's `make_act`: a sample of the policy, as in training) for
    /// `envs` evaluation environments per agent (`obs` `[A, envs, SAC_OBS]`), drawing at
    /// `clock[0]`, which [`Kernels::eval_tick`] moves on after each evaluation step.
    #[allow(clippy::too_many_arguments)]
    pub fn sac_act_eval(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &SacConfig,
        actor: &DeviceBuffer<f32>,
        rms: &DeviceBuffer<f32>,
        obs: &DeviceBuffer<f32>,
        clock: &DeviceBuffer<u32>,
        actions: &mut DeviceBuffer<f32>,
        envs: usize,
    ) -> Result<()> {
        let agents = agents_of("sac_act_eval", "actor", actor, ActorLayout::PARAMS)?;
        self.raw.sac_act_eval_checked(
            stream, actor, rms, obs, clock, actions, agents, envs, cfg.seed,
        )
    }

    /// SAC's side of a step of the environments, in one block: for each agent `a` and
    /// environment `e` (rows `a E .. (a + 1) E`, E = `cfg.num_envs`), the transition
    /// (`obs`, `actions`, `out.reward`, `out.final_obs`, done) at slot `(pos + e) % C` of
    /// ring `a`, pos = `counters[Counter::Pos]`, done = `out.terminated`, or
    /// `terminated || truncated` where `cfg.truncation_is_terminal` (rejax); rejax's
    /// `update_rms` of `rms[a]` with the batch `out.obs` of its E environments (the
    /// observations the step returned, reset ones where an episode ended, as rejax's);
    /// `obs = out.obs`, the observations the next act sees; and the counters moved on as
    /// [`Kernels::dqn_count`] moves them (`step_before = step`, `step += E`,
    /// `pos = (pos + E) % C`, `size = min(size + E, C)`).
    #[allow(clippy::too_many_arguments)]
    pub fn sac_store(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &SacConfig,
        obs: &mut DeviceBuffer<f32>,
        actions: &DeviceBuffer<f32>,
        out: &Transitions,
        counters: &mut DeviceBuffer<u32>,
        rms: &mut DeviceBuffer<f32>,
        replay: &mut SacReplay,
    ) -> Result<()> {
        let (agents, capacity) = (replay.agents, replay.capacity);
        self.raw.sac_store_checked(
            stream,
            obs,
            &out.obs,
            &out.final_obs,
            actions,
            &out.reward,
            &out.terminated,
            &out.truncated,
            counters,
            rms,
            &mut replay.obs,
            &mut replay.action,
            &mut replay.reward,
            &mut replay.next_obs,
            &mut replay.done,
            agents,
            cfg.num_envs,
            capacity,
            u32::from(cfg.truncation_is_terminal),
        )
    }

    /// `cfg.epochs` SAC updates of every agent, fused in one launch (a thread-block
    /// cluster of [`SAC_CLUSTER`](crate::sac::SAC_CLUSTER) blocks per agent on compute
    /// capability 9.0, one block elsewhere: [`Kernels::sac_update_blocks`]), if the
    /// iteration trains: `counters[Counter::Step] > cfg.fill_buffer` (so run it after
    /// [`Kernels::sac_store`], which moves the step on) and each ring holds a batch; then,
    /// in every launch, the Polyak step of the target critics. Each update draws
    /// `cfg.batch_size` distinct slots of the agent's ring, normalises them with `rms`, and
    /// takes an Adam step of the actor, then of the critics (targets from the new actor and
    /// `targets`), then of `log_alpha`; `losses[3 a ..]` gets agent `a`'s last actor,
    /// critic and temperature losses. `cuda/sac_update.cu` states every formula.
    ///
    /// Fails before launching if the device did not grant the kernel its shared memory
    /// ([`Kernels::sac_update_ready`]), the batch exceeds
    /// [`SAC_MAX_BATCH`](crate::sac::SAC_MAX_BATCH) or the ring's capacity, or a buffer has
    /// another length than the agents say.
    #[allow(clippy::too_many_arguments)]
    pub fn sac_update(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &SacConfig,
        nets: &mut SacNetworks,
        adam: &mut SacAdam,
        counters: &DeviceBuffer<u32>,
        rms: &DeviceBuffer<f32>,
        replay: &SacReplay,
        losses: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        // Without the opt-in the launch would fail in the driver, inside a capture.
        let Some(blocks) = self.sac_update_blocks else {
            return Err(Error::Argument {
                what: "sac_update: the device".into(),
                expected: format!(
                    "{} bytes of shared memory per block",
                    sac_update_smem_bytes()
                ),
                found: "less".into(),
            });
        };
        let agents = replay.agents;
        // A grid past u32 blocks is refused here, not wrapped (the checked launcher checks
        // the buffers against `agents`, not the grid).
        let grid = u32::try_from(agents)
            .ok()
            .and_then(|a| a.checked_mul(blocks))
            .ok_or_else(|| Error::Argument {
                what: "sac_update: agents".into(),
                expected: format!("at most {} agents", u32::MAX / blocks),
                found: agents.to_string(),
            })?;
        let config = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (SAC_UPDATE_THREADS, 1, 1),
            shared_mem_bytes: sac_update_smem_bytes() as u32,
        };
        let (keep, mix) = cfg.polyak_coefficients();
        self.raw.sac_update_checked(
            stream,
            config,
            &mut nets.actor,
            &mut nets.critics,
            &mut nets.targets,
            &mut nets.log_alpha,
            &mut adam.actor_m,
            &mut adam.actor_v,
            &mut adam.critic_m,
            &mut adam.critic_v,
            &mut adam.alpha_m,
            &mut adam.alpha_v,
            &mut adam.t,
            counters,
            rms,
            &replay.obs,
            &replay.action,
            &replay.reward,
            &replay.next_obs,
            &replay.done,
            losses,
            agents,
            replay.capacity,
            cfg.batch_size,
            cfg.epochs,
            cfg.seed,
            cfg.fill_buffer,
            cfg.gamma,
            cfg.learning_rate,
            cfg.b1(),
            cfg.c1(),
            cfg.b2(),
            cfg.c2(),
            cfg.adam_eps,
            cfg.max_grad,
            cfg.target_entropy,
            keep,
            mix,
        )
    }
}

/// SAC's replay rings: Pendulum's observations ([`SAC_OBS`] floats) and torques.
pub type SacReplay = ReplayRings<f32>;

impl SacReplay {
    /// Zeroed rings for `agents` agents of `capacity` slots each (both at least 1).
    pub fn new(device: &Device, agents: usize, capacity: usize) -> Result<SacReplay> {
        SacReplay::zeroed(device, "SacReplay::new", agents, capacity, SAC_OBS)
    }
}

/// The networks of `A` agents: what `sac_update` trains.
#[derive(Debug, StepBuffer)]
pub struct SacNetworks {
    /// `[A, ActorLayout::PARAMS]`.
    pub actor: DeviceBuffer<f32>,
    /// `[A, NUM_CRITICS, CriticLayout::PARAMS]`.
    pub critics: DeviceBuffer<f32>,
    /// The target critics, the critics' layout.
    pub targets: DeviceBuffer<f32>,
    /// `[A]`: the temperature's logarithm.
    pub log_alpha: DeviceBuffer<f32>,
}

impl SacNetworks {
    /// Uploads `actor` (`[A, ActorLayout::PARAMS]`), `critics` (also the targets' start)
    /// and `log_alpha` (`[A]`); lengths that disagree on `A` are refused.
    pub fn new(
        device: &Device,
        actor: &[f32],
        critics: &[f32],
        log_alpha: &[f32],
    ) -> Result<SacNetworks> {
        let agents = log_alpha.len();
        let per_critics = NUM_CRITICS * CriticLayout::PARAMS;
        if agents == 0
            || actor.len() != agents * ActorLayout::PARAMS
            || critics.len() != agents * per_critics
        {
            return Err(Error::Argument {
                what: "SacNetworks::new".into(),
                expected: format!(
                    "for A > 0 agents (log_alpha's length): {} floats of actor and {} of \
                     critics an agent",
                    ActorLayout::PARAMS,
                    per_critics
                ),
                found: format!("A = {agents}, {} and {} floats", actor.len(), critics.len()),
            });
        }
        Ok(SacNetworks {
            actor: device.upload_new("actors", actor)?,
            critics: device.upload_new("critics", critics)?,
            targets: device.upload_new("target critics", critics)?,
            log_alpha: device.upload_new("log alpha", log_alpha)?,
        })
    }
}

/// Adam's state of `A` agents: the moments of the actor, of the critics and of
/// `log_alpha`, and each agent's step count `[A]` (all three step together; also the
/// counter of the update's draws).
#[derive(Debug, StepBuffer)]
pub struct SacAdam {
    /// The actor's first moment, `[A, ActorLayout::PARAMS]`.
    pub actor_m: DeviceBuffer<f32>,
    /// The actor's second moment.
    pub actor_v: DeviceBuffer<f32>,
    /// The critics' first moment, `[A, NUM_CRITICS, CriticLayout::PARAMS]`.
    pub critic_m: DeviceBuffer<f32>,
    /// The critics' second moment.
    pub critic_v: DeviceBuffer<f32>,
    /// `log_alpha`'s first moment, `[A]`.
    pub alpha_m: DeviceBuffer<f32>,
    /// `log_alpha`'s second moment, `[A]`.
    pub alpha_v: DeviceBuffer<f32>,
    /// Updates taken by each agent, `[A]`.
    pub t: DeviceBuffer<u32>,
}

impl SacAdam {
    /// Zeroed state for `agents` agents.
    pub fn new(device: &Device, agents: usize) -> Result<SacAdam> {
        let actor = positive_product("SacAdam::new", agents, ActorLayout::PARAMS)?;
        let critics = positive_product("SacAdam::new", agents, NUM_CRITICS * CriticLayout::PARAMS)?;
        Ok(SacAdam {
            actor_m: device.alloc_zeros("actor Adam first moments", actor)?,
            actor_v: device.alloc_zeros("actor Adam second moments", actor)?,
            critic_m: device.alloc_zeros("critic Adam first moments", critics)?,
            critic_v: device.alloc_zeros("critic Adam second moments", critics)?,
            alpha_m: device.alloc_zeros("alpha Adam first moments", agents)?,
            alpha_v: device.alloc_zeros("alpha Adam second moments", agents)?,
            t: device.alloc_zeros("SAC Adam step counts", agents)?,
        })
    }
}

/// rejax's initial observation statistics of `agents` agents, `[A, RMS_FLOATS]`.
pub fn rms_buffer(device: &Device, agents: usize) -> Result<DeviceBuffer<f32>> {
    positive_product("rms_buffer", agents, RMS_FLOATS)?;
    let host: Vec<f32> = (0..agents)
        .flat_map(|_| crate::sac::layout::initial_rms())
        .collect();
    device.upload_new("observation statistics", &host)
}
