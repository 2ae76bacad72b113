//! GPU tests of the per-(sample, branch) head kernels: the double-DQN target
//! (`Kernels::ddqn_target`) and the dueling losses with their gradients
//! (`Kernels::dueling_losses`), against the CPU references, at the step's sizes and at
//! ragged ones: branch counts that leave idle lanes in a group (3 of 4, 5 of 8), one
//! branch, one action, and advantages on a coarse grid so that the target's arg-max meets
//! ties (the first maximum wins). They need a CUDA GPU of compute capability 9.0.
//!
//! Outputs are poisoned with NaN first and the loss buffer starts from random values, so
//! an element not written, or a slot overwritten instead of added into, fails. Bounds:
//! [`ROW_BOUND`] for per-sample values (a few f32 operations; relative to the tensor's root
//! mean square below it), [`SUM_BOUND`] for the losses, sums over `B D` terms added per
//! block and then across blocks. An indexing mistake is of order 1.

use super::{Rng, check_within, nan_buffer, rms, run_one_op};
use stepgraph::{Device, DeviceBuffer, Result};
use stepgraph_dqn::kernels::{
    DdqnTargetInputs, DuelingCoefficients, DuelingDims, DuelingInputs, DuelingOutputs, Kernels,
    LOSS_SLOTS, LossSlot,
};
use stepgraph_dqn::reference::{ddqn_target_reference, dueling_losses_reference};

const ROW_BOUND: f64 = 1e-5;
const SUM_BOUND: f64 = 1e-4;

const CASES: [DuelingDims; 5] = [
    // The step's sizes.
    DuelingDims {
        batch: 16384,
        branches: 4,
        actions: 5,
    },
    // Three branches in groups of four lanes; a batch no block divides.
    DuelingDims {
        batch: 1001,
        branches: 3,
        actions: 4,
    },
    // Five branches in groups of eight.
    DuelingDims {
        batch: 333,
        branches: 5,
        actions: 7,
    },
    // One branch (groups of one lane), one action.
    DuelingDims {
        batch: 77,
        branches: 1,
        actions: 1,
    },
    // Every branch slot (MAX_BRANCHES = 8), one sample.
    DuelingDims {
        batch: 1,
        branches: 8,
        actions: 3,
    },
];

/// `n` values on a grid of 0.5 in [-1, 1]: the arg-max meets ties often.
fn coarse(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.vec(n, 0.0, 5.0)
        .iter()
        .map(|x| x.floor() * 0.5 - 1.0)
        .collect()
}

fn upload_per_branch(
    device: &Device,
    what: &str,
    packed: &[f32],
    dims: DuelingDims,
) -> Result<Vec<DeviceBuffer<f32>>> {
    packed
        .chunks(dims.batch * dims.actions)
        .map(|c| device.upload_new(what, c))
        .collect()
}

#[test]
fn gpu_ddqn_target_matches_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    for (seed, dims) in CASES.into_iter().enumerate() {
        let case = format!("{dims:?}");
        let mut rng = Rng::new(200 + seed as u64);
        let (b, n) = (dims.batch, dims.branches * dims.batch * dims.actions);
        let v2 = rng.vec_nonzero(b, -1.0, 1.0);
        let adv2 = coarse(&mut rng, n);
        let vt = rng.vec_nonzero(b, -1.0, 1.0);
        let advt = rng.vec_nonzero(n, -1.0, 1.0);
        let r = rng.vec_nonzero(b, -1.0, 1.0);
        let done: Vec<f32> = rng
            .vec(b, 0.0, 1.0)
            .iter()
            .map(|&x| if x < 0.25 { 1.0 } else { 0.0 })
            .collect();
        let gamma = 0.97;
        let (want_y, want_ybar) =
            ddqn_target_reference(dims, &v2, &adv2, &vt, &advt, &r, &done, gamma);
        let up = |what: &str, v: &[f32]| device.upload_new(what, v);
        let (v2d, vtd, rd, doned) = (
            up("v2", &v2)?,
            up("vt", &vt)?,
            up("r", &r)?,
            up("done", &done)?,
        );
        let adv2d = upload_per_branch(&device, "adv2", &adv2, dims)?;
        let advtd = upload_per_branch(&device, "advt", &advt, dims)?;
        let mut y = nan_buffer(&device, "y", b * dims.branches)?;
        let mut ybar = nan_buffer(&device, "ybar", b)?;
        let inputs = DdqnTargetInputs {
            v2: &v2d,
            adv2: &adv2d,
            vt: &vtd,
            advt: &advtd,
            r: &rd,
            done: &doned,
        };
        run_one_op(&device, |stream| {
            k.ddqn_target(stream, dims, &inputs, gamma, &mut y, &mut ybar)
        })?;
        let (y, ybar) = (device.download(&y)?, device.download(&ybar)?);
        check_within(&case, "y", &y, &want_y, rms(&want_y), ROW_BOUND);
        check_within(&case, "ybar", &ybar, &want_ybar, rms(&want_ybar), ROW_BOUND);
    }
    Ok(())
}

#[test]
fn gpu_dueling_losses_match_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let coef = DuelingCoefficients::default();
    for (seed, dims) in CASES.into_iter().enumerate() {
        let case = format!("{dims:?}");
        let mut rng = Rng::new(300 + seed as u64);
        let (b, d, a) = (dims.batch, dims.branches, dims.actions);
        let v = rng.vec_nonzero(b, -1.0, 1.0);
        let adv = rng.vec_nonzero(d * b * a, -1.0, 1.0);
        let act: Vec<i32> = rng
            .vec(b * d, 0.0, a as f32)
            .iter()
            .map(|&x| (x as i32).min(a as i32 - 1))
            .collect();
        let y = rng.vec_nonzero(b * d, -2.0, 2.0);
        let before = rng.vec_nonzero(LOSS_SLOTS, 0.0, 1.0);
        let want = dueling_losses_reference(dims, &v, &adv, &act, &y, coef);
        let vd = device.upload_new("v", &v)?;
        let advd = upload_per_branch(&device, "adv", &adv, dims)?;
        let adv_refs: Vec<&DeviceBuffer<f32>> = advd.iter().collect();
        let actd = device.upload_new("act", &act)?;
        let yd = device.upload_new("y", &y)?;
        let mut dv = nan_buffer(&device, "dv", b)?;
        let mut dadv = (0..d)
            .map(|_| nan_buffer(&device, "dadv", b * a))
            .collect::<Result<Vec<_>>>()?;
        let mut qbar = nan_buffer(&device, "qbar", b)?;
        let mut losses = device.upload_new("losses", &before)?;
        let inputs = DuelingInputs {
            v: &vd,
            adv: &adv_refs,
            act: &actd,
            y: &yd,
        };
        run_one_op(&device, |stream| {
            let out = DuelingOutputs {
                dv: &mut dv,
                dadv: &mut dadv,
                qbar: &mut qbar,
                losses: &mut losses,
            };
            k.dueling_losses(stream, dims, &inputs, coef, out)
        })?;
        let dadv_got: Vec<f32> = dadv
            .iter()
            .map(|buf| device.download(buf))
            .collect::<Result<Vec<_>>>()?
            .concat();
        let dv = device.download(&dv)?;
        check_within(&case, "dv", &dv, &want.dv, rms(&want.dv), ROW_BOUND);
        check_within(
            &case,
            "dadv",
            &dadv_got,
            &want.dadv,
            rms(&want.dadv),
            ROW_BOUND,
        );
        let qbar = device.download(&qbar)?;
        check_within(&case, "qbar", &qbar, &want.qbar, rms(&want.qbar), ROW_BOUND);
        let losses = device.download(&losses)?;
        for (i, (&got, &start)) in losses.iter().zip(&before).enumerate() {
            let added = f64::from(got) - f64::from(start);
            let slot_used = [LossSlot::Td, LossSlot::Cql, LossSlot::Conf, LossSlot::Total]
                .iter()
                .any(|s| s.index() == i);
            if slot_used {
                let err = (added - want.losses[i]).abs() / want.losses[i].abs().max(1e-3);
                assert!(
                    err <= SUM_BOUND,
                    "{case}: loss slot {i}: {added:e} added, want {:e}",
                    want.losses[i]
                );
            } else {
                assert_eq!(got.to_bits(), start.to_bits(), "{case}: slot {i} changed");
            }
        }
    }
    Ok(())
}

/// The per-branch pointer tables are checked before anything is launched: a branch count
/// past the tables' eight slots, a slice of another length than the branch count, and a
/// branch's buffer of the wrong length are each an error naming the table.
#[test]
fn gpu_branch_tables_are_checked_before_the_launch() -> Result<()> {
    use stepgraph::Error;
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let mut rng = Rng::new(399);
    let (b, a) = (5usize, 3usize);
    let mut up = |what: &str, n: usize| device.upload_new(what, &rng.vec_nonzero(n, -1.0, 1.0));
    let (v2, vt, r, done) = (up("v2", b)?, up("vt", b)?, up("r", b)?, up("done", b)?);
    let nine: Vec<DeviceBuffer<f32>> = (0..9).map(|_| up("adv", b * a)).collect::<Result<_>>()?;
    let ragged = vec![up("adv", b * a)?, up("adv", b * a - 1)?];
    let target = |branches: usize, adv2: &[DeviceBuffer<f32>]| -> Result<()> {
        let dims = DuelingDims {
            batch: b,
            branches,
            actions: a,
        };
        let inputs = DdqnTargetInputs {
            v2: &v2,
            adv2,
            vt: &vt,
            advt: adv2,
            r: &r,
            done: &done,
        };
        let mut y = nan_buffer(&device, "y", b * branches)?;
        let mut ybar = nan_buffer(&device, "ybar", b)?;
        run_one_op(&device, |stream| {
            k.ddqn_target(stream, dims, &inputs, 0.9, &mut y, &mut ybar)
        })
    };
    // The op's error wraps the launcher's: look through the chain.
    let e = target(9, &nine).unwrap_err();
    assert!(
        e.errors().any(|e| matches!(e, Error::TooLarge { what, found: 9, max: 8, .. } if what.starts_with("ddqn_target: adv2"))),
        "{}",
        e.chain()
    );
    let e = target(4, &nine[..3]).unwrap_err();
    assert!(
        e.errors().any(|e| matches!(e, Error::Argument { what, found, .. } if what == "ddqn_target: adv2" && found == "3")),
        "{}",
        e.chain()
    );
    let e = target(2, &ragged).unwrap_err();
    assert!(
        e.errors().any(|e| matches!(e, Error::LengthMismatch { what, expected: 15, found: 14 } if what == "ddqn_target: adv2[1] ([B * A])")),
        "{}",
        e.chain()
    );
    // The same tables at a branch count they fit run.
    target(8, &nine[..8])
}
