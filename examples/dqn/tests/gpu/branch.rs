//! GPU tests of a branch's head kernels: the forward (`Kernels::branch_head_forward`, the
//! GLU and the advantage layer) and the backward (`Kernels::branch_head_backward`: `du` and
//! the three sums it folds in, the advantage layer's weight and bias gradients and the gate
//! layer's bias gradient) against the CPU references, at the step's sizes and at ragged
//! ones; the backward also run twice for the same bits. They need a CUDA GPU of compute
//! capability 9.0.
//!
//! Inputs are random and nonzero; outputs are poisoned with NaN first, so an element the
//! kernels did not write fails the check. Bounds are on the largest error relative to the
//! element's magnitude or, below the tensor's root mean square, to that: [`DU_BOUND`] for
//! `du`, a sum of `A` f32 products through the GLU's sigmoid, and [`SUM_BOUND`] for the
//! sums over up to 70000 rows, which the kernels add in f32 in chunks of about 64 rows
//! (the trunk join's sums, added the same way, are within 5.3e-7 in an f32 model). The
//! forward's `g` is one f32 product through the sigmoid and `adv` a sum of `G` of them:
//! [`DU_BOUND`]. An indexing mistake is of order 1.

use super::{Rng, bits, check_within, nan_buffer, rms, run_one_op};
use stepgraph::{Device, Result};
use stepgraph_dqn::kernels::{
    BranchHeadDims, BranchHeadInputs, BranchHeadOutputs, Kernels, branch_head_backward_scratch_len,
};
use stepgraph_dqn::reference::{
    BranchHeadReference, branch_head_backward_reference, branch_head_forward_reference,
};

const DU_BOUND: f64 = 1e-5;
const SUM_BOUND: f64 = 1e-4;

/// The inputs, host side, in `BranchHeadInputs` order.
struct Inputs {
    dadv: Vec<f32>,
    u: Vec<f32>,
    g: Vec<f32>,
    wa: Vec<f32>,
}

fn inputs(dims: BranchHeadDims, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let (b, g, a) = (dims.batch, dims.glu, dims.actions);
    Inputs {
        dadv: rng.vec_nonzero(b * a, -1.0, 1.0),
        u: rng.vec_nonzero(b * 2 * g, -3.0, 3.0),
        g: rng.vec_nonzero(b * g, -1.0, 1.0),
        wa: rng.vec_nonzero(a * g, -1.0, 1.0),
    }
}

/// The kernels' outputs from one eager run, in the reference's struct.
fn run(
    device: &Device,
    k: &Kernels,
    dims: BranchHeadDims,
    x: &Inputs,
) -> Result<BranchHeadReference> {
    let (b, g, a) = (dims.batch, dims.glu, dims.actions);
    let up = |what: &str, v: &[f32]| device.upload_new(what, v);
    let (dadv, u, gbuf, wa) = (
        up("dadv", &x.dadv)?,
        up("u", &x.u)?,
        up("g", &x.g)?,
        up("wa", &x.wa)?,
    );
    let nan = |what: &str, len: usize| nan_buffer(device, what, len);
    let mut du = nan("du", b * 2 * g)?;
    let (mut dwa, mut dba, mut dbg) = (nan("dwa", a * g)?, nan("dba", a)?, nan("dbg", 2 * g)?);
    let mut scratch = nan("scratch", branch_head_backward_scratch_len(dims))?;
    let inputs = BranchHeadInputs {
        dadv: &dadv,
        u: &u,
        g: &gbuf,
        wa: &wa,
    };
    run_one_op(device, |stream| {
        let out = BranchHeadOutputs {
            du: &mut du,
            dwa: &mut dwa,
            dba: &mut dba,
            dbg: &mut dbg,
        };
        k.branch_head_backward(stream, dims, &inputs, out, &mut scratch)
    })?;
    Ok(BranchHeadReference {
        du: device.download(&du)?,
        dwa: device.download(&dwa)?,
        dba: device.download(&dba)?,
        dbg: device.download(&dbg)?,
    })
}

fn check(case: &str, what: &str, got: &[f32], want: &[f32], bound: f64) {
    check_within(case, what, got, want, rms(want), bound);
}

const CASES: [BranchHeadDims; 4] = [
    // The step's sizes.
    BranchHeadDims {
        batch: 16384,
        glu: 32,
        actions: 5,
    },
    // A batch no chunk divides, a GLU past one unit a lane (no multiple of 32), 3 actions.
    BranchHeadDims {
        batch: 1001,
        glu: 45,
        actions: 3,
    },
    // One row, one action, one unit: most lanes idle.
    BranchHeadDims {
        batch: 1,
        glu: 1,
        actions: 1,
    },
    // The largest sizes the kernel takes: 8 actions, two full units a lane, and enough
    // rows that the 1024-chunk cap sets the chunk length.
    BranchHeadDims {
        batch: 70000,
        glu: 64,
        actions: 8,
    },
];

#[test]
fn gpu_branch_head_backward_matches_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    for (seed, dims) in CASES.into_iter().enumerate() {
        let case = format!("{dims:?}");
        assert!(dims.supported(), "{case}: a test case the kernel refuses");
        let x = inputs(dims, 60 + seed as u64);
        let got = run(&device, &k, dims, &x)?;
        let want = branch_head_backward_reference(dims, &x.dadv, &x.u, &x.g, &x.wa);
        check(&case, "du", &got.du, &want.du, DU_BOUND);
        check(&case, "dwa", &got.dwa, &want.dwa, SUM_BOUND);
        check(&case, "dba", &got.dba, &want.dba, SUM_BOUND);
        check(&case, "dbg", &got.dbg, &want.dbg, SUM_BOUND);
    }
    Ok(())
}

#[test]
fn gpu_branch_head_kernels_refuse_sizes_past_their_registers() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let wide = BranchHeadDims {
        batch: 4,
        glu: 65,
        actions: 5,
    };
    let e = run(&device, &k, wide, &inputs(wide, 3))
        .unwrap_err()
        .chain();
    assert!(e.contains("found 5 actions, width 65"), "{e}");
    let many = BranchHeadDims {
        batch: 4,
        glu: 8,
        actions: 9,
    };
    let e = run_forward(&device, &k, many, &inputs(many, 4), &[0.5; 9], true)
        .unwrap_err()
        .chain();
    assert!(e.contains("found 9 actions, width 8"), "{e}");
    Ok(())
}

#[test]
fn gpu_branch_head_backward_repeats_bit_for_bit() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let dims = CASES[0];
    let x = inputs(dims, 8);
    let all = |r: &BranchHeadReference| bits(&[&r.du, &r.dwa, &r.dba, &r.dbg]);
    let first = all(&run(&device, &k, dims, &x)?);
    let second = all(&run(&device, &k, dims, &x)?);
    assert!(first == second, "two runs on the same inputs differ");
    Ok(())
}

/// `(g, adv)` from one eager run of the forward; `g` is `None` when not asked for.
fn run_forward(
    device: &Device,
    k: &Kernels,
    dims: BranchHeadDims,
    x: &Inputs,
    ba: &[f32],
    write_g: bool,
) -> Result<(Option<Vec<f32>>, Vec<f32>)> {
    let (b, g, a) = (dims.batch, dims.glu, dims.actions);
    let u = device.upload_new("u", &x.u)?;
    let wa = device.upload_new("wa", &x.wa)?;
    let ba = device.upload_new("ba", ba)?;
    let mut gbuf = nan_buffer(device, "g", b * g)?;
    let mut adv = nan_buffer(device, "adv", b * a)?;
    run_one_op(device, |stream| {
        let g = if write_g { Some(&mut gbuf) } else { None };
        k.branch_head_forward(stream, dims, &u, &wa, &ba, g, &mut adv)
    })?;
    let g = if write_g {
        Some(device.download(&gbuf)?)
    } else {
        let untouched = device.download(&gbuf)?;
        assert!(
            untouched.iter().all(|v| v.is_nan()),
            "{dims:?}: g was written though not asked for"
        );
        None
    };
    Ok((g, device.download(&adv)?))
}

#[test]
fn gpu_branch_head_forward_matches_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    for (seed, dims) in CASES.into_iter().enumerate() {
        let case = format!("{dims:?}");
        let x = inputs(dims, 80 + seed as u64);
        let ba = Rng::new(90 + seed as u64).vec_nonzero(dims.actions, -1.0, 1.0);
        let (want_g, want_adv) = branch_head_forward_reference(dims, &x.u, &x.wa, &ba);
        let (g, adv) = run_forward(&device, &k, dims, &x, &ba, true)?;
        let g = g.expect("g was asked for");
        check(&case, "g", &g, &want_g, DU_BOUND);
        check(&case, "adv", &adv, &want_adv, DU_BOUND);
        // Without g: the same adv, bit for bit.
        let (_, adv_only) = run_forward(&device, &k, dims, &x, &ba, false)?;
        assert!(
            bits(&[&adv_only]) == bits(&[&adv]),
            "{case}: adv differs when g is not written"
        );
    }
    Ok(())
}
