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

/// xorshift64*: small, seedable, the same draws on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`; every seed, 0 included, gives a usable stream.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in [0, 1), 24 random bits.
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 40) as f32 / (1u64 << 24) as f32
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
    #[should_panic(expected = "largest error")]
    fn a_check_above_its_bound_fails() {
        check_within("case", "x", &[2.0], &[1.0], 1.0, 0.5);
    }
}
