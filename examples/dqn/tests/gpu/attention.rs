//! GPU tests of the window attention kernels (`Kernels::attention_forward` and
//! `Kernels::attention_backward`): against the CPU references, on both of the kernels'
//! paths (a warp per sample for `E / Hh == 16`, `W <= 8`; a block of samples otherwise), and
//! run twice for the same bits. Then of the fused head (`Kernels::attention_fused`, the
//! whole head forward and backward at the step's sizes): against the CPU reference,
//! against the unfused GPU path it replaces, twice for the same bits, and refusing other
//! sizes. They need a CUDA GPU of compute capability 9.0.
//!
//! Every input is random and nonzero; every output is poisoned with NaN first, so an
//! element the kernels did not write fails the check. The backward takes the forward's
//! `probs` from the GPU, and its reference takes the same `probs`, so each kernel is
//! checked on its own.
//!
//! The bound, [`BOUND`] = 1e-5, is on the largest elementwise error, relative to the
//! element's magnitude or, for elements smaller than the tensor's root mean square (whose
//! relative error is dominated by cancellation in their sums), to that root mean square;
//! `probs` (positive, no cancellation) is held to the plain relative error. The outputs are
//! of order 1: `qkv` in ±1.5 gives scores of about ±1 and `att`, `dqkv` near 0.1 to 0.5 in
//! root mean square. The kernels compute in f32 with sums of at most `E / Hh` or `W` terms
//! and `expf` (2 ulp); a CPU model of their arithmetic is within 1e-6 of the f64 reference
//! by this measure, and an indexing mistake is of order 1.
//!
//! The fused head is compared output by output by its largest elementwise error relative to
//! the output's largest magnitude (`pred`, each weight gradient, the two loss slots). A
//! mistake (a wrong fragment, a missed tile or sample, a double count) is of order 1 by
//! this measure, and one block's partial row lost out of 66 at the step's batch moves a
//! weight gradient by 1/66 of its size or more. The bounds, and why:
//!
//! - Against the CPU reference that rounds the products' operands to TF32 where the kernel
//!   does (`GemmOperands::Tf32`), in the kernel's order (the embedding folded into
//!   `W' = wqkv wemb`): [`FUSED_TF32_BOUND`] = 2e-4. What is left is the order of f32 sums
//!   against f64 (near 1e-6), and the operands the kernel rounds from its own f32 values
//!   (`W'`, `dqkv`): where one of them lies within its f32 error of a TF32 rounding
//!   boundary, the two sides round it a whole TF32 ulp apart (2⁻¹¹ to 2⁻¹⁰ of the value),
//!   and every term it enters moves by that. Such moves put `pred` and `dwemb` at up to
//!   5.6e-5 on an H200 (`B` = 300 and 2001, two draws of `r`), the other outputs at up to
//!   3.5e-5; those margins were measured on the kernel before the fold (which rounded
//!   `emb` and `demb` too), and the folded kernel passes the same bounds on the H200 (its
//!   margins not printed). Over one
//!   sample's 8 rows a move weighs more (one term of 8 instead of thousands; an estimated
//!   4e-4 by this measure at most), so the one-sample case is held to
//!   [`FUSED_TF32_SHORT_BOUND`] = 1e-3 (measured 9e-5 and 1e-5).
//! - Against the unfused GPU path at the step's batch, which the CPU reference is too slow
//!   for in a test (a debug build takes about 6 s a thousand samples): cuBLASLt's TF32
//!   GEMMs, whose conversion of the operands need not round as `cvt.rna` does, and three
//!   more products on TF32 operands (`o`, `datt`, `dwo`) that the fused kernel computes in
//!   f32 or folds away (and, since the fold, `emb` and `demb`, which it no longer forms).
//!   Each operand rounded differently moves its terms by up to 2⁻¹¹: measured up to 2.6e-4
//!   on an H200 before the fold (two draws of `r`; the folded kernel's outputs moved by up
//!   to 4.1e-4 against those of the kernel before it, in `bench/probes/attention`), held to
//!   [`FUSED_UNFUSED_BOUND`] = 2e-3 (MODEL.md allows a gradient 1e-2 against PyTorch).
//!   There, `pred` at the batch's first, middle and last samples is also held to
//!   [`FUSED_TF32_BOUND`], against the reference on those samples alone (a sample's `pred`
//!   depends on its own inputs only; measured 2.9e-5).

use super::{Rng, bits, check_within, nan_buffer, rms, run_one_op};
use stepgraph::{Device, DeviceBuffer, Result};
use stepgraph_dqn::kernels::{
    ATTENTION_FUSED_SIZES, AttentionDims, AttentionKernel, AttnFusedDims, AttnFusedInputs,
    AttnFusedOutputs, Kernels, LOSS_SLOTS, LossSlot,
};
use stepgraph_dqn::layers::Linear;
use stepgraph_dqn::model::{
    ATTENTION_HEAD_SMS, ATTN_LOSS_COEF, Attn, AttnAct, attention_unfused_head,
    attention_unfused_wgrad,
};
use stepgraph_dqn::reference::{
    AttnFusedReference, GemmOperands, attention_backward_reference, attention_forward_reference,
    attention_fused_reference,
};
use stepgraph_kernels::column_sums_scratch_len;

/// Largest elementwise error (see the module's documentation).
const BOUND: f64 = 1e-5;

/// The fused head against the CPU reference with TF32 operands, over `B W >= 2400` rows:
/// the largest error relative to the output's largest magnitude (see the module's
/// documentation).
const FUSED_TF32_BOUND: f64 = 2e-4;
/// The same over one sample's 8 rows, where one operand rounded the other way weighs more.
const FUSED_TF32_SHORT_BOUND: f64 = 1e-3;
/// The fused head against the unfused GPU path, by the same measure.
const FUSED_UNFUSED_BOUND: f64 = 2e-3;

/// The kernels' outputs, downloaded.
#[derive(PartialEq)]
struct AttentionResult {
    att: Vec<f32>,
    probs: Vec<f32>,
    dqkv: Vec<f32>,
}

/// Runs the forward, then the backward on the forward's `probs`, once, eagerly.
fn run(
    device: &Device,
    k: &Kernels,
    dims: AttentionDims,
    qkv: &[f32],
    datt: &[f32],
) -> Result<AttentionResult> {
    let rows = dims.batch * dims.window;
    let nan = |what: &str, len: usize| nan_buffer(device, what, len);
    let qkv: DeviceBuffer<f32> = device.upload_new("qkv", qkv)?;
    let datt: DeviceBuffer<f32> = device.upload_new("datt", datt)?;
    let mut att = nan("att", rows * dims.width)?;
    let mut probs = nan("probs", dims.batch * dims.heads * dims.window * dims.window)?;
    let mut dqkv = nan("dqkv", rows * 3 * dims.width)?;
    run_one_op(device, |stream| {
        k.attention_forward(stream, dims, &qkv, &mut att, &mut probs)?;
        k.attention_backward(stream, dims, &qkv, &probs, &datt, &mut dqkv)
    })?;
    Ok(AttentionResult {
        att: device.download(&att)?,
        probs: device.download(&probs)?,
        dqkv: device.download(&dqkv)?,
    })
}

fn check(case: &str, what: &str, got: &[f32], want: &[f32], floor: f64) {
    check_within(case, what, got, want, floor, BOUND);
}

fn data(dims: AttentionDims, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let rows = dims.batch * dims.window;
    (
        rng.vec_nonzero(rows * 3 * dims.width, -1.5, 1.5),
        rng.vec_nonzero(rows * dims.width, -1.0, 1.0),
    )
}

#[test]
fn gpu_attention_matches_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    let cases = [
        // The step's W, E and heads (the warp path), and a batch that no block size divides.
        AttentionDims {
            batch: 1001,
            window: 8,
            width: 64,
            heads: 4,
        },
        // Heads of 12 (the block path), a window of 5, a width that is no multiple of 16.
        AttentionDims {
            batch: 37,
            window: 5,
            width: 36,
            heads: 3,
        },
        // The warp path with a ragged window: 15 of 32 lanes busy, probs rows of 5 floats.
        AttentionDims {
            batch: 37,
            window: 5,
            width: 48,
            heads: 3,
        },
        // The warp path with two rows a lane (8 heads) and 2 warps a block.
        AttentionDims {
            batch: 19,
            window: 8,
            width: 128,
            heads: 8,
        },
    ];
    for (seed, dims) in cases.into_iter().enumerate() {
        let case = format!("{dims:?}");
        let (qkv, datt) = data(dims, 10 + seed as u64);
        let got = run(&device, &k, dims, &qkv, &datt)?;
        let (att, probs) = attention_forward_reference(dims, &qkv);
        // The backward's reference takes the GPU's probs, as the kernel does.
        let dqkv = attention_backward_reference(dims, &qkv, &got.probs, &datt);
        check(&case, "att", &got.att, &att, rms(&att));
        check(&case, "probs", &got.probs, &probs, 0.0);
        check(&case, "dqkv", &got.dqkv, &dqkv, rms(&dqkv));
    }
    Ok(())
}

#[test]
fn gpu_attention_repeats_bit_for_bit() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    // Both paths; the first with the step's sizes but the batch.
    for dims in [
        AttentionDims {
            batch: 4099,
            window: 8,
            width: 64,
            heads: 4,
        },
        AttentionDims {
            batch: 1001,
            window: 5,
            width: 36,
            heads: 3,
        },
    ] {
        let (qkv, datt) = data(dims, 99);
        let first = run(&device, &k, dims, &qkv, &datt)?;
        let again = run(&device, &k, dims, &qkv, &datt)?;
        assert!(
            again == first,
            "{dims:?}: a second run of the attention kernels differs from the first"
        );
    }
    Ok(())
}

/// The step's `S`, `W`, `E` and `Hh` (the sizes `attention_fused` takes) with `batch`
/// samples, on the step's SMs: at the step's batch, the grid and the sums' order the step
/// runs. (The whole GPU's grid differs only in how many tiles a block takes.)
fn fused_dims(batch: usize) -> AttnFusedDims {
    let (state, window, width, heads) = ATTENTION_FUSED_SIZES;
    AttnFusedDims {
        batch,
        state,
        window,
        width,
        heads,
        sms: ATTENTION_HEAD_SMS,
    }
}

/// The head's inputs on the host.
struct HeadData {
    win: Vec<f32>,
    wemb: Vec<f32>,
    bemb: Vec<f32>,
    wqkv: Vec<f32>,
    wo: Vec<f32>,
    wp: Vec<f32>,
    bp: f32,
    r: Vec<f32>,
}

impl HeadData {
    /// `win` and `r` of unit variance, as the step's normal draws, with `r` around −1: the
    /// residuals' mean, and with it `dbp` and every sum over samples of the gradient
    /// `g_b`, is then of order 1 rather than a cancellation near zero that no relative
    /// bound could hold. The weights are uniform in `±sqrt(3 / fan_in)`, an initialisation
    /// that keeps each product of order 1, so that the scores are of order 1 and the softmax
    /// far from uniform (the step's own `±1 / sqrt(fan_in)` leaves them near 0.1).
    fn new(dims: AttnFusedDims, seed: u64) -> HeadData {
        let mut rng = Rng::new(seed);
        let (rows, s, e) = (dims.batch * dims.window, dims.state, dims.width);
        let mut init = |n: usize, fan_in: usize| {
            let bound = (3.0 / fan_in as f32).sqrt();
            rng.vec_nonzero(n, -bound, bound)
        };
        HeadData {
            win: init(rows * s, 1),
            wemb: init(e * s, s),
            bemb: init(e, s),
            wqkv: init(3 * e * e, e),
            wo: init(e * e, e),
            wp: init(e, e),
            bp: 0.1,
            r: init(dims.batch, 1).iter().map(|x| x - 1.0).collect(),
        }
    }

    /// The reference with TF32 operands on `samples` alone (a batch of their own).
    fn reference(
        &self,
        dims: AttnFusedDims,
        samples: std::ops::Range<usize>,
    ) -> AttnFusedReference {
        let rows = dims.window * dims.state;
        let sub = AttnFusedDims {
            batch: samples.len(),
            ..dims
        };
        attention_fused_reference(
            sub,
            &self.win[samples.start * rows..samples.end * rows],
            &self.wemb,
            &self.bemb,
            &self.wqkv,
            &self.wo,
            &self.wp,
            self.bp,
            &self.r[samples],
            ATTN_LOSS_COEF,
            GemmOperands::Tf32,
        )
    }
}

/// The head's inputs on the device, the parameters as the step holds them.
struct HeadInputs {
    win: DeviceBuffer<f32>,
    attn: Attn,
    r: DeviceBuffer<f32>,
}

impl HeadInputs {
    fn upload(device: &Device, d: &HeadData) -> Result<HeadInputs> {
        Ok(HeadInputs {
            win: device.upload_new("win", &d.win)?,
            attn: Attn {
                emb: Linear {
                    w: device.upload_new("wemb", &d.wemb)?,
                    b: device.upload_new("bemb", &d.bemb)?,
                },
                qkv: device.upload_new("wqkv", &d.wqkv)?,
                o: device.upload_new("wo", &d.wo)?,
                p: Linear {
                    w: device.upload_new("wp", &d.wp)?,
                    b: device.upload_new("bp", &[d.bp])?,
                },
            },
            r: device.upload_new("r", &d.r)?,
        })
    }

    fn fused(&self) -> AttnFusedInputs<'_> {
        self.attn.fused_inputs(&self.win, &self.r)
    }
}

/// The head's outputs, NaN-poisoned (the loss buffer zeroed, as the step's memset does):
/// `pred`, the gradients as the step holds them, the loss buffer.
struct HeadOutputs {
    pred: DeviceBuffer<f32>,
    grad: Attn,
    losses: DeviceBuffer<f32>,
}

impl HeadOutputs {
    fn poisoned(device: &Device, dims: AttnFusedDims) -> Result<HeadOutputs> {
        let (s, e) = (dims.state, dims.width);
        let nan = |what: &str, len: usize| nan_buffer(device, what, len);
        Ok(HeadOutputs {
            pred: nan("pred", dims.batch)?,
            grad: Attn {
                emb: Linear {
                    w: nan("dwemb", e * s)?,
                    b: nan("dbemb", e)?,
                },
                qkv: nan("dwqkv", 3 * e * e)?,
                o: nan("dwo", e * e)?,
                p: Linear {
                    w: nan("dwp", e)?,
                    b: nan("dbp", 1)?,
                },
            },
            losses: device.upload_new("losses", &[0.0f32; LOSS_SLOTS])?,
        })
    }

    fn fused(&mut self) -> AttnFusedOutputs<'_> {
        AttnFusedOutputs {
            pred: &mut self.pred,
            grads: self.grad.fused_grads(&mut self.losses),
        }
    }

    fn download(&self, device: &Device) -> Result<HeadResult> {
        let g = &self.grad;
        Ok(HeadResult {
            pred: device.download(&self.pred)?,
            dwemb: device.download(&g.emb.w)?,
            dbemb: device.download(&g.emb.b)?,
            dwqkv: device.download(&g.qkv)?,
            dwo: device.download(&g.o)?,
            dwp: device.download(&g.p.w)?,
            dbp: device.download(&g.p.b)?,
            losses: device.download(&self.losses)?,
        })
    }
}

/// The outputs downloaded, or the reference's.
struct HeadResult {
    pred: Vec<f32>,
    dwemb: Vec<f32>,
    dbemb: Vec<f32>,
    dwqkv: Vec<f32>,
    dwo: Vec<f32>,
    dwp: Vec<f32>,
    dbp: Vec<f32>,
    losses: Vec<f32>,
}

impl HeadResult {
    /// Every output, named, in one order.
    fn outputs(&self) -> [(&'static str, &[f32]); 8] {
        [
            ("pred", &self.pred),
            ("dwemb", &self.dwemb),
            ("dbemb", &self.dbemb),
            ("dwqkv", &self.dwqkv),
            ("dwo", &self.dwo),
            ("dwp", &self.dwp),
            ("dbp", &self.dbp),
            ("losses", &self.losses),
        ]
    }

    /// The bits of every output, for comparing two runs exactly.
    fn bits(&self) -> Vec<u32> {
        bits(&self.outputs().map(|(_, x)| x))
    }
}

impl From<AttnFusedReference> for HeadResult {
    fn from(r: AttnFusedReference) -> HeadResult {
        HeadResult {
            pred: r.pred,
            dwemb: r.dwemb,
            dbemb: r.dbemb,
            dwqkv: r.dwqkv,
            dwo: r.dwo,
            dwp: r.dwp,
            dbp: vec![r.dbp],
            losses: r.losses.iter().map(|&l| l as f32).collect(),
        }
    }
}

/// Runs the fused head once, eagerly, into `out`.
fn launch_fused(
    device: &Device,
    k: &Kernels,
    dims: AttnFusedDims,
    x: &HeadInputs,
    out: &mut HeadOutputs,
    scratch: &mut DeviceBuffer<f32>,
) -> Result<()> {
    run_one_op(device, |stream| {
        k.attention_fused(
            stream,
            dims,
            &x.fused(),
            ATTN_LOSS_COEF,
            out.fused(),
            scratch,
        )
    })
}

/// Runs the fused head once, eagerly, and downloads its outputs.
fn run_fused(
    device: &Device,
    k: &Kernels,
    dims: AttnFusedDims,
    x: &HeadInputs,
) -> Result<HeadResult> {
    let mut out = HeadOutputs::poisoned(device, dims)?;
    let mut scratch = nan_buffer(device, "attention_fused scratch", dims.scratch_len())?;
    launch_fused(device, k, dims, x, &mut out, &mut scratch)?;
    out.download(device)
}

/// Runs the unfused path (the step's for sizes the fused kernel does not take) once,
/// eagerly, and downloads its outputs: the step's own functions, `model`'s
/// `attention_unfused_head` then `attention_unfused_wgrad`, on NaN-poisoned activations.
fn run_unfused(
    device: &Device,
    k: &Kernels,
    dims: AttnFusedDims,
    x: &HeadInputs,
) -> Result<HeadResult> {
    let (rows, e) = (dims.batch * dims.window, dims.width);
    let nan = |what: &str, len: usize| nan_buffer(device, what, len);
    let mut out = HeadOutputs::poisoned(device, dims)?;
    let mut act = AttnAct {
        emb: nan("emb", rows * e)?,
        qkv: nan("qkv", rows * 3 * e)?,
        probs: nan("probs", dims.batch * dims.heads * dims.window * dims.window)?,
        att: nan("att", rows * e)?,
        o: nan("o", rows * e)?,
        pred: nan("pred", dims.batch)?,
        d_o: nan("d_o", rows * e)?,
        datt: nan("datt", rows * e)?,
        dqkv: nan("dqkv", rows * 3 * e)?,
        demb: nan("demb", rows * e)?,
        scratch: nan("attn_pool scratch", dims.pool().scratch_len())?,
        bias_scratch: nan("bias-gradient partials", column_sums_scratch_len(rows, e))?,
    };
    run_one_op(device, |stream| {
        attention_unfused_head(
            stream,
            k,
            dims,
            &x.win,
            &x.r,
            &x.attn,
            &mut act,
            &mut out.grad.p,
            &mut out.losses,
        )?;
        attention_unfused_wgrad(stream, k, dims, &x.win, &mut act, &mut out.grad)
    })?;
    Ok(HeadResult {
        pred: device.download(&act.pred)?,
        ..out.download(device)?
    })
}

/// The largest magnitude of `x`: the scale each output's errors are measured against.
fn largest(x: &[f32]) -> f64 {
    x.iter().fold(0.0f64, |m, &v| m.max(f64::from(v).abs()))
}

/// Checks every output of `got` against `want` (see the module's documentation); the loss
/// slots other than `Attn` and `Total` must stay zero.
fn check_head(case: &str, got: &HeadResult, want: &HeadResult, bound: f64) {
    let slots = [LossSlot::Attn.index(), LossSlot::Total.index()];
    for ((what, g), (_, w)) in got.outputs().into_iter().zip(want.outputs()) {
        if what == "losses" {
            let pick = |x: &[f32]| slots.map(|i| x[i]);
            let (g, w) = (pick(g), pick(w));
            check_within(case, "loss (Attn, Total)", &g, &w, largest(&w), bound);
        } else {
            check_within(case, what, g, w, largest(w), bound);
        }
    }
    for (i, &l) in got.losses.iter().enumerate() {
        if !slots.contains(&i) {
            assert_eq!(l, 0.0, "{case}: loss slot {i} is not the head's to write");
        }
    }
}

#[test]
fn gpu_attention_fused_matches_the_cpu_reference() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    assert!(
        k.has_attention_fused(),
        "this GPU refused attention_fused its shared memory"
    );
    // A batch no tile divides (38 tiles, the last of 4 samples: fewer tiles than the step's
    // 66 SMs, a block each); an odd one over more tiles than blocks (251 tiles, the last of
    // one sample, so each block takes 3 or 4 tiles through both window buffers); one
    // sample (one block, one warp's sample valid).
    for (seed, (batch, bound)) in [
        (300, FUSED_TF32_BOUND),
        (2001, FUSED_TF32_BOUND),
        (1, FUSED_TF32_SHORT_BOUND),
    ]
    .into_iter()
    .enumerate()
    {
        let dims = fused_dims(batch);
        assert!(dims.fused_takes(), "{dims:?}");
        let data = HeadData::new(dims, 20 + seed as u64);
        let x = HeadInputs::upload(&device, &data)?;
        let got = run_fused(&device, &k, dims, &x)?;
        let want = HeadResult::from(data.reference(dims, 0..batch));
        check_head(
            &format!("attention_fused vs CPU with TF32 operands, B = {batch}"),
            &got,
            &want,
            bound,
        );
    }
    Ok(())
}

#[test]
fn gpu_attention_fused_matches_the_unfused_gpu_path_at_the_step_batch() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    // The step's sizes: 2048 tiles, 31 or 32 per block of 66.
    let batch = 16384;
    let dims = fused_dims(batch);
    let data = HeadData::new(dims, 30);
    let x = HeadInputs::upload(&device, &data)?;
    let fused = run_fused(&device, &k, dims, &x)?;
    let unfused = run_unfused(&device, &k, dims, &x)?;
    check_head(
        "attention_fused vs the unfused GPU path, B = 16384",
        &fused,
        &unfused,
        FUSED_UNFUSED_BOUND,
    );
    // pred of the first tiles, a middle block's and the last, against the reference on
    // those samples alone.
    for samples in [0..64, 8000..8064, batch - 64..batch] {
        let want = data.reference(dims, samples.clone());
        check_within(
            &format!("attention_fused vs CPU with TF32 operands, B = 16384, samples {samples:?}"),
            "pred",
            &fused.pred[samples],
            &want.pred,
            largest(&want.pred),
            FUSED_TF32_BOUND,
        );
    }
    Ok(())
}

#[test]
fn gpu_attention_fused_repeats_bit_for_bit() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    // The step's batch, and a ragged one with a last tile of one sample.
    for batch in [16384, 2001] {
        let dims = fused_dims(batch);
        let x = HeadInputs::upload(&device, &HeadData::new(dims, 40))?;
        let first = run_fused(&device, &k, dims, &x)?;
        let again = run_fused(&device, &k, dims, &x)?;
        assert!(
            again.bits() == first.bits(),
            "B = {batch}: a second run of attention_fused differs from the first"
        );
    }
    Ok(())
}

#[test]
fn gpu_attention_fused_refuses_other_sizes() -> Result<()> {
    let device = Device::new(0)?;
    let k = Kernels::load(&device)?;
    assert_eq!(
        k.attention_kernel(fused_dims(16384)),
        AttentionKernel::Fused
    );
    let others = [
        AttnFusedDims {
            width: 32,
            ..fused_dims(64)
        },
        AttnFusedDims {
            window: 4,
            ..fused_dims(64)
        },
        AttnFusedDims {
            state: 32,
            ..fused_dims(64)
        },
        AttnFusedDims {
            heads: 8,
            ..fused_dims(64)
        },
    ];
    for dims in others {
        assert!(!dims.fused_takes(), "{dims:?}");
        assert_eq!(
            k.attention_kernel(dims),
            AttentionKernel::Unfused,
            "{dims:?}"
        );
        let x = HeadInputs::upload(&device, &HeadData::new(dims, 50))?;
        let mut out = HeadOutputs::poisoned(&device, dims)?;
        // Scratch enough for the step's sizes at this batch: not what it refuses.
        let mut scratch = nan_buffer(&device, "scratch", fused_dims(dims.batch).scratch_len())?;
        let err = match launch_fused(&device, &k, dims, &x, &mut out, &mut scratch) {
            Ok(()) => panic!("attention_fused took sizes it is not written for: {dims:?}"),
            Err(e) => e.chain(),
        };
        let found = format!(
            "found S = {}, W = {}, E = {}, Hh = {}",
            dims.state, dims.window, dims.width, dims.heads
        );
        assert!(
            err.contains("attention_fused: expected S = 64, W = 8, E = 64 and Hh = 4")
                && err.contains(&found),
            "{err}"
        );
        // Nothing ran: every output still holds its poison, the loss buffer its zeros.
        let left = out.download(&device)?;
        for (what, x) in left.outputs() {
            let untouched = if what == "losses" {
                x.iter().all(|&l| l == 0.0)
            } else {
                x.iter().all(|l| l.is_nan())
            };
            assert!(untouched, "{dims:?}: {what} was written");
        }
    }
    Ok(())
}
