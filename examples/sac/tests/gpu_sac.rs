//! GPU tests of the SAC step: each kernel of `cuda/sac.cu` against its CPU reference on
//! random data (outputs poisoned with NaN first, so an element a kernel did not write
//! fails), and the whole step, planned on four streams, against the same step on one
//! stream, bit for bit. They need a CUDA GPU of compute capability 9.0 and run only with
//! the `gpu-tests` feature (`cargo xtask bundle --gpu-tests` builds them for the GPU
//! host).
//!
//! Bounds: the kernels use IEEE `expf`, `logf`, `tanhf`, `sqrtf` and `cospif` (a few ulps
//! each; the build does not pass `--use_fast_math`) where the references use f64, so the
//! elementwise outputs agree to about 1e-6 relative; the one-block sums add up to 16384
//! f32 terms in a fixed order (within about 1e-5 relative of the f64 sum). The sample's
//! inputs keep `|u| ≲ 3` except for the clamped rows, so `1 − tanh(u)²` is not lost to
//! cancellation in f32.
#![cfg(feature = "gpu-tests")]

use std::sync::Arc;

use stepgraph::{CaptureStream, Device, Result, Schedule, SmTarget};
use stepgraph_sac::host::{DEFAULT_REPLAY, Trainer};
use stepgraph_sac::kernels::{Buf, Kernels, NARROW_OUTPUTS};
use stepgraph_sac::layers::{Mlp, Sizes};
use stepgraph_sac::model::{CRITICS, sac};
use stepgraph_sac::reference::*;
use stepgraph_testkit::{Rng, bits, check_within, nan_buffer};

fn gpu() -> (Device, Kernels) {
    let device = Device::new(0).expect("these tests need a CUDA GPU of compute capability 9.0");
    let k = Kernels::load(&device).expect("kernels load");
    (device, k)
}

/// Runs `body` once, eagerly, on a fresh stream, and waits for it.
fn run_one_op(device: &Device, body: impl FnOnce(&CaptureStream<'_>) -> Result<()>) {
    stepgraph::exec::run_once(device, body).expect("the kernel runs");
}

/// The batch sizes each kernel is tried at: the step's, and ragged ones.
const ROWS: [usize; 3] = [16384, 1001, 1];

#[test]
fn gpu_concat_and_the_relu_backwards_are_exact() {
    let (device, k) = gpu();
    for rows in ROWS {
        let (xs, as_) = (64, 8);
        let mut rng = Rng::new(rows as u64);
        let x = rng.vec_nonzero(rows * xs, -1.0, 1.0);
        let a = rng.vec_nonzero(rows * as_, -1.0, 1.0);
        let (xb, ab) = (
            device.upload_new("x", &x).unwrap(),
            device.upload_new("a", &a).unwrap(),
        );
        let mut out = nan_buffer(&device, "out", rows * (xs + as_)).unwrap();
        run_one_op(&device, |s| {
            k.concat_cols(s, &xb, &ab, &mut out, rows, xs, as_)
        });
        let want = concat_cols_reference(&x, &a, rows, xs, as_);
        assert_eq!(
            bits(&[&device.download(&out).unwrap()]),
            bits(&[&want]),
            "concat, {rows} rows"
        );

        let h = rng.vec(rows * 256, -1.0, 1.0);
        let dz = rng.vec_nonzero(rows * 256, -1.0, 1.0);
        let hb = device.upload_new("h", &h).unwrap();
        let mut dzb = device.upload_new("dz", &dz).unwrap();
        run_one_op(&device, |s| k.relu_backward(s, &hb, &mut dzb));
        let mut want = dz.clone();
        relu_backward_reference(&h, &mut want);
        assert_eq!(
            bits(&[&device.download(&dzb).unwrap()]),
            bits(&[&want]),
            "relu, {rows} rows"
        );

        // ReLU's backward with the column sums' first pass: the same dz, and the bias
        // gradient the library's finish makes of its partials has the bits of
        // column_sums over that dz. Widths of whole column blocks and not.
        for cols in [256, 200] {
            let h = rng.vec(rows * cols, -1.0, 1.0);
            let dz = rng.vec_nonzero(rows * cols, -1.0, 1.0);
            let hb = device.upload_new("h", &h).unwrap();
            let scratch = stepgraph_kernels::column_sums_scratch_len(rows, cols);
            let (mut fused, mut plain) = (
                device.upload_new("dz", &dz).unwrap(),
                device.upload_new("dz", &dz).unwrap(),
            );
            let nan = |what: &str, n: usize| nan_buffer(&device, what, n).unwrap();
            let (mut partials, mut sums) = (nan("partials", scratch), nan("sums", scratch));
            let (mut db_fused, mut db_plain) = (nan("db", cols), nan("db", cols));
            run_one_op(&device, |s| {
                k.relu_backward_sums(s, &hb, &mut fused, cols, &mut partials)?;
                k.generic
                    .column_sums_finish(s, &partials, rows, cols, &mut db_fused)?;
                k.relu_backward(s, &hb, &mut plain)?;
                k.generic
                    .column_sums(s, &plain, rows, cols, &mut sums, &mut db_plain)
            });
            let mut want = dz.clone();
            relu_backward_reference(&h, &mut want);
            let case = format!("relu_backward_sums, {rows} rows, {cols} columns");
            let got = device.download(&fused).unwrap();
            assert_eq!(bits(&[&got]), bits(&[&want]), "{case}: dz");
            let db = device.download(&db_fused).unwrap();
            assert_eq!(
                bits(&[&db]),
                bits(&[&device.download(&db_plain).unwrap()]),
                "{case}: the bias gradient against column_sums"
            );
            let want_db = stepgraph_kernels::reference::column_sums_reference(&want, rows, cols);
            check_within(
                &case,
                "db",
                &db,
                &want_db,
                stepgraph_testkit::rms(&want),
                1e-4,
            );
        }

        // A critic's one output, the actor's 2A at the default and the odd sizes, the
        // widest the kernel takes; rows of whole 16-byte vectors (four elements a thread)
        // and a width that is not (one a thread).
        for (outs, cols) in [
            (1, 256),
            (16, 256),
            (12, 256),
            (NARROW_OUTPUTS, 256),
            (12, 200),
            (16, 201),
            (1, 201),
        ] {
            let h = rng.vec(rows * cols, -1.0, 1.0);
            let (dout, w) = (
                rng.vec_nonzero(rows * outs, -1.0, 1.0),
                rng.vec_nonzero(outs * cols, -1.0, 1.0),
            );
            let (hb, doutb, wb) = (
                device.upload_new("h", &h).unwrap(),
                device.upload_new("dout", &dout).unwrap(),
                device.upload_new("w", &w).unwrap(),
            );
            let mut dz = nan_buffer(&device, "dz", rows * cols).unwrap();
            run_one_op(&device, |s| {
                k.narrow_relu_grad(s, &doutb, &wb, &hb, &mut dz, outs)
            });
            assert_eq!(
                bits(&[&device.download(&dz).unwrap()]),
                bits(&[&narrow_relu_grad_reference(&dout, &w, &h, outs)]),
                "narrow_relu_grad, {rows} rows, {outs} outputs, {cols} columns"
            );
        }
    }
}

/// The transpose moves every element, at square, ragged and one-row shapes.
#[test]
fn gpu_transpose_is_exact() {
    let (device, k) = gpu();
    for (rows, cols) in [(256, 256), (200, 200), (33, 65), (1, 7)] {
        let mut rng = Rng::new(3 + (rows * cols) as u64);
        let x = rng.vec_nonzero(rows * cols, -1.0, 1.0);
        let xb = device.upload_new("in", &x).unwrap();
        let mut out = nan_buffer(&device, "out", rows * cols).unwrap();
        run_one_op(&device, |s| k.transpose(s, &xb, &mut out, rows, cols));
        let want: Vec<f32> = (0..cols)
            .flat_map(|c| x.iter().skip(c).step_by(cols).copied().collect::<Vec<_>>())
            .collect();
        assert_eq!(
            bits(&[&device.download(&out).unwrap()]),
            bits(&[&want]),
            "{rows} x {cols}"
        );
    }
}

/// The narrow matmul refuses a width it does not take and lengths that do not fit, naming
/// what it expected, before anything runs.
#[test]
fn gpu_narrow_relu_grad_refuses_what_it_does_not_take() {
    let (device, k) = gpu();
    let buf = |n: usize| device.upload_new("x", &vec![1.0f32; n]).unwrap();
    let (h, w33, w2) = (buf(4 * 8), buf(33 * 8), buf(2 * 8));
    let mut dz = nan_buffer(&device, "dz", 4 * 8).unwrap();
    let cases: [(&Buf, &Buf, usize, &str); 4] = [
        (
            &buf(4 * 33),
            &w33,
            33,
            "the output layer's width must be 1 to 32, found 33",
        ),
        (
            &buf(4 * 2),
            &w2,
            0,
            "the output layer's width must be 1 to 32, found 0",
        ),
        (
            &buf(7),
            &w2,
            2,
            "dout ([rows, k]): expected a positive multiple of 2 elements, found 7",
        ),
        (
            &buf(4 * 2),
            &buf(15),
            2,
            "w ([k, cols]): expected a positive multiple of 2 elements, found 15",
        ),
    ];
    for (dout, w, outs, want) in cases {
        let err = stepgraph::exec::run_once(&device, |s| {
            k.narrow_relu_grad(s, dout, w, &h, &mut dz, outs)
        })
        .unwrap_err()
        .chain();
        assert!(err.contains(want), "{err}");
    }
    assert!(device.download(&dz).unwrap().iter().all(|x| x.is_nan()));
}

/// A ReLU's output: uniform in [-1, 1), negatives at 0 (about half the elements).
fn relu_output(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.vec(n, -1.0, 1.0)
        .into_iter()
        .map(|v| v.max(0.0))
        .collect()
}

/// `critic_head` against its f64 reference at the step's sizes and ragged ones (hidden
/// widths of whole float4s and not, batches of one block and of a partial last block),
/// and the same bits when it runs again.
#[test]
fn gpu_critic_head_matches_its_reference_and_repeats_bit_for_bit() {
    let (device, k) = gpu();
    for rows in ROWS {
        for cols in [256, 200, 37] {
            let mut rng = Rng::new(31 + (rows * cols) as u64);
            let h = relu_output(&mut rng, rows * cols);
            let w = rng.vec_nonzero(cols, -1.0, 1.0);
            let y = rng.vec_nonzero(rows, -3.0, 3.0);
            let bias = 0.25f32;
            let up = |what: &str, x: &[f32]| device.upload_new(what, x).unwrap();
            let (hb, wb, bb, yb) = (up("h", &h), up("w", &w), up("bias", &[bias]), up("y", &y));
            let scratch = stepgraph_sac::kernels::critic_head_scratch_len(rows, cols);
            let run = || {
                let nan = |what: &str, n: usize| nan_buffer(&device, what, n).unwrap();
                let (mut q, mut dq, mut dz) =
                    (nan("q", rows), nan("dq", rows), nan("dz", rows * cols));
                let (mut partial, mut gw) = (nan("partial", scratch), nan("gw", cols));
                let (mut gb, mut loss) = (nan("gb", 1), nan("loss", 1));
                let mut gb_hidden = nan("gb_hidden", cols);
                run_one_op(&device, |s| {
                    k.critic_head(
                        s,
                        &hb,
                        &wb,
                        &bb,
                        &yb,
                        &mut q,
                        &mut dq,
                        &mut dz,
                        &mut partial,
                        &mut gw,
                        &mut gb,
                        &mut loss,
                        &mut gb_hidden,
                    )
                });
                [q, dq, dz, gw, gb, loss, gb_hidden].map(|b| device.download(&b).unwrap())
            };
            let got = run();
            let again = run();
            for (i, (a, b)) in got.iter().zip(&again).enumerate() {
                assert_eq!(
                    bits(&[a]),
                    bits(&[b]),
                    "output {i} repeats, {rows} x {cols}"
                );
            }
            let want = critic_head_reference(&h, &w, bias, &y);
            let case = format!("critic_head, {rows} rows, {cols} columns");
            let [q, dq, dz, gw, gb, loss, gb_hidden] = &got;
            let scale = |x: &[f32]| stepgraph_testkit::rms(x).max(f64::MIN_POSITIVE);
            check_within(&case, "q", q, &want.q, scale(&want.q), 1e-5);
            check_within(&case, "dq", dq, &want.dq, scale(&want.dq), 1e-5);
            check_within(&case, "dz", dz, &want.dz, scale(&want.dz), 1e-5);
            check_within(&case, "gw", gw, &want.gw, scale(&want.gw), 1e-4);
            check_within(&case, "gb", gb, &[want.gb], scale(&want.dq), 1e-4);
            check_within(&case, "loss", loss, &[want.loss], 1e-3, 1e-5);
            check_within(
                &case,
                "gb_hidden",
                gb_hidden,
                &want.gb_hidden,
                scale(&want.dz),
                1e-4,
            );
        }
    }
}

/// `critic_q_relu_grad` against its references: `dz` with the bits of
/// `narrow_relu_grad` for one output, `q` against the f64 product; hidden widths of whole
/// float4s and not, and the same bits when it runs again.
#[test]
fn gpu_critic_q_relu_grad_matches_its_references_and_repeats_bit_for_bit() {
    let (device, k) = gpu();
    for rows in ROWS {
        for cols in [256, 200, 37] {
            let mut rng = Rng::new(43 + (rows * cols) as u64);
            let h = relu_output(&mut rng, rows * cols);
            let w = rng.vec_nonzero(cols, -1.0, 1.0);
            let dq = rng.vec_nonzero(rows, -1.0, 1.0);
            let bias = -0.375f32;
            let up = |what: &str, x: &[f32]| device.upload_new(what, x).unwrap();
            let (hb, wb, bb, dqb) = (up("h", &h), up("w", &w), up("bias", &[bias]), up("dq", &dq));
            let run = || {
                let mut q = nan_buffer(&device, "q", rows).unwrap();
                let mut dz = nan_buffer(&device, "dz", rows * cols).unwrap();
                run_one_op(&device, |s| {
                    k.critic_q_relu_grad(s, &hb, &wb, &bb, &dqb, &mut q, &mut dz)
                });
                [q, dz].map(|b| device.download(&b).unwrap())
            };
            let (got, again) = (run(), run());
            let case = format!("critic_q_relu_grad, {rows} rows, {cols} columns");
            assert_eq!(
                bits(&[&got[0], &got[1]]),
                bits(&[&again[0], &again[1]]),
                "{case}"
            );
            assert_eq!(
                bits(&[&got[1]]),
                bits(&[&narrow_relu_grad_reference(&dq, &w, &h, 1)]),
                "{case}: dz"
            );
            let q: Vec<f32> = h
                .chunks_exact(cols)
                .map(|row| {
                    let dot: f64 = row
                        .iter()
                        .zip(&w)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    (dot + f64::from(bias)) as f32
                })
                .collect();
            check_within(&case, "q", &got[0], &q, stepgraph_testkit::rms(&q), 1e-5);
        }
    }
    // A bias of the wrong length is refused before anything runs.
    let (h, w, dq) = (
        device.upload_new("h", &[1.0f32; 8]).unwrap(),
        device.upload_new("w", &[1.0f32; 4]).unwrap(),
        device.upload_new("dq", &[1.0f32; 2]).unwrap(),
    );
    let (mut q, mut dz) = (
        nan_buffer(&device, "q", 2).unwrap(),
        nan_buffer(&device, "dz", 8).unwrap(),
    );
    let err = stepgraph::exec::run_once(&device, |s| {
        k.critic_q_relu_grad(s, &h, &w, &dq, &dq, &mut q, &mut dz)
    })
    .unwrap_err()
    .chain();
    assert!(err.contains("bias ([1])"), "{err}");
    assert!(err.contains("expected 1 elements, found 2"), "{err}");
    assert!(device.download(&dz).unwrap().iter().all(|v| v.is_nan()));
}

/// `relu_narrow_product` against its f64 reference: the step's input gradient (the
/// action's 8 columns after 64), the odd sizes' (6 after 200), 16 and one output, and the
/// widest it takes.
#[test]
fn gpu_relu_narrow_product_matches_its_reference_and_repeats_bit_for_bit() {
    let (device, k) = gpu();
    for rows in ROWS {
        // The butterfly's widths (8 of 8, 6 of 8, 16, 1) and the warp sums past 16.
        for (cols, inp, first, n) in [
            (256, 72, 64, 8),
            (200, 206, 200, 6),
            (128, 100, 80, 16),
            (33, 34, 33, 1),
            (37, 40, 8, 32),
        ] {
            let mut rng = Rng::new(37 + (rows * n) as u64);
            let h = rng.vec(rows * cols, -1.0, 1.0);
            let dh = rng.vec_nonzero(rows * cols, -1.0, 1.0);
            let w = rng.vec_nonzero(cols * inp, -1.0, 1.0);
            let up = |what: &str, x: &[f32]| device.upload_new(what, x).unwrap();
            let (hb, dhb, wb) = (up("h", &h), up("dh", &dh), up("w", &w));
            let run = || {
                let mut dx = nan_buffer(&device, "dx", rows * n).unwrap();
                run_one_op(&device, |s| {
                    k.relu_narrow_product(s, &dhb, &hb, &wb, inp, first, &mut dx)
                });
                device.download(&dx).unwrap()
            };
            let (got, again) = (run(), run());
            assert_eq!(bits(&[&got]), bits(&[&again]), "repeats, {rows} x {cols}");
            let want = relu_narrow_product_reference(&dh, &h, &w, inp, first, n);
            let floor = stepgraph_testkit::rms(&want);
            check_within(
                &format!("relu_narrow_product, {rows} rows, {cols} columns, {n} outputs"),
                "dx",
                &got,
                &want,
                floor,
                1e-5,
            );
        }
    }
}

/// Both fused kernels refuse sizes they do not take, naming what they expected, before
/// anything runs.
#[test]
fn gpu_the_fused_kernels_refuse_what_they_do_not_take() {
    let (device, k) = gpu();
    let buf = |n: usize| device.upload_new("x", &vec![1.0f32; n]).unwrap();
    let wide = stepgraph_sac::kernels::CRITIC_HEAD_MAX_UNITS + 1;
    let (h, w, one, y) = (buf(2 * wide), buf(wide), buf(1), buf(2));
    let (mut q, mut dq, mut dz) = (buf(2), buf(2), buf(2 * wide));
    let (mut partial, mut gw, mut gb, mut loss) = (buf(1 << 16), buf(wide), buf(1), buf(1));
    let mut gb_hidden = buf(wide);
    let err = stepgraph::exec::run_once(&device, |s| {
        k.critic_head(
            s,
            &h,
            &w,
            &one,
            &y,
            &mut q,
            &mut dq,
            &mut dz,
            &mut partial,
            &mut gw,
            &mut gb,
            &mut loss,
            &mut gb_hidden,
        )
    })
    .unwrap_err()
    .chain();
    assert!(err.contains("must have 1 to 767 units"), "{err}");
    assert!(err.contains("found 768"), "{err}");

    let (h, w8) = (buf(2 * 8), buf(8));
    let (mut dz, mut gw8, mut short, mut gb8) = (buf(2 * 8), buf(8), buf(17), buf(8));
    let err = stepgraph::exec::run_once(&device, |s| {
        k.critic_head(
            s, &h, &w8, &one, &y, &mut q, &mut dq, &mut dz, &mut short, &mut gw8, &mut gb,
            &mut loss, &mut gb8,
        )
    })
    .unwrap_err()
    .chain();
    assert!(
        err.contains("partial (at least critic_head_scratch_len"),
        "{err}"
    );
    assert!(err.contains("expected 18 elements, found 17"), "{err}");

    let (hh, ww) = (buf(2 * 8), buf(8 * 10));
    let mut dx = nan_buffer(&device, "dx", 2 * 4).unwrap();
    let err = stepgraph::exec::run_once(&device, |s| {
        k.relu_narrow_product(s, &hh, &hh, &ww, 10, 8, &mut dx)
    })
    .unwrap_err()
    .chain();
    assert!(
        err.contains("columns from 8 within the input's 10"),
        "{err}"
    );
    assert!(err.contains("found 4 columns"), "{err}");
    // A first column so far out that first + n wraps is refused, not launched.
    let err = stepgraph::exec::run_once(&device, |s| {
        k.relu_narrow_product(s, &hh, &hh, &ww, 10, usize::MAX, &mut dx)
    })
    .unwrap_err()
    .chain();
    assert!(
        err.contains(&format!("columns from {}", usize::MAX)),
        "{err}"
    );
    assert!(device.download(&dx).unwrap().iter().all(|x| x.is_nan()));

    // ReLU's backward with the sums: partials shorter than the plan's, and an h that is
    // not whole rows of the width given.
    let (h64, mut dz64) = (buf(64 * 32), nan_buffer(&device, "dz", 64 * 32).unwrap());
    let mut few = buf(31);
    let err = stepgraph::exec::run_once(&device, |s| {
        k.relu_backward_sums(s, &h64, &mut dz64, 32, &mut few)
    })
    .unwrap_err()
    .chain();
    assert!(
        err.contains("partials (at least column_sums_scratch_len)"),
        "{err}"
    );
    assert!(err.contains("expected 32 elements, found 31"), "{err}");
    let err = stepgraph::exec::run_once(&device, |s| {
        k.relu_backward_sums(s, &h64, &mut dz64, 30, &mut few)
    })
    .unwrap_err()
    .chain();
    assert!(
        err.contains("expected a positive multiple of 30 elements, found 2048"),
        "{err}"
    );
    assert!(device.download(&dz64).unwrap().iter().all(|x| x.is_nan()));
}

#[test]
fn gpu_mse_loss_matches_its_reference() {
    let (device, k) = gpu();
    for rows in ROWS {
        let mut rng = Rng::new(7 + rows as u64);
        let q = rng.vec_nonzero(rows, -3.0, 3.0);
        let y = rng.vec_nonzero(rows, -3.0, 3.0);
        let (qb, yb) = (
            device.upload_new("q", &q).unwrap(),
            device.upload_new("y", &y).unwrap(),
        );
        let mut dq = nan_buffer(&device, "dq", rows).unwrap();
        let mut loss = nan_buffer(&device, "loss", 1).unwrap();
        run_one_op(&device, |s| k.mse_loss(s, &qb, &yb, &mut dq, &mut loss));
        let (want_dq, want_loss) = mse_loss_reference(&q, &y);
        let case = format!("mse_loss, {rows} rows");
        let floor = 1e-3 / rows as f64;
        check_within(
            &case,
            "dq",
            &device.download(&dq).unwrap(),
            &want_dq,
            floor,
            1e-6,
        );
        check_within(
            &case,
            "loss",
            &device.download(&loss).unwrap(),
            &[want_loss],
            1e-3,
            1e-5,
        );
    }
}

/// A head `[rows, 2 dims]`: means in ±0.5, raw log_std in [−3, 0], and in every 7th row
/// one raw log_std below the lower clamp and one above the upper.
fn random_head(rng: &mut Rng, rows: usize, dims: usize) -> Vec<f32> {
    let mut head = Vec::with_capacity(rows * 2 * dims);
    for b in 0..rows {
        head.extend(rng.vec_nonzero(dims, -0.5, 0.5));
        let mut ls = rng.vec_nonzero(dims, -3.0, 0.0);
        if b % 7 == 0 && dims >= 2 {
            ls[0] = -25.0;
            ls[1] = 3.0;
        }
        head.extend(ls);
    }
    head
}

#[test]
fn gpu_tanh_gauss_sample_matches_its_reference() {
    let (device, k) = gpu();
    let dims = 8;
    for rows in ROWS {
        let mut rng = Rng::new(11 + rows as u64);
        let head = random_head(&mut rng, rows, dims);
        let mut eps = rng.vec_nonzero(rows * dims, -2.0, 2.0);
        // Small noise where log_std clamps at 2, so that u stays moderate there too.
        for b in (0..rows).step_by(7) {
            eps[b * dims + 1] *= 0.05;
        }
        let hb = device.upload_new("head", &head).unwrap();
        let eb = device.upload_new("eps", &eps).unwrap();
        let mut act = nan_buffer(&device, "act", rows * dims).unwrap();
        let mut logp = nan_buffer(&device, "logp", rows).unwrap();
        run_one_op(&device, |s| {
            k.tanh_gauss_sample(s, &hb, &eb, &mut act, &mut logp, rows, dims)
        });
        let (want_act, want_logp) = tanh_gauss_sample_reference(&head, &eps, rows, dims);
        let case = format!("tanh_gauss_sample, {rows} rows");
        check_within(
            &case,
            "act",
            &device.download(&act).unwrap(),
            &want_act,
            1e-2,
            1e-4,
        );
        check_within(
            &case,
            "logp",
            &device.download(&logp).unwrap(),
            &want_logp,
            1.0,
            1e-4,
        );
    }
}

#[test]
fn gpu_tanh_gauss_backward_matches_its_reference() {
    let (device, k) = gpu();
    let dims = 8;
    for rows in ROWS {
        let mut rng = Rng::new(13 + rows as u64);
        let head = random_head(&mut rng, rows, dims);
        let eps = rng.vec_nonzero(rows * dims, -2.0, 2.0);
        let act = rng.vec_nonzero(rows * dims, -0.95, 0.95);
        // The action's gradient through the critics.
        let want_da = rng.vec_nonzero(rows * dims, -2e-3, 2e-3);
        let log_alpha = -0.4f32;
        let up = |what: &str, v: &[f32]| device.upload_new(what, v).unwrap();
        let (hb, eb, ab) = (up("head", &head), up("eps", &eps), up("act", &act));
        let (da, la) = (up("da", &want_da), up("log_alpha", &[log_alpha]));
        let mut dhead = nan_buffer(&device, "dhead", rows * 2 * dims).unwrap();
        run_one_op(&device, |s| {
            k.tanh_gauss_backward(s, &hb, &eb, &ab, &da, &la, &mut dhead, rows, dims)
        });
        let want =
            tanh_gauss_backward_reference(&head, &eps, &act, &want_da, log_alpha, rows, dims);
        let got = device.download(&dhead).unwrap();
        // Relative to the gradient's scale: where the entropy and critic terms cancel,
        // an element is small and its f32 rounding is the larger terms'.
        let floor = 1e-2 * stepgraph_testkit::rms(&want);
        check_within(
            &format!("tanh_gauss_backward, {rows} rows"),
            "dhead",
            &got,
            &want,
            floor,
            1e-4,
        );
    }
}

/// The actor's backward through the smallest critic: the running selection
/// (`critic_min_select` a critic at a time) takes each row's gradient from the critic
/// the CPU's minimum names, ties to the lower index, for one to five critics; the fused
/// `tanh_gauss_backward_min` gives the bits of the selection followed by
/// `tanh_gauss_backward` for one to four and refuses five; and the result is the
/// reference backward of the selected gradient.
#[test]
fn gpu_the_backward_through_the_smallest_critic_matches_the_selection() {
    use stepgraph_sac::kernels::MIN_CRITICS;
    let (device, k) = gpu();
    let dims = 8;
    for rows in ROWS {
        let mut rng = Rng::new(71 + rows as u64);
        let mut qs: Vec<Vec<f32>> = (0..=MIN_CRITICS)
            .map(|_| rng.vec_nonzero(rows, -3.0, 3.0))
            .collect();
        // Ties every fifth row between critics 0 to 2 (the lower index wins).
        for i in (0..rows).step_by(5) {
            let tie = qs[0][i];
            qs[1][i] = tie;
            qs[2][i] = tie;
        }
        let das: Vec<Vec<f32>> = (0..=MIN_CRITICS)
            .map(|_| rng.vec_nonzero(rows * dims, -2e-3, 2e-3))
            .collect();
        let head = random_head(&mut rng, rows, dims);
        let eps = rng.vec_nonzero(rows * dims, -2.0, 2.0);
        let act = rng.vec_nonzero(rows * dims, -0.95, 0.95);
        let log_alpha = -0.4f32;
        let up = |what: &str, v: &[f32]| device.upload_new(what, v).unwrap();
        let qb: Vec<Buf> = qs.iter().map(|q| up("q", q)).collect();
        let dab: Vec<Buf> = das.iter().map(|d| up("da", d)).collect();
        let (hb, eb, ab) = (up("head", &head), up("eps", &eps), up("act", &act));
        let la = up("log_alpha", &[log_alpha]);
        for count in 1..=MIN_CRITICS + 1 {
            let case = format!("{rows} rows, {count} critics");
            let (q_in, da_in): (Vec<&Buf>, Vec<&Buf>) =
                qb[..count].iter().zip(&dab[..count]).unzip();
            let mut qmin = nan_buffer(&device, "qmin", rows).unwrap();
            let mut da = nan_buffer(&device, "da", rows * dims).unwrap();
            let mut dhead = nan_buffer(&device, "dhead", rows * 2 * dims).unwrap();
            run_one_op(&device, |s| {
                for (i, (q, d)) in q_in.iter().zip(&da_in).enumerate() {
                    k.critic_min_select(s, q, d, &mut qmin, &mut da, i, dims)?;
                }
                k.tanh_gauss_backward(s, &hb, &eb, &ab, &da, &la, &mut dhead, rows, dims)
            });
            let q_refs: Vec<&[f32]> = qs[..count].iter().map(|q| q.as_slice()).collect();
            let (want_min, want_argmin) = critic_min_reference(&q_refs);
            let da_refs: Vec<&[f32]> = das[..count].iter().map(|d| d.as_slice()).collect();
            let want_da = min_select_reference(&want_argmin, &da_refs, dims);
            let got_da = device.download(&da).unwrap();
            assert_eq!(bits(&[&got_da]), bits(&[&want_da]), "{case}: da");
            assert_eq!(
                bits(&[&device.download(&qmin).unwrap()]),
                bits(&[&want_min]),
                "{case}: qmin"
            );
            let running = device.download(&dhead).unwrap();
            let want =
                tanh_gauss_backward_reference(&head, &eps, &act, &want_da, log_alpha, rows, dims);
            let floor = 1e-2 * stepgraph_testkit::rms(&want);
            check_within(&case, "dhead", &running, &want, floor, 1e-4);

            let mut fused = nan_buffer(&device, "dhead", rows * 2 * dims).unwrap();
            let result = stepgraph::exec::run_once(&device, |s| {
                k.tanh_gauss_backward_min(
                    s, &hb, &eb, &ab, &q_in, &da_in, &la, &mut fused, rows, dims,
                )
            });
            if count > MIN_CRITICS {
                let err = result.unwrap_err().chain();
                assert!(
                    err.contains("expected 1 to 4 critics' outputs, found 5"),
                    "{case}: {err}"
                );
                continue;
            }
            result.expect("the fused backward runs");
            assert_eq!(
                bits(&[&device.download(&fused).unwrap()]),
                bits(&[&running]),
                "{case}: fused against running"
            );
            if count == 2 {
                // A gradient of another length is refused, by its name.
                let short = up("da", &das[1][..dims]);
                let err = stepgraph::exec::run_once(&device, |s| {
                    k.tanh_gauss_backward_min(
                        s,
                        &hb,
                        &eb,
                        &ab,
                        &q_in,
                        &[da_in[0], &short],
                        &la,
                        &mut fused,
                        rows,
                        dims,
                    )
                });
                if rows > 1 {
                    let err = err.unwrap_err().chain();
                    assert!(
                        err.contains("critic 1's gradient at the action ([rows, dims])"),
                        "{case}: {err}"
                    );
                }
            }
        }
    }
}

/// The fused minimum with the soft target, and with the actor loss, give the bits of the
/// running minimum (`critic_min` a critic at a time) followed by `soft_target` and
/// `actor_loss`, for one to four critics, with ties; five critics are refused.
#[test]
fn gpu_the_fused_minimum_gives_the_bits_of_the_running_one() {
    use stepgraph_sac::kernels::MIN_CRITICS;
    let (device, k) = gpu();
    for rows in ROWS {
        let mut rng = Rng::new(41 + rows as u64);
        let mut qs: Vec<Vec<f32>> = (0..MIN_CRITICS)
            .map(|_| rng.vec_nonzero(rows, -3.0, 3.0))
            .collect();
        for i in (0..rows).step_by(5) {
            let tie = qs[0][i];
            qs[2][i] = tie;
            qs[1][i] = tie;
        }
        let up = |what: &str, x: &[f32]| device.upload_new(what, x).unwrap();
        let qb: Vec<Buf> = qs.iter().map(|q| up("q", q)).collect();
        let r = up("r", &rng.vec(rows, -1.0, 1.0));
        let done: Vec<f32> = (0..rows).map(|i| f32::from(i % 3 == 0)).collect();
        let done = up("done", &done);
        let logp = up("logp", &rng.vec(rows, -4.0, 2.0));
        let log_alpha = up("log_alpha", &[-0.4]);
        for count in 1..=MIN_CRITICS {
            let outs: Vec<&Buf> = qb[..count].iter().collect();
            let run = |fused: bool| {
                let mut qmin = nan_buffer(&device, "qmin", rows).unwrap();
                let mut argmin = device.alloc_zeros::<u32>("argmin", rows).unwrap();
                let mut y = nan_buffer(&device, "y", rows).unwrap();
                let mut amin = nan_buffer(&device, "actor qmin", rows).unwrap();
                let mut aarg = device.alloc_zeros::<u32>("actor argmin", rows).unwrap();
                let mut loss = nan_buffer(&device, "loss", 1).unwrap();
                run_one_op(&device, |s| {
                    if fused {
                        k.min_soft_target(
                            s,
                            &outs,
                            &r,
                            &done,
                            &logp,
                            &log_alpha,
                            &mut qmin,
                            &mut argmin,
                            &mut y,
                            0.99,
                        )?;
                        return k.min_actor_loss(
                            s, &outs, &logp, &log_alpha, &mut amin, &mut aarg, &mut loss,
                        );
                    }
                    for (i, q) in outs.iter().enumerate() {
                        k.critic_min(s, q, &mut qmin, &mut argmin, i)?;
                        k.critic_min(s, q, &mut amin, &mut aarg, i)?;
                    }
                    k.soft_target(s, &r, &done, &qmin, &logp, &log_alpha, &mut y, 0.99)?;
                    k.actor_loss(s, &amin, &logp, &log_alpha, &mut loss)
                });
                let f = [&qmin, &y, &amin, &loss].map(|b| device.download(b).unwrap());
                let u = [&argmin, &aarg].map(|b| device.download(b).unwrap());
                (bits(&[&f[0], &f[1], &f[2], &f[3]]), u)
            };
            let (fused, running) = (run(true), run(false));
            assert_eq!(fused.0, running.0, "values, {rows} rows, {count} critics");
            assert_eq!(fused.1, running.1, "argmin, {rows} rows, {count} critics");
            // Where critics 0 to 2 tie, the minimum is critic 0's unless critic 3 is below.
            for i in (0..rows).step_by(5) {
                let low = count == 4 && qs[3][i] < qs[0][i];
                assert_eq!(
                    fused.1[0][i],
                    if low { 3 } else { 0 },
                    "row {i}, {count} critics"
                );
            }
        }
        let five: Vec<&Buf> = qb.iter().chain(qb.iter().take(1)).collect();
        let mut qmin = nan_buffer(&device, "qmin", rows).unwrap();
        let mut argmin = device.alloc_zeros::<u32>("argmin", rows).unwrap();
        let mut loss = nan_buffer(&device, "loss", 1).unwrap();
        let err = stepgraph::exec::run_once(&device, |s| {
            k.min_actor_loss(
                s,
                &five,
                &logp,
                &log_alpha,
                &mut qmin,
                &mut argmin,
                &mut loss,
            )
        })
        .unwrap_err()
        .chain();
        assert!(
            err.contains("expected 1 to 4 critics' outputs, found 5"),
            "{err}"
        );
    }
}

#[test]
fn gpu_soft_target_actor_loss_and_alpha_grad_match_their_references() {
    let (device, k) = gpu();
    for rows in ROWS {
        let mut rng = Rng::new(17 + rows as u64);
        let up = |what: &str, v: &[f32]| device.upload_new(what, v).unwrap();
        let r = rng.vec_nonzero(rows, -1.0, 1.0);
        let done: Vec<f32> = (0..rows)
            .map(|i| if i % 9 == 0 { 1.0 } else { 0.0 })
            .collect();
        // Three critics, with ties: the lower index wins one.
        let mut qs: Vec<Vec<f32>> = (0..3).map(|_| rng.vec_nonzero(rows, -3.0, 3.0)).collect();
        qs[1][0] = qs[0][0];
        if rows > 1 {
            qs[2][1] = qs[1][1].min(qs[0][1]);
        }
        let logp = rng.vec_nonzero(rows, -12.0, 4.0);
        let log_alpha = 0.3f32;
        let (rb, db, lb) = (up("r", &r), up("done", &done), up("logp", &logp));
        let qb: Vec<_> = qs.iter().map(|q| up("q", q)).collect();
        let la = up("log_alpha", &[log_alpha]);
        let case = format!("{rows} rows");

        let mut qmin = nan_buffer(&device, "qmin", rows).unwrap();
        let mut argmin = device.upload_new("argmin", &vec![u32::MAX; rows]).unwrap();
        let mut y = nan_buffer(&device, "y", rows).unwrap();
        let mut loss = nan_buffer(&device, "loss", 1).unwrap();
        run_one_op(&device, |s| {
            for (i, q) in qb.iter().enumerate() {
                k.critic_min(s, q, &mut qmin, &mut argmin, i)?;
            }
            k.soft_target(s, &rb, &db, &qmin, &lb, &la, &mut y, 0.99)?;
            k.actor_loss(s, &qmin, &lb, &la, &mut loss)
        });
        let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
        let (want_min, want_argmin) = critic_min_reference(&q_refs);
        assert_eq!(
            bits(&[&device.download(&qmin).unwrap()]),
            bits(&[&want_min]),
            "{case}: qmin"
        );
        assert_eq!(
            device.download(&argmin).unwrap(),
            want_argmin,
            "{case}: argmin"
        );
        let want = soft_target_reference(&r, &done, &want_min, &logp, log_alpha, 0.99);
        check_within(
            &case,
            "soft_target y",
            &device.download(&y).unwrap(),
            &want,
            1.0,
            1e-5,
        );
        let wl = actor_loss_reference(&want_min, &logp, log_alpha);
        check_within(
            &case,
            "actor loss",
            &device.download(&loss).unwrap(),
            &[wl],
            1.0,
            1e-5,
        );

        let mut grad = nan_buffer(&device, "grad", 1).unwrap();
        let mut aloss = nan_buffer(&device, "alpha loss", 1).unwrap();
        run_one_op(&device, |s| {
            k.alpha_grad(s, &lb, &la, &mut grad, &mut aloss, -8.0)
        });
        let (wg, wal) = alpha_grad_reference(&logp, log_alpha, -8.0);
        check_within(
            &case,
            "alpha grad",
            &device.download(&grad).unwrap(),
            &[wg],
            1.0,
            1e-5,
        );
        check_within(
            &case,
            "alpha loss",
            &device.download(&aloss).unwrap(),
            &[wal],
            1.0,
            1e-5,
        );
    }
}

/// Every parameter of a trainer, and its losses, as bits.
fn state_bits(t: &Trainer) -> (Vec<u32>, Vec<u32>) {
    let params = t.parameters().unwrap();
    let refs: Vec<&[f32]> = params.iter().map(|p| p.as_slice()).collect();
    (bits(&refs), bits(&[&t.losses().unwrap()]))
}

/// The planned step on its five streams and the same step on one stream, from the same seed,
/// give the same bits after every one of a few updates, with the critics' matmuls planned
/// for the whole GPU or for their share of it; the updates change what they should (the
/// critics, their targets, the actor, `log α`) and leave every loss finite.
#[test]
fn gpu_the_planned_step_replays_the_one_stream_step_bit_for_bit() {
    let (device, k) = gpu();
    let k = Arc::new(k);
    let targets = [SmTarget::Whole, SmTarget::Share(CRITICS as u32)];
    for (sizes, critic_sms) in [Sizes::small(), Sizes::default()]
        .into_iter()
        .flat_map(|s| targets.map(|t| (s, t)))
    {
        let seed = 2026;
        let config = sac::Config {
            critic_sms,
            ..stepgraph_sac::host::config(sizes)
        };
        let trainer = |schedule| {
            Trainer::with_config(&device, k.clone(), config, DEFAULT_REPLAY, seed, schedule)
                .unwrap()
        };
        let mut planned = trainer(Schedule::Planned);
        let mut serial = trainer(Schedule::OneStream);
        let start = planned.parameters().unwrap();
        for t in 1..=3 {
            planned.update().unwrap();
            serial.update().unwrap();
            let (p, pl) = state_bits(&planned);
            let (s, sl) = state_bits(&serial);
            assert_eq!(
                pl, sl,
                "{sizes:?} {critic_sms}, update {t}: the losses differ"
            );
            assert!(
                p == s,
                "{sizes:?} {critic_sms}, update {t}: the parameters differ"
            );
            let losses = planned.losses().unwrap();
            assert!(
                losses.iter().all(|l| l.is_finite()),
                "{sizes:?}: {losses:?}"
            );
            eprintln!("{sizes:?}, update {t}: L_Q1, L_Q2, L_pi, L_alpha = {losses:?}");
        }
        let end = planned.parameters().unwrap();
        let n = Mlp::NAMES.len();
        let nets = Trainer::networks(planned.step.buffers());
        // Every network's 6 tensors (Trainer::networks' order), then log_alpha: all moved.
        assert_eq!(start.len(), nets.len() * n + 1);
        for (i, (a, b)) in start.iter().zip(&end).enumerate() {
            let name = match nets.get(i / n) {
                None => "log_alpha".to_string(),
                Some((net, _)) => format!("{net}.{}", Mlp::NAMES[i % n]),
            };
            assert_ne!(a, b, "{sizes:?}: {name} did not change");
        }
        let counter = planned.step.download(|b| b.rng.counter()).unwrap();
        assert_eq!(counter, [3], "{sizes:?}: one draw per update");
        let t = planned.step.download(|b| b.clock.t()).unwrap();
        assert_eq!(t, [3], "{sizes:?}: one Adam step per update");
    }
}

/// Each update draws its own batch from the replay buffer and its own noise, in the graph:
/// the rows are the CPU draw of the generator at that update's counter, the batch is
/// those rows of the replay buffer bit for bit, the normals are the reference's within
/// their ulp bound, and the next update draws other rows.
#[test]
fn gpu_each_update_draws_a_fresh_batch_and_noise_from_the_replay_buffer() {
    use stepgraph_kernels::RNG_NORMAL_ULPS;
    use stepgraph_kernels::reference::{gather_rows_reference, rng_indices_reference};
    use stepgraph_sac::model::{BATCH_ROWS, NOISE_CUR, NOISE_NEXT};
    let (device, k) = gpu();
    let sizes = Sizes::small();
    let (rows, seed) = (5003, 77);
    let mut t =
        Trainer::with_replay(&device, Arc::new(k), sizes, rows, seed, Schedule::Planned).unwrap();
    let replay = t
        .step
        .download_many(|b| {
            vec![
                &b.replay.s,
                &b.replay.a,
                &b.replay.r,
                &b.replay.s2,
                &b.replay.done,
            ]
        })
        .unwrap();
    let widths = [sizes.obs, sizes.action, 1, sizes.obs, 1];
    let mut previous = None;
    for counter in 0..2u64 {
        t.update().unwrap();
        let idx = t.step.download(|b| &b.batch_rows).unwrap();
        let want = rng_indices_reference(seed, counter, BATCH_ROWS, rows as u32, sizes.batch);
        assert_eq!(idx, want, "update {counter}: the rows drawn");
        assert!(idx.iter().all(|&i| (i as usize) < rows));
        let batch = t
            .step
            .download_many(|b| {
                vec![
                    &b.batch.s,
                    &b.batch.a,
                    &b.batch.r,
                    &b.batch.s2,
                    &b.batch.done,
                ]
            })
            .unwrap();
        for (field, ((got, src), w)) in batch.iter().zip(&replay).zip(widths).enumerate() {
            let want = gather_rows_reference(src, &idx, w);
            assert_eq!(
                bits(&[got]),
                bits(&[&want]),
                "update {counter}: batch field {field}"
            );
        }
        let n = sizes.batch * sizes.action;
        let noise = t
            .step
            .download_many(|b| vec![&b.noise.next, &b.noise.cur])
            .unwrap();
        for (sub, got) in [NOISE_NEXT, NOISE_CUR].into_iter().zip(&noise) {
            let want = stepgraph_kernels::reference::rng_normal_reference(seed, counter, sub, n);
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (g.to_bits() as i64 - w.to_bits() as i64).unsigned_abs())
                .max()
                .unwrap();
            assert!(
                worst <= u64::from(RNG_NORMAL_ULPS),
                "update {counter}: {worst} ulps"
            );
        }
        if let Some(p) = previous.replace(idx.clone()) {
            assert_ne!(p, idx, "two updates drew the same rows");
        }
    }
}
