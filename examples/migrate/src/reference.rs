//! The training step computed on the CPU in `f64`, written from the math in
//! [`model`](crate::model) rather than from the kernels, to check the GPU step against.
//!
//! The GPU step is `f32`, with exact `f32` GEMM products, and sums up to `B·N` terms in
//! another order; the GPU test allows it a relative error
//! ([`rel_err`](stepgraph_testkit::rel_err)) of `2e-5` on the trunk's features, `3e-5` on
//! the heads' outputs (whose cosine embedding rounds `(i + 1)·tau` to `f32`, a `3e-6`
//! effect at the default sizes), `1e-4` on losses and gradients and `1e-6` on updated
//! weights.

use crate::host::{HostData, HostLinear, HostParams};
use crate::model::{Dims, HUBER_KAPPA};

/// A linear layer in `f64`.
#[derive(Clone, Debug, PartialEq)]
pub struct Lin {
    /// `[out, in]`.
    pub w: Vec<f64>,
    /// `[out]`.
    pub b: Vec<f64>,
}

impl From<&HostLinear> for Lin {
    fn from(l: &HostLinear) -> Lin {
        Lin {
            w: l.w.iter().map(|&v| v as f64).collect(),
            b: l.b.iter().map(|&v| v as f64).collect(),
        }
    }
}

/// `y[rows, out] = act(x[rows, input]·wᵀ + b)`, reading `x`'s rows `ld` apart.
fn linear(x: &[f64], rows: usize, input: usize, ld: usize, l: &Lin, relu: bool) -> Vec<f64> {
    let out = l.b.len();
    let mut y = vec![0.0; rows * out];
    for r in 0..rows {
        let xr = &x[r * ld..r * ld + input];
        for o in 0..out {
            let wo = &l.w[o * input..(o + 1) * input];
            let v = l.b[o] + xr.iter().zip(wo).map(|(a, b)| a * b).sum::<f64>();
            y[r * out + o] = if relu { v.max(0.0) } else { v };
        }
    }
    y
}

/// `(Σ_r dy[r, o]·x[r, i], Σ_r dy[r, o])`: the gradient of a linear layer's `w` and `b`
/// from `dy [rows, out]` and its input `x` (rows `ld` apart).
fn linear_grad(dy: &[f64], x: &[f64], rows: usize, out: usize, input: usize, ld: usize) -> Lin {
    let mut g = Lin {
        w: vec![0.0; out * input],
        b: vec![0.0; out],
    };
    for r in 0..rows {
        for o in 0..out {
            let d = dy[r * out + o];
            g.b[o] += d;
            for i in 0..input {
                g.w[o * input + i] += d * x[r * ld + i];
            }
        }
    }
    g
}

/// The trunk's features `h [B, H]`.
pub fn trunk(d: &Dims, l1: &Lin, l2: &Lin, x: &[f32]) -> Vec<f64> {
    let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let h1 = linear(&x, d.batch, d.input, d.input, l1, true);
    linear(&h1, d.batch, d.hidden, d.hidden, l2, true)
}

/// The IQN head's forward pass, loss and output-layer gradient.
#[derive(Clone, Debug)]
pub struct Iqn {
    /// `z [B N, A]`.
    pub z: Vec<f64>,
    /// `L_iqn`.
    pub loss: f64,
    /// `∂L_iqn/∂(wz, bz)`.
    pub grad: Lin,
}

/// The IQN head on features `h`, with the embedding `embed` and output layer `out`.
pub fn iqn(d: &Dims, embed: &Lin, out: &Lin, data: &HostData, h: &[f64]) -> Iqn {
    let (b, n, c, hd, a) = (d.batch, d.quantiles, d.cos_dim, d.hidden, d.actions);
    let rows = b * n;
    let mut cosf = vec![0.0; rows * c];
    for (r, &t) in data.tau.iter().enumerate() {
        for i in 0..c {
            cosf[r * c + i] = (std::f64::consts::PI * (i + 1) as f64 * t as f64).cos();
        }
    }
    let phi = linear(&cosf, rows, c, c, embed, true);
    let mut g = vec![0.0; rows * hd];
    for r in 0..rows {
        for k in 0..hd {
            g[r * hd + k] = phi[r * hd + k] * h[(r / n) * hd + k];
        }
    }
    let z = linear(&g, rows, hd, hd, out, false);
    let kappa = HUBER_KAPPA as f64;
    let mean = 1.0 / (rows * a) as f64;
    let mut loss = 0.0;
    let mut dz = vec![0.0; rows * a];
    for r in 0..rows {
        let tau = data.tau[r] as f64;
        for o in 0..a {
            let u = data.iqn_target[(r / n) * a + o] as f64 - z[r * a + o];
            let w = (tau - if u < 0.0 { 1.0 } else { 0.0 }).abs();
            let huber = if u.abs() <= kappa {
                0.5 * u * u
            } else {
                kappa * (u.abs() - 0.5 * kappa)
            };
            loss += w * huber;
            dz[r * a + o] = -mean * w * u.clamp(-kappa, kappa);
        }
    }
    Iqn {
        grad: linear_grad(&dz, &g, rows, a, hd, hd),
        z,
        loss: mean * loss,
    }
}

/// The attention head's forward pass, loss and output-layer gradient.
#[derive(Clone, Debug)]
pub struct Attention {
    /// The softmax of the scores, `[B T, T]`.
    pub p: Vec<f64>,
    /// `pred [B, R]`.
    pub pred: Vec<f64>,
    /// `L_attn`.
    pub loss: f64,
    /// `∂L_attn/∂(wo, bo)`.
    pub grad: Lin,
}

/// The attention head on features `h`.
pub fn attention(
    d: &Dims,
    tokens: &Lin,
    qkv: &Lin,
    out: &Lin,
    target: &[f32],
    h: &[f64],
) -> Attention {
    let (b, t, e, r) = (d.batch, d.tokens, d.width, d.outputs);
    let tok = linear(h, b, d.hidden, d.hidden, tokens, true);
    let qkv = linear(&tok, b * t, e, e, qkv, false);
    let row = |bb: usize, i: usize| &qkv[(bb * t + i) * 3 * e..(bb * t + i + 1) * 3 * e];
    let scale = 1.0 / (e as f64).sqrt();
    let mut p = vec![0.0; b * t * t];
    let mut ctx = vec![0.0; b * t * e];
    for bb in 0..b {
        for i in 0..t {
            let q = &row(bb, i)[..e];
            let s: Vec<f64> = (0..t)
                .map(|j| {
                    scale
                        * q.iter()
                            .zip(&row(bb, j)[e..2 * e])
                            .map(|(x, y)| x * y)
                            .sum::<f64>()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
            for j in 0..t {
                let pij = (s[j] - m).exp() / z;
                p[(bb * t + i) * t + j] = pij;
                for k in 0..e {
                    ctx[(bb * t + i) * e + k] += pij * row(bb, j)[2 * e + k];
                }
            }
        }
    }
    // Token 0 of each sample: rows t·e apart.
    let pred = linear(&ctx, b, e, t * e, out, false);
    let mean = 1.0 / (b * r) as f64;
    let diff: Vec<f64> = pred
        .iter()
        .zip(target)
        .map(|(p, &y)| p - y as f64)
        .collect();
    let loss = mean * diff.iter().map(|v| v * v).sum::<f64>();
    let dpred: Vec<f64> = diff.iter().map(|v| 2.0 * mean * v).collect();
    Attention {
        grad: linear_grad(&dpred, &ctx, b, r, e, t * e),
        p,
        pred,
        loss,
    }
}

/// One training step from `params`: every output, and the parameters after it.
#[derive(Clone, Debug)]
pub struct Step {
    /// The trunk's features `h [B, H]`.
    pub h: Vec<f64>,
    /// The IQN head.
    pub iqn: Iqn,
    /// The attention head.
    pub attention: Attention,
    /// `params` with both output layers moved by `−lr·grad`, rounded to `f32`.
    pub next: HostParams,
}

/// The step the trainer captures: trunk, IQN head and update, attention head and update.
pub fn step(d: &Dims, lr: f32, params: &HostParams, data: &HostData) -> Step {
    let h = trunk(
        d,
        &(&params.trunk1).into(),
        &(&params.trunk2).into(),
        &data.x,
    );
    let iqn = iqn(
        d,
        &(&params.iqn_embed).into(),
        &(&params.iqn_out).into(),
        data,
        &h,
    );
    let attention = attention(
        d,
        &(&params.attn_tokens).into(),
        &(&params.attn_qkv).into(),
        &(&params.attn_out).into(),
        &data.attn_target,
        &h,
    );
    let sgd = |l: &HostLinear, g: &Lin| {
        let one = |w: &[f32], g: &[f64]| -> Vec<f32> {
            w.iter()
                .zip(g)
                .map(|(&w, &g)| (w as f64 - lr as f64 * g) as f32)
                .collect()
        };
        HostLinear {
            w: one(&l.w, &g.w),
            b: one(&l.b, &g.b),
        }
    };
    let mut next = params.clone();
    next.iqn_out = sgd(&params.iqn_out, &iqn.grad);
    next.attn_out = sgd(&params.attn_out, &attention.grad);
    Step {
        h,
        iqn,
        attention,
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host;

    fn setup() -> (Dims, HostParams, HostData, Vec<f64>) {
        let d = Dims::small();
        let (p, x) = host::init(&d, 5);
        let h = trunk(&d, &(&p.trunk1).into(), &(&p.trunk2).into(), &x.x);
        (d, p, x, h)
    }

    /// Central differences of `loss` at `(w, b)`, against `grad`, at every `stride`-th
    /// weight and every bias.
    fn check_grad(layer: &Lin, grad: &Lin, stride: usize, loss: impl Fn(&Lin) -> f64) {
        let eps = 1e-6;
        let probe = |at: &dyn Fn(&mut Lin) -> &mut f64| {
            let (mut up, mut down) = (layer.clone(), layer.clone());
            *at(&mut up) += eps;
            *at(&mut down) -= eps;
            (loss(&up) - loss(&down)) / (2.0 * eps)
        };
        for i in (0..layer.w.len()).step_by(stride) {
            let fd = probe(&|l: &mut Lin| &mut l.w[i]);
            assert!(
                (fd - grad.w[i]).abs() <= 1e-6 + 1e-4 * fd.abs(),
                "w[{i}]: {fd} vs {}",
                grad.w[i]
            );
        }
        for i in 0..layer.b.len() {
            let fd = probe(&|l: &mut Lin| &mut l.b[i]);
            assert!(
                (fd - grad.b[i]).abs() <= 1e-6 + 1e-4 * fd.abs(),
                "b[{i}]: {fd} vs {}",
                grad.b[i]
            );
        }
    }

    #[test]
    fn the_iqn_gradient_is_the_derivative_of_its_loss() {
        let (d, p, x, h) = setup();
        let embed = Lin::from(&p.iqn_embed);
        let out = Lin::from(&p.iqn_out);
        let r = iqn(&d, &embed, &out, &x, &h);
        assert!(r.loss > 0.0 && r.loss.is_finite());
        assert!(r.grad.w.iter().any(|&g| g != 0.0));
        check_grad(&out, &r.grad, 3, |l| iqn(&d, &embed, l, &x, &h).loss);
    }

    #[test]
    fn the_attention_gradient_is_the_derivative_of_its_loss() {
        let (d, p, x, h) = setup();
        let (tokens, qkv) = (Lin::from(&p.attn_tokens), Lin::from(&p.attn_qkv));
        let out = Lin::from(&p.attn_out);
        let r = attention(&d, &tokens, &qkv, &out, &x.attn_target, &h);
        assert!(r.loss > 0.0 && r.loss.is_finite());
        check_grad(&out, &r.grad, 1, |l| {
            attention(&d, &tokens, &qkv, l, &x.attn_target, &h).loss
        });
    }

    #[test]
    fn attention_weights_are_a_distribution_over_tokens() {
        let (d, p, x, h) = setup();
        let r = attention(
            &d,
            &(&p.attn_tokens).into(),
            &(&p.attn_qkv).into(),
            &(&p.attn_out).into(),
            &x.attn_target,
            &h,
        );
        for row in r.p.chunks(d.tokens) {
            assert!(row.iter().all(|&v| v > 0.0));
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
    }

    #[test]
    fn a_step_moves_only_the_output_layers_and_lowers_both_losses() {
        let (d, p, x, _) = setup();
        let lr = 0.05;
        let s = step(&d, lr, &p, &x);
        assert_eq!(s.next.trunk1, p.trunk1);
        assert_eq!(s.next.iqn_embed, p.iqn_embed);
        assert_eq!(s.next.attn_qkv, p.attn_qkv);
        assert_ne!(s.next.iqn_out, p.iqn_out);
        assert_ne!(s.next.attn_out, p.attn_out);
        let after = step(&d, lr, &s.next, &x);
        assert!(
            after.iqn.loss < s.iqn.loss,
            "{} -> {}",
            s.iqn.loss,
            after.iqn.loss
        );
        assert!(
            after.attention.loss < s.attention.loss,
            "{} -> {}",
            s.attention.loss,
            after.attention.loss
        );
    }
}
