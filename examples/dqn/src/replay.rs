//! Where the step's batch comes from ([`BatchSource`]): a replay buffer on the device,
//! filled once at startup and sampled inside the graph, or a batch the host uploads
//! before each replay.
//!
//! With the replay buffer a replay needs nothing from the host: the step's first ops draw
//! the rows ([`Kernels::replay_draw`], from a generator whose counter lives in device
//! memory and is moved on by the step itself) and gather them into the step's batch.

use stepgraph::{Device, DeviceBuffer, HostInput, Result, StepBuffer};

use crate::kernels::{Kernels, ReplayTensor};
use crate::layers::{Buf, D, Sizes};

/// Transitions on the device, one row each: `s`, `s2` `[N, S]`, `act` `[N, D]` (i32 in
/// `0..A`), `r`, `done` `[N]`, `win` `[N, W, S]`. Read by the step, written only by
/// [`ReplayBuffer::fill`].
#[derive(Debug, StepBuffer)]
pub struct ReplayBuffer {
    pub s: Buf,
    pub s2: Buf,
    pub act: DeviceBuffer<i32>,
    pub r: Buf,
    pub done: Buf,
    pub win: Buf,
}

impl ReplayBuffer {
    /// A buffer of `capacity` rows of zeros for `s`'s sizes.
    pub fn zeros(device: &Device, s: &Sizes, capacity: usize) -> Result<ReplayBuffer> {
        let z = |what: &str, n: usize| device.alloc_zeros::<f32>(what, n);
        Ok(ReplayBuffer {
            s: z("replay s", capacity * s.state)?,
            s2: z("replay s2", capacity * s.state)?,
            act: device.alloc_zeros("replay act", capacity * D)?,
            r: z("replay r", capacity)?,
            done: z("replay done", capacity)?,
            win: z("replay win", capacity * s.window * s.state)?,
        })
    }

    /// A buffer of `capacity` rows filled from `seed` ([`ReplayBuffer::fill`]).
    pub fn generated(
        device: &Device,
        k: &Kernels,
        s: &Sizes,
        capacity: usize,
        seed: u64,
    ) -> Result<ReplayBuffer> {
        let mut buf = ReplayBuffer::zeros(device, s, capacity)?;
        buf.fill(device, k, s, seed)?;
        Ok(buf)
    }

    /// Its rows.
    pub fn capacity(&self) -> usize {
        self.r.len()
    }

    /// Fills every row from `seed`, on the device, with the distributions of the host's
    /// generated transitions: standard normals for the states, the window and the
    /// reward, actions uniform in `0..A`, `done = 1` with probability 0.1. Waits for it.
    pub fn fill(&mut self, device: &Device, k: &Kernels, s: &Sizes, seed: u64) -> Result<()> {
        stepgraph::exec::run_once(device, |stream| {
            k.replay_fill_normal(stream, &mut self.s, seed, ReplayTensor::S)?;
            k.replay_fill_normal(stream, &mut self.s2, seed, ReplayTensor::S2)?;
            k.replay_fill_actions(stream, &mut self.act, s.actions, seed, ReplayTensor::Act)?;
            k.replay_fill_normal(stream, &mut self.r, seed, ReplayTensor::R)?;
            k.replay_fill_bernoulli(stream, &mut self.done, 0.1, seed, ReplayTensor::Done)?;
            k.replay_fill_normal(stream, &mut self.win, seed, ReplayTensor::Win)
        })
    }
}

/// One batch as MODEL.md's inputs, fed by the host (`s`, `s2` `[B, S]`, `act` `[B, D]`,
/// `r`, `done` `[B]`, `win` `[B, W, S]`, `tau` `[B, N]`): pinned, double-buffered staging
/// that the step's load ops copy into its batch inside the graph, so the host fills the
/// next batch (`Step::stage`, `Step::fill`) while the current replay runs.
#[derive(Debug, StepBuffer)]
pub struct HostBatch {
    pub s: HostInput<f32>,
    pub s2: HostInput<f32>,
    pub act: HostInput<i32>,
    pub r: HostInput<f32>,
    pub done: HostInput<f32>,
    pub win: HostInput<f32>,
    pub tau: HostInput<f32>,
}

impl HostBatch {
    /// Staging slots for `s`'s sizes, zeroed.
    pub fn new(device: &Device, s: &Sizes) -> Result<HostBatch> {
        let f = |what: &str, n: usize| HostInput::<f32>::new(device, what, n);
        let b = s.batch;
        Ok(HostBatch {
            s: f("host s", b * s.state)?,
            s2: f("host s2", b * s.state)?,
            act: HostInput::new(device, "host act", b * D)?,
            r: f("host r", b)?,
            done: f("host done", b)?,
            win: f("host win", b * s.window * s.state)?,
            tau: f("host tau", b * s.quantiles)?,
        })
    }
}

/// Where the step's batch comes from: the step's `draw_sample`, `load_batch` and
/// `load_window` ops each take it and match on it once.
// One per step, built once and never moved in a loop: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum BatchSource {
    /// Rows drawn from the buffer inside the graph, fresh at every replay.
    Replay(ReplayBuffer),
    /// The batch the host staged before the replay, copied from pinned memory.
    Host(HostBatch),
}

// SAFETY: each variant is a step buffer (checked below) and the enum adds only its
// discriminant, plain data an op reads through the `&` it is given: no host handle and
// no interior mutability. The ops take it by `&` only, so the variant a replay runs is
// the one its capture matched on; a change of variant between replays is a change of the
// step's buffers, which the step captures anew like any other.
unsafe impl StepBuffer for BatchSource {}

/// Compiles only for a step buffer: the variants' check.
const fn is_step_buffer<T: StepBuffer>() {}

const _: () = {
    is_step_buffer::<ReplayBuffer>();
    is_step_buffer::<HostBatch>();
};

impl BatchSource {
    /// The host-fed batch, where the step has one.
    pub fn host(&self) -> Option<&HostBatch> {
        match self {
            BatchSource::Host(h) => Some(h),
            BatchSource::Replay(_) => None,
        }
    }

    /// The replay buffer, where the step samples from one.
    pub fn replay(&self) -> Option<&ReplayBuffer> {
        match self {
            BatchSource::Replay(r) => Some(r),
            BatchSource::Host(_) => None,
        }
    }
}

/// The generator's state and what it drew: `counter` (one u64, the draws so far: the key
/// of the next) and the rows `idx` `[B]` of the last draw.
#[derive(Debug, StepBuffer)]
pub struct Sampler {
    pub counter: DeviceBuffer<u64>,
    pub idx: DeviceBuffer<u32>,
}

impl Sampler {
    /// A sampler at counter 0 for batches of `batch` rows.
    pub fn new(device: &Device, batch: usize) -> Result<Sampler> {
        Ok(Sampler {
            counter: device.alloc_zeros("replay counter", 1)?,
            idx: device.alloc_zeros("replay rows drawn", batch)?,
        })
    }
}
