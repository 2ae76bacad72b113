//! The floor of an op or a step: how long its counted arithmetic and its compulsory memory
//! traffic take at the GPU's measured ceilings, whatever the kernels.
//!
//! The work bound ([`WorkBound`](crate::WorkBound)) says what a schedule can reach with the
//! kernels as they are; the floor says what kernels could reach. A [`Floor`] is counted
//! from the model (the program knows its shapes, stepgraph does not): the matrix products'
//! FLOPs, which tensor cores run, and the bytes the op must read and write at least once
//! (its inputs and outputs; intermediate tensors are taken to stay on chip, as a fully
//! fused op would keep them). Elementwise arithmetic is left out. Each part left out
//! lowers the floor, so it stays a lower bound.
//!
//! [`Ceilings`] are measured on the GPU at hand, each the median of timed runs after
//! warm-up: a cuBLASLt TF32 product of two random `8192 × 8192` matrices, and a
//! device-to-device copy of 1 GiB of random data, its bytes counted read and written.
//! The floor is the larger of its two times: the arithmetic at the matmul rate, the
//! bytes at the copy rate.

use std::fmt;
use std::iter::Sum;
use std::ops::Add;

use crate::blas::{BlasSession, Matmul, MatmulArgs, Precision};
use crate::driver::device::Device;
use crate::driver::event::{elapsed_ms, event};
use crate::error::{Error, Result};
use crate::measure::timing::median;
use crate::op::stream::Mode;

/// The side of the square TF32 product [`Ceilings::measure`] times.
pub const CEILING_MATMUL: usize = 8192;
/// Bytes of the copy [`Ceilings::measure`] times (each copy moves twice this).
pub const CEILING_COPY_BYTES: usize = 1 << 30;
/// Untimed runs before the timed ones.
const WARMUP: usize = 3;
/// Timed runs; the median is kept.
const RUNS: usize = 10;

/// What an op (or a step) must do whatever its kernels: matrix-product FLOPs and bytes
/// read and written once.
///
/// ```
/// use stepgraph::stats::{Ceilings, Floor};
///
/// // A linear layer's forward on a batch: x [16384, 256] · wᵀ, w [512, 256], reading x and
/// // w and writing y [16384, 512] once.
/// let (b, i, o) = (16384, 256, 512);
/// let layer = Floor::matmul(b, o, i) + Floor::f32s(b * i + o * i + b * o);
/// // At given rates; `Ceilings::measure(&device)?` measures them on the GPU at hand.
/// let rates = Ceilings::new(400e12, 4e12);
/// assert!((layer.compute_ms(&rates) - 0.01074).abs() < 1e-5); // 4.29 GFLOP
/// assert!((layer.memory_ms(&rates) - 0.01271).abs() < 1e-5); // 50.9 MB
/// assert_eq!(layer.ms(&rates), layer.memory_ms(&rates)); // bound by its bytes
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Floor {
    /// FLOPs of its matrix products (2·m·n·k each).
    pub tensor_flop: f64,
    /// Bytes it must read and write at least once.
    pub bytes: f64,
}

impl Floor {
    /// Nothing to do.
    pub const ZERO: Floor = Floor {
        tensor_flop: 0.0,
        bytes: 0.0,
    };

    /// `tensor_flop` FLOPs of matrix products and `bytes` bytes of traffic.
    pub const fn new(tensor_flop: f64, bytes: f64) -> Floor {
        Floor { tensor_flop, bytes }
    }

    /// A product `[m, k] · [k, n]`: `2·m·n·k` FLOPs, no bytes (its operands' traffic is
    /// counted where they are the op's inputs or outputs).
    pub fn matmul(m: usize, n: usize, k: usize) -> Floor {
        Floor::new(2.0 * m as f64 * n as f64 * k as f64, 0.0)
    }

    /// `count` f32 values read or written once.
    pub fn f32s(count: usize) -> Floor {
        Floor::new(0.0, 4.0 * count as f64)
    }

    /// The same work `times` times over.
    pub fn times(self, times: usize) -> Floor {
        Floor::new(self.tensor_flop * times as f64, self.bytes * times as f64)
    }

    /// Milliseconds of its arithmetic at the matmul rate.
    pub fn compute_ms(&self, c: &Ceilings) -> f64 {
        self.tensor_flop / c.tf32_flop_per_s * 1e3
    }

    /// Milliseconds of its bytes at the copy rate.
    pub fn memory_ms(&self, c: &Ceilings) -> f64 {
        self.bytes / c.copy_bytes_per_s * 1e3
    }

    /// The floor in milliseconds: the larger of the two.
    pub fn ms(&self, c: &Ceilings) -> f64 {
        self.compute_ms(c).max(self.memory_ms(c))
    }

    /// FLOPs per byte.
    pub fn intensity(&self) -> f64 {
        self.tensor_flop / self.bytes
    }
}

impl Add for Floor {
    type Output = Floor;

    fn add(self, other: Floor) -> Floor {
        Floor::new(
            self.tensor_flop + other.tensor_flop,
            self.bytes + other.bytes,
        )
    }
}

impl Sum for Floor {
    fn sum<I: Iterator<Item = Floor>>(iter: I) -> Floor {
        iter.fold(Floor::ZERO, Add::add)
    }
}

impl fmt::Display for Floor {
    /// `34.36 GFLOP, 0.034 GB`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.2} GFLOP, {:.3} GB",
            self.tensor_flop / 1e9,
            self.bytes / 1e9
        )
    }
}

/// The GPU's rates a [`Floor`] is taken at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceilings {
    /// FLOP/s of a large TF32 matmul on random data.
    pub tf32_flop_per_s: f64,
    /// Bytes/s of a large device-to-device copy, read and written counted.
    pub copy_bytes_per_s: f64,
}

impl Ceilings {
    /// Given rates (a datasheet's, or an earlier measurement's).
    pub const fn new(tf32_flop_per_s: f64, copy_bytes_per_s: f64) -> Ceilings {
        Ceilings {
            tf32_flop_per_s,
            copy_bytes_per_s,
        }
    }

    /// Measures both on `device` (about 1.3 GB of host data generated and uploaded, 3 GB
    /// of device memory for the time of the call).
    pub fn measure(device: &Device) -> Result<Ceilings> {
        crate::scope::check("Ceilings::measure")?;
        let session = BlasSession::new(device)?;
        let stream = session.stream();
        let mut rng = SplitMix(0x5eed_f100);
        let n = CEILING_MATMUL;
        let a = device.upload_new("ceiling matmul A", &rng.uniforms(n * n))?;
        let b = device.upload_new("ceiling matmul B", &rng.uniforms(n * n))?;
        let mut d = device.alloc_zeros::<f32>("ceiling matmul D", n * n)?;
        let spec = Matmul::new(n, n, n)
            .with_trans_b(true)
            .with_precision(Precision::Tf32);
        let blas = session.blas(Mode::Eager);
        let matmul_ms = time(device, stream, &mut || {
            blas.matmul(&spec, &a, &b, &mut d, MatmulArgs::new())
        })?;
        drop((a, b, d));

        let words = CEILING_COPY_BYTES / 4;
        let src = device.upload_new("ceiling copy source", &rng.uniforms(words))?;
        let mut dst = device.alloc_zeros::<f32>("ceiling copy destination", words)?;
        let copy_ms = time(device, stream, &mut || {
            stream
                .memcpy_dtod(src.slice(), dst.slice_mut())
                .map_err(Error::driver("cuMemcpyDtoDAsync"))
        })?;
        let flop = 2.0 * (n as f64).powi(3);
        Ok(Ceilings::new(
            flop / (matmul_ms * 1e-3),
            2.0 * CEILING_COPY_BYTES as f64 / (copy_ms * 1e-3),
        ))
    }
}

impl fmt::Display for Ceilings {
    /// `TF32 matmul 412.3 TFLOP/s, copy 4.31 TB/s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TF32 matmul {:.1} TFLOP/s, copy {:.2} TB/s",
            self.tf32_flop_per_s / 1e12,
            self.copy_bytes_per_s / 1e12
        )
    }
}

/// The median milliseconds of `run` on `stream` over [`RUNS`] runs after [`WARMUP`].
fn time(
    device: &Device,
    stream: &cudarc::driver::CudaStream,
    run: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..WARMUP {
        run()?;
    }
    let timing = |_| event(device, true);
    let starts = (0..RUNS).map(timing).collect::<Result<Vec<_>>>()?;
    let ends = (0..RUNS).map(timing).collect::<Result<Vec<_>>>()?;
    for (start, end) in starts.iter().zip(&ends) {
        start
            .record(stream)
            .map_err(Error::driver("cuEventRecord"))?;
        run()?;
        end.record(stream).map_err(Error::driver("cuEventRecord"))?;
    }
    stream
        .synchronize()
        .map_err(Error::driver("cuStreamSynchronize"))?;
    let mut ms = starts
        .iter()
        .zip(&ends)
        .map(|(s, e)| elapsed_ms(s, e))
        .collect::<Result<Vec<_>>>()?;
    Ok(median(&mut ms))
}

/// SplitMix64: the ceilings' random inputs, uniform in [−1, 1).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniforms(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_is_the_slower_of_its_arithmetic_and_its_bytes() {
        let c = Ceilings::new(400e12, 4e12);
        // 40 GFLOP at 400 TFLOP/s: 0.1 ms; 0.2 GB at 4 TB/s: 0.05 ms.
        let f = Floor::matmul(1000, 1000, 20_000) + Floor::f32s(50_000_000);
        assert_eq!(f.tensor_flop, 4e10);
        assert_eq!(f.bytes, 2e8);
        assert!((f.compute_ms(&c) - 0.1).abs() < 1e-12);
        assert!((f.memory_ms(&c) - 0.05).abs() < 1e-12);
        assert_eq!(f.ms(&c), f.compute_ms(&c));
        assert_eq!(f.intensity(), 200.0);
        // Memory-bound when the bytes weigh more.
        let g = f + Floor::f32s(100_000_000);
        assert_eq!(g.ms(&c), g.memory_ms(&c));
        assert_eq!(f.to_string(), "40.00 GFLOP, 0.200 GB");
    }

    #[test]
    fn floors_add_up_and_repeat() {
        let parts = [Floor::matmul(2, 3, 4), Floor::f32s(5), Floor::ZERO];
        let total: Floor = parts.into_iter().sum();
        assert_eq!(total, Floor::new(48.0, 20.0));
        assert_eq!(total.times(3), Floor::new(144.0, 60.0));
        assert_eq!(Floor::matmul(2, 3, 4).times(0), Floor::ZERO);
    }

    #[test]
    fn ceilings_say_their_rates() {
        let c = Ceilings::new(412.34e12, 4.3149e12);
        assert_eq!(c.to_string(), "TF32 matmul 412.3 TFLOP/s, copy 4.31 TB/s");
    }

    #[test]
    fn the_random_inputs_are_uniform_in_minus_one_to_one() {
        let v = SplitMix(1).uniforms(100_000);
        assert!(v.iter().all(|&x| (-1.0..1.0).contains(&x)));
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        // Not constant: the matmul must not run on a repeated value.
        let distinct: std::collections::HashSet<u32> = v.iter().map(|x| x.to_bits()).collect();
        assert!(distinct.len() > 99_000, "{}", distinct.len());
    }
}
