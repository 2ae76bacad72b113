//! An optimizer step over a whole model: the global gradient norm, Adam with global-norm
//! clipping over a table of parameters in one launch, and deterministic column sums
//! (`cuda/optim.cu`).

use stepgraph::{CaptureStream, Device, DeviceBuffer, DeviceMem, Error, LaunchConfig, Result};

use crate::Kernels;
use crate::launch::{
    BLOCK_THREADS, check_len, check_scratch, len_u32, positive, product, row_chunk_plan, same_len,
    tile_config,
};

/// Elements of the concatenated parameters that one block of the optimizer kernels takes
/// (`OPTIM_CHUNK` in `cuda/optim.cu`): two per thread. The update ends the step with
/// nothing beside it, so its latency counts whole: at 2048 (eight per thread) the DQN
/// step's 188k parameters made 92 blocks, fewer than the SMs, each thread a chain of eight
/// dependent loads.
pub const OPTIM_CHUNK: usize = 512;

/// Words (`u64`) per entry of the device parameter table (`PARAM_TABLE_WORDS`).
pub const PARAM_TABLE_WORDS: usize = 6;

/// Index of the learning rate in the device scalars [`Kernels::adam_clip_update`] reads.
pub const ADAM_LR: usize = 0;
/// Index of `1 − β1ᵗ` in those scalars.
pub const ADAM_BIAS1: usize = 1;
/// Index of `1 − β2ᵗ` in those scalars.
pub const ADAM_BIAS2: usize = 2;
/// Device scalars [`Kernels::adam_clip_update`] reads (indices `0..ADAM_SCALARS`).
pub const ADAM_SCALARS: usize = 3;

/// One parameter tensor of the optimizer's table: the device addresses of the parameter,
/// its gradient and its two Adam moments, all `len` floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamEntry {
    /// Address of the parameter (`float*`).
    pub param: u64,
    /// Address of its gradient (`const float*`).
    pub grad: u64,
    /// Address of Adam's first moment (`float*`).
    pub m: u64,
    /// Address of Adam's second moment (`float*`).
    pub v: u64,
    /// Elements of each.
    pub len: usize,
}

impl ParamEntry {
    /// The entry for four buffers of the same length.
    pub fn of(
        param: &DeviceBuffer<f32>,
        grad: &DeviceBuffer<f32>,
        m: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
    ) -> Result<ParamEntry> {
        same_len(
            "ParamEntry: grad (the length of param)",
            param.len(),
            grad.len(),
        )?;
        same_len("ParamEntry: m (the length of param)", param.len(), m.len())?;
        same_len("ParamEntry: v (the length of param)", param.len(), v.len())?;
        Ok(ParamEntry {
            param: param.device_address(),
            grad: grad.device_address(),
            m: m.device_address(),
            v: v.device_address(),
            len: param.len(),
        })
    }
}

/// The optimizer's parameter table: built once on the host, uploaded once, read by
/// [`Kernels::grad_sq_norm`] and [`Kernels::adam_clip_update`], which then cover every
/// parameter in one launch each.
///
/// Device layout ([`ParamTable::words`]): `T` entries of [`PARAM_TABLE_WORDS`] `u64`s,
/// entry `k` at words `6k .. 6k + 6`: `[param, grad, m, v, len, start]`, the four
/// addresses of [`ParamEntry`], its length, and `start`, the sum of the lengths of entries
/// `0..k` (the entry's offset in the concatenation of all parameters).
///
/// The kernels reach the buffers through these addresses, so the wrappers take the
/// buffers themselves too and check, entry by entry, that they are the table's: a launch
/// only touches buffers that its caller holds borrows of.
#[derive(Debug)]
pub struct ParamTable {
    table: DeviceBuffer<u64>,
    entries: Vec<ParamEntry>,
    total: usize,
}

// SAFETY: device memory (the table's words) and the host's copy of the entries, plain
// data that only `new` writes; an op reaches the table through the borrow it is given.
unsafe impl stepgraph::StepBuffer for ParamTable {}

impl ParamTable {
    /// The table's words, as uploaded (see the layout above). Fails when the lengths
    /// add up past `u64::MAX`: the entries are plain values, and a wrapped `start` would
    /// send the kernels to the wrong element.
    pub fn words(entries: &[ParamEntry]) -> Result<Vec<u64>> {
        let mut start = 0u64;
        let mut words = Vec::with_capacity(entries.len() * PARAM_TABLE_WORDS);
        for (k, e) in entries.iter().enumerate() {
            let len = e.len as u64;
            words.extend_from_slice(&[e.param, e.grad, e.m, e.v, len, start]);
            start = start.checked_add(len).ok_or_else(|| {
                Error::Invalid(format!(
                    "ParamTable: expected entry lengths that add up to at most {}, found a \
                     sum past it at entry {k} (length {len})",
                    u64::MAX
                ))
            })?;
        }
        Ok(words)
    }

    /// Builds and uploads the table (blocking: call it when building the step, not in an
    /// op). Fails if there are no elements at all.
    pub fn new(device: &Device, entries: Vec<ParamEntry>) -> Result<ParamTable> {
        let total = entries
            .iter()
            .try_fold(0usize, |acc, e| acc.checked_add(e.len))
            .ok_or_else(|| Error::Invalid("ParamTable: the total length overflows".into()))?;
        if total == 0 {
            return Err(Error::Invalid("ParamTable: there are no parameters".into()));
        }
        len_u32("ParamTable: entries", entries.len())?;
        len_u32("ParamTable: blocks", total.div_ceil(OPTIM_CHUNK))?;
        let table = device.upload_new("parameter table", &ParamTable::words(&entries)?)?;
        Ok(ParamTable {
            table,
            entries,
            total,
        })
    }

    /// The entries, in table order.
    pub fn entries(&self) -> &[ParamEntry] {
        &self.entries
    }

    /// The table as the kernels read it ([`PARAM_TABLE_WORDS`] `u64` words per entry:
    /// param, grad, m and v addresses, length, start), for a crate's own kernels over
    /// every parameter (a health check, an EMA of the weights).
    pub fn on_device(&self) -> &DeviceBuffer<u64> {
        &self.table
    }

    /// Elements of all parameters together.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Blocks of the optimizer kernels, and the length of [`Kernels::grad_sq_norm`]'s
    /// scratch buffer: one partial sum per block.
    pub fn blocks(&self) -> usize {
        self.total.div_ceil(OPTIM_CHUNK)
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.blocks() as u32, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    fn check_count(&self, what: &str, found: usize) -> Result<()> {
        same_len(what, self.entries.len(), found)
    }

    fn check(
        &self,
        what: &str,
        k: usize,
        field: &str,
        expected: u64,
        buf: &DeviceBuffer<f32>,
    ) -> Result<()> {
        if buf.device_address() != expected || buf.len() != self.entries[k].len {
            return Err(Error::Invalid(format!(
                "{what}: the {field} buffer given for table entry {k} is not the one in the \
                 table (address or length differs)"
            )));
        }
        Ok(())
    }
}

/// The buffers of one table entry, borrowed for [`Kernels::adam_clip_update`].
#[derive(Debug)]
pub struct AdamSlot<'a> {
    /// The parameter, updated in place.
    pub param: &'a mut DeviceBuffer<f32>,
    /// Its gradient.
    pub grad: &'a DeviceBuffer<f32>,
    /// Adam's first moment, updated in place.
    pub m: &'a mut DeviceBuffer<f32>,
    /// Adam's second moment, updated in place.
    pub v: &'a mut DeviceBuffer<f32>,
}

/// Adam's and the clipping's constants (the step-dependent ones are device scalars).
///
/// Held in f64 and rounded to f32 at launch; `1 − β1` and `1 − β2` are computed in f64
/// first (in f32, `1 − 0.999` is 1.3e-5 off 0.001), as PyTorch does with its Python floats.
#[derive(Clone, Copy, Debug, PartialEq, stepgraph::ConfigValue)]
pub struct AdamHyper {
    /// Global-norm clipping threshold.
    pub max_norm: f64,
    /// `β1`.
    pub beta1: f64,
    /// `β2`.
    pub beta2: f64,
    /// `ε`.
    pub eps: f64,
}

impl AdamHyper {
    /// `[max_norm, β1, β2, 1 − β1, 1 − β2, ε]` as the kernel takes them.
    pub fn kernel_args(&self) -> [f32; 6] {
        [
            self.max_norm as f32,
            self.beta1 as f32,
            self.beta2 as f32,
            (1.0 - self.beta1) as f32,
            (1.0 - self.beta2) as f32,
            self.eps as f32,
        ]
    }
}

impl Default for AdamHyper {
    /// MODEL.md's: max_norm 10, β1 0.9, β2 0.999, ε 1e-8.
    fn default() -> Self {
        AdamHyper {
            max_norm: 10.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// The step-dependent values [`Kernels::adam_clip_update`] reads from device scalars,
/// in index order ([`ADAM_LR`], [`ADAM_BIAS1`], [`ADAM_BIAS2`]).
///
/// ```
/// use stepgraph_kernels::{AdamHyper, AdamScalars};
///
/// let s = AdamScalars::at_step(3e-4, &AdamHyper::default(), 1);
/// assert_eq!((s.bias1, s.bias2), (0.1, 0.001));
/// assert_eq!(s.values(), [s.lr, s.bias1, s.bias2]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamScalars {
    /// The learning rate.
    pub lr: f32,
    /// `1 − β1ᵗ`.
    pub bias1: f32,
    /// `1 − β2ᵗ`.
    pub bias2: f32,
}

impl AdamScalars {
    /// The values for step `t` (counting from 1), the bias corrections computed in f64
    /// (`βᵗ` by repeated squaring, which [`Kernels::adam_tick`] repeats on the device bit
    /// for bit) and rounded once. A `t` past `i32::MAX` counts as `i32::MAX`: `βᵗ` is 0
    /// long before, for any `β < 1`.
    pub fn at_step(lr: f32, hyper: &AdamHyper, t: u32) -> AdamScalars {
        let t = t.min(i32::MAX as u32);
        AdamScalars {
            lr,
            bias1: (1.0 - pow_by_squaring(hyper.beta1, t)) as f32,
            bias2: (1.0 - pow_by_squaring(hyper.beta2, t)) as f32,
        }
    }

    /// The values at their device-scalar indices, for `DeviceScalars::new` or `set`.
    pub fn values(self) -> [f32; ADAM_SCALARS] {
        let mut v = [0.0; ADAM_SCALARS];
        v[ADAM_LR] = self.lr;
        v[ADAM_BIAS1] = self.bias1;
        v[ADAM_BIAS2] = self.bias2;
        v
    }
}

/// `base^exp` by repeated squaring in f64: the multiplications in a fixed order, so that
/// `adam_pow` in `cuda/optim.cu` gets the same bits (the order of `f64::powi` is the
/// platform's business). It is the order of compiler-rt's `__powidf2`, which `powi` calls
/// on x86-64, so the values are those `powi` gave there.
pub(crate) fn pow_by_squaring(mut base: f64, mut exp: u32) -> f64 {
    let mut r = 1.0;
    loop {
        if exp & 1 == 1 {
            r *= base;
        }
        exp >>= 1;
        if exp == 0 {
            return r;
        }
        base *= base;
    }
}

/// Adam's step count `t` on the device, with the scalars [`Kernels::adam_clip_update`]
/// reads: [`Kernels::adam_tick`] advances `t` and writes `[lr, 1 − β1ᵗ, 1 − β2ᵗ]` (at
/// [`ADAM_LR`], [`ADAM_BIAS1`], [`ADAM_BIAS2`]) inside the graph, so each replay takes
/// the next step's bias corrections with nothing staged from the host.
///
/// A step buffer: hold it in a step's `#[buffers]` (or a `#[derive(StepBuffer)]` struct
/// of them); the op that ticks takes it by `&mut`, the update by `&`, and the plan orders
/// them.
///
/// ```ignore
/// // In the optimizer op, with `clock: &mut AdamClock`:
/// k.adam_tick(stream, clock, 3e-4, hyper)?;
/// k.grad_sq_norm(stream, &table, &grads, scratch, sq_norm)?;
/// k.adam_clip_update(stream, &table, &mut slots, sq_norm, clock.scalars(), hyper)?;
/// // On the host, after replays: the steps taken so far.
/// let t = step.download(|b| b.clock.t())?[0];
/// ```
#[derive(Debug)]
pub struct AdamClock {
    t: DeviceBuffer<u64>,
    scalars: DeviceBuffer<f32>,
}

// SAFETY: device memory only (the step count and the scalars), reached through the
// borrow an op is given.
unsafe impl stepgraph::StepBuffer for AdamClock {}

impl AdamClock {
    /// A clock that has taken `t` steps (0 for a fresh model, the saved count to resume):
    /// its next tick makes step `t + 1`. Blocking: call it when building the step.
    ///
    /// The scalars hold NaN until the first tick, so an update issued before its tick
    /// turns the parameters to NaN, plainly, instead of training with stale corrections.
    pub fn new(device: &Device, t: u64) -> Result<AdamClock> {
        Ok(AdamClock {
            t: device.upload_new("Adam step count", &[t])?,
            scalars: device.upload_new("Adam scalars", &[f32::NAN; ADAM_SCALARS])?,
        })
    }

    /// The step count, one `u64`: the steps taken (the `t` of the last tick). Download it
    /// to save a run's position, or to check it.
    pub fn t(&self) -> &DeviceBuffer<u64> {
        &self.t
    }

    /// The scalars the last tick wrote, `[lr, 1 − β1ᵗ, 1 − β2ᵗ]`, for
    /// [`Kernels::adam_clip_update`] (or a crate's own kernels).
    pub fn scalars(&self) -> &DeviceBuffer<f32> {
        &self.scalars
    }
}

/// How [`Kernels::column_sums`] splits the rows: `(column blocks, row chunks, rows per
/// chunk)`. Depends on the sizes only, so the sums' bits do too.
pub(crate) fn column_sums_plan(rows: usize, cols: usize) -> (usize, usize, usize) {
    row_chunk_plan(rows, cols, 256)
}

/// The grid of [`Kernels::column_sums`]' first pass over `[rows, cols]`, for a kernel of
/// your own that forms a tensor and sums its columns in the same pass (a ReLU's backward
/// and the bias gradient it feeds, say), then lets [`Kernels::column_sums_finish`] add
/// the partials.
///
/// Such a kernel launches [`ColumnSumsPlan::launch`]: blocks of 32 × 32 threads, block
/// `(i, y)` for columns `32 i + threadIdx.x` of the rows `[y rows_per_chunk, (y + 1)
/// rows_per_chunk)` (the last chunk ends at `rows`). Each thread adds the values of its
/// column at rows `y rows_per_chunk + threadIdx.y + 32 k` in order of `k`, calls
/// `column_tile_sum` (`#include "stepgraph/reduce.cuh"`), and the threads with
/// `threadIdx.y == 0` write `partials[y cols + c]` for `c < cols`. That is the order of
/// [`Kernels::column_sums`], so the sums have its bits. The plan depends on the sizes
/// only.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnSumsPlan {
    /// Blocks of 32 columns: `ceil(cols / 32)`.
    pub col_blocks: usize,
    /// Chunks of rows, one partial row each.
    pub chunks: usize,
    /// Rows per chunk (the last may have fewer).
    pub rows_per_chunk: usize,
}

impl ColumnSumsPlan {
    /// The plan for an `[rows, cols]` tensor.
    pub fn new(rows: usize, cols: usize) -> ColumnSumsPlan {
        let (col_blocks, chunks, rows_per_chunk) = column_sums_plan(rows, cols);
        ColumnSumsPlan {
            col_blocks,
            chunks,
            rows_per_chunk,
        }
    }

    /// The first pass's launch: `(col_blocks, chunks)` blocks of 32 × 32 threads.
    pub fn launch(&self) -> Result<LaunchConfig> {
        Ok(tile_config(
            len_u32("column sums: column blocks", self.col_blocks)?,
            len_u32("column sums: row chunks", self.chunks)?,
        ))
    }

    /// The partials' length for `cols` columns: `chunks × cols`
    /// ([`column_sums_scratch_len`]).
    pub fn partials_len(&self, cols: usize) -> usize {
        self.chunks.saturating_mul(cols)
    }
}

/// Length of the scratch buffer [`Kernels::column_sums`] needs for an `[rows, cols]` input.
pub fn column_sums_scratch_len(rows: usize, cols: usize) -> usize {
    ColumnSumsPlan::new(rows, cols).partials_len(cols)
}

/// The checks of an Adam update's slots against its table (count, and every buffer by
/// address and length) and of its device scalars' length.
fn check_adam_slots(
    what: &str,
    table: &ParamTable,
    slots: &[AdamSlot<'_>],
    scalars: &impl DeviceMem<f32>,
) -> Result<()> {
    table.check_count(&format!("{what}: slots (one per table entry)"), slots.len())?;
    for (k, (s, e)) in slots.iter().zip(&table.entries).enumerate() {
        table.check(what, k, "param", e.param, s.param)?;
        table.check(what, k, "grad", e.grad, s.grad)?;
        table.check(what, k, "m", e.m, s.m)?;
        table.check(what, k, "v", e.v, s.v)?;
    }
    if scalars.len() < ADAM_SCALARS {
        return Err(Error::Invalid(format!(
            "{what}: the device scalars hold {} values; the kernel reads indices \
             {ADAM_LR} (lr), {ADAM_BIAS1} (1 - beta1^t) and {ADAM_BIAS2} (1 - beta2^t)",
            scalars.len()
        )));
    }
    Ok(())
}

impl Kernels {
    /// `sq_norm[0] = ‖g‖²` over every gradient of `table`, two-pass and deterministic:
    /// `grad_sq_norm_partial` (one block of 256 per [`OPTIM_CHUNK`] elements) writes one
    /// partial sum per block into `scratch` (at least [`ParamTable::blocks`] floats), then
    /// `grad_sq_norm_finish` (one block of 1024) adds them in order.
    ///
    /// `grads` must be the table's gradient buffers, in table order (checked by address
    /// and length). [`grad_sq_norm_reference`](crate::reference::grad_sq_norm_reference) is the CPU version.
    pub fn grad_sq_norm(
        &self,
        stream: &CaptureStream<'_>,
        table: &ParamTable,
        grads: &[&DeviceBuffer<f32>],
        scratch: &mut DeviceBuffer<f32>,
        sq_norm: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        table.check_count("grad_sq_norm: gradients (one per table entry)", grads.len())?;
        for (k, (g, e)) in grads.iter().zip(&table.entries).enumerate() {
            table.check("grad_sq_norm", k, "grad", e.grad, g)?;
        }
        check_len("grad_sq_norm: sq_norm ([1])", sq_norm.len(), 1)?;
        // SAFETY: the table's entries are the gradients passed in (same addresses and
        // lengths, checked above), borrowed for this call.
        let blocks = unsafe { self.grad_sq_norm_partials("grad_sq_norm", stream, table, scratch)? };
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel reads partials[0..blocks) (scratch holds at least that many) and
        // writes out[0] (sq_norm holds 1, checked above).
        unsafe {
            self.raw
                .grad_sq_norm_finish(stream, config, &*scratch, blocks, sq_norm)
        }
    }

    /// The norm's first launch, shared by [`Kernels::grad_sq_norm`] and
    /// [`Kernels::grad_norm_adam`]: `grad_sq_norm_partial` writes one partial sum of
    /// squares per block of the table into `scratch` (checked to hold
    /// [`ParamTable::blocks`] floats; `what` names the caller in the error). Returns the
    /// block count, the partials' count for the pass that adds them.
    ///
    /// # Safety
    ///
    /// The table's gradients must be buffers the caller holds borrowed for this call
    /// (checked against the table by address and length), so that they are alive when
    /// the launch reads them.
    unsafe fn grad_sq_norm_partials(
        &self,
        what: &str,
        stream: &CaptureStream<'_>,
        table: &ParamTable,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<u32> {
        let blocks = len_u32(&format!("{what}: blocks"), table.blocks())?;
        check_scratch(
            &format!("{what}: scratch (at least ParamTable::blocks)"),
            scratch.len(),
            table.blocks(),
        )?;
        let count = table.entries.len() as u32;
        let total = table.total as u64;
        // SAFETY: the gradients are alive (the caller's contract); block x reads elements
        // [x OPTIM_CHUNK, ..) < total of them and writes partials[x] with x < blocks <=
        // scratch.len() (checked above).
        unsafe {
            self.raw.grad_sq_norm_partial(
                stream,
                table.config(),
                &table.table,
                count,
                total,
                scratch,
            )?
        };
        Ok(blocks)
    }

    /// Adam with global-norm clipping, in place, over every tensor of `table` in one
    /// launch (formulas in `cuda/optim.cu` and MODEL.md). Reads `sq_norm[0]`
    /// ([`Kernels::grad_sq_norm`]) and, from device memory at run time, the learning rate
    /// and the bias corrections at [`ADAM_LR`], [`ADAM_BIAS1`], [`ADAM_BIAS2`] of
    /// `scalars`: an [`AdamClock`]'s ([`AdamClock::scalars`], advanced on the device by
    /// [`Kernels::adam_tick`]), a [`DeviceScalars`](stepgraph::DeviceScalars)' device copy,
    /// or a buffer an op stages from a `HostInput` at every replay ([`AdamScalars::values`]
    /// fills either of the last two).
    ///
    /// A non-finite `sq_norm[0]` (a NaN or infinite gradient, or a sum of squares that
    /// overflows) skips the update: parameters and moments keep their values, so one bad
    /// element is not trained into every parameter and the host can report the step.
    ///
    /// `slots` must be the table's buffers, in table order (checked by address and
    /// length). One block of 256 per [`OPTIM_CHUNK`] elements.
    /// [`adam_clip_update_reference`](crate::reference::adam_clip_update_reference) is the CPU version.
    pub fn adam_clip_update(
        &self,
        stream: &CaptureStream<'_>,
        table: &ParamTable,
        slots: &mut [AdamSlot<'_>],
        sq_norm: &DeviceBuffer<f32>,
        scalars: &impl DeviceMem<f32>,
        hyper: AdamHyper,
    ) -> Result<()> {
        check_adam_slots("adam_clip_update", table, slots, scalars)?;
        check_len("adam_clip_update: sq_norm ([1])", sq_norm.len(), 1)?;
        let count = table.entries.len() as u32;
        let total = table.total as u64;
        let [max_norm, beta1, beta2, omb1, omb2, eps] = hyper.kernel_args();
        // SAFETY: every address in the table is one of the buffers in `slots` (checked
        // above, with its length), which this call borrows (the params and moments
        // mutably), block x touches elements [x OPTIM_CHUNK, ..) < total only, and scalars
        // holds indices 0..=2 (checked above).
        unsafe {
            self.raw.adam_clip_update(
                stream,
                table.config(),
                &table.table,
                count,
                total,
                sq_norm,
                scalars,
                max_norm,
                beta1,
                beta2,
                omb1,
                omb2,
                eps,
            )
        }
    }

    /// [`Kernels::grad_sq_norm`] then [`Kernels::adam_clip_update`] in two launches
    /// instead of three: the norm's partial sums into `scratch`, then the update, whose
    /// blocks each add the partials themselves, in the order of `grad_sq_norm`'s finishing
    /// block (the same bits of the norm, so the same update), block 0 also writing the norm
    /// to `sq_norm[0]` for the host. The finishing block's launch is gone: on an
    /// optimizer step at the end of a chain of dependent kernels, about a microsecond each
    /// however little it does. Where something must read or change the norm between the
    /// two (a health check), call those two instead.
    ///
    /// The gradients are the slots' (`slots` must be the table's buffers, in table order,
    /// checked by address and length); `scratch` holds at least [`ParamTable::blocks`]
    /// floats; the scalars are [`Kernels::adam_clip_update`]'s.
    #[allow(clippy::too_many_arguments)]
    pub fn grad_norm_adam(
        &self,
        stream: &CaptureStream<'_>,
        table: &ParamTable,
        slots: &mut [AdamSlot<'_>],
        scratch: &mut DeviceBuffer<f32>,
        sq_norm: &mut DeviceBuffer<f32>,
        scalars: &impl DeviceMem<f32>,
        hyper: AdamHyper,
    ) -> Result<()> {
        check_adam_slots("grad_norm_adam", table, slots, scalars)?;
        check_len("grad_norm_adam: sq_norm ([1])", sq_norm.len(), 1)?;
        // SAFETY: the table's gradients are the slots' (addresses and lengths checked
        // above), borrowed for this call.
        let blocks =
            unsafe { self.grad_sq_norm_partials("grad_norm_adam", stream, table, scratch)? };
        let count = table.entries.len() as u32;
        let total = table.total as u64;
        let [max_norm, beta1, beta2, omb1, omb2, eps] = hyper.kernel_args();
        // SAFETY: as adam_clip_update's; each block also reads partials[0..blocks) (scratch
        // holds that many, written by the launch before on this stream) and block 0 writes
        // sq_norm[0] (one element, checked), which nothing in this launch reads.
        unsafe {
            self.raw.adam_clip_update_partials(
                stream,
                table.config(),
                &table.table,
                count,
                total,
                &*scratch,
                blocks,
                sq_norm,
                scalars,
                max_norm,
                beta1,
                beta2,
                omb1,
                omb2,
                eps,
            )
        }
    }

    /// Advances Adam's clock by one step: `t ← t + 1`, then the clock's scalars ←
    /// [`AdamScalars::at_step`]`(lr, hyper, t)`, computed on the device in f64 with the
    /// same operations, so the same bits ([`adam_tick_reference`](crate::reference::adam_tick_reference)
    /// is the CPU version). One thread; issue it before the update that reads
    /// [`AdamClock::scalars`]. `lr` is fixed in the captured launch; `hyper`'s `β1` and `β2`
    /// are the ones the update uses.
    ///
    /// Fails with [`Error::Invalid`] unless `0 ≤ β < 1` for both betas (outside that range
    /// the bias corrections are not corrections).
    pub fn adam_tick(
        &self,
        stream: &CaptureStream<'_>,
        clock: &mut AdamClock,
        lr: f32,
        hyper: AdamHyper,
    ) -> Result<()> {
        for (name, beta) in [("beta1", hyper.beta1), ("beta2", hyper.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(Error::Invalid(format!(
                    "adam_tick: expected {name} in [0, 1), found {beta}"
                )));
            }
        }
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let AdamClock { t, scalars } = clock;
        // SAFETY: one thread writes t[0] (the clock holds one u64) and scalars[0..3] (it
        // holds ADAM_SCALARS = 3 floats); both were allocated so by `AdamClock::new`.
        unsafe {
            self.raw
                .adam_tick(stream, config, t, scalars, lr, hyper.beta1, hyper.beta2)
        }
    }

    /// The second pass of [`Kernels::column_sums`] alone: `out[c]` = the sum over the
    /// chunks of `partials[y cols + c]`, in order, where a kernel of your own wrote the
    /// partials of an `[rows, cols]` tensor on the grid of [`ColumnSumsPlan::new`]`(rows,
    /// cols)` (its first pass fused with the op that formed the tensor). `partials` holds
    /// at least [`column_sums_scratch_len`] floats; `ceil(cols / 32)` blocks of 32 × 32.
    pub fn column_sums_finish(
        &self,
        stream: &CaptureStream<'_>,
        partials: &DeviceBuffer<f32>,
        rows: usize,
        cols: usize,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        positive("column_sums_finish: rows", rows)?;
        let c = positive("column_sums_finish: cols", cols)?;
        check_len("column_sums_finish: out ([cols])", out.len(), cols)?;
        let plan = ColumnSumsPlan::new(rows, cols);
        check_scratch(
            "column_sums_finish: partials (at least column_sums_scratch_len)",
            partials.len(),
            plan.partials_len(cols),
        )?;
        let col_blocks = len_u32("column_sums_finish: column blocks", plan.col_blocks)?;
        let chunks = len_u32("column_sums_finish: row chunks", plan.chunks)?;
        // SAFETY: the kernel reads chunks cols floats of partials (checked above) and writes
        // out[c] for c < cols = out.len() (checked above).
        unsafe {
            self.raw.column_sums_finish(
                stream,
                tile_config(col_blocks, 1),
                partials,
                chunks,
                c,
                out,
            )
        }
    }

    /// `out[c] = Σ_r x[r, c]` for `x[rows, cols]`, two-pass and deterministic:
    /// `column_sums_partial` (`(ceil(cols / 32), chunks)` blocks of 32 × 32, each summing
    /// a chunk of rows) writes `[chunks, cols]` partial sums into `scratch` (at least
    /// [`column_sums_scratch_len`] floats), then `column_sums_finish` (`ceil(cols / 32)`
    /// blocks of 32 × 32) adds them in order. For bias gradients that a cuBLASLt epilogue
    /// does not give. [`column_sums_reference`](crate::reference::column_sums_reference) is the CPU version.
    pub fn column_sums(
        &self,
        stream: &CaptureStream<'_>,
        x: &DeviceBuffer<f32>,
        rows: usize,
        cols: usize,
        scratch: &mut DeviceBuffer<f32>,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let r = positive("column_sums: rows", rows)?;
        let c = positive("column_sums: cols", cols)?;
        check_len(
            "column_sums: x ([rows, cols])",
            x.len(),
            product("column_sums", &[rows, cols])?,
        )?;
        check_len("column_sums: out ([cols])", out.len(), cols)?;
        let plan = ColumnSumsPlan::new(rows, cols);
        check_scratch(
            "column_sums: scratch (at least column_sums_scratch_len)",
            scratch.len(),
            plan.partials_len(cols),
        )?;
        let per_chunk = len_u32("column_sums: rows per chunk", plan.rows_per_chunk)?;
        {
            // SAFETY: block (i, y) reads columns < cols of rows [y rows_per_chunk, rows) of
            // x (rows cols floats, checked) and writes partials[y cols + c] with y <
            // chunks, c < cols: inside scratch.
            unsafe {
                self.raw.column_sums_partial(
                    stream,
                    plan.launch()?,
                    x,
                    r,
                    c,
                    per_chunk,
                    &mut *scratch,
                )?
            };
        }
        self.column_sums_finish(stream, scratch, rows, cols, out)
    }
}
