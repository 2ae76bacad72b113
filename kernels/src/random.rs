//! A counter-based random generator on the device, and the gather of the rows it draws
//! (`cuda/random.cu`).
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

use stepgraph::{CaptureStream, Device, DeviceBuffer, DeviceMem, DeviceMemMut, Error, Result};

use crate::Kernels;
use crate::launch::{elementwise_config, len_u32, positive, product, same_len};

/// The largest distance, in ulps, between a normal of [`Kernels::rng_normal`] and
/// [`rng_normal_reference`](crate::rng_normal_reference) (correctly rounded from f64). The
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
/// use stepgraph_kernels::{DeviceRng, Kernels, rng_normal_reference, Substream};
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

/// splitmix64's output function (`rng_splitmix` in `cuda/random.cu`).
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(RNG_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const RNG_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

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
    /// so `|z| < 5.8`. Within [`RNG_NORMAL_ULPS`] of [`rng_normal_reference`](crate::rng_normal_reference).
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
    /// it. [`rng_uniform_reference`](crate::rng_uniform_reference) computes the same bits.
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
    /// [`Kernels::gather_rows`] never meets one out of range. [`rng_indices_reference`](crate::rng_indices_reference)
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
    /// `dst`. [`gather_rows_reference`](crate::gather_rows_reference) computes the same values.
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
