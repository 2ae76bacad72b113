//! GPU tests of an IQL expectile head in one pass (`Kernels::expectile_head`): `e`, `de`,
//! the layer's gradients and the loss it adds, against the CPU reference, at the step's
//! sizes and at ragged ones, for both expectiles; run twice for the same bits. They need
//! a CUDA GPU of compute capability 9.0.
//!
//! Inputs are random and nonzero; outputs are poisoned with NaN first, so an element the
//! kernels did not write fails the check, and the loss buffer starts from random values,
//! so a slot the kernels overwrote instead of adding into fails too. Bounds: [`ROW_BOUND`]
//! for `e` and `de`, a dot product of `H` f32 terms (relative to the tensor's root mean
//! square below it: `u = qbar − e` cancels); [`SUM_BOUND`] for the sums over up to 70000
//! rows, added in f32 in chunks of 64 to 69 rows as the trunk join's are (within 5.3e-7 in
//! an f32 model). A wrong index in `e`, `de` or `dwe` is off by order 1; a lost or doubled
//! row moves the loss and `dbe` by about 1/B only, which the ragged batches (1001 and 1
//! rows) make large.

use super::{Rng, bits, check_within, nan_buffer, rms, run_one_op};
use stepgraph::{Device, Result};
use stepgraph_dqn::kernels::{
    Expectile, ExpectileHeadDims, ExpectileHeadInputs, ExpectileHeadOutputs, Kernels, LOSS_SLOTS,
    LossSlot, expectile_head_scratch_len,
};
use stepgraph_dqn::reference::expectile_head_reference;

const ROW_BOUND: f64 = 1e-5;
const SUM_BOUND: f64 = 1e-4;

struct Inputs {
    h: Vec<f32>,
    we: Vec<f32>,
    be: f32,
    qbar: Vec<f32>,
    losses: Vec<f32>,
}

fn inputs(dims: ExpectileHeadDims, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    Inputs {
        h: rng.vec_nonzero(dims.batch * dims.hidden, -1.0, 1.0),
        we: rng.vec_nonzero(dims.hidden, -0.2, 0.2),
        be: rng.vec_nonzero(1, -0.5, 0.5)[0],
        qbar: rng.vec_nonzero(dims.batch, -1.0, 1.0),
        losses: rng.vec_nonzero(LOSS_SLOTS, 0.0, 1.0),
    }
}

/// `(e, de, dwe, dbe, losses)` from one eager run.
type Outputs = (Vec<f32>, Vec<f32>, Vec<f32>, f32, Vec<f32>);

fn run(
    device: &Device,
    k: &Kernels,
    dims: ExpectileHeadDims,
    ex: Expectile,
    x: &Inputs,
) -> Result<Outputs> {
    let up = |what: &str, v: &[f32]| device.upload_new(what, v);
    let (h, we, be, qbar) = (
        up("h", &x.h)?,
        up("we", &x.we)?,
        up("be", &[x.be])?,
        up("qbar", &x.qbar)?,
    );
    let mut losses = up("losses", &x.losses)?;
    let nan = |what: &str, len: usize| nan_buffer(device, what, len);
    let (mut e, mut de) = (nan("e", dims.batch)?, nan("de", dims.batch)?);
    let (mut dwe, mut dbe) = (nan("dwe", dims.hidden)?, nan("dbe", 1)?);
    let mut scratch = nan("scratch", expectile_head_scratch_len(dims))?;
    let inputs = ExpectileHeadInputs {
        h: &h,
        we: &we,
        be: &be,
        qbar: &qbar,
    };
    run_one_op(device, |stream| {
        let out = ExpectileHeadOutputs {
            e: &mut e,
            de: &mut de,
            dwe: &mut dwe,
            dbe: &mut dbe,
            losses: &mut losses,
        };
        k.expectile_head(stream, dims, &inputs, ex, out, &mut scratch)
    })?;
    Ok((
        device.download(&e)?,
        device.download(&de)?,
        device.download(&dwe)?,
        device.download(&dbe)?[0],
        device.download(&losses)?,
    ))
}

const CASES: [ExpectileHeadDims; 4] = [
    // The step's sizes.
    ExpectileHeadDims {
        batch: 16384,
        hidden: 256,
    },
    // A batch no chunk divides, a width past four units a lane and no multiple of 32.
    ExpectileHeadDims {
        batch: 1001,
        hidden: 100,
    },
    // One row, one unit: most lanes idle.
    ExpectileHeadDims {
        batch: 1,
        hidden: 1,
    },
    // Enough rows that the 1024-chunk cap sets the chunk length (69 rows).
    ExpectileHeadDims {
        batch: 70000,
        hidden: 256,
    },
];

#[test]
fn gpu_expectile_head_matches_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    for (seed, dims) in CASES.into_iter().enumerate() {
        for ex in [Expectile::HIGH, Expectile::LOW] {
            let case = format!("{dims:?}, tau {}", ex.tau);
            let x = inputs(dims, 100 + seed as u64);
            let (e, de, dwe, dbe, losses) = run(&device, &k, dims, ex, &x)?;
            let want = expectile_head_reference(dims, &x.h, &x.we, x.be, &x.qbar, ex);
            check_within(&case, "e", &e, &want.e, rms(&want.e), ROW_BOUND);
            check_within(&case, "de", &de, &want.de, rms(&want.de), ROW_BOUND);
            check_within(&case, "dwe", &dwe, &want.dwe, rms(&want.dwe), SUM_BOUND);
            let floor = want.dbe.abs().max(1e-3);
            check_within(
                &case,
                "dbe",
                &[dbe],
                &[want.dbe],
                f64::from(floor),
                SUM_BOUND,
            );
            for slot in [LossSlot::Iql, LossSlot::Total] {
                let i = slot.index();
                let added = f64::from(losses[i]) - f64::from(x.losses[i]);
                // Relative, with a floor: one row's loss may be near zero.
                let err = (added - want.losses[i]).abs() / want.losses[i].abs().max(1e-3);
                assert!(
                    err <= SUM_BOUND,
                    "{case}: loss slot {slot:?} got {added:e} added, want {:e}",
                    want.losses[i]
                );
            }
            for (i, (&got, &before)) in losses.iter().zip(&x.losses).enumerate() {
                if i != LossSlot::Iql.index() && i != LossSlot::Total.index() {
                    assert_eq!(got.to_bits(), before.to_bits(), "{case}: slot {i} changed");
                }
            }
        }
    }
    Ok(())
}

#[test]
fn gpu_expectile_head_refuses_a_trunk_wider_than_its_registers() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let dims = ExpectileHeadDims {
        batch: 4,
        hidden: 257,
    };
    let x = inputs(dims, 5);
    let e = run(&device, &k, dims, Expectile::HIGH, &x)
        .unwrap_err()
        .chain();
    assert!(
        e.contains("expected `H <= 32 * EXPECTILE_HEAD_MAX_UNITS`, found 257"),
        "{e}"
    );
    Ok(())
}

#[test]
fn gpu_expectile_head_repeats_bit_for_bit() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let dims = CASES[0];
    let x = inputs(dims, 9);
    let all = |(e, de, dwe, dbe, losses): &Outputs| bits(&[e, de, dwe, &[*dbe], losses]);
    let first = all(&run(&device, &k, dims, Expectile::LOW, &x)?);
    let second = all(&run(&device, &k, dims, Expectile::LOW, &x)?);
    assert!(first == second, "two runs on the same inputs differ");
    Ok(())
}
