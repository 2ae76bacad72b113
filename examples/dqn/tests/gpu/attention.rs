//! GPU tests of the window attention kernels (`Kernels::attention_forward` and
//! `Kernels::attention_backward`): against the CPU references, on both of the kernels'
//! paths (a warp per sample for `E / Hh == 16`, `W <= 8`; a block of samples otherwise), and
//! run twice for the same bits. They need a CUDA GPU of compute capability 9.0.
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

use super::{Rng, check_within, nan_buffer, rms, run_one_op};
use stepgraph::{Device, DeviceBuffer, Result};
use stepgraph_dqn::kernels::{AttentionDims, Kernels};
use stepgraph_dqn::reference::{attention_backward_reference, attention_forward_reference};

/// Largest elementwise error (see the module's documentation).
const BOUND: f64 = 1e-5;

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
