//! A counter-based random generator on the device, and the gather of the rows it draws
//! (`cuda/random.cu`): of one array ([`Kernels::gather_rows`]), or of several at the same
//! indices in one launch ([`GatherTable`], [`Kernels::gather_rows_table`]).
//!
//! Its only state is a 64-bit counter in device memory ([`DeviceRng`]). Every value is a
//! pure function of the seed, the counter, a [`Substream`] and the element's index:
//!
//! ```text
//! key(seed, counter)       = splitmix(splitmix(seed) ^ counter)
//! bits(key, substream, e)  = splitmix(key + ((substream << 32) | e) · 0x9E3779B97F4A7C15)
//! ```
//!
//! where `splitmix` is splitmix64's output function ([`rng_bits`]). An op draws with the
//! counter as it stands and a later op advances it ([`Kernels::rng_advance`]), both inside
//! the captured graph, so each replay draws fresh values without the host. Within one counter
//! value, every (substream, element) pair hashes a different 64-bit word, so several ops
//! may draw from one generator between two advances, each with its own substream, and
//! get unrelated values.
//!
//! The CPU references compute the same integers: uniforms and indices bit for bit,
//! normals within [`RNG_NORMAL_ULPS`] ulps.

use stepgraph::{
    CaptureStream, Device, DeviceBuffer, DeviceMem, DeviceMemMut, Error, LaunchConfig, Result,
};

use crate::Kernels;
use crate::launch::{BLOCK_THREADS, elementwise_config, len_u32, positive, product, same_len};

/// The largest distance, in ulps, between a normal of [`Kernels::rng_normal`] and
/// [`rng_normal_reference`](crate::reference::rng_normal_reference) (correctly rounded from f64). The
/// device's `logf` and `cospif` are within 1 ulp each and `sqrtf` and the product round
/// once each: a relative error under 5 · 2⁻²⁴, at most 5 ulps of the result wherever it
/// falls in its binade, and the reference's own rounding adds half of one.
pub const RNG_NORMAL_ULPS: u32 = 6;

/// Which of a generator's independent sequences a draw takes: ops that draw from one
/// [`DeviceRng`] at the same counter value take different substreams, or they draw the
/// same values. Substream 0 is the sequence of the DQN and SAC examples' own generators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Substream(pub u32);

/// A counter-based generator's state: the seed, on the host (it is fixed in the captured
/// launches), and the counter, one `u64` in device memory that [`Kernels::rng_advance`]
/// moves on inside the graph.
///
/// A step buffer: hold it in a step's `#[buffers]`, alone or as a field of a
/// `#[derive(StepBuffer)]` struct. The ops that draw take it by `&`, the op that advances
/// it by `&mut`, and the plan orders them.
///
/// ```no_run
/// #[stepgraph::step(streams(main), kernels = stepgraph_kernels::Kernels)]
/// mod noise {
///     use stepgraph::{CaptureStream, DeviceBuffer, Result};
///     use stepgraph_kernels::{DeviceRng, Kernels, Substream};
///
///     #[buffers]
///     pub struct Buffers {
///         pub rng: DeviceRng,
///         pub eps: DeviceBuffer<f32>,
///         pub idx: DeviceBuffer<u32>,
///     }
///
///     fn draw(
///         s: &CaptureStream<'_>,
///         k: &Kernels,
///         rng: &DeviceRng,
///         eps: &mut DeviceBuffer<f32>,
///         idx: &mut DeviceBuffer<u32>,
///     ) -> Result<()> {
///         k.rng_normal(s, rng, Substream(0), eps)?;
///         k.rng_indices(s, rng, Substream(1), 10_000, idx)
///     }
///
///     fn advance(s: &CaptureStream<'_>, k: &Kernels, rng: &mut DeviceRng) -> Result<()> {
///         k.rng_advance(s, rng)
///     }
/// }
///
/// use stepgraph_kernels::reference::rng_normal_reference;
/// use stepgraph_kernels::{DeviceRng, Kernels, Substream};
///
/// let device = stepgraph::Device::new(0)?;
/// let buffers = noise::Buffers {
///     rng: DeviceRng::new(&device, 42)?,
///     eps: device.alloc_zeros("eps", 256)?,
///     idx: device.alloc_zeros("idx", 64)?,
/// };
/// let mut step = noise::Step::new(&device, Kernels::load(&device)?, buffers, noise::Config {})?;
/// step.replay()?; // draws at counter 0 (capture only recorded the launches)
/// step.replay()?; // and at counter 1
/// assert_eq!(step.download(|b| b.rng.counter())?, [2]);
/// let eps = step.download(|b| &b.eps)?;
/// let want = rng_normal_reference(42, 1, Substream(0), 256);
/// # let _ = (eps, want);
/// # Ok::<(), stepgraph::Error>(())
/// ```
#[derive(Debug)]
pub struct DeviceRng {
    seed: u64,
    counter: DeviceBuffer<u64>,
}

// SAFETY: one u64 of device memory (the counter) and the seed, a plain value fixed at
// construction; an op reaches the counter only through the borrow it is given.
unsafe impl stepgraph::StepBuffer for DeviceRng {}

impl DeviceRng {
    /// A generator for `seed`, its counter at 0 (blocking: call it when building the step).
    pub fn new(device: &Device, seed: u64) -> Result<DeviceRng> {
        DeviceRng::resume(device, seed, 0)
    }

    /// A generator for `seed` whose counter stands at `counter`: a run that resumes where
    /// a saved one stopped (its seed and [`DeviceRng::counter`]) draws what it would have.
    pub fn resume(device: &Device, seed: u64, counter: u64) -> Result<DeviceRng> {
        Ok(DeviceRng {
            seed,
            counter: device.upload_new("random generator counter", &[counter])?,
        })
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The counter, one `u64` in device memory: download it to save a run's position.
    pub fn counter(&self) -> &DeviceBuffer<u64> {
        &self.counter
    }
}

/// splitmix64's output function of `z` + [`RNG_GAMMA`] (`rng_splitmix` in the exported
/// header `stepgraph/random.cuh`): the mixing step of this generator, for a crate that
/// hashes keys of its own on the device and needs the same bits on the CPU.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(RNG_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// splitmix64's increment (`RNG_GAMMA` in `stepgraph/random.cuh`).
pub const RNG_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The 64 random bits of element `e` of a draw at `counter` from `substream`: what every
/// kernel of [`DeviceRng`] starts from (see the module's formula), for a crate's own
/// kernels and references that draw the same way.
///
/// ```
/// use stepgraph_kernels::{Substream, rng_bits};
///
/// // Pure: the same inputs, the same bits; any input changed, other bits.
/// assert_eq!(rng_bits(7, 3, Substream(1), 10), rng_bits(7, 3, Substream(1), 10));
/// assert_ne!(rng_bits(7, 3, Substream(1), 10), rng_bits(7, 4, Substream(1), 10));
/// assert_ne!(rng_bits(7, 3, Substream(1), 10), rng_bits(7, 3, Substream(2), 10));
/// ```
pub fn rng_bits(seed: u64, counter: u64, substream: Substream, e: u32) -> u64 {
    let key = splitmix(splitmix(seed) ^ counter);
    let index = (u64::from(substream.0) << 32) | u64::from(e);
    splitmix(key.wrapping_add(index.wrapping_mul(RNG_GAMMA)))
}

/// The top 24 bits as a float in `[0, 1)`, exactly.
pub(crate) fn unit24(bits: u64) -> f32 {
    (bits >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// The float just below `x`, for a finite `x` (`f32::next_down`, which needs Rust 1.86).
pub(crate) fn float_below(x: f32) -> f32 {
    if x == 0.0 {
        -f32::from_bits(1)
    } else if x > 0.0 {
        f32::from_bits(x.to_bits() - 1)
    } else {
        f32::from_bits(x.to_bits() + 1)
    }
}

/// `cos(π x)` in f64 for `x` in `[0, 2)`, reduced to `[0, 1/4]` exactly first (as the
/// device's `cospif` does), so that the zeros at `x = 1/2` and `3/2` are exact.
pub(crate) fn cospi(x: f64) -> f64 {
    let y = if x > 1.0 { 2.0 - x } else { x };
    let (y, sign) = if y > 0.5 { (1.0 - y, -1.0) } else { (y, 1.0) };
    let c = if y <= 0.25 {
        (std::f64::consts::PI * y).cos()
    } else {
        (std::f64::consts::PI * (0.5 - y)).sin()
    };
    sign * c
}

impl Kernels {
    /// Fills `out` with standard normals drawn at the generator's current counter from
    /// `substream`: element `e` is Box-Muller on the bits of `e` (the module's formula),
    /// `sqrt(−2 ln u1) · cos(2π u2)` with `u1 ∈ (0, 1]` and `u2 ∈ [0, 1)` of 24 bits each,
    /// so `|z| < 5.8`. Within [`RNG_NORMAL_ULPS`] of [`rng_normal_reference`](crate::reference::rng_normal_reference).
    ///
    /// The counter is read when the kernel runs: a replay draws at the counter that the
    /// replays before it left.
    pub fn rng_normal(
        &self,
        stream: &CaptureStream<'_>,
        rng: &DeviceRng,
        substream: Substream,
        out: &mut impl DeviceMemMut<f32>,
    ) -> Result<()> {
        let n = len_u32("rng_normal: out", out.len())?;
        // SAFETY: one thread reads the counter (one u64, allocated so by DeviceRng), and
        // threads with e >= n = out.len() return.
        unsafe {
            self.raw.rng_normal(
                stream,
                elementwise_config(n),
                &rng.counter,
                rng.seed,
                substream.0,
                out,
                n,
            )
        }
    }

    /// Fills `out` with uniforms in `[lo, hi)` drawn at the generator's current counter
    /// from `substream`: `fmaf(hi − lo, u, lo)` with `u` the top 24 bits of element `e`'s
    /// over 2²⁴, and `hi` itself (which the rounding can reach) replaced by the float below
    /// it. [`rng_uniform_reference`](crate::reference::rng_uniform_reference) computes the same bits.
    ///
    /// Fails with [`Error::Invalid`] unless `lo < hi`, both finite, with `hi − lo` finite.
    pub fn rng_uniform(
        &self,
        stream: &CaptureStream<'_>,
        rng: &DeviceRng,
        substream: Substream,
        lo: f32,
        hi: f32,
        out: &mut impl DeviceMemMut<f32>,
    ) -> Result<()> {
        // An empty or inverted range has no uniform in it, and an infinite width turns
        // every draw into inf or NaN.
        if !(lo.is_finite() && hi.is_finite() && lo < hi && (hi - lo).is_finite()) {
            return Err(Error::Invalid(format!(
                "rng_uniform: expected finite bounds lo < hi with a finite hi - lo, found \
                 [{lo}, {hi})"
            )));
        }
        let n = len_u32("rng_uniform: out", out.len())?;
        // SAFETY: one counter read (one u64), and threads with e >= n = out.len() return.
        unsafe {
            self.raw.rng_uniform(
                stream,
                elementwise_config(n),
                &rng.counter,
                rng.seed,
                substream.0,
                lo,
                hi,
                out,
                n,
            )
        }
    }

    /// Fills `idx` with row indices uniform in `[0, rows)` drawn at the generator's
    /// current counter from `substream`: the high 64 bits of `bits · rows` (Lemire's
    /// multiply, no modulo bias beyond 2⁻⁶⁴ per row), always below `rows`, so
    /// [`Kernels::gather_rows`] never meets one out of range. [`rng_indices_reference`](crate::reference::rng_indices_reference)
    /// computes the same indices.
    ///
    /// Fails with [`Error::Invalid`] if `rows` is 0 or above `u32::MAX`.
    pub fn rng_indices(
        &self,
        stream: &CaptureStream<'_>,
        rng: &DeviceRng,
        substream: Substream,
        rows: usize,
        idx: &mut impl DeviceMemMut<u32>,
    ) -> Result<()> {
        let rows = positive("rng_indices: rows", rows)?;
        let n = len_u32("rng_indices: idx", idx.len())?;
        // SAFETY: one counter read (one u64), and threads with e >= n = idx.len() return.
        unsafe {
            self.raw.rng_indices(
                stream,
                elementwise_config(n),
                &rng.counter,
                rng.seed,
                substream.0,
                rows,
                idx,
                n,
            )
        }
    }

    /// Moves the generator on by one draw (`counter += 1`, one thread), inside the graph:
    /// the draws after it, and the next replay's, take new values. Issue it after every op
    /// that draws at the current counter (the plan orders it after them: it writes the
    /// generator they read).
    pub fn rng_advance(&self, stream: &CaptureStream<'_>, rng: &mut DeviceRng) -> Result<()> {
        // SAFETY: one thread adds 1 to the counter's one u64.
        unsafe {
            self.raw
                .rng_advance(stream, elementwise_config(1), &mut rng.counter)
        }
    }

    /// `dst[i, :] ← src[idx[i], :]` for rows of `row_len` floats: `src` holds
    /// `src.len() / row_len` rows, `dst` one row per index. One thread per element of
    /// `dst`. [`gather_rows_reference`](crate::reference::gather_rows_reference) computes the same values.
    ///
    /// Checked on the host: `row_len ≥ 1`, `src` a whole number of rows (at least one),
    /// and `dst` exactly `idx.len()` rows. The indices are on the device, so the host
    /// cannot check them: an index out of range gathers a row of NaN instead of reading
    /// past `src`. Indices from [`Kernels::rng_indices`] with `rows` the row count of
    /// `src` are always in range.
    pub fn gather_rows(
        &self,
        stream: &CaptureStream<'_>,
        src: &impl DeviceMem<f32>,
        idx: &impl DeviceMem<u32>,
        dst: &mut impl DeviceMemMut<f32>,
        row_len: usize,
    ) -> Result<()> {
        positive("gather_rows: row_len", row_len)?;
        // A partial last row would let an in-range index read past the end of src.
        if src.len() % row_len != 0 || src.is_empty() {
            return Err(Error::Invalid(format!(
                "gather_rows: expected src to hold a whole number (at least 1) of rows of \
                 {row_len}, found {} elements",
                src.len()
            )));
        }
        let rows = len_u32("gather_rows: src", src.len())? / row_len as u32;
        same_len(
            "gather_rows: dst (idx.len() rows of row_len)",
            product("gather_rows: dst", &[idx.len(), row_len])?,
            dst.len(),
        )?;
        let count = len_u32("gather_rows: dst", dst.len())?;
        // SAFETY: thread i < count = dst.len() = idx.len() row_len (checked above) reads
        // idx[i / row_len] (in idx) and writes dst[i]; it reads src[row row_len + c] only
        // for row < rows = src.len() / row_len and c < row_len, inside src.
        unsafe {
            self.raw.gather_rows(
                stream,
                elementwise_config(count),
                src,
                rows,
                idx,
                dst,
                row_len as u32,
                count,
            )
        }
    }
}

/// Words (`u64`) per entry of the device gather table (`GATHER_TABLE_WORDS` in
/// `cuda/random.cu`).
pub const GATHER_TABLE_WORDS: usize = 5;

/// Units of the concatenated destinations that one block of
/// [`Kernels::gather_rows_table`] takes (`GATHER_CHUNK`): two per thread. A unit is a
/// float, or four for an entry whose rows are a multiple of 4 floats (`float4` accesses).
pub const GATHER_CHUNK: usize = 512;

/// A table of `(src, dst, row_len)` entries that [`Kernels::gather_rows_table`] gathers at
/// the same row indices in one launch: the fields of a replay buffer (each `rows` rows of
/// its own width) into the fields of a batch (each `batch` rows). Built once on the host,
/// uploaded once.
///
/// Device layout: `T` entries of [`GATHER_TABLE_WORDS`] `u64`s, entry `k` at words
/// `5k .. 5k + 5`: `[src, dst, row_len, width, start]`, the two addresses, the floats per
/// row, the floats per unit the kernel moves (4 where `row_len` is a multiple of 4 and both
/// addresses are 16-byte aligned, else 1), and `start`, the units of entries `0..k`
/// (`batch · row_len / width` each).
///
/// As with [`PairTable`](crate::PairTable), the kernel reaches the buffers through these
/// addresses, so the launch wrapper takes the buffers too and checks them against the
/// table: a launch only touches buffers its caller holds borrows of.
///
/// ```no_run
/// use stepgraph::{CaptureStream, Device, DeviceBuffer, Result};
/// use stepgraph_kernels::{GatherTable, Kernels};
///
/// /// Transitions: states of 64 floats, actions of 8, rewards.
/// struct Fields {
///     s: DeviceBuffer<f32>,
///     a: DeviceBuffer<f32>,
///     r: DeviceBuffer<f32>,
/// }
///
/// // `replay` holds `rows` transitions, `batch` holds `n` of them.
/// fn table(device: &Device, rows: usize, n: usize, replay: &Fields, batch: &Fields) -> Result<GatherTable> {
///     let entries = [(&replay.s, &batch.s, 64), (&replay.a, &batch.a, 8), (&replay.r, &batch.r, 1)];
///     GatherTable::new(device, rows, n, &entries)
/// }
///
/// // In an op, with `idx` from `rng_indices(.., rows, idx)`:
/// fn gather(
///     stream: &CaptureStream<'_>,
///     k: &Kernels,
///     table: &GatherTable,
///     idx: &DeviceBuffer<u32>,
///     replay: &Fields,
///     batch: &mut Fields,
/// ) -> Result<()> {
///     let Fields { s, a, r } = batch;
///     k.gather_rows_table(stream, table, idx, &[&replay.s, &replay.a, &replay.r], &mut [s, a, r])
/// }
/// ```
#[derive(Debug)]
pub struct GatherTable {
    table: DeviceBuffer<u64>,
    entries: Vec<GatherEntry>,
    rows: usize,
    batch: usize,
    units: u64,
}

// SAFETY: device memory (the table's words) and the host's copy of the entries, plain
// data that only `new` writes; an op reaches the table through the borrow it is given.
unsafe impl stepgraph::StepBuffer for GatherTable {}

/// One entry as the host checks it: the two buffers' addresses and lengths, and the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GatherEntry {
    src: u64,
    src_len: usize,
    dst: u64,
    dst_len: usize,
    row_len: usize,
}

impl GatherEntry {
    fn of(src: &DeviceBuffer<f32>, dst: &DeviceBuffer<f32>, row_len: usize) -> GatherEntry {
        GatherEntry {
            src: src.device_address(),
            src_len: src.len(),
            dst: dst.device_address(),
            dst_len: dst.len(),
            row_len,
        }
    }

    /// Floats per unit of the kernel: `float4`s need rows of a multiple of 4 floats, so
    /// that every row starts 16-byte aligned, and aligned buffers.
    fn width(&self) -> usize {
        if crate::launch::float4_rows(self.row_len, &[self.src, self.dst]) {
            4
        } else {
            1
        }
    }
}

impl GatherTable {
    /// Builds and uploads the table of `entries`, `(src, dst, row_len)` each: every `src`
    /// holds `rows` rows of its `row_len` floats, every `dst` `batch` rows (blocking: call
    /// it when building the step, not in an op).
    ///
    /// Fails with [`Error::LengthMismatch`] naming the entry whose `src` is not `rows`
    /// rows or whose `dst` is not `batch` rows, and with [`Error::Invalid`] if `rows`,
    /// `batch` or a `row_len` is 0, there are no entries, a `dst` is also another entry's
    /// `dst` or `src`, or a size is too large for the kernel's 32-bit counts.
    pub fn new(
        device: &Device,
        rows: usize,
        batch: usize,
        entries: &[(&DeviceBuffer<f32>, &DeviceBuffer<f32>, usize)],
    ) -> Result<GatherTable> {
        let entries: Vec<GatherEntry> = entries
            .iter()
            .map(|&(src, dst, row_len)| GatherEntry::of(src, dst, row_len))
            .collect();
        let (words, units) = GatherTable::plan(rows, batch, &entries)?;
        let table = device.upload_new("gather table", &words)?;
        Ok(GatherTable {
            table,
            entries,
            rows,
            batch,
            units,
        })
    }

    /// Checks the entries, rule by rule, and lays out the table's words (see the layout
    /// above); returns them and the units of all entries together.
    fn plan(rows: usize, batch: usize, entries: &[GatherEntry]) -> Result<(Vec<u64>, u64)> {
        check_gather_sizes(rows, batch, entries.len())?;
        for (k, e) in entries.iter().enumerate() {
            check_gather_src(k, e, rows)?;
            check_gather_dst(k, e, batch)?;
        }
        check_gather_dsts_distinct(entries)?;
        let mut words = Vec::with_capacity(entries.len() * GATHER_TABLE_WORDS);
        // Each dst's length fits 32 bits and there are fewer than 2³² entries, so the sum
        // of the units fits 64.
        let mut start = 0u64;
        for e in entries {
            let width = e.width();
            words.extend_from_slice(&[e.src, e.dst, e.row_len as u64, width as u64, start]);
            start += (e.dst_len / width) as u64;
        }
        len_u32(
            "GatherTable: blocks",
            start.div_ceil(GATHER_CHUNK as u64) as usize,
        )?;
        Ok((words, start))
    }

    /// Entries in the table.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no entries (never, for a built one; for symmetry with `len`).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Rows of every `src`: the indices' range.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Rows of every `dst`: the number of indices.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Floats of all destinations together (what one launch writes).
    pub fn total(&self) -> usize {
        self.entries.iter().map(|e| e.dst_len).sum()
    }

    /// The table as the kernel reads it ([`GATHER_TABLE_WORDS`] words per entry), for a
    /// crate's own kernels.
    pub fn on_device(&self) -> &DeviceBuffer<u64> {
        &self.table
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.units.div_ceil(GATHER_CHUNK as u64) as u32, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Checks that `srcs` and `dsts` are the table's buffers, in table order.
    fn check(
        &self,
        what: &str,
        srcs: &[&DeviceBuffer<f32>],
        dsts: &[&mut DeviceBuffer<f32>],
    ) -> Result<()> {
        let recorded: Vec<[(u64, usize); 2]> = self
            .entries
            .iter()
            .map(|e| [(e.src, e.src_len), (e.dst, e.dst_len)])
            .collect();
        let srcs = srcs.iter().map(|b| (b.device_address(), b.len())).collect();
        let dsts = dsts.iter().map(|b| (b.device_address(), b.len())).collect();
        let sides = [("srcs", "src"), ("dsts", "dst")];
        crate::multi_tensor::check_table_buffers(what, "entry", sides, &recorded, [srcs, dsts])
    }
}

/// The kernel compares indices with `rows` and divides by each entry's units per row, all
/// in 32 bits; and an empty table has nothing to launch.
fn check_gather_sizes(rows: usize, batch: usize, entries: usize) -> Result<()> {
    positive("GatherTable: rows", rows)?;
    positive("GatherTable: batch", batch)?;
    positive("GatherTable: entries", entries)?;
    Ok(())
}

/// A src shorter than `rows` rows would let an in-range index read past its end; a longer
/// one, or a partial row, means the entry was built for another buffer.
fn check_gather_src(k: usize, e: &GatherEntry, rows: usize) -> Result<()> {
    positive(&format!("GatherTable: row_len of entry {k}"), e.row_len)?;
    let what = format!(
        "GatherTable: src of entry {k} ({rows} rows of {})",
        e.row_len
    );
    same_len(&what, product(&what, &[rows, e.row_len])?, e.src_len)?;
    len_u32(&what, e.src_len).map(|_| ())
}

/// A dst shorter than `batch` rows would be written past its end; a longer one would keep
/// a stale tail. Its length bounds the entry's 32-bit unit index.
fn check_gather_dst(k: usize, e: &GatherEntry, batch: usize) -> Result<()> {
    let what = format!(
        "GatherTable: dst of entry {k} ({batch} rows of {})",
        e.row_len
    );
    same_len(&what, product(&what, &[batch, e.row_len])?, e.dst_len)?;
    len_u32(&what, e.dst_len).map(|_| ())
}

/// Two entries writing one buffer, or one reading what another writes, race within the
/// launch; the launch could not be called anyway, as it borrows each dst mutably.
fn check_gather_dsts_distinct(entries: &[GatherEntry]) -> Result<()> {
    for (k, e) in entries.iter().enumerate() {
        for (j, other) in entries.iter().enumerate() {
            for (side, addr) in [("src", other.src), ("dst", other.dst)] {
                if addr == e.dst && (j, side) != (k, "dst") {
                    let whose = if j == k {
                        "its own".to_string()
                    } else {
                        format!("entry {j}'s")
                    };
                    return Err(Error::Invalid(format!(
                        "GatherTable: expected entry {k}'s dst to be a buffer of its own, \
                         found {whose} {side} at its address {addr:#x}"
                    )));
                }
            }
        }
    }
    Ok(())
}

impl Kernels {
    /// `dst_k[i, :] ← src_k[idx[i], :]` for every entry `k` of `table`, in one launch:
    /// the values of one [`Kernels::gather_rows`] per entry, bit for bit (including a row
    /// of NaN for an index out of range), and
    /// [`gather_rows_table_reference`](crate::reference::gather_rows_table_reference) on the CPU.
    /// One block of 256 per [`GATHER_CHUNK`] units of the destinations together, whatever
    /// the number of entries; rows of a multiple of 4 floats move as `float4`s.
    ///
    /// `srcs` and `dsts` must be the table's buffers, in table order (checked by address
    /// and length), and `idx` must hold [`GatherTable::batch`] indices. As for
    /// `gather_rows`, the host cannot check the indices: one at or above
    /// [`GatherTable::rows`] gathers rows of NaN instead of reading past a `src`. Indices
    /// from [`Kernels::rng_indices`] with `rows` the table's rows are always in range.
    pub fn gather_rows_table(
        &self,
        stream: &CaptureStream<'_>,
        table: &GatherTable,
        idx: &impl DeviceMem<u32>,
        srcs: &[&DeviceBuffer<f32>],
        dsts: &mut [&mut DeviceBuffer<f32>],
    ) -> Result<()> {
        table.check("gather_rows_table", srcs, dsts)?;
        same_len(
            "gather_rows_table: idx (the table's batch)",
            table.batch,
            idx.len(),
        )?;
        // All in 32 bits: checked when the table was built.
        let (count, rows, batch) = (
            table.entries.len() as u32,
            table.rows as u32,
            table.batch as u32,
        );
        // SAFETY: every address in the table is one of the buffers of `srcs` and `dsts`
        // (checked above, with its length), which this call borrows (`dsts` mutably, so no
        // dst is another entry's src or dst). Block b touches units [b GATHER_CHUNK, ..) <
        // units only; unit j of entry k reads idx[j / per_row], below batch = idx.len(),
        // writes dst_k's unit j < batch row_len / width = dst_k.len() / width, and reads
        // src_k's row idx[..] only below rows = src_k.len() / row_len. Units of 4 floats are
        // only where row_len is a multiple of 4 and both addresses 16-byte aligned (checked
        // at build; the addresses are the same ones).
        unsafe {
            self.raw.gather_rows_table(
                stream,
                table.config(),
                &table.table,
                count,
                table.units,
                idx,
                rows,
                batch,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substream_zero_draws_the_examples_bits() {
        // The DQN example's replay_bits(replay_key(seed, counter), e), written out.
        let (seed, counter) = (0x5eed_u64, 17u64);
        let key = splitmix(splitmix(seed) ^ counter);
        for e in [0u32, 1, 255, 1 << 20] {
            let want = splitmix(key.wrapping_add(u64::from(e).wrapping_mul(RNG_GAMMA)));
            assert_eq!(rng_bits(seed, counter, Substream(0), e), want);
        }
    }

    #[test]
    fn splitmix_matches_the_published_sequence() {
        // splitmix64 seeded with 0 (Vigna's reference next() adds gamma, then mixes).
        assert_eq!(splitmix(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn substreams_and_elements_hash_distinct_words() {
        let mut seen = std::collections::HashSet::new();
        for s in 0..4 {
            for e in 0..1000 {
                assert!(seen.insert(rng_bits(1, 0, Substream(s), e)), "{s} {e}");
            }
        }
    }

    /// An entry at made-up addresses: `src` at `base`, `dst` at `base + 0x1000`.
    fn entry(base: u64, rows: usize, batch: usize, row_len: usize) -> GatherEntry {
        GatherEntry {
            src: base,
            src_len: rows * row_len,
            dst: base + 0x1000,
            dst_len: batch * row_len,
            row_len,
        }
    }

    fn plan_err(rows: usize, batch: usize, entries: &[GatherEntry]) -> Error {
        GatherTable::plan(rows, batch, entries).unwrap_err()
    }

    #[test]
    fn gather_table_words_follow_the_documented_layout() {
        // A replay buffer's s, a, r at 10 rows into 3: float4 units for rows of 64 and 8.
        let entries = [
            entry(0x10000, 10, 3, 64),
            entry(0x20000, 10, 3, 8),
            entry(0x30000, 10, 3, 1),
        ];
        let (words, units) = GatherTable::plan(10, 3, &entries).unwrap();
        assert_eq!(
            words,
            [
                0x10000, 0x11000, 64, 4, 0, //
                0x20000, 0x21000, 8, 4, 48, //
                0x30000, 0x31000, 1, 1, 54,
            ]
        );
        assert_eq!(words.len(), 3 * GATHER_TABLE_WORDS);
        assert_eq!(units, 57);
    }

    #[test]
    fn gather_units_are_float4s_only_for_aligned_rows_of_a_multiple_of_four() {
        assert_eq!(entry(0x100, 2, 2, 12).width(), 4);
        assert_eq!(entry(0x100, 2, 2, 6).width(), 1);
        assert_eq!(entry(0x104, 2, 2, 12).width(), 1);
        let mut e = entry(0x100, 2, 2, 12);
        e.dst += 8;
        assert_eq!(e.width(), 1);
    }

    #[test]
    fn gather_table_refuses_sources_of_other_rows_naming_the_entry() {
        let mut short = entry(0x20000, 10, 3, 8);
        short.src_len = 9 * 8;
        let err = plan_err(10, 3, &[entry(0x10000, 10, 3, 64), short]);
        assert!(
            matches!(
                err,
                Error::LengthMismatch {
                    expected: 80,
                    found: 72,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "GatherTable: src of entry 1 (10 rows of 8): expected 80 elements, found 72"
        );
    }

    #[test]
    fn gather_table_refuses_destinations_of_other_batches_naming_the_entry() {
        let mut long = entry(0x30000, 10, 3, 1);
        long.dst_len = 4;
        let err = plan_err(
            10,
            3,
            &[entry(0x10000, 10, 3, 64), entry(0x20000, 10, 3, 8), long],
        );
        assert_eq!(
            err.to_string(),
            "GatherTable: dst of entry 2 (3 rows of 1): expected 3 elements, found 4"
        );
    }

    #[test]
    fn gather_table_refuses_empty_sizes() {
        let cases = [
            (
                0,
                3,
                vec![entry(0x10000, 0, 3, 4)],
                "GatherTable: rows: expected at least 1, found 0",
            ),
            (
                10,
                0,
                vec![entry(0x10000, 10, 0, 4)],
                "GatherTable: batch: expected at least 1, found 0",
            ),
            (
                10,
                3,
                vec![],
                "GatherTable: entries: expected at least 1, found 0",
            ),
            (
                10,
                3,
                vec![entry(0x10000, 10, 3, 4), entry(0x20000, 10, 3, 0)],
                "GatherTable: row_len of entry 1: expected at least 1, found 0",
            ),
        ];
        for (rows, batch, entries, want) in cases {
            assert_eq!(plan_err(rows, batch, &entries).to_string(), want);
        }
    }

    #[test]
    fn gather_table_refuses_a_destination_that_is_another_buffer_of_the_table() {
        let (a, mut b) = (entry(0x10000, 10, 3, 4), entry(0x20000, 10, 3, 4));
        b.dst = a.dst;
        let err = plan_err(10, 3, &[a, b]).to_string();
        assert_eq!(
            err,
            "GatherTable: expected entry 0's dst to be a buffer of its own, found entry 1's dst \
             at its address 0x11000"
        );
        let mut b = entry(0x20000, 10, 3, 4);
        b.src = a.dst;
        b.src_len = a.dst_len;
        let err = plan_err(3, 3, &[entry(0x10000, 3, 3, 4), b]).to_string();
        assert!(
            err.contains("entry 0's dst") && err.contains("entry 1's src"),
            "{err}"
        );
        let mut own = entry(0x10000, 3, 3, 4);
        own.dst = own.src;
        let err = plan_err(3, 3, &[own]).to_string();
        assert!(err.contains("found its own src"), "{err}");
    }

    #[test]
    fn gather_table_refuses_buffers_past_32_bit_indices() {
        let big = 1usize << 31;
        let err = plan_err(big, 1, &[entry(0x10000, big, 1, 2)]).to_string();
        assert!(
            err.starts_with("GatherTable: src of entry 0 (2147483648 rows of 2) has 4294967296"),
            "{err}"
        );
        let err = plan_err(1, big, &[entry(0x10000, 1, big, 2)]).to_string();
        assert!(
            err.starts_with("GatherTable: dst of entry 0 (2147483648 rows of 2) has 4294967296"),
            "{err}"
        );
    }

    #[test]
    fn the_float_below_steps_down_one_ulp_across_signs() {
        assert_eq!(float_below(2.0), 2.0 - f32::EPSILON);
        assert_eq!(float_below(1.0), 1.0 - f32::EPSILON / 2.0);
        assert_eq!(float_below(-1.0), -1.0 - f32::EPSILON);
        assert!(float_below(0.0) < 0.0 && float_below(-0.0) < 0.0);
        assert_eq!(float_below(f32::from_bits(1)), 0.0);
    }

    #[test]
    fn cospi_is_exact_at_its_zeros_and_close_elsewhere() {
        assert_eq!(cospi(0.0), 1.0);
        assert_eq!(cospi(0.5), 0.0);
        assert_eq!(cospi(1.5), 0.0);
        assert_eq!(cospi(1.0), -1.0);
        for i in 0..2000 {
            let x = f64::from(i) / 1000.0;
            let want = (std::f64::consts::PI * x).cos();
            assert!((cospi(x) - want).abs() < 1e-15, "{x}");
        }
    }
}
