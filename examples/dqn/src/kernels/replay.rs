//! The kernels of `cuda/replay.cu`: the replay buffer's fill, the draw of a batch and its
//! gathers.

use super::*;

/// The rows of transitions the gathers read or write: `s`, `s2` `[rows, S]`, `act`
/// `[rows, D]`, `r`, `done` `[rows]` (the replay buffer's rows, or a batch's).
#[derive(Clone, Copy, Debug)]
pub struct TransitionRows<'a> {
    pub s: &'a DeviceBuffer<f32>,
    pub s2: &'a DeviceBuffer<f32>,
    pub act: &'a DeviceBuffer<i32>,
    pub r: &'a DeviceBuffer<f32>,
    pub done: &'a DeviceBuffer<f32>,
}

/// The same, written.
#[derive(Debug)]
pub struct TransitionRowsMut<'a> {
    pub s: &'a mut DeviceBuffer<f32>,
    pub s2: &'a mut DeviceBuffer<f32>,
    pub act: &'a mut DeviceBuffer<i32>,
    pub r: &'a mut DeviceBuffer<f32>,
    pub done: &'a mut DeviceBuffer<f32>,
}

/// Which tensor of the replay buffer a fill writes: each has a key of its own, so the
/// tensors are independent draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayTensor {
    /// `s [N, S]`.
    S = 0,
    /// `s2 [N, S]`.
    S2 = 1,
    /// `act [N, D]`.
    Act = 2,
    /// `r [N]`.
    R = 3,
    /// `done [N]`.
    Done = 4,
    /// `win [N, W, S]`.
    Win = 5,
}

impl ReplayTensor {
    /// The tensor's number in the generator's key (`tensor` in `cuda/replay.cu`).
    pub const fn id(self) -> u64 {
        self as u64
    }
}

impl Kernels {
    /// The draw of one replay from the generator at `counter[0]`: `idx[b]` uniform in
    /// `[0, capacity)` for every `b < idx.len()`, and `tau` (IQN's fractions) uniform in
    /// `[0.02, 0.98]`. Reads the counter and does not move it: [`Kernels::replay_advance`]
    /// does, after. [`replay_draw_reference`](crate::reference::replay_draw_reference)
    /// computes the same bits on the CPU.
    ///
    /// One thread per index and per fraction, blocks of [`BLOCK_THREADS`].
    pub fn replay_draw(
        &self,
        stream: &CaptureStream<'_>,
        counter: &DeviceBuffer<u64>,
        idx: &mut DeviceBuffer<u32>,
        tau: &mut DeviceBuffer<f32>,
        seed: u64,
        capacity: usize,
    ) -> Result<()> {
        let (batch, taus) = (idx.len(), tau.len());
        self.raw
            .replay_draw_checked(stream, counter, idx, tau, seed, capacity, batch, taus)
    }

    /// `counter[0] += 1`: the next replay draws from the next key.
    pub fn replay_advance(
        &self,
        stream: &CaptureStream<'_>,
        counter: &mut DeviceBuffer<u64>,
    ) -> Result<()> {
        self.raw.replay_advance_checked(stream, counter)
    }

    /// `dst[b] = src[idx[b]]` for the per-row tensors of transitions (`s`, `s2`, `act`,
    /// `r`, `done`), `state` floats per state and `branches` actions per row. `src` holds
    /// the replay buffer's rows, `dst` one row per index. An index out of range (only a
    /// caller's own can be: the draw's are below the capacity) gathers NaN and action 0,
    /// which the step's finite check stops at.
    ///
    /// One thread per element of a row's `2 S + D + 2` values, blocks of [`BLOCK_THREADS`].
    pub fn replay_gather(
        &self,
        stream: &CaptureStream<'_>,
        idx: &DeviceBuffer<u32>,
        src: TransitionRows<'_>,
        dst: TransitionRowsMut<'_>,
        state: usize,
        branches: usize,
    ) -> Result<()> {
        let capacity = src.r.len();
        self.raw.replay_gather_checked(
            stream,
            idx,
            src.s,
            src.s2,
            src.act,
            src.r,
            src.done,
            dst.s,
            dst.s2,
            dst.act,
            dst.r,
            dst.done,
            capacity,
            idx.len(),
            state,
            branches,
        )
    }

    /// `dst[b, :] = src[idx[b], :]` for rows of `width` floats (the window of past
    /// states, `W S`). An index out of range gathers NaN. Rows of a multiple of 4 floats
    /// are copied as `float4`s, one thread each; other widths one thread per float.
    pub fn replay_gather_rows(
        &self,
        stream: &CaptureStream<'_>,
        idx: &DeviceBuffer<u32>,
        src: &DeviceBuffer<f32>,
        dst: &mut DeviceBuffer<f32>,
        width: usize,
    ) -> Result<()> {
        let capacity = src.len() / width.max(1);
        let batch = idx.len();
        if width.is_multiple_of(4) {
            self.raw
                .replay_gather_rows4_checked(stream, idx, src, dst, capacity, batch, width)
        } else {
            self.raw
                .replay_gather_rows_checked(stream, idx, src, dst, capacity, batch, width)
        }
    }

    /// Fills `x` with standard normals (Box-Muller), drawn from the key of `(seed,
    /// tensor)`.
    pub fn replay_fill_normal(
        &self,
        stream: &CaptureStream<'_>,
        x: &mut DeviceBuffer<f32>,
        seed: u64,
        tensor: ReplayTensor,
    ) -> Result<()> {
        let n = x.len();
        self.raw
            .replay_fill_normal_checked(stream, x, n, seed, tensor.id())
    }

    /// Fills `x` with actions uniform in `[0, actions)`.
    pub fn replay_fill_actions(
        &self,
        stream: &CaptureStream<'_>,
        x: &mut DeviceBuffer<i32>,
        actions: usize,
        seed: u64,
        tensor: ReplayTensor,
    ) -> Result<()> {
        let n = x.len();
        self.raw
            .replay_fill_actions_checked(stream, x, n, actions, seed, tensor.id())
    }

    /// Fills `x` with 1 at probability `p` and 0 otherwise.
    pub fn replay_fill_bernoulli(
        &self,
        stream: &CaptureStream<'_>,
        x: &mut DeviceBuffer<f32>,
        p: f32,
        seed: u64,
        tensor: ReplayTensor,
    ) -> Result<()> {
        let n = x.len();
        self.raw
            .replay_fill_bernoulli_checked(stream, x, n, p, seed, tensor.id())
    }
}
