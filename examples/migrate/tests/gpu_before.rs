//! GPU tests of the "before" trainer: they need a CUDA GPU (written for an H200) and run
//! only with the `gpu-tests` feature. Every test uses random weights and data.
//!
//! Each captured step is checked against the CPU reference recomputed from the state the
//! trainer started that step from, so an error shows at the step that makes it; the same
//! seed must give the same bits, captured or eager.
#![cfg(feature = "gpu-tests")]

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DevicePtr};
use stepgraph_migrate::before::LEARNING_RATE;
use stepgraph_migrate::host::{HostLinear, HostParams};
use stepgraph_migrate::lt::{Gemm, Lt, WORKSPACE_BYTES};
use stepgraph_migrate::reference::{self, Lin};
use stepgraph_migrate::{Dims, Error, Trainer};
use stepgraph_testkit::rel_err;

fn gpu() -> Arc<CudaContext> {
    CudaContext::new(0).expect("these tests need a CUDA GPU")
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn within(what: &str, step: usize, got: &[f32], want: &[f64], tol: f64) {
    assert!(
        got.iter().all(|x| x.is_finite()),
        "step {step}: {what} is not finite"
    );
    let e = rel_err(got, want);
    assert!(
        e <= tol,
        "step {step}: {what} is off by {e:.3e} (tolerance {tol:.0e})"
    );
}

fn grad_within(what: &str, step: usize, got: &HostLinear, want: &Lin) {
    within(&format!("{what} w"), step, &got.w, &want.w, 1e-4);
    within(&format!("{what} b"), step, &got.b, &want.b, 1e-4);
}

fn linear_within(what: &str, step: usize, got: &HostLinear, want: &HostLinear) {
    within(&format!("{what} w"), step, &got.w, &f64s(&want.w), 1e-6);
    within(&format!("{what} b"), step, &got.b, &f64s(&want.b), 1e-6);
}

/// Replays the captured step `steps` times; checks every step against the reference and
/// returns the losses.
fn check_against_reference(dims: Dims, steps: usize) -> Vec<(f32, f32)> {
    let mut t = Trainer::new(gpu(), dims, 7).expect("trainer");
    t.capture().expect("capture");
    let data = t.data().unwrap();
    let mut before: HostParams = t.params().unwrap();
    let mut losses = Vec::new();
    for step in 1..=steps {
        t.replay().unwrap();
        t.sync().unwrap();
        let r = reference::step(&dims, LEARNING_RATE, &before, &data);
        within("h", step, &t.features().unwrap(), &r.h, 2e-5);
        within("z", step, &t.iqn_outputs().unwrap(), &r.iqn.z, 3e-5);
        within(
            "pred",
            step,
            &t.attention_outputs().unwrap(),
            &r.attention.pred,
            3e-5,
        );
        let (iqn, attn) = (t.iqn_loss().unwrap(), t.attention_loss().unwrap());
        within("L_iqn", step, &[iqn], &[r.iqn.loss], 1e-4);
        within("L_attn", step, &[attn], &[r.attention.loss], 1e-4);
        grad_within("IQN grad", step, &t.iqn_grad().unwrap(), &r.iqn.grad);
        grad_within(
            "attention grad",
            step,
            &t.attention_grad().unwrap(),
            &r.attention.grad,
        );
        let after = t.params().unwrap();
        linear_within("IQN out", step, &after.iqn_out, &r.next.iqn_out);
        linear_within("attention out", step, &after.attn_out, &r.next.attn_out);
        // Only the output layers are trained.
        assert_eq!(after.trunk1, before.trunk1, "step {step}");
        assert_eq!(after.trunk2, before.trunk2, "step {step}");
        assert_eq!(after.iqn_embed, before.iqn_embed, "step {step}");
        assert_eq!(after.attn_tokens, before.attn_tokens, "step {step}");
        assert_eq!(after.attn_qkv, before.attn_qkv, "step {step}");
        losses.push((iqn, attn));
        before = after;
    }
    losses
}

#[test]
fn gpu_the_captured_step_matches_the_cpu_reference_at_small_sizes() {
    let losses = check_against_reference(Dims::small(), 4);
    // Each replay trains: the state, and so the losses, move from step to step.
    for w in losses.windows(2) {
        assert!(w[1].0 < w[0].0 && w[1].1 < w[0].1, "{losses:?}");
    }
}

#[test]
fn gpu_the_captured_step_matches_the_cpu_reference_at_the_default_sizes() {
    let losses = check_against_reference(Dims::default(), 2);
    assert_ne!(losses[0], losses[1]);
}

/// Everything a step leaves behind, as bits.
fn state_bits(t: &Trainer) -> Vec<Vec<u32>> {
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<u32>>();
    let p = t.params().unwrap();
    let (ig, ag) = (t.iqn_grad().unwrap(), t.attention_grad().unwrap());
    vec![
        bits(vec![t.iqn_loss().unwrap(), t.attention_loss().unwrap()]),
        bits(t.features().unwrap()),
        bits(t.iqn_outputs().unwrap()),
        bits(t.attention_outputs().unwrap()),
        bits(ig.w),
        bits(ig.b),
        bits(ag.w),
        bits(ag.b),
        bits(p.iqn_out.w),
        bits(p.iqn_out.b),
        bits(p.attn_out.w),
        bits(p.attn_out.b),
    ]
}

#[test]
fn gpu_two_trainers_with_one_seed_give_the_same_bits() {
    let ctx = gpu();
    let mut a = Trainer::new(ctx.clone(), Dims::default(), 99).unwrap();
    let mut b = Trainer::new(ctx, Dims::default(), 99).unwrap();
    a.capture().unwrap();
    b.capture().unwrap();
    for step in 1..=3 {
        a.replay().unwrap();
        b.replay().unwrap();
        a.sync().unwrap();
        b.sync().unwrap();
        assert!(
            state_bits(&a) == state_bits(&b),
            "step {step}: the trainers differ"
        );
    }
}

#[test]
fn gpu_the_graph_and_the_eager_step_give_the_same_bits() {
    let ctx = gpu();
    let mut graph = Trainer::new(ctx.clone(), Dims::default(), 3).unwrap();
    let mut eager = Trainer::new(ctx, Dims::default(), 3).unwrap();
    graph.capture().unwrap();
    for step in 1..=2 {
        graph.replay().unwrap();
        eager.step_eager().unwrap();
        graph.sync().unwrap();
        eager.sync().unwrap();
        assert!(
            state_bits(&graph) == state_bits(&eager),
            "step {step}: graph and eager differ"
        );
    }
}

#[test]
fn gpu_capturing_runs_nothing_and_a_replay_before_capture_is_refused() {
    let mut t = Trainer::new(gpu(), Dims::small(), 1).unwrap();
    assert!(matches!(t.replay(), Err(Error::Invalid(_))));
    t.capture().unwrap();
    t.sync().unwrap();
    // Activations start as NaN; the capture recorded the step without running it.
    assert!(t.features().unwrap().iter().all(|x| x.is_nan()));
    t.replay().unwrap();
    t.sync().unwrap();
    assert!(t.features().unwrap().iter().all(|x| x.is_finite()));
}

/// A GEMM of the IQN head's gradient shape (long k), with inputs on `stream`.
struct Operands {
    gemm: Gemm,
    a: cudarc::driver::CudaSlice<f32>,
    b: cudarc::driver::CudaSlice<f32>,
}

fn operands(stream: &Arc<CudaStream>) -> Operands {
    let gemm = Dims::default().gemms().iqn_grad;
    let mut rng = stepgraph_testkit::Rng::new(5);
    let a = rng.fill(gemm.a().extent(), 1.0);
    let b = rng.fill(gemm.b().extent(), 1.0);
    Operands {
        gemm,
        a: stream.clone_htod(&a).unwrap(),
        b: stream.clone_htod(&b).unwrap(),
    }
}

#[test]
fn gpu_a_stream_and_workspace_override_gives_the_same_bits_as_the_defaults() {
    let ctx = gpu();
    // SAFETY: before this test allocates; every buffer below is used on the stream it was
    // allocated on, or after a synchronisation of the other.
    unsafe { ctx.disable_event_tracking() };
    let main = ctx.new_stream().unwrap();
    let side = ctx.new_stream().unwrap();
    let lt = Lt::new(main.clone()).unwrap();
    let ops = operands(&main);
    let need = lt.prepare(&ops.gemm).unwrap();
    assert!(need <= WORKSPACE_BYTES);
    let mut d_default = main.alloc_zeros::<f32>(ops.gemm.d().extent()).unwrap();
    lt.matmul(None, None, &ops.gemm, &ops.a, &ops.b, &mut d_default)
        .unwrap();
    main.synchronize().unwrap();

    // SAFETY: a workspace is scratch that cuBLASLt writes before it reads.
    let workspace = unsafe { side.alloc::<u8>(WORKSPACE_BYTES) }.unwrap();
    let mut d_side = side.alloc_zeros::<f32>(ops.gemm.d().extent()).unwrap();
    side.synchronize().unwrap();
    let (ws, _guard) = workspace.device_ptr(&side);
    lt.matmul(
        Some(&side),
        Some((ws, workspace.len())),
        &ops.gemm,
        &ops.a,
        &ops.b,
        &mut d_side,
    )
    .unwrap();
    side.synchronize().unwrap();
    let bits = |s: &Arc<CudaStream>, d: &cudarc::driver::CudaSlice<f32>| -> Vec<u32> {
        s.clone_dtoh(d)
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    };
    assert!(bits(&main, &d_default) == bits(&side, &d_side));

    // A misaligned or short workspace is refused before anything is issued.
    let e = lt
        .matmul(
            Some(&side),
            Some((ws + 16, 1 << 20)),
            &ops.gemm,
            &ops.a,
            &ops.b,
            &mut d_side,
        )
        .unwrap_err();
    assert!(e.to_string().contains("256-byte aligned"), "{e}");
    if need > 0 {
        let e = lt
            .matmul(
                Some(&side),
                Some((ws, need - 1)),
                &ops.gemm,
                &ops.a,
                &ops.b,
                &mut d_side,
            )
            .unwrap_err();
        assert!(e.to_string().contains("needs"), "{e}");
    }
}
