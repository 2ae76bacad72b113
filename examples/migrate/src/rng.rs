//! The seeded generator of the trainer's initial weights and data.

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
/// 2014): a 64-bit state and a few arithmetic operations per number, so that the same
/// seed gives the same weights on every machine, with no dependency for it.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose sequence depends only on `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in the open interval (0, 1): the top 24 bits, offset by half a step, so
    /// neither end is reached (an IQN fraction of exactly 0 or 1 is degenerate).
    pub fn open01(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    /// Uniform in (-bound, bound).
    pub fn symmetric(&mut self, bound: f32) -> f32 {
        bound * (2.0 * self.open01() - 1.0)
    }

    /// `n` values uniform in (-bound, bound).
    pub fn symmetric_vec(&mut self, n: usize, bound: f32) -> Vec<f32> {
        (0..n).map(|_| self.symmetric(bound)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_sequence_and_another_seed_another() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..16).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..16).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::new(8);
            (0..16).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn splitmix64_matches_its_published_sequence() {
        // The reference implementation's first outputs for seed 1234567.
        let mut r = Rng::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn open01_stays_inside_and_symmetric_is_centred() {
        let mut r = Rng::new(3);
        let xs: Vec<f32> = (0..100_000).map(|_| r.open01()).collect();
        assert!(xs.iter().all(|&x| x > 0.0 && x < 1.0));
        let mean = xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        let ys = r.symmetric_vec(100_000, 0.25);
        assert!(ys.iter().all(|&y| y.abs() < 0.25));
        let mean = ys.iter().map(|&y| y as f64).sum::<f64>() / ys.len() as f64;
        assert!(mean.abs() < 0.005, "{mean}");
    }
}
