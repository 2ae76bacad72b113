//! The agents' kernels (`cuda/*.cu`, built by stepgraph-build) and the device buffers they
//! work on: each kernel behind a method that takes the run's [`DqnConfig`] and checks
//! every size before it launches (through the `_checked` launcher its size contract
//! generates).

use stepgraph::cudarc::driver::ValidAsZeroBits;
use stepgraph::{
    CaptureStream, Device, DeviceBuffer, DeviceRepr, Error, LaunchConfig, Result, StepBuffer,
};
use stepgraph_envs::{EpisodeStats, Transitions};

use crate::config::DqnConfig;
use crate::layout::{COUNTERS, DuelingLayout, OBS};

/// The registry stepgraph-build generated from `cuda/*.cu`.
pub(crate) mod raw {
    stepgraph::include_kernels!();
}
pub use raw::{KernelId, ModuleId};

/// The largest batch `dqn_update` takes (`MAX_BATCH` in `cuda/update.cu`).
pub const MAX_BATCH: usize = 128;
/// Threads of a `dqn_update` block (`UPDATE_THREADS`).
pub const UPDATE_THREADS: u32 = 256;
/// Blocks per agent of `dqn_update`, one thread-block cluster, where the loaded image is
/// for compute capability 9.0 or newer (`DQN_CLUSTER`); older images take one block per
/// agent.
pub const DQN_CLUSTER: u32 = 4;
/// Floats of the update's shared memory that do not depend on the batch: the online
/// parameters and the target parameters (later the gradients), each padded to a multiple
/// of 4 (`2 * PARAMS_PAD`).
const UPDATE_FIXED_FLOATS: usize = 2 * 4676;
/// Floats of the update's shared memory per row of the batch (`UPDATE_ROW_FLOATS`).
const UPDATE_ROW_FLOATS: usize = 153;

/// Bytes of dynamic shared memory `dqn_update` takes for a batch of `batch`: 94 KiB at
/// rejax's 100, 113 KiB at [`MAX_BATCH`].
pub const fn update_smem_bytes(batch: usize) -> usize {
    4 * (UPDATE_FIXED_FLOATS + batch * UPDATE_ROW_FLOATS)
}

/// The agents' kernels, loaded once per device (before any capture).
#[derive(Debug)]
pub struct Kernels {
    pub(crate) raw: raw::Kernels,
    max_batch: usize,
    /// `dqn_update`'s blocks per agent: a cluster of [`DQN_CLUSTER`] where the loaded
    /// image was built for compute capability 9.0 or newer, else 1.
    dqn_update_blocks: u32,
    /// `sac_update`'s blocks per agent, `None` where it did not get its shared memory
    /// (`crate::sac::sac_update_smem_bytes`).
    pub(crate) sac_update_blocks: Option<u32>,
}

impl Kernels {
    /// Loads this crate's module into `device`'s context (each kernel's parameter list is
    /// checked against its CUDA signature) and opts `dqn_update` in to the shared memory
    /// of a batch of [`MAX_BATCH`], or of the largest batch the device allows
    /// ([`Kernels::max_batch`]); a device that allows none fails with
    /// [`Error::DynamicShared`]. `sac_update` is opted in to its 145 KiB where the device
    /// grants them (A100, H100, H200); elsewhere [`Kernels::sac_update`] refuses to launch.
    pub fn load(device: &Device) -> Result<Kernels> {
        let raw = raw::Kernels::load(device)?;
        let update = raw.kernel(KernelId::DqnUpdate);
        let bytes = |batch: usize| update_smem_bytes(batch) as u32;
        let max_batch = match update.set_max_dynamic_shared(bytes(MAX_BATCH)) {
            Ok(()) => MAX_BATCH,
            Err(Error::DynamicShared {
                optin: Some(optin),
                static_bytes,
                ..
            }) if (optin as usize) >= update_smem_bytes(1) + static_bytes.unwrap_or(0) as usize => {
                let room = optin as usize - static_bytes.unwrap_or(0) as usize;
                let fit = (room / 4 - UPDATE_FIXED_FLOATS) / UPDATE_ROW_FLOATS;
                update.set_max_dynamic_shared(bytes(fit))?;
                fit
            }
            Err(other) => return Err(other),
        };
        let dqn_update_blocks = if raw
            .module(KernelId::DqnUpdate.module())
            .image()
            .is_some_and(|i| has_clusters(i.target))
        {
            DQN_CLUSTER
        } else {
            1
        };
        let sac_update_blocks = crate::sac::launch::opt_in_sac_update(
            raw.kernel(KernelId::SacUpdate),
            raw.module(KernelId::SacUpdate.module())
                .image()
                .map(|i| i.target),
        )?;
        Ok(Kernels {
            raw,
            max_batch,
            dqn_update_blocks,
            sac_update_blocks,
        })
    }

    /// The largest batch [`Kernels::dqn_update`] takes on this device: [`MAX_BATCH`]
    /// where the device grants a block 113 KiB of shared memory (A100, H100), less on GPUs
    /// with less (99 KiB on the RTX 30 and 40 series: 100, rejax's batch, still fits).
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// A kernel of this crate, for launches without a wrapper (checked against its
    /// parameter list when launched).
    pub fn kernel(&self, id: KernelId) -> &stepgraph::Kernel {
        self.raw.kernel(id)
    }

    /// rejax's training act for every environment of every agent: `actions[a, e]` for
    /// `obs[a, e, :]` (`[A, E, OBS]`, E = `cfg.num_envs`, A = `params.len() / PARAMS`), at
    /// the step `counters[Counter::Step]` read when the kernel runs: uniform while that
    /// step is at most `cfg.fill_buffer`, else epsilon-greedy on the online network with
    /// epsilon from the linear schedule. The draws are keyed by (seed, agent, step, env).
    pub fn dqn_act(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &DqnConfig,
        params: &DeviceBuffer<f32>,
        obs: &DeviceBuffer<f32>,
        counters: &DeviceBuffer<u32>,
        actions: &mut DeviceBuffer<i32>,
    ) -> Result<()> {
        let agents = agents_of("dqn_act", "params", params, DuelingLayout::PARAMS)?;
        self.raw.dqn_act_checked(
            stream,
            params,
            obs,
            counters,
            actions,
            agents,
            cfg.num_envs,
            cfg.seed,
            cfg.fill_buffer,
            cfg.eps_start,
            cfg.eps_end,
            cfg.exploration_steps as usize,
        )
    }

    /// Evaluation's act (rejax's `make_act`): epsilon-greedy with `cfg.eval_epsilon` for
    /// `envs` evaluation environments per agent (`obs` `[A, envs, OBS]`), drawing at
    /// `clock[0]`, which [`Kernels::eval_tick`] moves on after each evaluation step.
    #[allow(clippy::too_many_arguments)]
    pub fn dqn_act_eval(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &DqnConfig,
        params: &DeviceBuffer<f32>,
        obs: &DeviceBuffer<f32>,
        clock: &DeviceBuffer<u32>,
        actions: &mut DeviceBuffer<i32>,
        envs: usize,
    ) -> Result<()> {
        let agents = agents_of("dqn_act_eval", "params", params, DuelingLayout::PARAMS)?;
        self.raw.dqn_act_eval_checked(
            stream,
            params,
            obs,
            clock,
            actions,
            agents,
            envs,
            cfg.seed,
            cfg.eval_epsilon,
        )
    }

    /// `clock[0] += 1`: the evaluation act's next draws.
    pub fn eval_tick(
        &self,
        stream: &CaptureStream<'_>,
        clock: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        self.raw.eval_tick_checked(stream, clock)
    }

    /// Stores a step of the environments: for each agent `a` and environment `e` (agent
    /// `a`'s environments are rows `a E .. (a + 1) E`, E = `cfg.num_envs`), the transition
    /// (`obs`, `actions`, `out.reward`, `out.final_obs`, done) at slot `(pos + e) % C` of
    /// ring `a`, pos = `counters[Counter::Pos]`. Done is `out.terminated`, or
    /// `terminated || truncated` where `cfg.truncation_is_terminal` (rejax).
    ///
    /// `obs` (`[A, E, OBS]`) are the observations the actions were chosen for: the
    /// environments' step has overwritten `out.obs` with the next ones by now, so the
    /// caller keeps a copy of them from before the step. Run [`Kernels::dqn_count`]
    /// after it.
    #[allow(clippy::too_many_arguments)]
    pub fn replay_insert(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &DqnConfig,
        obs: &DeviceBuffer<f32>,
        actions: &DeviceBuffer<i32>,
        out: &Transitions,
        counters: &DeviceBuffer<u32>,
        replay: &mut Replay,
    ) -> Result<()> {
        let (agents, capacity) = (replay.agents, replay.capacity);
        self.raw.replay_insert_checked(
            stream,
            obs,
            &out.final_obs,
            actions,
            &out.reward,
            &out.terminated,
            &out.truncated,
            counters,
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

    /// Moves the counters on after a step of `cfg.num_envs` environments per agent and its
    /// insert: `step_before = step`, `step += E`, `pos = (pos + E) % C`,
    /// `size = min(size + E, C)`, C = `cfg.buffer_size`.
    pub fn dqn_count(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &DqnConfig,
        counters: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        self.raw
            .dqn_count_checked(stream, counters, cfg.num_envs, cfg.buffer_size)
    }

    /// `cfg.epochs` DQN updates of every agent, fused in one launch (a cluster of
    /// [`DQN_CLUSTER`] blocks per agent on compute capability 9.0, else one block),
    /// if the iteration trains: `counters[Counter::StepBefore] > cfg.fill_buffer` (so run
    /// it after [`Kernels::dqn_count`]) and each ring holds a batch. Each update draws
    /// `cfg.batch_size` distinct slots of the agent's ring, forms the double-DQN targets
    /// with `target`, and takes a clipped Adam step of `params`; `loss[a]` gets agent
    /// `a`'s last loss. `cuda/update.cu` states every formula.
    ///
    /// Fails before launching if the batch exceeds [`Kernels::max_batch`] or the ring's
    /// capacity, or a buffer has another length than the agents say.
    #[allow(clippy::too_many_arguments)]
    pub fn dqn_update(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &DqnConfig,
        params: &mut DeviceBuffer<f32>,
        target: &DeviceBuffer<f32>,
        adam: &mut AdamState,
        counters: &DeviceBuffer<u32>,
        replay: &Replay,
        loss: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let batch = cfg.batch_size;
        // The block's shared memory was opted in for at most max_batch rows: a launch
        // asking for more would fail in the driver, inside a capture.
        if batch > self.max_batch {
            return Err(Error::Argument {
                what: "dqn_update: cfg.batch_size".into(),
                expected: format!("at most {} on this device", self.max_batch),
                found: batch.to_string(),
            });
        }
        let agents = replay.agents;
        let config = LaunchConfig {
            grid_dim: (
                u32::try_from(agents)
                    .ok()
                    .and_then(|a| a.checked_mul(self.dqn_update_blocks))
                    .unwrap_or(u32::MAX),
                1,
                1,
            ),
            block_dim: (UPDATE_THREADS, 1, 1),
            shared_mem_bytes: update_smem_bytes(batch) as u32,
        };
        self.raw.dqn_update_checked(
            stream,
            config,
            params,
            target,
            &mut adam.m,
            &mut adam.v,
            &mut adam.t,
            counters,
            &replay.obs,
            &replay.action,
            &replay.reward,
            &replay.next_obs,
            &replay.done,
            loss,
            agents,
            replay.capacity,
            batch,
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
        )
    }

    /// `target = polyak target + (1 - polyak) online`, elementwise over all agents'
    /// parameters (rejax updates the target every iteration, training or not).
    pub fn polyak(
        &self,
        stream: &CaptureStream<'_>,
        cfg: &DqnConfig,
        online: &DeviceBuffer<f32>,
        target: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let (keep, mix) = cfg.polyak_coefficients();
        self.raw
            .polyak_checked(stream, online, target, online.len(), keep, mix)
    }
}

impl Kernels {
    /// Records each evaluation environment's first episode return since
    /// [`Kernels::first_returns_clear`]: `first[i] = last_return[i]` at the step that ends
    /// environment `i`'s first episode (`episodes[i]` reaches 1), once. Run it after every
    /// step of the environments; a step ends at most one episode of each.
    pub fn first_returns(
        &self,
        stream: &CaptureStream<'_>,
        stats: &EpisodeStats,
        first: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        self.raw.first_returns_checked(
            stream,
            &stats.episodes,
            &stats.last_return,
            first,
            first.len(),
        )
    }

    /// `first[i] = NaN` for every environment: no episode recorded yet.
    pub fn first_returns_clear(
        &self,
        stream: &CaptureStream<'_>,
        first: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        self.raw
            .first_returns_clear_checked(stream, first, first.len())
    }
}

/// The number of agents whose networks `params` (named `name` in errors) holds, `[A, per]`
/// with `per` floats an agent: the kernels take `A` from the networks and check every
/// other buffer against it.
pub(crate) fn agents_of(
    what: &str,
    name: &str,
    params: &DeviceBuffer<f32>,
    per: usize,
) -> Result<usize> {
    let agents = params.len() / per;
    if agents == 0 || !params.len().is_multiple_of(per) {
        return Err(Error::Argument {
            what: format!("{what}: {name}"),
            expected: format!("a positive multiple of {per} floats"),
            found: params.len().to_string(),
        });
    }
    Ok(agents)
}

/// The replay rings of `A` agents, `C` slots each, laid out `[A, C, ...]` row-major, with
/// actions of type `T`: slot `s` of agent `a` is row `a C + s`. DQN's are [`Replay`]
/// (CartPole's discrete actions), SAC's [`SacReplay`](crate::sac::SacReplay) (Pendulum's
/// torques).
#[derive(Debug, StepBuffer)]
pub struct ReplayRings<T> {
    /// `[A, C, obs]`: the observation acted on, as the environment gave it.
    pub obs: DeviceBuffer<f32>,
    /// `[A, C]`: the action taken.
    pub action: DeviceBuffer<T>,
    /// `[A, C]`: the reward.
    pub reward: DeviceBuffer<f32>,
    /// `[A, C, obs]`: the observation reached (the environment's final observation).
    pub next_obs: DeviceBuffer<f32>,
    /// `[A, C]`: 1 where the value of what follows is 0, else 0.
    pub done: DeviceBuffer<u8>,
    pub(crate) agents: usize,
    pub(crate) capacity: usize,
}

/// DQN's replay rings: CartPole's observations ([`OBS`] floats) and actions.
pub type Replay = ReplayRings<i32>;

impl<T: DeviceRepr + Clone + Default> ReplayRings<T> {
    /// Writes `host` (rings of the same agents and capacity) into these rings.
    pub fn upload(&mut self, device: &Device, host: &crate::reference::HostRings<T>) -> Result<()> {
        if (host.agents, host.capacity) != (self.agents, self.capacity) {
            return Err(Error::Argument {
                what: "ReplayRings::upload: the host rings".into(),
                expected: format!("{} agents of {} slots", self.agents, self.capacity),
                found: format!("{} agents of {} slots", host.agents, host.capacity),
            });
        }
        device.upload(&mut self.obs, &host.obs)?;
        device.upload(&mut self.action, &host.action)?;
        device.upload(&mut self.reward, &host.reward)?;
        device.upload(&mut self.next_obs, &host.next_obs)?;
        device.upload(&mut self.done, &host.done)
    }

    /// The rings, read back to the host.
    pub fn download(&self, device: &Device) -> Result<crate::reference::HostRings<T>> {
        Ok(crate::reference::HostRings {
            agents: self.agents,
            capacity: self.capacity,
            obs: device.download(&self.obs)?,
            action: device.download(&self.action)?,
            reward: device.download(&self.reward)?,
            next_obs: device.download(&self.next_obs)?,
            done: device.download(&self.done)?,
        })
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> ReplayRings<T> {
    /// Zeroed rings for `agents` agents of `capacity` slots each (both at least 1) of
    /// observations of `obs` floats; `what` names the caller in errors.
    pub(crate) fn zeroed(
        device: &Device,
        what: &str,
        agents: usize,
        capacity: usize,
        obs: usize,
    ) -> Result<ReplayRings<T>> {
        let rows = positive_product(what, agents, capacity)?;
        let obs_len = positive_product(&format!("{what}: observations"), rows, obs)?;
        Ok(ReplayRings {
            obs: device.alloc_zeros("replay observations", obs_len)?,
            action: device.alloc_zeros("replay actions", rows)?,
            reward: device.alloc_zeros("replay rewards", rows)?,
            next_obs: device.alloc_zeros("replay next observations", obs_len)?,
            done: device.alloc_zeros("replay done flags", rows)?,
            agents,
            capacity,
        })
    }
}

impl<T> ReplayRings<T> {
    /// Agents.
    pub fn agents(&self) -> usize {
        self.agents
    }

    /// Slots per ring.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Replay {
    /// Zeroed rings for `agents` agents of `capacity` slots each (both at least 1).
    pub fn new(device: &Device, agents: usize, capacity: usize) -> Result<Replay> {
        Replay::zeroed(device, "Replay::new", agents, capacity, OBS)
    }
}

/// Adam's state for every agent: the moments `[A, PARAMS]` and each agent's step count
/// `[A]` (also the counter of its batches' draws).
#[derive(Debug, StepBuffer)]
pub struct AdamState {
    /// The first moment.
    pub m: DeviceBuffer<f32>,
    /// The second moment.
    pub v: DeviceBuffer<f32>,
    /// Updates taken by each agent.
    pub t: DeviceBuffer<u32>,
}

impl AdamState {
    /// Zeroed state for `agents` agents.
    pub fn new(device: &Device, agents: usize) -> Result<AdamState> {
        let len = positive_product("AdamState::new", agents, DuelingLayout::PARAMS)?;
        Ok(AdamState {
            m: device.alloc_zeros("Adam first moments", len)?,
            v: device.alloc_zeros("Adam second moments", len)?,
            t: device.alloc_zeros("Adam step counts", agents)?,
        })
    }
}

/// A zeroed counters buffer ([`crate::Counter`]).
pub fn counters(device: &Device) -> Result<DeviceBuffer<u32>> {
    device.alloc_zeros("DQN counters", COUNTERS)
}

pub(crate) fn positive_product(what: &str, a: usize, b: usize) -> Result<usize> {
    match a.checked_mul(b) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(Error::Argument {
            what: what.into(),
            expected: "positive sizes whose product fits usize".into(),
            found: format!("{a} * {b}"),
        }),
    }
}

/// Whether code for `target` (`sm_90`, `compute_80`, `sm_100a`) was built with clusters:
/// `cuda/cluster.cuh` uses them from compute capability 9.0, for both updates.
pub(crate) fn has_clusters(target: &str) -> bool {
    let digits: String = target
        .trim_start_matches("sm_")
        .trim_start_matches("compute_")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse::<u32>().is_ok_and(|cc| cc >= 90)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_come_with_compute_capability_9() {
        for (target, clusters) in [
            ("sm_90", true),
            ("sm_90a", true),
            ("sm_100a", true),
            ("compute_90", true),
            ("sm_89", false),
            ("sm_80", false),
            ("compute_80", false),
            ("sm_", false),
        ] {
            assert_eq!(has_clusters(target), clusters, "{target}");
        }
    }

    #[test]
    fn the_update_sizes_agree_with_the_kernel_source() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda/update.cu");
        let defines = stepgraph_testkit::cuda_defines(path).expect("update.cu reads");
        let get = |name: &str| -> usize { defines[name].parse().expect(name) };
        assert_eq!(get("MAX_BATCH"), MAX_BATCH);
        assert_eq!(get("UPDATE_THREADS"), UPDATE_THREADS as usize);
        assert_eq!(2 * get("PARAMS_PAD"), UPDATE_FIXED_FLOATS);
        assert_eq!(get("UPDATE_ROW_FLOATS"), UPDATE_ROW_FLOATS);
        assert_eq!(get("DQN_CLUSTER"), DQN_CLUSTER as usize);
        // rejax's batch fits the 99 KiB of the consumer GPUs.
        assert!(update_smem_bytes(100) <= 99 * 1024);
    }
}
