//! CPU references of the SAC step's kernels (`cuda/sac.cu`), in f64 where the kernel
//! rounds differently (transcendentals), for the GPU tests to compare against; the unit
//! tests check the gradients against finite differences of the losses they come from.

use crate::kernels::{LOG_STD_MAX, LOG_STD_MIN, TANH_EPS};

/// `½ log 2π`.
const LOG_SQRT_2PI: f64 = 0.918_938_533_204_672_7;

/// `[x[b], a[b]]` for every row: `x [rows, xs]`, `a [rows, as_]`.
pub fn concat_cols_reference(x: &[f32], a: &[f32], rows: usize, xs: usize, as_: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * (xs + as_));
    for b in 0..rows {
        out.extend_from_slice(&x[b * xs..(b + 1) * xs]);
        out.extend_from_slice(&a[b * as_..(b + 1) * as_]);
    }
    out
}

/// `dz[i] = h[i] > 0 ? dz[i] : 0`.
pub fn relu_backward_reference(h: &[f32], dz: &mut [f32]) {
    for (d, &v) in dz.iter_mut().zip(h) {
        if v <= 0.0 || v.is_nan() {
            *d = 0.0;
        }
    }
}

/// `dz[b, j] = h[b, j] > 0 ? Σ_o dout[b, o] w[o, j] : 0` for `dout [rows, k]`,
/// `w [k, cols]`, the sum in `o` order as the kernel forms it (the first product, then
/// fused multiply-adds).
pub fn narrow_relu_grad_reference(dout: &[f32], w: &[f32], h: &[f32], k: usize) -> Vec<f32> {
    let cols = w.len() / k;
    h.iter()
        .enumerate()
        .map(|(i, &v)| {
            if v > 0.0 {
                let (b, j) = (i / cols, i % cols);
                let d = &dout[b * k..(b + 1) * k];
                (1..k).fold(d[0] * w[j], |acc, o| d[o].mul_add(w[o * cols + j], acc))
            } else {
                0.0
            }
        })
        .collect()
}

/// `(dq, loss)`: `dq = 2 (q − y) / n`, `loss = mean (q − y)²`.
pub fn mse_loss_reference(q: &[f32], y: &[f32]) -> (Vec<f32>, f32) {
    let n = q.len() as f64;
    let dq = q
        .iter()
        .zip(y)
        .map(|(&q, &y)| (2.0 * (f64::from(q) - f64::from(y)) / n) as f32)
        .collect();
    let loss = q
        .iter()
        .zip(y)
        .map(|(&q, &y)| (f64::from(q) - f64::from(y)).powi(2))
        .sum::<f64>()
        / n;
    (dq, loss as f32)
}

/// What [`Kernels::critic_head`](crate::kernels::Kernels::critic_head) computes, the sums
/// in f64: `(q, dq, dz, gw, gb, loss)` for `h [rows, cols]`, `w [cols]`, `bias`, `y [rows]`.
#[derive(Clone, Debug)]
pub struct CriticHead {
    pub q: Vec<f32>,
    pub dq: Vec<f32>,
    pub dz: Vec<f32>,
    pub gw: Vec<f32>,
    pub gb: f32,
    pub loss: f32,
    /// `Σ_rows dz`: the hidden layer's bias gradient.
    pub gb_hidden: Vec<f32>,
}

/// A critic's output layer `q = h w + bias`, its MSE against `y` and their backward:
/// `dq = 2 (q − y) / rows`, `dz = (dq wᵀ) ⊙ (h > 0)`, `gw = dqᵀ h`, `gb = Σ dq`,
/// `gb_hidden = Σ_rows dz`.
pub fn critic_head_reference(h: &[f32], w: &[f32], bias: f32, y: &[f32]) -> CriticHead {
    let (rows, cols) = (y.len(), w.len());
    let n = rows as f64;
    let mut out = CriticHead {
        q: Vec::with_capacity(rows),
        dq: Vec::with_capacity(rows),
        dz: Vec::with_capacity(rows * cols),
        gw: vec![0.0; cols],
        gb: 0.0,
        loss: 0.0,
        gb_hidden: Vec::new(),
    };
    let (mut gw, mut gb, mut sq) = (vec![0.0f64; cols], 0.0f64, 0.0f64);
    let mut gb_hidden = vec![0.0f64; cols];
    for (b, &yb) in y.iter().enumerate() {
        let row = &h[b * cols..(b + 1) * cols];
        let q = f64::from(bias)
            + row
                .iter()
                .zip(w)
                .map(|(&hv, &wv)| f64::from(hv) * f64::from(wv))
                .sum::<f64>();
        let d = q - f64::from(yb);
        let g = 2.0 * d / n;
        out.q.push(q as f32);
        out.dq.push(g as f32);
        for (j, &hv) in row.iter().enumerate() {
            let dz = if hv > 0.0 { g * f64::from(w[j]) } else { 0.0 };
            out.dz.push(dz as f32);
            gw[j] += g * f64::from(hv);
            gb_hidden[j] += dz;
        }
        gb += g;
        sq += d * d;
    }
    out.gw = gw.into_iter().map(|v| v as f32).collect();
    out.gb_hidden = gb_hidden.into_iter().map(|v| v as f32).collect();
    out.gb = gb as f32;
    out.loss = (sq / n) as f32;
    out
}

/// `dx[b, c] = Σ_j (h[b, j] > 0 ? dh[b, j] : 0) w[j, first + c]` for `c < n`, with
/// `h, dh [rows, cols]` and `w [cols, inp]`, the sums in f64.
pub fn relu_narrow_product_reference(
    dh: &[f32],
    h: &[f32],
    w: &[f32],
    inp: usize,
    first: usize,
    n: usize,
) -> Vec<f32> {
    let cols = w.len() / inp;
    let rows = h.len() / cols;
    let mut dx = Vec::with_capacity(rows * n);
    for b in 0..rows {
        for c in 0..n {
            let s: f64 = (0..cols)
                .filter(|&j| h[b * cols + j] > 0.0)
                .map(|j| f64::from(dh[b * cols + j]) * f64::from(w[j * inp + first + c]))
                .sum();
            dx.push(s as f32);
        }
    }
    dx
}

/// The clamped log standard deviation.
fn clamp_log_std(raw: f32) -> f64 {
    f64::from(raw.clamp(LOG_STD_MIN, LOG_STD_MAX))
}

/// `(act, logp)` of the tanh-Gaussian sample: `head [rows, 2 dims]`, `eps [rows, dims]`.
pub fn tanh_gauss_sample_reference(
    head: &[f32],
    eps: &[f32],
    rows: usize,
    dims: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut act = vec![0.0; rows * dims];
    let mut logp = vec![0.0; rows];
    for b in 0..rows {
        let mut lp = 0.0f64;
        for j in 0..dims {
            let mean = f64::from(head[b * 2 * dims + j]);
            let ls = clamp_log_std(head[b * 2 * dims + dims + j]);
            let e = f64::from(eps[b * dims + j]);
            let a = (mean + ls.exp() * e).tanh();
            act[b * dims + j] = a as f32;
            lp += -0.5 * e * e - ls - LOG_SQRT_2PI - (1.0 - a * a + f64::from(TANH_EPS)).ln();
        }
        logp[b] = lp as f32;
    }
    (act, logp)
}

/// `(qmin, argmin)` over the critics' outputs `qs[i] [n]`: the smallest, the lowest index
/// on a tie.
pub fn critic_min_reference(qs: &[&[f32]]) -> (Vec<f32>, Vec<u32>) {
    let n = qs.first().map_or(0, |q| q.len());
    let mut qmin = vec![0.0f32; n];
    let mut argmin = vec![0u32; n];
    for b in 0..n {
        for (i, q) in qs.iter().enumerate() {
            if i == 0 || q[b] < qmin[b] {
                qmin[b] = q[b];
                argmin[b] = i as u32;
            }
        }
    }
    (qmin, argmin)
}

/// `y = r + γ (1 − done) (qmin − exp(log_alpha) logp_next)`.
pub fn soft_target_reference(
    r: &[f32],
    done: &[f32],
    qmin: &[f32],
    logp_next: &[f32],
    log_alpha: f32,
    gamma: f32,
) -> Vec<f32> {
    let alpha = f64::from(log_alpha).exp();
    (0..r.len())
        .map(|i| {
            let v = f64::from(qmin[i]) - alpha * f64::from(logp_next[i]);
            (f64::from(r[i]) + f64::from(gamma) * (1.0 - f64::from(done[i])) * v) as f32
        })
        .collect()
}

/// The actor loss `mean(α logp − qmin)`.
pub fn actor_loss_reference(qmin: &[f32], logp: &[f32], log_alpha: f32) -> f32 {
    let alpha = f64::from(log_alpha).exp();
    let sum = qmin
        .iter()
        .zip(logp)
        .map(|(&q, &l)| alpha * f64::from(l) - f64::from(q))
        .sum::<f64>();
    (sum / qmin.len() as f64) as f32
}

/// The actor loss's gradient at the action, row by row from the critic smallest there
/// (`argmin`, [`critic_min_reference`]'s): `das[k]` `[rows, dims]` is critic `k`'s at every
/// row.
pub fn min_select_reference(argmin: &[u32], das: &[&[f32]], dims: usize) -> Vec<f32> {
    argmin
        .iter()
        .enumerate()
        .flat_map(|(b, &k)| das[k as usize][b * dims..(b + 1) * dims].iter().copied())
        .collect()
}

/// `dhead [rows, 2 dims]` of the actor loss (MODEL.md, "Actor"), from the sample's `head`,
/// `eps`, `act` and `da [rows, dims]`, the loss's gradient with respect to the action
/// through the critics.
#[allow(clippy::too_many_arguments)]
pub fn tanh_gauss_backward_reference(
    head: &[f32],
    eps: &[f32],
    act: &[f32],
    da: &[f32],
    log_alpha: f32,
    rows: usize,
    dims: usize,
) -> Vec<f32> {
    let scale = f64::from(log_alpha).exp() / rows as f64;
    let mut dhead = vec![0.0; rows * 2 * dims];
    for b in 0..rows {
        for j in 0..dims {
            let raw = head[b * 2 * dims + dims + j];
            let ls = clamp_log_std(raw);
            let a = f64::from(act[b * dims + j]);
            let one_minus = 1.0 - a * a;
            let g = 2.0 * a * one_minus / (one_minus + f64::from(TANH_EPS));
            let du = scale * g + f64::from(da[b * dims + j]) * one_minus;
            dhead[b * 2 * dims + j] = du as f32;
            let inside = (LOG_STD_MIN..=LOG_STD_MAX).contains(&raw);
            dhead[b * 2 * dims + dims + j] = if inside {
                (du * ls.exp() * f64::from(eps[b * dims + j]) - scale) as f32
            } else {
                0.0
            };
        }
    }
    dhead
}

/// `(grad, loss)` of the temperature: `−mean(logp + H̄)` and `−log_alpha mean(logp + H̄)`.
pub fn alpha_grad_reference(logp: &[f32], log_alpha: f32, target_entropy: f32) -> (f32, f32) {
    let mean = logp
        .iter()
        .map(|&l| f64::from(l) + f64::from(target_entropy))
        .sum::<f64>()
        / logp.len() as f64;
    (-mean as f32, (-f64::from(log_alpha) * mean) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepgraph_testkit::Rng;

    /// The actor's loss as a function of its head alone, the critics' input gradient
    /// replaced by a fixed linear term `Σ w ⊙ â`: `mean(α logp) + Σ w â`.
    fn head_loss(
        head: &[f32],
        eps: &[f32],
        w: &[f64],
        log_alpha: f32,
        rows: usize,
        dims: usize,
    ) -> f64 {
        let (act, logp) = tanh_gauss_sample_reference(head, eps, rows, dims);
        // Recomputed in f64 for the finite differences: act and logp are rounded to f32.
        let alpha = f64::from(log_alpha).exp();
        let mut total = 0.0;
        for b in 0..rows {
            let mut lp = 0.0;
            for j in 0..dims {
                let mean = f64::from(head[b * 2 * dims + j]);
                let ls = clamp_log_std(head[b * 2 * dims + dims + j]);
                let e = f64::from(eps[b * dims + j]);
                let a = (mean + ls.exp() * e).tanh();
                lp += -0.5 * e * e - ls - LOG_SQRT_2PI - (1.0 - a * a + f64::from(TANH_EPS)).ln();
                total += w[b * dims + j] * a;
            }
            total += alpha * lp / rows as f64;
        }
        let _ = (act, logp);
        total
    }

    #[test]
    fn the_head_gradient_matches_finite_differences_of_the_actor_loss() {
        let (rows, dims) = (3, 4);
        let mut rng = Rng::new(11);
        let mut head = rng.vec(rows * 2 * dims, -1.0, 1.0);
        // One log_std past each clamp: no gradient reaches it.
        head[dims] = 3.0;
        head[2 * dims + dims + 1] = -25.0;
        let eps = rng.vec(rows * dims, -1.5, 1.5);
        let log_alpha = -0.7f32;
        // The critics' summed action gradient plays the role of w.
        let da = rng.vec(rows * dims, -0.5, 0.5);
        let w: Vec<f64> = da.iter().map(|&v| f64::from(v)).collect();
        let (act, _) = tanh_gauss_sample_reference(&head, &eps, rows, dims);
        let dhead = tanh_gauss_backward_reference(&head, &eps, &act, &da, log_alpha, rows, dims);
        for k in 0..head.len() {
            let h = 1e-3f32;
            let (mut up, mut down) = (head.clone(), head.clone());
            up[k] += h;
            down[k] -= h;
            let fd = (head_loss(&up, &eps, &w, log_alpha, rows, dims)
                - head_loss(&down, &eps, &w, log_alpha, rows, dims))
                / (f64::from(up[k]) - f64::from(down[k]));
            let got = f64::from(dhead[k]);
            assert!(
                (got - fd).abs() <= 2e-3 * fd.abs().max(1e-2),
                "dhead[{k}]: {got} against finite differences {fd}"
            );
        }
        assert_eq!(dhead[dims], 0.0);
        assert_eq!(dhead[2 * dims + dims + 1], 0.0);
    }

    #[test]
    fn the_critic_and_temperature_gradients_are_their_losses_derivatives() {
        let mut rng = Rng::new(3);
        let q = rng.vec(50, -2.0, 2.0);
        let y = rng.vec(50, -2.0, 2.0);
        let (dq, loss) = mse_loss_reference(&q, &y);
        let mut up = q.clone();
        up[7] += 1e-2;
        let (_, loss_up) = mse_loss_reference(&up, &y);
        let fd = (f64::from(loss_up) - f64::from(loss)) / f64::from(up[7] - q[7]);
        assert!((fd - f64::from(dq[7])).abs() < 1e-3, "{fd} {}", dq[7]);
        let logp = rng.vec(50, -10.0, 5.0);
        let (g, l) = alpha_grad_reference(&logp, 0.3, -8.0);
        let (_, l2) = alpha_grad_reference(&logp, 0.31, -8.0);
        assert!(((f64::from(l2) - f64::from(l)) / 0.01 - f64::from(g)).abs() < 1e-3);
    }

    #[test]
    fn the_actor_loss_sends_its_gradient_to_the_smallest_critic() {
        let (q1, q2, q3) = (
            [1.0, 3.0, 2.0, 5.0],
            [2.0, 1.0, 2.0, 5.0],
            [4.0, 4.0, 0.5, 5.0],
        );
        let (two, argmin2) = critic_min_reference(&[&q1, &q2]);
        assert_eq!(
            (two, argmin2.clone()),
            (vec![1.0, 1.0, 2.0, 5.0], vec![0, 1, 0, 0])
        );
        let (three, argmin3) = critic_min_reference(&[&q1, &q2, &q3]);
        assert_eq!(
            (three.clone(), argmin3.clone()),
            (vec![1.0, 1.0, 0.5, 5.0], vec![0, 1, 2, 0])
        );
        // Each row's gradient from its smallest critic: two columns, critic k's are k.k.
        let das: Vec<Vec<f32>> = (0..3).map(|k| vec![k as f32 + 0.5; 8]).collect();
        let das: Vec<&[f32]> = das.iter().map(|d| d.as_slice()).collect();
        assert_eq!(
            min_select_reference(&argmin3, &das, 2),
            [0.5, 0.5, 1.5, 1.5, 2.5, 2.5, 0.5, 0.5]
        );
        let loss = actor_loss_reference(&three, &[0.5; 4], 0.0);
        assert!((loss - (0.5 - 7.5 / 4.0)).abs() < 1e-6, "{loss}");
    }

    #[test]
    fn the_sample_is_in_range_and_its_log_prob_is_the_corrected_density() {
        // One dimension, mean 0, log_std 0, eps 0: a = 0, logp = -½ log 2π - log(1 + 1e-6).
        let (act, logp) = tanh_gauss_sample_reference(&[0.0, 0.0], &[0.0], 1, 1);
        assert_eq!(act, [0.0]);
        assert!((f64::from(logp[0]) + LOG_SQRT_2PI).abs() < 1e-5);
        let mut rng = Rng::new(5);
        let head = rng.vec(64 * 16, -3.0, 3.0);
        let eps = rng.vec(64 * 8, -3.0, 3.0);
        let (act, logp) = tanh_gauss_sample_reference(&head, &eps, 64, 8);
        assert!(act.iter().all(|a| a.abs() <= 1.0));
        assert!(logp.iter().all(|l| l.is_finite()));
    }

    #[test]
    fn concat_relu_and_target_are_what_they_say() {
        let out = concat_cols_reference(&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0], 2, 2, 1);
        assert_eq!(out, [1.0, 2.0, 5.0, 3.0, 4.0, 6.0]);
        let mut dz = [1.0, 2.0, 3.0];
        relu_backward_reference(&[0.5, 0.0, -1.0], &mut dz);
        assert_eq!(dz, [1.0, 0.0, 0.0]);
        let y = soft_target_reference(&[1.0, 1.0], &[0.0, 1.0], &[2.0, 2.0], &[1.0, 1.0], 0.0, 0.5);
        assert_eq!(y, [1.5, 1.0]);
    }

    #[test]
    fn the_narrow_matmul_is_the_product_through_the_relu() {
        // dout [2, 2], w [2, 3]: row 0 = [1, 2] · w, row 1 = [-1, 0.5] · w, masked by h.
        let dout = [1.0, 2.0, -1.0, 0.5];
        let w = [1.0, 0.0, -2.0, 3.0, 4.0, 0.25];
        let h = [1.0, 0.0, 2.0, -1.0, 3.0, 0.5];
        let dz = narrow_relu_grad_reference(&dout, &w, &h, 2);
        assert_eq!(dz, [7.0, 0.0, -1.5, 0.0, 2.0, 2.125]);
        // Against f64 at random sizes: the f32 sum is within its rounding.
        let mut rng = Rng::new(9);
        let (rows, k, cols) = (5, 16, 7);
        let (dout, w, h) = (
            rng.vec(rows * k, -1.0, 1.0),
            rng.vec(k * cols, -1.0, 1.0),
            rng.vec(rows * cols, -1.0, 1.0),
        );
        let dz = narrow_relu_grad_reference(&dout, &w, &h, k);
        for (i, (&got, &hv)) in dz.iter().zip(&h).enumerate() {
            let (b, j) = (i / cols, i % cols);
            let exact: f64 = (0..k)
                .map(|o| f64::from(dout[b * k + o]) * f64::from(w[o * cols + j]))
                .sum();
            let want = if hv > 0.0 { exact } else { 0.0 };
            assert!(
                (f64::from(got) - want).abs() < 1e-5,
                "{i}: {got} against {want}"
            );
        }
    }

    /// The critic's MSE as a function of its output layer and of the pre-activation `z`
    /// of its last hidden layer (`h = relu(z)`), in f64.
    fn critic_loss(z: &[f64], w: &[f64], bias: f64, y: &[f32]) -> f64 {
        let cols = w.len();
        y.iter()
            .enumerate()
            .map(|(b, &yb)| {
                let q: f64 = bias
                    + (0..cols)
                        .map(|j| z[b * cols + j].max(0.0) * w[j])
                        .sum::<f64>();
                (q - f64::from(yb)).powi(2)
            })
            .sum::<f64>()
            / y.len() as f64
    }

    #[test]
    fn the_critic_heads_gradients_match_finite_differences_of_its_loss() {
        let (rows, cols) = (5, 7);
        let mut rng = Rng::new(23);
        // The pre-activation z; the kernel is given h = relu(z).
        let z32 = rng.vec(rows * cols, -1.0, 1.0);
        let h: Vec<f32> = z32.iter().map(|&v| v.max(0.0)).collect();
        let (w, y) = (rng.vec(cols, -1.0, 1.0), rng.vec(rows, -2.0, 2.0));
        let bias = 0.3f32;
        let got = critic_head_reference(&h, &w, bias, &y);
        let z: Vec<f64> = z32.iter().map(|&v| f64::from(v)).collect();
        let w64: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        let step = 1e-4;
        let fd = |f: &dyn Fn(f64) -> f64| (f(step) - f(-step)) / (2.0 * step);
        let close = |what: &str, got: f32, want: f64| {
            assert!(
                (f64::from(got) - want).abs() <= 1e-6 + 1e-4 * want.abs(),
                "{what}: {got} against {want}"
            );
        };
        close("loss", got.loss, critic_loss(&z, &w64, f64::from(bias), &y));
        close(
            "gb",
            got.gb,
            fd(&|e| critic_loss(&z, &w64, f64::from(bias) + e, &y)),
        );
        for j in 0..cols {
            let moved = |e: f64| {
                let mut w2 = w64.clone();
                w2[j] += e;
                critic_loss(&z, &w2, f64::from(bias), &y)
            };
            close(&format!("gw[{j}]"), got.gw[j], fd(&moved));
            // The hidden layer's bias moves column j of z in every row.
            let shifted = |e: f64| {
                let mut z2 = z.clone();
                z2.iter_mut().skip(j).step_by(cols).for_each(|v| *v += e);
                critic_loss(&z2, &w64, f64::from(bias), &y)
            };
            close(&format!("gb_hidden[{j}]"), got.gb_hidden[j], fd(&shifted));
        }
        for k in 0..rows * cols {
            let moved = |e: f64| {
                let mut z2 = z.clone();
                z2[k] += e;
                critic_loss(&z2, &w64, f64::from(bias), &y)
            };
            // Away from the kink at 0 (|z| > step for these inputs).
            assert!(z[k].abs() > step);
            close(&format!("dz[{k}]"), got.dz[k], fd(&moved));
        }
    }

    #[test]
    fn the_narrow_product_is_relus_backward_then_the_matmul() {
        let (rows, cols, inp, first, n) = (3, 5, 6, 2, 3);
        let mut rng = Rng::new(29);
        let (h, dh) = (
            rng.vec(rows * cols, -1.0, 1.0),
            rng.vec(rows * cols, -1.0, 1.0),
        );
        let w = rng.vec(cols * inp, -1.0, 1.0);
        let got = relu_narrow_product_reference(&dh, &h, &w, inp, first, n);
        let mut dz = dh.clone();
        relu_backward_reference(&h, &mut dz);
        for b in 0..rows {
            for c in 0..n {
                let want: f64 = (0..cols)
                    .map(|j| f64::from(dz[b * cols + j]) * f64::from(w[j * inp + first + c]))
                    .sum();
                assert!((f64::from(got[b * n + c]) - want).abs() <= 1e-6, "{b} {c}");
            }
        }
    }
}
