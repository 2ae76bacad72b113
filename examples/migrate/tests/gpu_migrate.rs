//! GPU tests of the migration: the stepgraph step (`after`), built from the trainer's
//! existing functions, against the trainer that captures them on one stream (`before`).
//! Same seed, same random state, same steps: every buffer must come out with the same
//! bits. The speed of each is printed, not asserted (the benchmark is `migrate`).
#![cfg(feature = "gpu-tests")]

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice};
use stepgraph_migrate::{After, Dims, Trainer};

fn gpu() -> Arc<CudaContext> {
    CudaContext::new(0).expect("these tests need a CUDA GPU")
}

/// Every buffer of the step, by name, from a `State` or the step's `Buffers` (the same
/// fields).
macro_rules! slices {
    ($s:expr) => {{
        let s = $s;
        vec![
            ("x", &s.x),
            ("trunk.l1.w", &s.trunk.l1.w),
            ("trunk.l1.b", &s.trunk.l1.b),
            ("trunk.l2.w", &s.trunk.l2.w),
            ("trunk.l2.b", &s.trunk.l2.b),
            ("trunk_acts.h1", &s.trunk_acts.h1),
            ("trunk_acts.h", &s.trunk_acts.h),
            ("iqn.embed.w", &s.iqn.embed.w),
            ("iqn.embed.b", &s.iqn.embed.b),
            ("iqn.out.w", &s.iqn.out.w),
            ("iqn.out.b", &s.iqn.out.b),
            ("iqn_data.tau", &s.iqn_data.tau),
            ("iqn_data.target", &s.iqn_data.target),
            ("iqn_acts.cosf", &s.iqn_acts.cosf),
            ("iqn_acts.phi", &s.iqn_acts.phi),
            ("iqn_acts.g", &s.iqn_acts.g),
            ("iqn_acts.z", &s.iqn_acts.z),
            ("iqn_acts.dz", &s.iqn_acts.dz),
            ("iqn_acts.row_loss", &s.iqn_acts.row_loss),
            ("iqn_acts.loss", &s.iqn_acts.loss),
            ("iqn_grad.w", &s.iqn_grad.w),
            ("iqn_grad.b", &s.iqn_grad.b),
            ("attn.tokens.w", &s.attn.tokens.w),
            ("attn.tokens.b", &s.attn.tokens.b),
            ("attn.qkv.w", &s.attn.qkv.w),
            ("attn.qkv.b", &s.attn.qkv.b),
            ("attn.out.w", &s.attn.out.w),
            ("attn.out.b", &s.attn.out.b),
            ("attn_data.target", &s.attn_data.target),
            ("attn_acts.tok", &s.attn_acts.tok),
            ("attn_acts.qkv", &s.attn_acts.qkv),
            ("attn_acts.scores", &s.attn_acts.scores),
            ("attn_acts.ctx", &s.attn_acts.ctx),
            ("attn_acts.pred", &s.attn_acts.pred),
            ("attn_acts.dpred", &s.attn_acts.dpred),
            ("attn_acts.row_loss", &s.attn_acts.row_loss),
            ("attn_acts.loss", &s.attn_acts.loss),
            ("attn_grad.w", &s.attn_grad.w),
            ("attn_grad.b", &s.attn_grad.b),
        ]
    }};
}

fn bits_of(
    read: impl Fn(&CudaSlice<f32>) -> Vec<f32>,
    slices: Vec<(&str, &CudaSlice<f32>)>,
) -> Vec<(String, Vec<u32>)> {
    slices
        .into_iter()
        .map(|(name, s)| {
            (
                name.to_string(),
                read(s).into_iter().map(f32::to_bits).collect(),
            )
        })
        .collect()
}

fn before_bits(t: &Trainer) -> Vec<(String, Vec<u32>)> {
    t.sync().unwrap();
    let read = |s: &CudaSlice<f32>| t.stream().clone_dtoh(s).unwrap();
    bits_of(read, slices!(t.state()))
}

fn after_bits(a: &After) -> Vec<(String, Vec<u32>)> {
    a.step.wait().unwrap();
    let read = |s: &CudaSlice<f32>| a.device.download(s).unwrap();
    bits_of(read, slices!(a.step.buffers()))
}

fn assert_same(step: usize, before: &[(String, Vec<u32>)], after: &[(String, Vec<u32>)]) {
    assert_eq!(before.len(), after.len());
    for ((name, b), (_, a)) in before.iter().zip(after) {
        let first = b.iter().zip(a).position(|(x, y)| x != y);
        assert!(
            first.is_none() && a.len() == b.len(),
            "after step {step}: `{name}` differs from the before's at element {first:?} of {}",
            b.len()
        );
    }
}

#[test]
fn gpu_the_step_gives_the_original_trainers_bits_and_runs_the_heads_side_by_side() {
    let ctx = gpu();
    let dims = Dims::default();
    for seed in [5, 11] {
        let mut before = Trainer::new(ctx.clone(), dims, seed).unwrap();
        before.capture().unwrap();
        let mut after = After::new(ctx.clone(), dims, seed).unwrap();
        // The seeded state is the same before any step.
        assert_same(0, &before_bits(&before), &after_bits(&after));
        let mut losses = Vec::new();
        for step in 1..=4 {
            before.replay().unwrap();
            after.step.replay().unwrap();
            let (b, a) = (before_bits(&before), after_bits(&after));
            assert_same(step, &b, &a);
            losses.push(before.iqn_loss().unwrap());
        }
        // The steps trained something: the IQN loss moved.
        assert!(losses.windows(2).any(|w| w[0] != w[1]), "{losses:?}");
    }

    // The plan: each head waits once, for the trunk; the end joins both heads.
    let plan = stepgraph_migrate::after::step::Step::plan();
    println!("{plan}");
    assert_eq!(plan.streams.len(), 3);
    for op in plan.ops {
        let waits = usize::from(op.name == "iqn_fwd" || op.name == "attn_fwd");
        assert_eq!(op.waits.len(), waits, "{}", op.name);
    }
    assert_eq!(plan.final_waits.len(), 2);
    // The captured graph matches the plan, the heads' work in it and unordered.
    let mut after = After::new(ctx.clone(), dims, 1).unwrap();
    let report = after.step.verify().unwrap();
    println!("{report}");
    assert_eq!(report.ops, 5);
    assert!(report.independent_pairs >= 4, "{report}");

    // The speed of each, printed (the benchmark is `migrate`, in bench/BENCHMARKS.md).
    let mut before = Trainer::new(ctx.clone(), dims, 3).unwrap();
    before.capture().unwrap();
    let figures = stepgraph_migrate::bench::compare(&before, &mut after.step, 20, 200, 3).unwrap();
    println!("{figures}");
}
