//! GPU tests of the fused IQN head (`Kernels::iqn_fused`, both of its kernels: `iqn_wgmma`
//! on Hopper's warpgroup MMA at the step's sizes, `iqn_fused` on `mma.sync` elsewhere):
//! against the CPU reference, against each other, and against the unfused GPU path it replaces (`iqn_cos_features`, the cuBLASLt `phi` GEMM,
//! `iqn_forward_backward`, the cuBLASLt `dwphi` GEMM). They need a CUDA GPU of compute
//! capability 9.0 with cuBLASLt.
//!
//! Every input is random and nonzero; every output is poisoned with NaN first, so an
//! element the kernels did not write fails the check. Each tensor is compared by
//! `‖got − want‖ / ‖want‖`. A mistake in the kernel (a wrong fragment, a missed tile, a
//! double count) is of order 1. The bounds, and why:
//!
//! - Against the CPU reference that rounds the products' operands to TF32 as the kernel
//!   does (`GemmOperands::Tf32`): [`TF32_OPERANDS_BOUND`] = 1e-3. What is left is the order
//!   of f32 sums (tensor-core accumulation against f64: about 1e-6 relative) and the
//!   kernels' cosines against a correctly rounded one: `iqn_fused`'s `cospif` is within 1
//!   ulp of f32, which moves a TF32 operand by one TF32 ulp in about 1 case in 8000;
//!   `iqn_wgmma`'s special-function cosine within 2^-21.4, about 1 case in a few hundred,
//!   each move 2^-11 of one term. A CPU model of the kernel's arithmetic puts the
//!   differences near 1e-5.
//! - Against the exact reference (`GemmOperands::Exact`) and against the unfused GPU path:
//!   MODEL.md's bounds, [`GRADIENT_BOUND`] = 1e-2 for gradients and [`LOSS_BOUND`] = 1e-3
//!   for the loss. TF32 keeps 10 mantissa bits (unit roundoff 2⁻¹¹ ≈ 4.9e-4), so `phi`'s
//!   pre-activations move by about 5e-4 of their terms' norm; wherever one is that close to
//!   zero its ReLU mask flips, and that moves `dbphi` and `dwphi` by a whole term. Those
//!   sums over samples cancel (the cosine features average to zero over `τ`), so the flips
//!   weigh more than the rounding itself. A CPU model with this data puts `dwphi` and
//!   `dbphi` at 2e-3 to 3e-3 of their norms for `B N = 9600` and near 1e-3 for `B N =
//!   131072` (exact against rounded to nearest), and at 4e-3 and 1.3e-3 between rounding to
//!   nearest (this kernel) and truncating (which cuBLASLt's TF32 conversion may do); `dh`
//!   and `dwq` stay near 1e-4 and 5e-4. Shorter sums scatter more, so the small ragged case
//!   is held to the first check only.

use super::{Rng, nan_buffer, run_one_op};
use stepgraph::{Device, DeviceBuffer, Epilogue, Matmul, MatmulArgs, Precision, Result};
use stepgraph_dqn::kernels::{
    IqnFusedDims, IqnFusedInputs, IqnFusedKernel, IqnFusedOutputs, IqnInputs, IqnOutputs, Kernels,
    LOSS_SLOTS, LossSlot, PERSISTENT_SMS,
};
use stepgraph_dqn::model::IQN_HEAD_SMS;
use stepgraph_dqn::reference::{GemmOperands, iqn_fused_reference};
use stepgraph_testkit::rel_err;

/// Every output against the reference with TF32 operands (see the module's documentation).
const TF32_OPERANDS_BOUND: f64 = 1e-3;
/// Gradients against exact products, or against the other TF32 path (MODEL.md).
const GRADIENT_BOUND: f64 = 1e-2;
/// The loss against exact products, or against the other TF32 path (MODEL.md).
const LOSS_BOUND: f64 = 1e-3;

/// Relative-error bounds: gradients, loss.
#[derive(Clone, Copy)]
struct Bounds {
    gradients: f64,
    loss: f64,
}

/// The step's weight of `L_iqn` (MODEL.md).
const COEF: f32 = 0.5;

/// The head's inputs on the host.
struct HeadData {
    h: Vec<f32>,
    tau: Vec<f32>,
    ybar: Vec<f32>,
    wphi: Vec<f32>,
    bphi: Vec<f32>,
    wq: Vec<f32>,
    bq: f32,
}

impl HeadData {
    /// Scales as in training: `h` after a ReLU, `wphi` and `wq` like an initialisation
    /// (`|x wᵀ|` of order 1), `ybar` wide enough that `u` takes both signs and both Huber
    /// branches. `tau` stays off 0 and 1.
    fn new(dims: IqnFusedDims, seed: u64) -> HeadData {
        let mut rng = Rng::new(seed);
        let (b, n, h, c) = (dims.batch, dims.quantiles, dims.hidden, dims.cosines);
        let wphi_scale = (3.0 / c as f32).sqrt();
        let wq_scale = (3.0 / h as f32).sqrt();
        HeadData {
            h: rng.vec(b * h, 0.01, 1.5),
            tau: rng.vec(b * n, 0.01, 0.99),
            ybar: rng.vec_nonzero(b, -2.0, 2.0),
            wphi: rng.vec_nonzero(h * c, -wphi_scale, wphi_scale),
            bphi: rng.vec_nonzero(h, -0.5, 0.5),
            wq: rng.vec_nonzero(h, -wq_scale, wq_scale),
            bq: 0.1,
        }
    }
}

/// The head's inputs on the device.
struct HeadInputs {
    h: DeviceBuffer<f32>,
    tau: DeviceBuffer<f32>,
    ybar: DeviceBuffer<f32>,
    wphi: DeviceBuffer<f32>,
    bphi: DeviceBuffer<f32>,
    wq: DeviceBuffer<f32>,
    bq: DeviceBuffer<f32>,
}

impl HeadInputs {
    fn upload(device: &Device, d: &HeadData) -> Result<HeadInputs> {
        Ok(HeadInputs {
            h: device.upload_new("h", &d.h)?,
            tau: device.upload_new("tau", &d.tau)?,
            ybar: device.upload_new("ybar", &d.ybar)?,
            wphi: device.upload_new("wphi", &d.wphi)?,
            bphi: device.upload_new("bphi", &d.bphi)?,
            wq: device.upload_new("wq", &d.wq)?,
            bq: device.upload_new("bq", &[d.bq])?,
        })
    }
}

/// The head's outputs, NaN-poisoned (the loss buffer zeroed, as the step's memset does).
struct HeadOutputs {
    dh: DeviceBuffer<f32>,
    dwphi: DeviceBuffer<f32>,
    dbphi: DeviceBuffer<f32>,
    dwq: DeviceBuffer<f32>,
    dbq: DeviceBuffer<f32>,
    losses: DeviceBuffer<f32>,
}

/// The outputs downloaded.
#[derive(PartialEq)]
struct HeadResult {
    dh: Vec<f32>,
    dwphi: Vec<f32>,
    dbphi: Vec<f32>,
    dwq: Vec<f32>,
    dbq: Vec<f32>,
    losses: Vec<f32>,
}

impl HeadOutputs {
    fn poisoned(device: &Device, dims: IqnFusedDims) -> Result<HeadOutputs> {
        Ok(HeadOutputs {
            dh: nan_buffer(device, "dh", dims.batch * dims.hidden)?,
            dwphi: nan_buffer(device, "dwphi", dims.hidden * dims.cosines)?,
            dbphi: nan_buffer(device, "dbphi", dims.hidden)?,
            dwq: nan_buffer(device, "dwq", dims.hidden)?,
            dbq: nan_buffer(device, "dbq", 1)?,
            losses: device.upload_new("losses", &[0.0f32; LOSS_SLOTS])?,
        })
    }

    fn download(&self, device: &Device) -> Result<HeadResult> {
        Ok(HeadResult {
            dh: device.download(&self.dh)?,
            dwphi: device.download(&self.dwphi)?,
            dbphi: device.download(&self.dbphi)?,
            dwq: device.download(&self.dwq)?,
            dbq: device.download(&self.dbq)?,
            losses: device.download(&self.losses)?,
        })
    }
}

/// Runs the fused head once with `kernel`, eagerly, and downloads its outputs.
fn run_fused(
    device: &Device,
    k: &Kernels,
    kernel: IqnFusedKernel,
    dims: IqnFusedDims,
    x: &HeadInputs,
) -> Result<HeadResult> {
    let mut out = HeadOutputs::poisoned(device, dims)?;
    let mut scratch = nan_buffer(device, "iqn_fused scratch", dims.scratch_len())?;
    run_one_op(device, |stream| {
        let inputs = IqnFusedInputs {
            h: &x.h,
            tau: &x.tau,
            ybar: &x.ybar,
            wphi: &x.wphi,
            bphi: &x.bphi,
            wq: &x.wq,
            bq: &x.bq,
        };
        let outputs = IqnFusedOutputs {
            dh: &mut out.dh,
            dwphi: &mut out.dwphi,
            dbphi: &mut out.dbphi,
            dwq: &mut out.dwq,
            dbq: &mut out.dbq,
            losses: &mut out.losses,
        };
        k.iqn_fused_with(kernel, stream, dims, &inputs, COEF, outputs, &mut scratch)
    })?;
    out.download(device)
}

/// Runs the unfused path (the step's fallback) once, eagerly, and downloads its outputs.
fn run_unfused(
    device: &Device,
    k: &Kernels,
    dims: IqnFusedDims,
    x: &HeadInputs,
) -> Result<HeadResult> {
    let (h, c) = (dims.hidden, dims.cosines);
    let rows = dims.batch * dims.quantiles;
    let mut out = HeadOutputs::poisoned(device, dims)?;
    let mut cosf = nan_buffer(device, "cosf", rows * c)?;
    let mut phi = nan_buffer(device, "phi", rows * h)?;
    let mut dphi_pre = nan_buffer(device, "dphi_pre", rows * h)?;
    let mut scratch = nan_buffer(device, "iqn scratch", dims.unfused().scratch_len())?;
    run_one_op(device, |stream| {
        let blas = stream.blas();
        k.iqn_cos_features(stream, &x.tau, &mut cosf, c)?;
        let phi_spec = Matmul::new(rows, h, c)
            .with_trans_b(true)
            .with_precision(Precision::Tf32)
            .with_epilogue(Epilogue::ReluBias);
        blas.matmul(
            &phi_spec,
            &cosf,
            &x.wphi,
            &mut phi,
            MatmulArgs::new().bias(&x.bphi),
        )?;
        let inputs = IqnInputs {
            h: &x.h,
            phi: &phi,
            wq: &x.wq,
            bq: &x.bq,
            ybar: &x.ybar,
            tau: &x.tau,
        };
        let outputs = IqnOutputs {
            dphi_pre: &mut dphi_pre,
            dh: &mut out.dh,
            dwq: &mut out.dwq,
            dbphi: &mut out.dbphi,
            dbq: &mut out.dbq,
            losses: &mut out.losses,
        };
        k.iqn_forward_backward(stream, dims.unfused(), &inputs, COEF, outputs, &mut scratch)?;
        let dwphi_spec = Matmul::new(h, c, rows)
            .with_trans_a(true)
            .with_precision(Precision::Tf32);
        blas.matmul(
            &dwphi_spec,
            &dphi_pre,
            &cosf,
            &mut out.dwphi,
            MatmulArgs::new(),
        )
    })?;
    out.download(device)
}
fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

/// Checks every output of `got` against `want`, naming the case.
fn check_head(case: &str, got: &HeadResult, want: &HeadResult64, bounds: Bounds) {
    let loss_slots = [LossSlot::Iqn.index(), LossSlot::Total.index()];
    let got_losses: Vec<f32> = loss_slots.iter().map(|&i| got.losses[i]).collect();
    let want_losses: Vec<f64> = loss_slots.iter().map(|&i| want.losses[i]).collect();
    let checks: [(&str, &[f32], &[f64], f64); 6] = [
        ("dh", &got.dh, &want.dh, bounds.gradients),
        ("dwphi", &got.dwphi, &want.dwphi, bounds.gradients),
        ("dbphi", &got.dbphi, &want.dbphi, bounds.gradients),
        ("dwq", &got.dwq, &want.dwq, bounds.gradients),
        ("dbq", &got.dbq, &want.dbq, bounds.gradients),
        ("loss (IQN, total)", &got_losses, &want_losses, bounds.loss),
    ];
    for (what, g, w, bound) in checks {
        let err = rel_err(g, w);
        eprintln!("{case}: {what}: relative error {err:.3e} (bound {bound:.0e})");
        assert!(
            err < bound,
            "{case}: {what}: relative error {err:e} is not under {bound:e}"
        );
    }
    // Slots other than IQN's and the total are not the head's to write.
    for (i, &l) in got.losses.iter().enumerate() {
        if !loss_slots.contains(&i) {
            assert_eq!(l, 0.0, "{case}: loss slot {i}");
        }
    }
}

/// A result to compare against, widened to f64.
struct HeadResult64 {
    dh: Vec<f64>,
    dwphi: Vec<f64>,
    dbphi: Vec<f64>,
    dwq: Vec<f64>,
    dbq: Vec<f64>,
    losses: Vec<f64>,
}

impl From<&HeadResult> for HeadResult64 {
    fn from(r: &HeadResult) -> HeadResult64 {
        HeadResult64 {
            dh: widen(&r.dh),
            dwphi: widen(&r.dwphi),
            dbphi: widen(&r.dbphi),
            dwq: widen(&r.dwq),
            dbq: widen(&r.dbq),
            losses: widen(&r.losses),
        }
    }
}

/// The step's `N`, `H` and `C` (the sizes `iqn_wgmma` takes) with `batch` samples, on the
/// step's SMs: at the step's batch, the grid and the sums' order the step runs.
fn step_dims(batch: usize) -> IqnFusedDims {
    IqnFusedDims {
        batch,
        quantiles: 32,
        hidden: 256,
        cosines: 64,
        sms: IQN_HEAD_SMS,
    }
}

/// Ragged everywhere: a second, partial tile of quantiles; a last warp with 8 of its 16
/// units; features that stop inside a k-chunk; fewer samples than SMs. Only `iqn_fused`
/// takes it.
const RAGGED: IqnFusedDims = IqnFusedDims {
    batch: 37,
    quantiles: 40,
    hidden: 200,
    cosines: 37,
    sms: PERSISTENT_SMS,
};

#[test]
fn gpu_iqn_fused_takes_the_kernel_its_sizes_and_gpu_call_for() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    // These tests run on a Hopper GPU, where the driver must take the sm_90a cubin, except
    // in portable mode, where it must take the PTX and the step must do without wgmma.
    let hopper = expects_wgmma(&device);
    assert_eq!(
        k.has_wgmma(),
        hopper,
        "whether the sm_90a image of cuda/iqn.cu was loaded (portable mode: {})",
        stepgraph::env::portable()
    );
    let at_step_sizes = if hopper {
        IqnFusedKernel::Wgmma
    } else {
        IqnFusedKernel::MmaSync
    };
    for batch in [1, 2001, 16384] {
        assert_eq!(k.iqn_fused_kernel(step_dims(batch)), at_step_sizes);
    }
    if !hopper {
        // Asked for by name without its image, iqn_wgmma is refused, naming the image.
        let dims = step_dims(64);
        let x = HeadInputs::upload(&device, &HeadData::new(dims, 3))?;
        let err = match run_fused(&device, &k, IqnFusedKernel::Wgmma, dims, &x) {
            Ok(_) => panic!("iqn_wgmma ran without its sm_90a image"),
            Err(e) => e.chain(),
        };
        assert!(err.contains("expected the sm_90a image"), "{err}");
        return Ok(());
    }
    let others = [
        RAGGED,
        IqnFusedDims {
            quantiles: 16,
            ..step_dims(64)
        },
        IqnFusedDims {
            hidden: 128,
            ..step_dims(64)
        },
        IqnFusedDims {
            cosines: 48,
            ..step_dims(64)
        },
    ];
    for dims in others {
        assert_eq!(
            k.iqn_fused_kernel(dims),
            IqnFusedKernel::MmaSync,
            "{dims:?}"
        );
        // Asked for by name, iqn_wgmma refuses them before anything runs.
        let data = HeadData::new(dims, 3);
        let x = HeadInputs::upload(&device, &data)?;
        let err = match run_fused(&device, &k, IqnFusedKernel::Wgmma, dims, &x) {
            Ok(_) => panic!("iqn_wgmma took sizes it is not written for: {dims:?}"),
            Err(e) => e.chain(),
        };
        assert!(
            err.contains("expected N = 32 quantiles, C = 64 cosine features and H = 256"),
            "{err}"
        );
    }
    Ok(())
}

#[test]
fn gpu_iqn_fused_matches_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    use IqnFusedKernel::{MmaSync, Wgmma};
    let cases = [
        // The step's H, N and C, and a batch that is a multiple of nothing the kernels use:
        // 150 tiles of iqn_wgmma, so some of its 116 blocks take two.
        (step_dims(300), &[Wgmma, MmaSync][..]),
        // An odd batch (iqn_wgmma's last tile has one sample) and 8 or 9 tiles per block,
        // through both of its buffers many times.
        (step_dims(2001), &[Wgmma, MmaSync][..]),
        // One sample: one block, half a tile.
        (step_dims(1), &[Wgmma, MmaSync][..]),
        (RAGGED, &[MmaSync][..]),
    ];
    for (seed, (dims, kernels)) in cases.into_iter().enumerate() {
        assert!(dims.supported(), "{dims:?}");
        let data = HeadData::new(dims, 100 + seed as u64);
        let x = HeadInputs::upload(&device, &data)?;
        let reference = |operands| {
            let r = iqn_fused_reference(
                dims, &data.h, &data.tau, &data.ybar, &data.wphi, &data.bphi, &data.wq, data.bq,
                COEF, operands,
            );
            HeadResult64 {
                dh: widen(&r.dh),
                dwphi: widen(&r.dwphi),
                dbphi: widen(&r.dbphi),
                dwq: widen(&r.dwq),
                dbq: vec![f64::from(r.dbq)],
                losses: r.losses.to_vec(),
            }
        };
        let tf32 = reference(GemmOperands::Tf32);
        // The ReLU flips' share of the error grows as the sums get shorter: the small
        // cases are held to the tight check only.
        let exact = (dims.batch * dims.quantiles >= 4096).then(|| reference(GemmOperands::Exact));
        for &kernel in kernels.iter().filter(|k| runnable(&device).contains(k)) {
            let got = run_fused(&device, &k, kernel, dims, &x)?;
            check_head(
                &format!("{kernel:?} vs CPU with TF32 operands, {dims:?}"),
                &got,
                &tf32,
                Bounds {
                    gradients: TF32_OPERANDS_BOUND,
                    loss: TF32_OPERANDS_BOUND,
                },
            );
            if let Some(exact) = &exact {
                check_head(
                    &format!("{kernel:?} vs exact CPU, {dims:?}"),
                    &got,
                    exact,
                    Bounds {
                        gradients: GRADIENT_BOUND,
                        loss: LOSS_BOUND,
                    },
                );
            }
        }
    }
    Ok(())
}

#[test]
fn gpu_iqn_fused_matches_the_unfused_gpu_path_and_repeats_bit_for_bit() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    // The step's sizes but the batch: 4096 samples, 35 per block of iqn_fused, some blocks
    // 36; 2048 tiles of iqn_wgmma, 17 or 18 per block.
    let dims = step_dims(4096);
    let data = HeadData::new(dims, 7);
    let x = HeadInputs::upload(&device, &data)?;
    let unfused = run_unfused(&device, &k, dims, &x)?;
    for kernel in runnable(&device) {
        let fused = run_fused(&device, &k, kernel, dims, &x)?;
        check_head(
            &format!("{kernel:?} vs unfused GPU path"),
            &fused,
            &HeadResult64::from(&unfused),
            Bounds {
                gradients: GRADIENT_BOUND,
                loss: LOSS_BOUND,
            },
        );
        // The grid and the order of every sum depend on the sizes only.
        let again = run_fused(&device, &k, kernel, dims, &x)?;
        assert!(
            again == fused,
            "a second run of {kernel:?} differs from the first"
        );
    }
    Ok(())
}

#[test]
fn gpu_iqn_wgmma_matches_iqn_fused_at_the_step_batch_and_repeats_bit_for_bit() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    if !expects_wgmma(&device) {
        // Portable mode: no wgmma to compare (the test above checks that it is refused).
        return Ok(());
    }
    // The step's sizes: 8192 tiles, 70 or 71 per block (too large for the CPU reference
    // in a test; the two kernels share nothing but the finishing kernel).
    let dims = step_dims(16384);
    let data = HeadData::new(dims, 11);
    let x = HeadInputs::upload(&device, &data)?;
    let wgmma = run_fused(&device, &k, IqnFusedKernel::Wgmma, dims, &x)?;
    let mma = run_fused(&device, &k, IqnFusedKernel::MmaSync, dims, &x)?;
    check_head(
        "Wgmma vs MmaSync at the step's sizes",
        &wgmma,
        &HeadResult64::from(&mma),
        Bounds {
            gradients: GRADIENT_BOUND,
            loss: LOSS_BOUND,
        },
    );
    let again = run_fused(&device, &k, IqnFusedKernel::Wgmma, dims, &x)?;
    assert!(
        again == wgmma,
        "a second run of iqn_wgmma differs from the first"
    );
    Ok(())
}

/// Whether `iqn_wgmma` must be available: on Hopper, unless the portable mode loads PTX.
fn expects_wgmma(device: &Device) -> bool {
    device.compute_capability() == (9, 0) && !stepgraph::env::portable()
}

/// The fused kernels this GPU can run: both, or `iqn_fused` alone without wgmma.
fn runnable(device: &Device) -> Vec<IqnFusedKernel> {
    let all = [IqnFusedKernel::Wgmma, IqnFusedKernel::MmaSync];
    let wgmma = expects_wgmma(device);
    all.into_iter()
        .filter(|&k| wgmma || k == IqnFusedKernel::MmaSync)
        .collect()
}
