//! What a GPU test of a kernel or a step needs besides the GPU: seeded random inputs
//! (never zeros, which hide an element a kernel forgot to write), buffers of NaN that a
//! kernel must overwrite, and comparisons against a reference computed another way,
//! with the error printed whether or not it passes; and [`npy`], the NumPy files an
//! example exchanges with its PyTorch reference.
//!
//! ```
//! use stepgraph_testkit::{Rng, check_within};
//!
//! let mut rng = Rng::new(7);
//! let x = rng.vec(1000, -1.0, 1.0);
//! let doubled: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
//! let reference: Vec<f32> = x.iter().map(|v| v + v).collect();
//! check_within("doubling", "y", &doubled, &reference, 1e-6, 0.0);
//! ```

use stepgraph::{Device, DeviceBuffer, Result};

pub mod npy;

/// xorshift64*: small, seedable, the same draws on every machine. The one host-side
/// generator of the workspace: test inputs, and the examples' initial weights and
/// generated training data (which reach the PyTorch checks through `.npy` files, never
/// through a second implementation of this sequence).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`; every seed, 0 included, gives a usable stream.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1), 24 random bits.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in the open interval (0, 1): 24 random bits offset by half a step, so that
    /// neither end is reached (a quantile fraction of exactly 0 or 1 is degenerate).
    pub fn open01(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    /// Uniform in [0, 1), 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n`; `n` must not be 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A standard normal draw (Box-Muller on two uniforms, the first kept off 0).
    pub fn normal(&mut self) -> f32 {
        let u1 = self.next_f32().max(1e-7);
        let u2 = self.next_f32();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }

    /// `n` values uniform in [lo, hi), in f64 (53 random bits each).
    pub fn vec_f64(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| lo + (hi - lo) * self.next_f64()).collect()
    }

    /// `n` values uniform in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * self.next_f32()).collect()
    }

    /// `n` values uniform in [lo, hi), a draw of exactly zero replaced by 0.125: inputs
    /// that must not hide an unwritten or ignored element.
    pub fn vec_nonzero(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v = lo + (hi - lo) * self.next_f32();
                if v == 0.0 { 0.125 } else { v }
            })
            .collect()
    }

    /// `len` values uniform in [-scale, scale).
    pub fn fill(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|_| (self.next_f32() * 2.0 - 1.0) * scale)
            .collect()
    }
}

/// A device buffer of `len` NaNs: an element a kernel fails to write fails the
/// comparison.
pub fn nan_buffer(device: &Device, what: &str, len: usize) -> Result<DeviceBuffer<f32>> {
    device.upload_new(what, &vec![f32::NAN; len])
}

/// The bits of every value of `parts`, in order: for checking that two runs agree
/// exactly.
pub fn bits(parts: &[&[f32]]) -> Vec<u32> {
    parts
        .iter()
        .flat_map(|v| v.iter().map(|x| x.to_bits()))
        .collect()
}

/// The largest `|got - want| / max(|want|, floor)`; infinite if anything of `got` is not
/// finite. Panics if the lengths differ (a test's own mistake).
pub fn max_err(got: &[f32], want: &[f32], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "compared lengths");
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let (g, w) = (f64::from(g), f64::from(w));
            if g.is_finite() {
                (g - w).abs() / w.abs().max(floor).max(f64::MIN_POSITIVE)
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// The relative error of `got` as a whole: `‖got − want‖₂ / ‖want‖₂`, or `‖got‖₂` when
/// `want` is all zeros; infinite if anything of `got` is not finite. For results whose
/// elements may each be off by more than a tolerance while the tensor is right (sums in
/// another order, TF32 matmuls), where [`max_err`] would be too strict. Panics if the
/// lengths differ (a test's own mistake).
pub fn rel_err<G, W>(got: &[G], want: &[W]) -> f64
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    assert_eq!(got.len(), want.len(), "compared lengths");
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let (g, w) = (g.into(), w.into());
        if !g.is_finite() {
            return f64::INFINITY;
        }
        diff += (g - w).powi(2);
        norm += w.powi(2);
    }
    if norm > 0.0 {
        (diff / norm).sqrt()
    } else {
        diff.sqrt()
    }
}

/// The root mean square of `x`, a scale for error floors.
pub fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

/// Asserts that `max_err(got, want, floor) <= bound`, and prints the error either way,
/// so that a passing run still shows how close it was.
pub fn check_within(case: &str, what: &str, got: &[f32], want: &[f32], floor: f64, bound: f64) {
    let err = max_err(got, want, floor);
    eprintln!("{case}: {what}: largest error {err:.3e} (bound {bound:.0e}, floor {floor:.3e})");
    assert!(
        err <= bound,
        "{case}: {what}: largest error {err:e} is above {bound:e}"
    );
}

/// The `#define NAME value` lines of a CUDA source, by name: for a test that a kernel
/// crate's Rust constants agree with the ones its `.cu` files define.
///
/// ```
/// let dir = std::env::temp_dir().join("stepgraph-testkit-defines");
/// std::fs::create_dir_all(&dir).unwrap();
/// let file = dir.join("k.cuh");
/// std::fs::write(&file, "#define CHUNK 256\n  #define SLOTS 8 // slots\nint x;\n").unwrap();
/// let defines = stepgraph_testkit::cuda_defines(&file).unwrap();
/// assert_eq!(defines["CHUNK"], "256");
/// assert_eq!(defines["SLOTS"], "8");
/// ```
pub fn cuda_defines(
    path: impl AsRef<std::path::Path>,
) -> std::io::Result<std::collections::HashMap<String, String>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(|l| {
            let mut words = l.trim().strip_prefix("#define ")?.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_seeded_in_range_and_never_zero_where_asked() {
        let (a, b) = (
            Rng::new(3).vec(100, -2.0, 2.0),
            Rng::new(3).vec(100, -2.0, 2.0),
        );
        assert_eq!(a, b);
        assert_ne!(a, Rng::new(4).vec(100, -2.0, 2.0));
        assert!(a.iter().all(|v| (-2.0..2.0).contains(v)));
        assert!(
            Rng::new(0)
                .vec_nonzero(10_000, -1.0, 1.0)
                .iter()
                .all(|&v| v != 0.0)
        );
    }

    #[test]
    fn the_error_is_relative_floored_and_infinite_for_nan() {
        assert_eq!(max_err(&[1.1], &[1.0], 1e-3), 0.10000002384185791);
        assert_eq!(max_err(&[0.001], &[0.0], 0.01), 0.10000000474974513);
        assert_eq!(max_err(&[f32::NAN], &[1.0], 1.0), f64::INFINITY);
        assert_eq!(bits(&[&[1.0], &[-0.0]]), [0x3f80_0000, 0x8000_0000]);
        assert!((rms(&[3.0, 4.0]) - 12.5f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn the_sequence_is_xorshift64_star_and_every_draw_derives_from_it() {
        // xorshift64* (Vigna, 2016); seed 1 starts from the multiplier itself, odd.
        let mut r = Rng::new(1);
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..4 {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            assert_eq!(r.next_u64(), state.wrapping_mul(0x2545_F491_4F6C_DD1D));
        }
        let (mut a, mut b) = (Rng::new(9), Rng::new(9));
        assert_eq!(a.next_f32(), (b.next_u64() >> 40) as f32 / 16_777_216.0);
        assert_eq!(
            a.next_f64(),
            (b.next_u64() >> 11) as f64 / 9_007_199_254_740_992.0
        );
    }

    #[test]
    fn draws_stay_in_their_ranges() {
        let mut r = Rng::new(5);
        for _ in 0..10_000 {
            let o = r.open01();
            assert!(o > 0.0 && o < 1.0, "{o}");
            assert!(r.below(7) < 7);
            assert!(r.normal().is_finite());
        }
        let v = r.vec_f64(10_000, -0.5, 0.5);
        assert!(v.iter().all(|x| (-0.5..0.5).contains(x)));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.02, "{mean}");
        let z: Vec<f32> = (0..20_000).map(|_| r.normal()).collect();
        let var = z.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / z.len() as f64;
        assert!((var - 1.0).abs() < 0.05, "{var}");
    }

    #[test]
    fn the_relative_error_is_of_the_whole_tensor() {
        assert_eq!(rel_err(&[1.0f32, 2.0], &[1.0f32, 2.0]), 0.0);
        assert!((rel_err(&[3.0f64, 0.0], &[4.0f64, 0.0]) - 0.25).abs() < 1e-15);
        // Mixed precision: f32 results against an f64 reference.
        assert!((rel_err(&[3.0f32, 4.0], &[0.0f64, 4.0]) - 0.75).abs() < 1e-15);
        // An all-zero reference: the absolute norm.
        assert_eq!(rel_err(&[0.0f64, 0.0], &[0.0f64, 0.0]), 0.0);
        assert_eq!(rel_err(&[3.0f64, 4.0], &[0.0f64, 0.0]), 5.0);
        assert_eq!(rel_err(&[f32::NAN], &[1.0f32]), f64::INFINITY);
    }

    #[test]
    #[should_panic(expected = "largest error")]
    fn a_check_above_its_bound_fails() {
        check_within("case", "x", &[2.0], &[1.0], 1.0, 0.5);
    }
}
