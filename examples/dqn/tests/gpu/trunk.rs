//! GPU tests of the trunk's gradient join (`Kernels::trunk_grad_join`): `dz2` and the
//! three sums it folds in (layer 2's bias gradient, the value head's weight and bias
//! gradients) against the CPU reference, at the step's sizes and at ragged ones, and run
//! twice for the same bits. They need a CUDA GPU of compute capability 9.0.
//!
//! Inputs are random and nonzero, half of `h_out` negative (masked); outputs are poisoned
//! with NaN first, so an element the kernels did not write fails the check. Bounds are on
//! the largest error relative to the element's magnitude or, below the tensor's root mean
//! square, to that (cancellation dominates there): [`DZ2_BOUND`] for `dz2`, a sum of
//! `D + 4` f32 terms, and [`SUM_BOUND`] for the sums over up to 16384 rows, which the
//! kernels add in f32 in chunks. An f32 model of the kernels' order at the step's sizes
//! (`examples/dqn/join_model.py`) is within 5.3e-7 of the f64 reference
//! by this measure for `dz2` and the sums. An indexing mistake is of order 1.
//!
//! Also the trunk's first layer backward (`Kernels::trunk_l1_grad`), below.

use super::{Rng, bits, check_within, nan_buffer, rms, run_one_op};
use stepgraph::{Device, DeviceBuffer, Result};
use stepgraph_dqn::kernels::{
    Kernels, TrunkDims, TrunkGrads, TrunkJoinOutputs, TrunkL1Dims, TrunkL1Inputs, TrunkL1Outputs,
    trunk_grad_join_scratch_len, trunk_l1_grad_scratch_len,
};
use stepgraph_dqn::reference::{
    TrunkJoinReference, trunk_grad_join_reference, trunk_l1_grad_reference,
};

const DZ2_BOUND: f64 = 1e-5;
const SUM_BOUND: f64 = 1e-4;

/// The inputs, host side, in `TrunkGrads` order (`dh_branch` packed `[D, B, H]`).
struct Inputs {
    h_out: Vec<f32>,
    dv: Vec<f32>,
    wv: Vec<f32>,
    dh_branch: Vec<f32>,
    de_hi: Vec<f32>,
    we_hi: Vec<f32>,
    de_lo: Vec<f32>,
    we_lo: Vec<f32>,
    dh_iqn: Vec<f32>,
}

fn inputs(dims: TrunkDims, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let (b, h, d) = (dims.batch, dims.hidden, dims.branches);
    Inputs {
        h_out: rng.vec_nonzero(b * h, -1.0, 1.0),
        dv: rng.vec_nonzero(b, -1.0, 1.0),
        wv: rng.vec_nonzero(h, -1.0, 1.0),
        dh_branch: rng.vec_nonzero(d * b * h, -1.0, 1.0),
        de_hi: rng.vec_nonzero(b, -1.0, 1.0),
        we_hi: rng.vec_nonzero(h, -1.0, 1.0),
        de_lo: rng.vec_nonzero(b, -1.0, 1.0),
        we_lo: rng.vec_nonzero(h, -1.0, 1.0),
        dh_iqn: rng.vec_nonzero(b * h, -1.0, 1.0),
    }
}

/// The kernels' outputs from one eager run, in the reference's struct.
fn run(device: &Device, k: &Kernels, dims: TrunkDims, x: &Inputs) -> Result<TrunkJoinReference> {
    let (b, h) = (dims.batch, dims.hidden);
    let up = |what: &str, v: &[f32]| device.upload_new(what, v);
    let h_out = up("h_out", &x.h_out)?;
    let dv = up("dv", &x.dv)?;
    let wv = up("wv", &x.wv)?;
    let dh_branch = x
        .dh_branch
        .chunks(b * h)
        .map(|c| up("dh_branch", c))
        .collect::<Result<Vec<DeviceBuffer<f32>>>>()?;
    let de_hi = up("de_hi", &x.de_hi)?;
    let we_hi = up("we_hi", &x.we_hi)?;
    let de_lo = up("de_lo", &x.de_lo)?;
    let we_lo = up("we_lo", &x.we_lo)?;
    let dh_iqn = up("dh_iqn", &x.dh_iqn)?;
    let nan = |what: &str, len: usize| nan_buffer(device, what, len);
    let mut dz2 = nan("dz2", b * h)?;
    let mut scratch = nan("scratch", trunk_grad_join_scratch_len(b, h))?;
    let (mut db2, mut dwv, mut dbv) = (nan("db2", h)?, nan("dwv", h)?, nan("dbv", 1)?);
    let grads = TrunkGrads {
        h_out: &h_out,
        dv: &dv,
        wv: &wv,
        dh_branch: &dh_branch,
        de_hi: &de_hi,
        we_hi: &we_hi,
        de_lo: &de_lo,
        we_lo: &we_lo,
        dh_iqn: &dh_iqn,
    };
    run_one_op(device, |stream| {
        let out = TrunkJoinOutputs {
            db2: &mut db2,
            dwv: &mut dwv,
            dbv: &mut dbv,
        };
        k.trunk_grad_join(stream, dims, &grads, &mut dz2, &mut scratch, out)
    })?;
    Ok(TrunkJoinReference {
        dz2: device.download(&dz2)?,
        db2: device.download(&db2)?,
        dwv: device.download(&dwv)?,
        dbv: device.download(&dbv)?[0],
    })
}

fn check(case: &str, what: &str, got: &[f32], want: &[f32], bound: f64) {
    check_within(case, what, got, want, rms(want), bound);
}

const CASES: [TrunkDims; 4] = [
    // The step's sizes.
    TrunkDims {
        batch: 16384,
        hidden: 256,
        branches: 4,
    },
    // A batch no chunk divides, a width that is no multiple of 32, three branches.
    TrunkDims {
        batch: 1001,
        hidden: 100,
        branches: 3,
    },
    // One row, one branch: a chunk of one row, most threads idle.
    TrunkDims {
        batch: 1,
        hidden: 33,
        branches: 1,
    },
    // Every branch slot the kernel unrolls (MAX_BRANCHES = 8), and 35 column blocks: the
    // 1024-block cap leaves 29 chunks of 142 rows, more than the 128 the plan aims at.
    TrunkDims {
        batch: 4096,
        hidden: 1100,
        branches: 8,
    },
];

#[test]
fn gpu_trunk_grad_join_matches_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    for (seed, dims) in CASES.into_iter().enumerate() {
        let case = format!("{dims:?}");
        let x = inputs(dims, 40 + seed as u64);
        let got = run(&device, &k, dims, &x)?;
        let want = trunk_grad_join_reference(
            dims,
            &x.h_out,
            &x.dv,
            &x.wv,
            &x.dh_branch,
            &x.de_hi,
            &x.we_hi,
            &x.de_lo,
            &x.we_lo,
            &x.dh_iqn,
        );
        check(&case, "dz2", &got.dz2, &want.dz2, DZ2_BOUND);
        check(&case, "db2", &got.db2, &want.db2, SUM_BOUND);
        check(&case, "dwv", &got.dwv, &want.dwv, SUM_BOUND);
        check(&case, "dbv", &[got.dbv], &[want.dbv], SUM_BOUND);
    }
    Ok(())
}

#[test]
fn gpu_trunk_grad_join_repeats_bit_for_bit() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let dims = CASES[0];
    let x = inputs(dims, 7);
    let all = |r: &TrunkJoinReference| bits(&[&r.dz2, &r.db2, &r.dwv, &[r.dbv]]);
    let first = all(&run(&device, &k, dims, &x)?);
    let second = all(&run(&device, &k, dims, &x)?);
    assert!(first == second, "two runs on the same inputs differ");
    Ok(())
}

// ---- The trunk's first layer, backward (`Kernels::trunk_l1_grad`) ----
//
// Inputs random and nonzero, about half of `h1` negative (masked). `dw1` is a TF32
// product: each operand rounded to 10 mantissa bits (a relative 2^-11 each), so a sum of
// B products with random signs is off by about 1e-3 of its typical size; the bound is
// [`L1_DW_BOUND`] relative to each element or, below the root mean square, to that. An
// indexing mistake is of order 1. `db1` adds f32 values: [`SUM_BOUND`].

const L1_DW_BOUND: f64 = 5e-3;

const L1_CASES: [TrunkL1Dims; 4] = [
    // The step's sizes.
    TrunkL1Dims {
        batch: 16384,
        hidden: 256,
        state: 64,
    },
    // A batch no chunk of 32 rows divides, widths that fill no warp or tile.
    TrunkL1Dims {
        batch: 1001,
        hidden: 100,
        state: 12,
    },
    // One row, the smallest widths.
    TrunkL1Dims {
        batch: 1,
        hidden: 4,
        state: 4,
    },
    // Past the 256-chunk cap: chunks of 160 rows.
    TrunkL1Dims {
        batch: 40000,
        hidden: 256,
        state: 64,
    },
];

struct L1Inputs {
    dh1: Vec<f32>,
    h1: Vec<f32>,
    s: Vec<f32>,
}

fn l1_inputs(dims: TrunkL1Dims, seed: u64) -> L1Inputs {
    let mut rng = Rng::new(seed);
    let (b, h, s) = (dims.batch, dims.hidden, dims.state);
    L1Inputs {
        dh1: rng.vec_nonzero(b * h, -1.0, 1.0),
        h1: rng.vec_nonzero(b * h, -1.0, 1.0),
        s: rng.vec_nonzero(b * s, -1.0, 1.0),
    }
}

fn l1_run(
    device: &Device,
    k: &Kernels,
    dims: TrunkL1Dims,
    x: &L1Inputs,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let up = |what: &str, v: &[f32]| device.upload_new(what, v);
    let (dh1, h1, s) = (up("dh1", &x.dh1)?, up("h1", &x.h1)?, up("s", &x.s)?);
    let mut scratch = nan_buffer(device, "scratch", trunk_l1_grad_scratch_len(dims))?;
    let mut dw1 = nan_buffer(device, "dw1", dims.hidden * dims.state)?;
    let mut db1 = nan_buffer(device, "db1", dims.hidden)?;
    let inputs = TrunkL1Inputs {
        dh1: &dh1,
        h1: &h1,
        s: &s,
    };
    run_one_op(device, |stream| {
        let out = TrunkL1Outputs {
            dw1: &mut dw1,
            db1: &mut db1,
        };
        k.trunk_l1_grad(stream, dims, &inputs, &mut scratch, out)
    })?;
    Ok((device.download(&dw1)?, device.download(&db1)?))
}

#[test]
fn gpu_trunk_l1_grad_matches_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    for (seed, dims) in L1_CASES.into_iter().enumerate() {
        let case = format!("{dims:?}");
        let x = l1_inputs(dims, 60 + seed as u64);
        let (dw1, db1) = l1_run(&device, &k, dims, &x)?;
        let (want_dw1, want_db1) = trunk_l1_grad_reference(&x.dh1, &x.h1, &x.s, dims);
        check(&case, "dw1", &dw1, &want_dw1, L1_DW_BOUND);
        check(&case, "db1", &db1, &want_db1, SUM_BOUND);
    }
    Ok(())
}

#[test]
fn gpu_trunk_l1_grad_repeats_bit_for_bit() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let dims = L1_CASES[0];
    let x = l1_inputs(dims, 9);
    let (a, b) = l1_run(&device, &k, dims, &x)?;
    let (c, d) = l1_run(&device, &k, dims, &x)?;
    assert!(
        bits(&[&a, &b]) == bits(&[&c, &d]),
        "two runs on the same inputs differ"
    );
    Ok(())
}

#[test]
fn gpu_trunk_l1_grad_refuses_what_its_tiles_do_not_hold() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let dims = TrunkL1Dims {
        batch: 8,
        hidden: 320,
        state: 64,
    };
    let x = l1_inputs(dims, 3);
    let err = l1_run(&device, &k, dims, &x).unwrap_err().chain();
    assert!(
        err.contains("trunk_l1_grad_partial: expected `H <= TL1_MAX_H`, found 320"),
        "{err}"
    );
    Ok(())
}
