//! GPU tests of cuBLASLt matmuls (`Blas::matmul` through a `BlasSession`): every
//! precision, transposes, epilogues, the dry pass and the plan cache. They need a CUDA
//! GPU (compute capability 9.0) with the CUDA 13 driver and cuBLASLt.
//!
//! Each test fills its inputs from a seeded generator, poisons the outputs with NaN (so an
//! element the matmul did not write fails the check), and compares with a row-major f64
//! reference by relative error `‖out − ref‖ / ‖ref‖`. Bounds: exact f32 1e-5 (f32
//! accumulation of k ≤ 128 products of O(1) values is good to about 1e-6); TF32 2e-3
//! (inputs rounded to a 10-bit mantissa, unit roundoff 2⁻¹¹ ≈ 4.9e-4, about 7e-4
//! expected); bf16 2e-2 (bf16 output, unit roundoff 2⁻⁸ ≈ 3.9e-3, the references use the
//! bf16-rounded inputs).

use super::{Rng, nan_buffer};
use half::bf16;
use stepgraph::exec::{BlasSession, Executor, Issue, Mode};
use stepgraph::plan::{OpDesc, OpId, PlanDesc, StreamDesc, StreamId};
use stepgraph::{
    Device, Epilogue, Error, Matmul, MatmulArgs, Precision, Result, Schedule, SmTarget,
};
use stepgraph_testkit::rel_err;

const F32_BOUND: f64 = 1e-5;
const TF32_BOUND: f64 = 2e-3;
const BF16_BOUND: f64 = 2e-2;

fn setup() -> Result<(Device, BlasSession)> {
    let device = Device::new(0)?;
    let session = BlasSession::new(&device)?;
    Ok((device, session))
}

fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}
fn check(what: &str, out: &[f64], reference: &[f64], bound: f64) {
    let err = rel_err(out, reference);
    eprintln!("{what}: relative error {err:.3e} (bound {bound:.0e})");
    assert!(
        err < bound,
        "{what}: relative error {err:e} is not under {bound:e}"
    );
}

/// Row-major `op(A)[m, k] · op(B)[k, n]` in f64, A stored `k × m` when `trans_a`, B
/// stored `n × k` when `trans_b`.
fn host_matmul(spec: &Matmul, a: &[f64], b: &[f64]) -> Vec<f64> {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    let op_a = |i: usize, l: usize| {
        if spec.trans_a {
            a[l * m + i]
        } else {
            a[i * k + l]
        }
    };
    let op_b = |l: usize, j: usize| {
        if spec.trans_b {
            b[j * k + l]
        } else {
            b[l * n + j]
        }
    };
    let mut d = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            d[i * n + j] = (0..k).map(|l| op_a(i, l) * op_b(l, j)).sum();
        }
    }
    d
}

/// cuBLASLt's GELU, the tanh approximation.
fn gelu(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

/// Derivative of [`gelu`].
fn gelu_grad(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let t = (c * (x + 0.044715 * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
}

/// Column sums of a row-major `m × n` matrix: the bias gradient of `D[i, j] = … + b[j]`.
fn column_sums(d: &[f64], m: usize, n: usize) -> Vec<f64> {
    (0..n).map(|j| (0..m).map(|i| d[i * n + j]).sum()).collect()
}

/// Bit `(i, j)` of a ReLU mask with `ld_bits` bits per row.
fn mask_bit(mask: &[u8], ld_bits: usize, i: usize, j: usize) -> bool {
    mask[i * ld_bits / 8 + j / 8] & (1 << (j % 8)) != 0
}

/// Scale that keeps `Σₖ a·b` of O(1) size for uniform inputs.
fn input_scale(k: usize) -> f32 {
    (3.0 / k as f32).sqrt()
}

#[test]
fn gpu_matmul_f32_all_transposes_with_alpha_beta_and_c() -> Result<()> {
    let (device, session) = setup()?;
    let (m, n, k) = (96, 80, 112);
    let mut rng = Rng::new(1);
    for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
        let spec = Matmul::new(m, n, k)
            .with_trans_a(trans_a)
            .with_trans_b(trans_b);
        let a = rng.fill(m * k, input_scale(k));
        let b = rng.fill(k * n, 1.0);
        let c = rng.fill(m * n, 1.0);
        let a_dev = device.upload_new("a", &a)?;
        let b_dev = device.upload_new("b", &b)?;
        let c_dev = device.upload_new("c", &c)?;
        let mut d_dev = nan_buffer(&device, "d", m * n)?;
        let args = MatmulArgs::new().alpha(0.75).beta(0.5).c(&c_dev);
        session
            .blas(Mode::Eager)
            .matmul(&spec, &a_dev, &b_dev, &mut d_dev, args)?;
        session.synchronize()?;
        let p = host_matmul(&spec, &to_f64(&a), &to_f64(&b));
        let reference: Vec<f64> = p
            .iter()
            .zip(&c)
            .map(|(p, &c)| 0.75 * p + 0.5 * f64::from(c))
            .collect();
        check(
            &format!("f32 trans_a={trans_a} trans_b={trans_b}"),
            &to_f64(&device.download(&d_dev)?),
            &reference,
            F32_BOUND,
        );
    }
    Ok(())
}

#[test]
fn gpu_matmul_f32_without_c_accumulates_into_d_in_place() -> Result<()> {
    let (device, session) = setup()?;
    let (m, n, k) = (64, 48, 32);
    let spec = Matmul::new(m, n, k).with_trans_b(true);
    let mut rng = Rng::new(2);
    let a = rng.fill(m * k, input_scale(k));
    let b = rng.fill(n * k, 1.0);
    let d0 = rng.fill(m * n, 1.0);
    let a_dev = device.upload_new("a", &a)?;
    let b_dev = device.upload_new("b", &b)?;
    let mut d_dev = device.upload_new("d", &d0)?;
    session.blas(Mode::Eager).matmul(
        &spec,
        &a_dev,
        &b_dev,
        &mut d_dev,
        MatmulArgs::new().beta(1.0),
    )?;
    session.synchronize()?;
    let p = host_matmul(&spec, &to_f64(&a), &to_f64(&b));
    let reference: Vec<f64> = p.iter().zip(&d0).map(|(p, &d)| p + f64::from(d)).collect();
    check(
        "f32 D += A·Bᵀ",
        &to_f64(&device.download(&d_dev)?),
        &reference,
        F32_BOUND,
    );
    Ok(())
}

#[test]
fn gpu_matmul_tf32_is_within_tf32_rounding() -> Result<()> {
    let (device, session) = setup()?;
    let (m, n, k) = (128, 96, 128);
    let spec = Matmul::new(m, n, k)
        .with_trans_b(true)
        .with_precision(Precision::Tf32);
    let mut rng = Rng::new(3);
    let a = rng.fill(m * k, input_scale(k));
    let b = rng.fill(n * k, 1.0);
    let a_dev = device.upload_new("a", &a)?;
    let b_dev = device.upload_new("b", &b)?;
    let mut d_dev = nan_buffer(&device, "d", m * n)?;
    session
        .blas(Mode::Eager)
        .matmul(&spec, &a_dev, &b_dev, &mut d_dev, MatmulArgs::new())?;
    session.synchronize()?;
    let reference = host_matmul(&spec, &to_f64(&a), &to_f64(&b));
    check(
        "tf32",
        &to_f64(&device.download(&d_dev)?),
        &reference,
        TF32_BOUND,
    );
    Ok(())
}

#[test]
fn gpu_matmul_bf16_with_transposes_and_bias() -> Result<()> {
    let (device, session) = setup()?;
    let (m, n, k) = (64, 128, 96);
    let mut rng = Rng::new(4);
    for (trans_a, epilogue) in [(false, Epilogue::Default), (true, Epilogue::Bias)] {
        let spec = Matmul::new(m, n, k)
            .with_trans_a(trans_a)
            .with_trans_b(true)
            .with_precision(Precision::Bf16)
            .with_epilogue(epilogue);
        let to_bf16 = |x: Vec<f32>| x.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
        let a = to_bf16(rng.fill(m * k, input_scale(k)));
        let b = to_bf16(rng.fill(n * k, 1.0));
        let bias = to_bf16(rng.fill(n, 1.0));
        let a_dev = device.upload_new("a", &a)?;
        let b_dev = device.upload_new("b", &b)?;
        let bias_dev = device.upload_new("bias", &bias)?;
        let mut d_dev = device.upload_new("d", &vec![bf16::NAN; m * n])?;
        let args = if epilogue == Epilogue::Bias {
            MatmulArgs::new().bias(&bias_dev)
        } else {
            MatmulArgs::new()
        };
        session
            .blas(Mode::Eager)
            .matmul(&spec, &a_dev, &b_dev, &mut d_dev, args)?;
        session.synchronize()?;
        let wide = |x: &[bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
        let mut reference = host_matmul(&spec, &wide(&a), &wide(&b));
        if epilogue == Epilogue::Bias {
            for (x, j) in reference.iter_mut().zip((0..n).cycle()) {
                *x += bias[j].to_f64();
            }
        }
        check(
            &format!("bf16 trans_a={trans_a} {epilogue:?}"),
            &wide(&device.download(&d_dev)?),
            &reference,
            BF16_BOUND,
        );
    }
    Ok(())
}

/// One forward epilogue with a bias in f32: `D = act(A·Bᵀ + bias)`, bias by column.
fn forward_with_bias(epilogue: Epilogue, act: fn(f64) -> f64, bound: f64) -> Result<()> {
    let (device, session) = setup()?;
    let (m, n, k) = (64, 96, 80);
    let spec = Matmul::new(m, n, k)
        .with_trans_b(true)
        .with_epilogue(epilogue);
    let mut rng = Rng::new(5);
    let a = rng.fill(m * k, input_scale(k));
    let b = rng.fill(n * k, 1.0);
    let bias = rng.fill(n, 1.0);
    let a_dev = device.upload_new("a", &a)?;
    let b_dev = device.upload_new("b", &b)?;
    let bias_dev = device.upload_new("bias", &bias)?;
    let mut d_dev = nan_buffer(&device, "d", m * n)?;
    session.blas(Mode::Eager).matmul(
        &spec,
        &a_dev,
        &b_dev,
        &mut d_dev,
        MatmulArgs::new().bias(&bias_dev),
    )?;
    session.synchronize()?;
    let p = host_matmul(&spec, &to_f64(&a), &to_f64(&b));
    let reference: Vec<f64> = p
        .iter()
        .enumerate()
        .map(|(x, p)| act(p + f64::from(bias[x % n])))
        .collect();
    check(
        &format!("f32 {epilogue:?}"),
        &to_f64(&device.download(&d_dev)?),
        &reference,
        bound,
    );
    Ok(())
}

#[test]
fn gpu_matmul_bias_adds_the_bias_to_every_row() -> Result<()> {
    forward_with_bias(Epilogue::Bias, |x| x, F32_BOUND)
}

#[test]
fn gpu_matmul_relu_bias() -> Result<()> {
    forward_with_bias(Epilogue::ReluBias, |x| x.max(0.0), F32_BOUND)
}

#[test]
fn gpu_matmul_gelu_bias_is_the_tanh_approximation() -> Result<()> {
    forward_with_bias(Epilogue::GeluBias, gelu, F32_BOUND)
}

#[test]
fn gpu_matmul_gelu_aux_bias_saves_the_gelu_input_with_padded_rows() -> Result<()> {
    let (device, session) = setup()?;
    // n = 100 is not a multiple of 8, so each aux row is padded to 104 elements.
    let (m, n, k) = (32, 100, 64);
    let spec = Matmul::new(m, n, k)
        .with_trans_b(true)
        .with_epilogue(Epilogue::GeluAuxBias);
    let ld = spec.aux_ld().unwrap();
    assert_eq!(ld, 104);
    let mut rng = Rng::new(6);
    let a = rng.fill(m * k, input_scale(k));
    let b = rng.fill(n * k, 1.0);
    let bias = rng.fill(n, 1.0);
    let a_dev = device.upload_new("a", &a)?;
    let b_dev = device.upload_new("b", &b)?;
    let bias_dev = device.upload_new("bias", &bias)?;
    let mut d_dev = nan_buffer(&device, "d", m * n)?;
    let mut aux_dev = nan_buffer(&device, "gelu input", spec.aux_len().unwrap())?;
    session.blas(Mode::Eager).matmul(
        &spec,
        &a_dev,
        &b_dev,
        &mut d_dev,
        MatmulArgs::new()
            .bias(&bias_dev)
            .save_gelu_input(&mut aux_dev),
    )?;
    session.synchronize()?;
    let p = host_matmul(&spec, &to_f64(&a), &to_f64(&b));
    let pre: Vec<f64> = p
        .iter()
        .enumerate()
        .map(|(x, p)| p + f64::from(bias[x % n]))
        .collect();
    let aux = device.download(&aux_dev)?;
    let saved: Vec<f64> = (0..m * n)
        .map(|x| f64::from(aux[(x / n) * ld + x % n]))
        .collect();
    check("f32 GeluAuxBias saved input", &saved, &pre, F32_BOUND);
    let reference: Vec<f64> = pre.iter().map(|&x| gelu(x)).collect();
    check(
        "f32 GeluAuxBias output",
        &to_f64(&device.download(&d_dev)?),
        &reference,
        F32_BOUND,
    );
    Ok(())
}

/// The MLP backward this epilogue is for: forward `h = relu(x·w1ᵀ + b1)` saves the mask;
/// backward `dpre = (dy·w2) ⊙ mask`, `db1 = Σ_batch dpre` (column sums).
#[test]
fn gpu_matmul_relu_mask_then_drelu_bgrad() -> Result<()> {
    let (device, session) = setup()?;
    let (batch, input, hidden, out) = (64, 48, 96, 40);
    let mut rng = Rng::new(7);

    // Forward: m = batch, n = hidden, k = input.
    let fwd = Matmul::new(batch, hidden, input)
        .with_trans_b(true)
        .with_epilogue(Epilogue::ReluAuxBias);
    let x = rng.fill(batch * input, input_scale(input));
    let w1 = rng.fill(hidden * input, 1.0);
    let b1 = rng.fill(hidden, 0.5);
    let x_dev = device.upload_new("x", &x)?;
    let w1_dev = device.upload_new("w1", &w1)?;
    let b1_dev = device.upload_new("b1", &b1)?;
    let mut h_dev = nan_buffer(&device, "h", batch * hidden)?;
    let mut mask_dev = device.alloc_zeros::<u8>("relu mask", fwd.aux_len().unwrap())?;
    session.blas(Mode::Eager).matmul(
        &fwd,
        &x_dev,
        &w1_dev,
        &mut h_dev,
        MatmulArgs::new()
            .bias(&b1_dev)
            .save_relu_mask(&mut mask_dev),
    )?;
    session.synchronize()?;
    let pre: Vec<f64> = host_matmul(&fwd, &to_f64(&x), &to_f64(&w1))
        .iter()
        .enumerate()
        .map(|(e, p)| p + f64::from(b1[e % hidden]))
        .collect();
    let h_ref: Vec<f64> = pre.iter().map(|p| p.max(0.0)).collect();
    check(
        "f32 ReluAuxBias output",
        &to_f64(&device.download(&h_dev)?),
        &h_ref,
        F32_BOUND,
    );
    // The mask layout the docs promise: row i at byte i·ld/8, bit j%8 of byte j/8,
    // set where the pre-activation is positive.
    let ld_bits = fwd.aux_ld().unwrap();
    let mask = device.download(&mask_dev)?;
    let mut wrong = 0;
    for i in 0..batch {
        for j in 0..hidden {
            let p = pre[i * hidden + j];
            // Too close to zero for f32 and f64 to agree on the sign.
            if p.abs() > 1e-4 && mask_bit(&mask, ld_bits, i, j) != (p > 0.0) {
                wrong += 1;
            }
        }
    }
    assert_eq!(
        wrong, 0,
        "mask bits disagreeing with the pre-activation sign"
    );

    // Backward: m = batch, n = hidden, k = out; w2 is [out, hidden], used as is.
    let bwd = Matmul::new(batch, hidden, out).with_epilogue(Epilogue::DReluBgrad);
    let dy = rng.fill(batch * out, input_scale(out));
    let w2 = rng.fill(out * hidden, 1.0);
    let dy_dev = device.upload_new("dy", &dy)?;
    let w2_dev = device.upload_new("w2", &w2)?;
    let mut dpre_dev = nan_buffer(&device, "dpre", batch * hidden)?;
    let mut db1_dev = nan_buffer(&device, "db1", hidden)?;
    session.blas(Mode::Eager).matmul(
        &bwd,
        &dy_dev,
        &w2_dev,
        &mut dpre_dev,
        MatmulArgs::new()
            .relu_mask(&mask_dev)
            .bias_grad(&mut db1_dev),
    )?;
    session.synchronize()?;
    let dh = host_matmul(&bwd, &to_f64(&dy), &to_f64(&w2));
    let dpre_ref: Vec<f64> = dh
        .iter()
        .enumerate()
        .map(|(e, g)| {
            if mask_bit(&mask, ld_bits, e / hidden, e % hidden) {
                *g
            } else {
                0.0
            }
        })
        .collect();
    check(
        "f32 DReluBgrad output",
        &to_f64(&device.download(&dpre_dev)?),
        &dpre_ref,
        F32_BOUND,
    );
    check(
        "f32 DReluBgrad bias gradient (column sums)",
        &to_f64(&device.download(&db1_dev)?),
        &column_sums(&dpre_ref, batch, hidden),
        F32_BOUND,
    );
    Ok(())
}

#[test]
fn gpu_matmul_dgelu_bgrad_reads_the_gelu_input() -> Result<()> {
    let (device, session) = setup()?;
    let (m, n, k) = (48, 100, 64);
    let spec = Matmul::new(m, n, k).with_epilogue(Epilogue::DGeluBgrad);
    let ld = spec.aux_ld().unwrap();
    let mut rng = Rng::new(8);
    let a = rng.fill(m * k, input_scale(k));
    let b = rng.fill(k * n, 1.0);
    let x = rng.fill(spec.aux_len().unwrap(), 2.0);
    let a_dev = device.upload_new("a", &a)?;
    let b_dev = device.upload_new("b", &b)?;
    let x_dev = device.upload_new("gelu input", &x)?;
    let mut d_dev = nan_buffer(&device, "d", m * n)?;
    let mut db_dev = nan_buffer(&device, "db", n)?;
    session.blas(Mode::Eager).matmul(
        &spec,
        &a_dev,
        &b_dev,
        &mut d_dev,
        MatmulArgs::new().gelu_input(&x_dev).bias_grad(&mut db_dev),
    )?;
    session.synchronize()?;
    let p = host_matmul(&spec, &to_f64(&a), &to_f64(&b));
    let reference: Vec<f64> = p
        .iter()
        .enumerate()
        .map(|(e, g)| g * gelu_grad(f64::from(x[(e / n) * ld + e % n])))
        .collect();
    check(
        "f32 DGeluBgrad output",
        &to_f64(&device.download(&d_dev)?),
        &reference,
        F32_BOUND,
    );
    check(
        "f32 DGeluBgrad bias gradient (column sums)",
        &to_f64(&device.download(&db_dev)?),
        &column_sums(&reference, m, n),
        F32_BOUND,
    );
    Ok(())
}

/// The weight gradient of `y = x·wᵀ + b`: `dw[out, in] = dyᵀ·x` with dy stored
/// `[batch, out]`, and `db = Σ_batch dy` from the same matmul.
#[test]
fn gpu_matmul_bgrad_a_is_the_linear_layer_bias_gradient() -> Result<()> {
    let (device, session) = setup()?;
    let (batch, input, out) = (64, 96, 48);
    let spec = Matmul::new(out, input, batch)
        .with_trans_a(true)
        .with_epilogue(Epilogue::BgradA);
    assert_eq!(spec.bias_len(), Some(out));
    let mut rng = Rng::new(9);
    let dy = rng.fill(batch * out, input_scale(batch));
    let x = rng.fill(batch * input, 1.0);
    let dy_dev = device.upload_new("dy", &dy)?;
    let x_dev = device.upload_new("x", &x)?;
    let mut dw_dev = nan_buffer(&device, "dw", out * input)?;
    let mut db_dev = nan_buffer(&device, "db", out)?;
    session.blas(Mode::Eager).matmul(
        &spec,
        &dy_dev,
        &x_dev,
        &mut dw_dev,
        MatmulArgs::new().bias_grad(&mut db_dev),
    )?;
    session.synchronize()?;
    check(
        "f32 BgradA product",
        &to_f64(&device.download(&dw_dev)?),
        &host_matmul(&spec, &to_f64(&dy), &to_f64(&x)),
        F32_BOUND,
    );
    let db_ref: Vec<f64> = (0..out)
        .map(|o| (0..batch).map(|r| f64::from(dy[r * out + o])).sum())
        .collect();
    check(
        "f32 BgradA bias gradient (Σ_k op(A)[i, k])",
        &to_f64(&device.download(&db_dev)?),
        &db_ref,
        F32_BOUND,
    );
    Ok(())
}

#[test]
fn gpu_matmul_bgrad_b_reduces_op_b_over_k() -> Result<()> {
    let (device, session) = setup()?;
    let (m, n, k) = (80, 64, 96);
    let spec = Matmul::new(m, n, k).with_epilogue(Epilogue::BgradB);
    assert_eq!(spec.bias_len(), Some(n));
    let mut rng = Rng::new(10);
    let a = rng.fill(m * k, input_scale(k));
    let b = rng.fill(k * n, 1.0);
    let a_dev = device.upload_new("a", &a)?;
    let b_dev = device.upload_new("b", &b)?;
    let mut d_dev = nan_buffer(&device, "d", m * n)?;
    let mut db_dev = nan_buffer(&device, "db", n)?;
    session.blas(Mode::Eager).matmul(
        &spec,
        &a_dev,
        &b_dev,
        &mut d_dev,
        MatmulArgs::new().bias_grad(&mut db_dev),
    )?;
    session.synchronize()?;
    check(
        "f32 BgradB product",
        &to_f64(&device.download(&d_dev)?),
        &host_matmul(&spec, &to_f64(&a), &to_f64(&b)),
        F32_BOUND,
    );
    let db_ref: Vec<f64> = (0..n)
        .map(|j| (0..k).map(|l| f64::from(b[l * n + j])).sum())
        .collect();
    check(
        "f32 BgradB bias gradient (Σ_k op(B)[k, j])",
        &to_f64(&device.download(&db_dev)?),
        &db_ref,
        F32_BOUND,
    );
    Ok(())
}

#[test]
fn gpu_matmul_strided_batch_shares_one_bias() -> Result<()> {
    let (device, session) = setup()?;
    let (batch, m, n, k) = (3, 32, 48, 40);
    let spec = Matmul::new(m, n, k)
        .with_trans_b(true)
        .with_epilogue(Epilogue::Bias)
        .with_batch(batch);
    let mut rng = Rng::new(11);
    let a = rng.fill(spec.a_len(), input_scale(k));
    let b = rng.fill(spec.b_len(), 1.0);
    let bias = rng.fill(n, 1.0);
    let a_dev = device.upload_new("a", &a)?;
    let b_dev = device.upload_new("b", &b)?;
    let bias_dev = device.upload_new("bias", &bias)?;
    let mut d_dev = nan_buffer(&device, "d", spec.d_len())?;
    session.blas(Mode::Eager).matmul(
        &spec,
        &a_dev,
        &b_dev,
        &mut d_dev,
        MatmulArgs::new().bias(&bias_dev),
    )?;
    session.synchronize()?;
    let one = Matmul::new(m, n, k).with_trans_b(true);
    let mut reference = Vec::with_capacity(spec.d_len());
    for i in 0..batch {
        let p = host_matmul(
            &one,
            &to_f64(&a[i * m * k..(i + 1) * m * k]),
            &to_f64(&b[i * n * k..(i + 1) * n * k]),
        );
        reference.extend(
            p.iter()
                .enumerate()
                .map(|(e, p)| p + f64::from(bias[e % n])),
        );
    }
    check(
        "f32 batch of 3 with a shared bias",
        &to_f64(&device.download(&d_dev)?),
        &reference,
        F32_BOUND,
    );
    Ok(())
}

#[test]
fn gpu_matmul_planned_for_a_share_of_the_sms_is_the_same_product() -> Result<()> {
    // A weight gradient's shape (dW = dYᵀ X over a batch of 16384 rows): few output
    // tiles, a long k, so cuBLASLt splits k by the SMs it plans for.
    let (device, session) = setup()?;
    let (m, n, k) = (256, 72, 16384);
    let whole = Matmul::new(m, n, k)
        .with_trans_a(true)
        .with_precision(Precision::Tf32);
    let mut rng = Rng::new(11);
    let a = rng.fill(whole.a_len(), input_scale(k));
    let b = rng.fill(whole.b_len(), 1.0);
    let a_dev = device.upload_new("a", &a)?;
    let b_dev = device.upload_new("b", &b)?;
    let reference = host_matmul(&whole, &to_f64(&a), &to_f64(&b));
    let sms = u32::try_from(device.sm_count()?).expect("a positive SM count");
    let targets = [
        SmTarget::Whole,
        SmTarget::Share(2),
        SmTarget::Share(3),
        SmTarget::Count(sms / 4),
        SmTarget::Count(sms),
    ];
    for target in targets {
        let spec = whole.with_sm_target(target);
        let mut d_dev = nan_buffer(&device, "d", spec.d_len())?;
        session
            .blas(Mode::Eager)
            .matmul(&spec, &a_dev, &b_dev, &mut d_dev, MatmulArgs::new())?;
        session.synchronize()?;
        check(
            &format!("tf32 planned for {target} SMs"),
            &to_f64(&device.download(&d_dev)?),
            &reference,
            TF32_BOUND,
        );
        assert!(session.handle().is_planned(&spec), "{spec}");
    }
    // Each target is a plan of its own.
    assert_eq!(session.handle().planned(), targets.len());

    // A view planned for a share plans the specs that name no target for it, and leaves
    // a spec's own target alone.
    let fresh = BlasSession::new(&device)?;
    let blas = fresh.blas(Mode::Eager).planned_for(SmTarget::Share(4));
    let own = whole.with_sm_target(SmTarget::Count(sms / 2));
    for spec in [whole, own] {
        let mut d_dev = nan_buffer(&device, "d", spec.d_len())?;
        blas.matmul(&spec, &a_dev, &b_dev, &mut d_dev, MatmulArgs::new())?;
        fresh.synchronize()?;
        check(
            &format!("tf32 through a view planned for 1/4, spec {spec}"),
            &to_f64(&device.download(&d_dev)?),
            &reference,
            TF32_BOUND,
        );
    }
    let handle = fresh.handle();
    assert!(handle.is_planned(&whole.with_sm_target(SmTarget::Share(4))));
    assert!(handle.is_planned(&own));
    assert!(!handle.is_planned(&whole));
    assert_eq!(handle.planned(), 2);
    Ok(())
}

#[test]
fn gpu_an_sm_target_beyond_the_gpu_is_refused_naming_its_sms() -> Result<()> {
    let (device, session) = setup()?;
    let sms = u32::try_from(device.sm_count()?).expect("a positive SM count");
    for target in [SmTarget::Count(sms + 1), SmTarget::Share(sms + 1)] {
        let spec = Matmul::new(32, 16, 8).with_sm_target(target);
        let a_dev = device.upload_new("a", &vec![1.0f32; spec.a_len()])?;
        let b_dev = device.upload_new("b", &vec![1.0f32; spec.b_len()])?;
        let mut d_dev = nan_buffer(&device, "d", spec.d_len())?;
        let err = session
            .blas(Mode::Eager)
            .matmul(&spec, &a_dev, &b_dev, &mut d_dev, MatmulArgs::new())
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, Error::Matmul { .. })
                && msg.contains(&format!(
                    "the SM target {target} names no SM of the GPU's {sms}"
                )),
            "{msg}"
        );
        assert!(!session.handle().is_planned(&spec));
        session.synchronize()?;
        assert!(
            device.download(&d_dev)?.iter().all(|x| x.is_nan()),
            "nothing may run"
        );
    }
    Ok(())
}

#[test]
fn gpu_capture_mode_without_a_plan_is_matmul_not_planned() -> Result<()> {
    let (device, session) = setup()?;
    let spec = Matmul::new(32, 16, 8).with_trans_b(true);
    let a_dev = device.upload_new("a", &vec![1.0f32; spec.a_len()])?;
    let b_dev = device.upload_new("b", &vec![1.0f32; spec.b_len()])?;
    let mut d_dev = nan_buffer(&device, "d", spec.d_len())?;
    let err = session
        .blas(Mode::Capture)
        .matmul(&spec, &a_dev, &b_dev, &mut d_dev, MatmulArgs::new())
        .unwrap_err();
    match &err {
        Error::MatmulNotPlanned { shape } => {
            assert_eq!(
                shape,
                "32x16x8 f32 trans_a=false trans_b=true epilogue=Default"
            );
        }
        other => panic!("expected MatmulNotPlanned, got {other:?}"),
    }
    assert!(!session.handle().is_planned(&spec));
    session.synchronize()?;
    assert!(
        device.download(&d_dev)?.iter().all(|x| x.is_nan()),
        "nothing may run"
    );
    Ok(())
}

#[test]
fn gpu_dry_pass_plans_and_warms_without_writing_the_callers_outputs() -> Result<()> {
    let (device, session) = setup()?;
    let (batch, input, out) = (32, 24, 16);
    let spec = Matmul::new(out, input, batch)
        .with_trans_a(true)
        .with_epilogue(Epilogue::BgradA);
    let mut rng = Rng::new(12);
    let dy = rng.fill(batch * out, 1.0);
    let x = rng.fill(batch * input, 1.0);
    let dy_dev = device.upload_new("dy", &dy)?;
    let x_dev = device.upload_new("x", &x)?;
    let mut dw_dev = nan_buffer(&device, "dw", out * input)?;
    let mut db_dev = nan_buffer(&device, "db", out)?;

    session.blas(Mode::Dry).matmul(
        &spec,
        &dy_dev,
        &x_dev,
        &mut dw_dev,
        MatmulArgs::new().bias_grad(&mut db_dev),
    )?;
    session.synchronize()?;
    assert!(session.handle().is_planned(&spec));
    assert_eq!(session.handle().planned(), 1);
    assert!(device.download(&dw_dev)?.iter().all(|v| v.is_nan()));
    assert!(device.download(&db_dev)?.iter().all(|v| v.is_nan()));

    // A capture-mode issue now finds the plan (nothing is being captured here, so it runs).
    session.blas(Mode::Capture).matmul(
        &spec,
        &dy_dev,
        &x_dev,
        &mut dw_dev,
        MatmulArgs::new().bias_grad(&mut db_dev),
    )?;
    session.synchronize()?;
    assert_eq!(session.handle().planned(), 1, "the plan is reused");
    check(
        "f32 BgradA after a dry pass",
        &to_f64(&device.download(&dw_dev)?),
        &host_matmul(&spec, &to_f64(&dy), &to_f64(&x)),
        F32_BOUND,
    );

    // Another spec is another plan.
    let plain = Matmul::new(out, input, batch).with_trans_a(true);
    session
        .blas(Mode::Eager)
        .matmul(&plain, &dy_dev, &x_dev, &mut dw_dev, MatmulArgs::new())?;
    session.synchronize()?;
    assert_eq!(session.handle().planned(), 2);
    Ok(())
}

#[test]
fn gpu_wrong_lengths_fail_before_anything_runs() -> Result<()> {
    let (device, session) = setup()?;
    let spec = Matmul::new(16, 32, 8);
    let a_dev = device.upload_new("a", &vec![1.0f32; spec.a_len()])?;
    let b_short = device.upload_new("b", &vec![1.0f32; spec.b_len() - 1])?;
    let mut d_dev = nan_buffer(&device, "d", spec.d_len())?;
    let err = session
        .blas(Mode::Eager)
        .matmul(&spec, &a_dev, &b_short, &mut d_dev, MatmulArgs::new())
        .unwrap_err();
    match err {
        Error::LengthMismatch {
            what,
            expected,
            found,
        } => {
            assert_eq!(what, "matmul operand B (k x n = 8 x 32)");
            assert_eq!((expected, found), (256, 255));
        }
        other => panic!("expected LengthMismatch, got {other:?}"),
    }
    assert_eq!(session.handle().planned(), 0);
    Ok(())
}

/// Two matmuls of one spec (one plan, one descriptor) with different bias and aux
/// buffers, captured into a graph: each captured matmul keeps its own pointers, and a
/// replay reads the inputs as they are at replay time.
#[test]
fn gpu_matmuls_captured_in_a_graph_keep_their_own_pointers_and_replay() -> Result<()> {
    let device = Device::new(0)?;
    let (m, n, k) = (64, 72, 48);
    let spec = Matmul::new(m, n, k)
        .with_trans_b(true)
        .with_epilogue(Epilogue::GeluAuxBias);
    let aux_len = spec.aux_len().unwrap();
    let ld = spec.aux_ld().unwrap();
    let mut rng = Rng::new(13);
    let a0 = rng.fill(m * k, input_scale(k));
    let w = rng.fill(n * k, 1.0);
    let b1 = rng.fill(n, 1.0);
    let b2 = rng.fill(n, 1.0);
    // Buffers before the executor: it is dropped first, with its graph.
    let mut a_dev = device.upload_new("a", &a0)?;
    let w_dev = device.upload_new("w", &w)?;
    let b1_dev = device.upload_new("b1", &b1)?;
    let b2_dev = device.upload_new("b2", &b2)?;
    let mut d1_dev = nan_buffer(&device, "d1", m * n)?;
    let mut d2_dev = nan_buffer(&device, "d2", m * n)?;
    let mut x1_dev = nan_buffer(&device, "x1", aux_len)?;
    let mut x2_dev = nan_buffer(&device, "x2", aux_len)?;
    // One op on one stream: the matmuls captured as a graph outside any step.
    static ONE_OP: PlanDesc = PlanDesc::new("one_op")
        .with_streams(&[StreamDesc::named("main")])
        .with_ops(&[OpDesc::new("one_op", StreamId::ORIGIN)]);
    let mut exec = Executor::new(&device, &ONE_OP, Schedule::Planned)?;

    let mut issue = |issue: &Issue<'_>| -> Result<()> {
        issue.op(OpId(0), |stream| {
            let blas = stream.blas();
            blas.matmul(
                &spec,
                &a_dev,
                &w_dev,
                &mut d1_dev,
                MatmulArgs::new().bias(&b1_dev).save_gelu_input(&mut x1_dev),
            )?;
            blas.matmul(
                &spec,
                &a_dev,
                &w_dev,
                &mut d2_dev,
                MatmulArgs::new().bias(&b2_dev).save_gelu_input(&mut x2_dev),
            )
        })
    };
    exec.capture(&mut issue)?;
    let kernels = exec.node_counts()?;
    eprintln!("captured graph: {kernels:?}");

    let verify = |a: &[f32], round: &str| -> Result<()> {
        exec.replay()?;
        exec.wait()?;
        let p = host_matmul(&spec, &to_f64(a), &to_f64(&w));
        for (bias, d_dev, x_dev, which) in [(&b1, &d1_dev, &x1_dev, 1), (&b2, &d2_dev, &x2_dev, 2)]
        {
            let pre: Vec<f64> = p
                .iter()
                .enumerate()
                .map(|(e, p)| p + f64::from(bias[e % n]))
                .collect();
            let x = device.download(x_dev)?;
            let saved: Vec<f64> = (0..m * n)
                .map(|e| f64::from(x[(e / n) * ld + e % n]))
                .collect();
            check(
                &format!("{round}: captured matmul {which} GELU input"),
                &saved,
                &pre,
                F32_BOUND,
            );
            let reference: Vec<f64> = pre.iter().map(|&x| gelu(x)).collect();
            check(
                &format!("{round}: captured matmul {which} output"),
                &to_f64(&device.download(d_dev)?),
                &reference,
                F32_BOUND,
            );
        }
        Ok(())
    };
    verify(&a0, "first replay")?;

    // New data in the same buffer: the graph reads it at the next replay.
    let a1 = rng.fill(m * k, input_scale(k));
    device.upload(&mut a_dev, &a1)?;
    verify(&a1, "replay with new input")?;
    Ok(())
}
