//! CPU references of this crate's kernels: the elementwise ones, the random draws
//! (normals within [`RNG_NORMAL_ULPS`](crate::RNG_NORMAL_ULPS)) and Adam's clock bit for
//! bit, the optimizer's with the kernel's f32 operations in the kernel's order, the
//! reductions in f64. The GPU tests compare the kernels with these.

use crate::random::{cospi, float_below, unit24};
use crate::{ADAM_BIAS1, ADAM_BIAS2, ADAM_LR, AdamHyper, AdamScalars, Substream, rng_bits};

fn check(what: &str, found: usize, expected: usize) {
    assert_eq!(found, expected, "{what}: wrong length");
}

/// What [`Kernels::chain_step`](crate::Kernels::chain_step) computes, on the CPU, bit for bit.
///
/// The kernel does one `fmaf(v, a, b)` per step, rounded once; `f32::mul_add` rounds the
/// same way, whereas `v * a + b` here would round twice and drift from the GPU's result.
pub fn chain_step_reference(x: &mut [f32], iters: u32, a: f32, b: f32) {
    for v in x {
        for _ in 0..iters {
            *v = v.mul_add(a, b);
        }
    }
}

/// What [`Kernels::axpby`](crate::Kernels::axpby) computes, on the CPU, bit for bit (`a.mul_add(x, b * y)`).
///
/// # Panics
/// If `x` and `y` differ in length.
pub fn axpby_reference(x: &[f32], y: &mut [f32], a: f32, b: f32) {
    assert_eq!(
        x.len(),
        y.len(),
        "axpby_reference: x and y differ in length"
    );
    for (y, x) in y.iter_mut().zip(x) {
        *y = a.mul_add(*x, b * *y);
    }
}

/// What [`Kernels::fill_affine`](crate::Kernels::fill_affine) computes, on the CPU, bit for bit.
pub fn fill_affine_reference(y: &mut [f32], start: f32, step: f32) {
    for (i, y) in y.iter_mut().enumerate() {
        *y = (i as f32).mul_add(step, start);
    }
}

/// What [`Kernels::grad_sq_norm`](crate::Kernels::grad_sq_norm) computes: `‖g‖²` over
/// every gradient (summed in f64).
pub fn grad_sq_norm_reference(grads: &[&[f32]]) -> f32 {
    grads
        .iter()
        .flat_map(|g| g.iter())
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>() as f32
}

/// What [`Kernels::adam_clip_update`](crate::Kernels::adam_clip_update) does to one
/// tensor, in f32 with the kernel's operations in the kernel's order (the kernel may fuse
/// a multiply and an add where this rounds twice: compare with a tolerance of a few ulps).
pub fn adam_clip_update_reference(
    param: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    sq_norm: f32,
    scalars: AdamScalars,
    hyper: AdamHyper,
) {
    check("adam_clip_update_reference: grad", grad.len(), param.len());
    check("adam_clip_update_reference: m", m.len(), param.len());
    check("adam_clip_update_reference: v", v.len(), param.len());
    if !sq_norm.is_finite() {
        return; // the kernel skips the step, leaving everything as it was
    }
    let values = scalars.values();
    let (lr, bias1, bias2) = (values[ADAM_LR], values[ADAM_BIAS1], values[ADAM_BIAS2]);
    let [max_norm, beta1, beta2, omb1, omb2, eps] = hyper.kernel_args();
    let clip = (max_norm / (sq_norm.sqrt() + 1e-6)).min(1.0);
    for j in 0..param.len() {
        let g = clip * grad[j];
        m[j] = beta1 * m[j] + omb1 * g;
        v[j] = beta2 * v[j] + omb2 * g * g;
        param[j] -= lr * (m[j] / bias1) / ((v[j] / bias2).sqrt() + eps);
    }
}

/// What [`Kernels::adam_tick`](crate::Kernels::adam_tick) does to a clock that has taken
/// `t` steps: the new count `t + 1` and the scalars it writes, bit for bit
/// ([`AdamScalars::at_step`] at `t + 1`, a count past `u32::MAX` clamped as the kernel
/// clamps it).
pub fn adam_tick_reference(t: u64, lr: f32, hyper: &AdamHyper) -> (u64, AdamScalars) {
    let now = t.wrapping_add(1);
    let exp = u32::try_from(now).unwrap_or(u32::MAX);
    (now, AdamScalars::at_step(lr, hyper, exp))
}

/// What [`Kernels::rng_normal`](crate::Kernels::rng_normal) draws into `n` elements at
/// `counter`: Box-Muller in f64, rounded once (the kernel's are within
/// [`RNG_NORMAL_ULPS`](crate::RNG_NORMAL_ULPS) ulps of these).
pub fn rng_normal_reference(seed: u64, counter: u64, substream: Substream, n: usize) -> Vec<f32> {
    (0..n)
        .map(|e| {
            let bits = rng_bits(seed, counter, substream, e as u32);
            let u1 = (((bits >> 40) + 1) as f64) / 16_777_216.0;
            let u2 = (((bits >> 16) & 0xFF_FFFF) as f64) / 16_777_216.0;
            ((-2.0 * u1.ln()).sqrt() * cospi(2.0 * u2)) as f32
        })
        .collect()
}

/// What [`Kernels::rng_uniform`](crate::Kernels::rng_uniform) draws into `n` elements at
/// `counter`, bit for bit.
pub fn rng_uniform_reference(
    seed: u64,
    counter: u64,
    substream: Substream,
    lo: f32,
    hi: f32,
    n: usize,
) -> Vec<f32> {
    (0..n)
        .map(|e| {
            let u = unit24(rng_bits(seed, counter, substream, e as u32));
            let v = (hi - lo).mul_add(u, lo);
            if v < hi { v } else { float_below(hi) }
        })
        .collect()
}

/// What [`Kernels::rng_indices`](crate::Kernels::rng_indices) draws into `n` indices at
/// `counter`, bit for bit: the high word of `bits · rows`.
pub fn rng_indices_reference(
    seed: u64,
    counter: u64,
    substream: Substream,
    rows: u32,
    n: usize,
) -> Vec<u32> {
    (0..n)
        .map(|e| {
            let bits = rng_bits(seed, counter, substream, e as u32);
            ((u128::from(bits) * u128::from(rows)) >> 64) as u32
        })
        .collect()
}

/// What [`Kernels::gather_rows`](crate::Kernels::gather_rows) writes: `dst[i, :] =
/// src[idx[i], :]`, a row of NaN for an index out of range.
///
/// # Panics
/// If `row_len` is 0 or `src` is not a whole number of rows.
pub fn gather_rows_reference(src: &[f32], idx: &[u32], row_len: usize) -> Vec<f32> {
    assert!(
        row_len > 0 && src.len().is_multiple_of(row_len),
        "gather_rows_reference: src is not whole rows"
    );
    let rows = src.len() / row_len;
    idx.iter()
        .flat_map(|&r| {
            let r = r as usize;
            if r < rows {
                src[r * row_len..(r + 1) * row_len].to_vec()
            } else {
                vec![f32::NAN; row_len]
            }
        })
        .collect()
}

/// What [`Kernels::gather_rows_table`](crate::Kernels::gather_rows_table) writes: for
/// each entry `(src, row_len)`, the [`gather_rows_reference`] of `src` at `idx`, one
/// destination per entry, in order.
///
/// # Panics
/// If a `row_len` is 0 or a `src` is not a whole number of rows.
pub fn gather_rows_table_reference(entries: &[(&[f32], usize)], idx: &[u32]) -> Vec<Vec<f32>> {
    entries
        .iter()
        .map(|&(src, row_len)| gather_rows_reference(src, idx, row_len))
        .collect()
}

/// What [`Kernels::column_sums`](crate::Kernels::column_sums) computes: `out[c] = Σ_r x[r,
/// c]` (summed in f64).
pub fn column_sums_reference(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    check("column_sums_reference: x", x.len(), rows * cols);
    let mut out = vec![0.0f64; cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c] += f64::from(x[r * cols + c]);
        }
    }
    out.iter().map(|&v| v as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adam_first_step_moves_each_parameter_by_about_lr() {
        // At t = 1 with zero moments, m / (1 - b1) = g and v / (1 - b2) = g^2, so the step
        // is lr g / (|g| + eps).
        let hyper = AdamHyper::default();
        let scalars = AdamScalars::at_step(0.01, &hyper, 1);
        let grad = [0.5f32, -2.0, 0.0];
        let mut param = [1.0f32, 1.0, 1.0];
        let (mut m, mut v) = ([0.0f32; 3], [0.0f32; 3]);
        adam_clip_update_reference(&mut param, &grad, &mut m, &mut v, 4.25, scalars, hyper);
        assert!((param[0] - 0.99).abs() < 1e-5, "{param:?}");
        assert!((param[1] - 1.01).abs() < 1e-5, "{param:?}");
        assert_eq!(param[2], 1.0);
    }

    #[test]
    fn adam_clips_by_the_global_norm() {
        // ‖g‖ = 100 > max_norm = 10: g is scaled by 1/10 before the moments see it.
        let hyper = AdamHyper::default();
        let scalars = AdamScalars::at_step(0.01, &hyper, 1);
        let grad = [100.0f32];
        let (mut param, mut m, mut v) = ([0.0f32], [0.0f32], [0.0f32]);
        adam_clip_update_reference(&mut param, &grad, &mut m, &mut v, 1e4, scalars, hyper);
        let g = 100.0 * (10.0 / (100.0 + 1e-6));
        assert!((m[0] - 0.1 * g as f32).abs() < 1e-4, "{m:?}");
        assert!((v[0] - 0.001 * (g * g) as f32).abs() < 1e-3, "{v:?}");
    }

    #[test]
    fn adam_skips_a_step_whose_norm_is_not_finite() {
        let hyper = AdamHyper::default();
        let scalars = AdamScalars::at_step(0.01, &hyper, 2);
        for sq_norm in [f32::NAN, f32::INFINITY] {
            let grad = [0.5f32, f32::NAN];
            let (mut param, mut m, mut v) = ([1.0f32, 2.0], [0.1f32, 0.2], [0.01f32, 0.02]);
            adam_clip_update_reference(&mut param, &grad, &mut m, &mut v, sq_norm, scalars, hyper);
            assert_eq!(
                (param, m, v),
                ([1.0, 2.0], [0.1, 0.2], [0.01, 0.02]),
                "{sq_norm}"
            );
        }
    }

    #[test]
    fn adam_ticks_count_from_the_given_step() {
        let hyper = AdamHyper::default();
        assert_eq!(
            adam_tick_reference(0, 0.5, &hyper),
            (1, AdamScalars::at_step(0.5, &hyper, 1))
        );
        assert_eq!(
            adam_tick_reference(41, 0.5, &hyper),
            (42, AdamScalars::at_step(0.5, &hyper, 42))
        );
        // Far past where beta^t underflows, the corrections are exactly 1.
        let (t, s) = adam_tick_reference(u64::from(u32::MAX) + 7, 0.5, &hyper);
        assert_eq!((t, s.bias1, s.bias2), (u64::from(u32::MAX) + 8, 1.0, 1.0));
    }

    #[test]
    fn uniforms_stay_in_their_range_even_where_the_rounding_reaches_hi() {
        for (lo, hi) in [(0.0f32, 1.0f32), (1.0, 2.0), (-3.0, -2.5), (-1e-30, 1e-30)] {
            let u = rng_uniform_reference(9, 2, Substream(3), lo, hi, 4096);
            assert!(u.iter().all(|v| (lo..hi).contains(v)), "[{lo}, {hi})");
            assert!(u.windows(2).any(|w| w[0] != w[1]), "[{lo}, {hi})");
        }
        // 1 + (1 - 2^-24) rounds to 2: the largest u in [1, 2) must still land below 2.
        let top = (1.0f32 - f32::EPSILON / 2.0).mul_add(1.0, 1.0);
        assert_eq!(top, 2.0);
        assert_eq!(float_below(2.0), 2.0 - f32::EPSILON);
    }

    #[test]
    fn indices_are_below_rows_and_cover_them() {
        for rows in [1u32, 2, 7, 1000] {
            let idx = rng_indices_reference(5, 0, Substream(0), rows, 20_000);
            assert!(idx.iter().all(|&i| i < rows), "{rows}");
            let distinct: std::collections::HashSet<_> = idx.iter().collect();
            assert_eq!(distinct.len(), rows as usize, "{rows}");
        }
    }

    #[test]
    fn normals_have_mean_zero_and_unit_variance() {
        let z = rng_normal_reference(11, 3, Substream(0), 100_000);
        let mean = z.iter().map(|&v| f64::from(v)).sum::<f64>() / z.len() as f64;
        let var = z
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / z.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.02,
            "{mean} {var}"
        );
        assert!(z.iter().all(|v| v.abs() < 5.8));
        // Another counter, other values.
        assert_ne!(z[..8], rng_normal_reference(11, 4, Substream(0), 8)[..]);
    }

    #[test]
    fn gathers_rows_and_nan_for_an_index_out_of_range() {
        let src = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let got = gather_rows_reference(&src, &[2, 0, 3], 2);
        assert_eq!(got[..4], [5.0, 6.0, 1.0, 2.0]);
        assert!(got[4].is_nan() && got[5].is_nan());
    }

    #[test]
    fn a_table_gathers_every_entry_at_the_same_rows() {
        let (s, r) = ([1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [10.0f32, 20.0, 30.0]);
        let got = gather_rows_table_reference(&[(&s, 2), (&r, 1)], &[2, 0]);
        assert_eq!(got, [vec![5.0, 6.0, 1.0, 2.0], vec![30.0, 10.0]]);
    }

    #[test]
    fn sums() {
        let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(column_sums_reference(&x, 2, 3), vec![5.0, 7.0, 9.0]);
        assert_eq!(column_sums_reference(&x, 3, 2), vec![9.0, 12.0]);
        assert_eq!(grad_sq_norm_reference(&[&x[..2], &x[2..3]]), 14.0);
    }
}
