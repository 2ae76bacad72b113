//! GPU tests of the optimizer's two launches (`Kernels::grad_sq_norm`, then
//! `Kernels::adam_clip_update`, as the step's `clip_and_adam` issues them) against the
//! CPU references, and of `Kernels::grad_norm_adam` (the norm finished in the update's
//! blocks) against them bit for bit, over tensors whose lengths put chunk boundaries inside tensors, at
//! them, and between tensors of one element; of the guard that skips a step whose
//! gradients are not finite; and of Adam's clock on the device (`Kernels::adam_tick`),
//! bit for bit against `AdamScalars::at_step`. They need a CUDA GPU of compute capability
//! 9.0.
//!
//! Bounds: the norm is a sum of up to ~70k squares that the kernels add in f32 in chunks
//! of 512 and the reference in f64, so [`NORM_BOUND`] relative; the update is a few f32
//! operations an element that the kernel may fuse where the reference rounds twice, so
//! [`UPDATE_BOUND`] relative to each element or, below the tensor's root mean square, to
//! that; and the update `param − param before` to [`DELTA_BOUND`] of its root mean square,
//! since parameters of order 1 move by about `lr` and round to an ulp of themselves.
//! A wrong index or formula is off by the size of the element.

use super::{Rng, bits, check_within, rms, run_one_op};
use stepgraph::{Device, DeviceBuffer, DeviceScalars, Result};
use stepgraph_kernels::reference::{
    adam_clip_update_reference, adam_tick_reference, grad_sq_norm_reference,
};
use stepgraph_kernels::{
    ADAM_SCALARS, AdamClock, AdamHyper, AdamScalars, AdamSlot, Kernels, OPTIM_CHUNK, ParamEntry,
    ParamTable,
};

const NORM_BOUND: f64 = 1e-5;
const UPDATE_BOUND: f64 = 1e-6;
const DELTA_BOUND: f64 = 1e-2;
const LR: f32 = 3e-4;

/// Tensor lengths: chunk boundaries inside a tensor, exactly at its end, one-element
/// tensors on either side of one, and a long tensor of many chunks.
const LENGTHS: [usize; 7] = [
    1,
    OPTIM_CHUNK - 1,
    1,
    OPTIM_CHUNK,
    3 * OPTIM_CHUNK + 7,
    1,
    65_541,
];

/// Host copies of every tensor of the table.
#[derive(Clone)]
struct State {
    param: Vec<Vec<f32>>,
    grad: Vec<Vec<f32>>,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

/// Random parameters, moments as after a few steps (`v > 0`), and gradients of scale
/// `grad_scale`.
fn state(seed: u64, grad_scale: f32) -> State {
    let mut rng = Rng::new(seed);
    let mut each = |lo: f32, hi: f32| -> Vec<Vec<f32>> {
        LENGTHS
            .iter()
            .map(|&n| rng.vec_nonzero(n, lo, hi))
            .collect()
    };
    State {
        param: each(-1.0, 1.0),
        grad: each(-grad_scale, grad_scale),
        m: each(-1e-2, 1e-2),
        v: each(1e-6, 1e-4),
    }
}

/// Where the update's learning rate and bias corrections come from.
enum Scalars {
    /// Device scalars set on the host.
    Staged(AdamScalars),
    /// An [`AdamClock`] that has taken `after` steps, ticked once (at [`LR`]) before the
    /// update.
    Clock { after: u64 },
}

/// How the norm and the update are issued.
#[derive(Clone, Copy, Debug)]
enum Launches {
    /// `grad_sq_norm`, then `adam_clip_update`.
    NormThenUpdate,
    /// `grad_norm_adam`.
    Fused,
}

/// Runs the two launches once on the GPU; returns `sq_norm` and the state after them.
fn run(
    device: &Device,
    k: &Kernels,
    x: &State,
    scalars: AdamScalars,
    hyper: AdamHyper,
) -> Result<(f32, State)> {
    run_with(
        device,
        k,
        x,
        hyper,
        Scalars::Staged(scalars),
        Launches::NormThenUpdate,
    )
}

/// [`run`], with the scalars from `scalars`, issued as `launches` says.
fn run_with(
    device: &Device,
    k: &Kernels,
    x: &State,
    hyper: AdamHyper,
    scalars: Scalars,
    launches: Launches,
) -> Result<(f32, State)> {
    let up = |what: &str, v: &[Vec<f32>]| -> Result<Vec<DeviceBuffer<f32>>> {
        v.iter().map(|t| device.upload_new(what, t)).collect()
    };
    let mut param = up("param", &x.param)?;
    let grad = up("grad", &x.grad)?;
    let mut m = up("m", &x.m)?;
    let mut v = up("v", &x.v)?;
    let entries = (0..LENGTHS.len())
        .map(|i| ParamEntry::of(&param[i], &grad[i], &m[i], &v[i]))
        .collect::<Result<Vec<_>>>()?;
    let table = ParamTable::new(device, entries)?;
    let mut scratch = device.upload_new("norm partials", &vec![f32::NAN; table.blocks()])?;
    // Finite and wrong: a NaN the norm kernel failed to write would pass as "not finite".
    let mut sq_norm = device.upload_new("sq_norm", &[-1.0f32])?;
    enum Held {
        Staged(DeviceScalars<f32>),
        Clock(AdamClock),
    }
    let mut held = match scalars {
        Scalars::Staged(s) => {
            Held::Staged(DeviceScalars::new(device, "adam scalars", &s.values())?)
        }
        Scalars::Clock { after } => Held::Clock(AdamClock::new(device, after)?),
    };
    run_one_op(device, |stream| {
        if let Held::Clock(clock) = &mut held {
            k.adam_tick(stream, clock, LR, hyper)?;
        }
        let grads: Vec<&DeviceBuffer<f32>> = grad.iter().collect();
        let scalars = match &held {
            Held::Staged(staged) => staged.on_device(),
            Held::Clock(clock) => clock.scalars(),
        };
        let mut slots: Vec<AdamSlot<'_>> = param
            .iter_mut()
            .zip(&grad)
            .zip(m.iter_mut().zip(v.iter_mut()))
            .map(|((param, grad), (m, v))| AdamSlot { param, grad, m, v })
            .collect();
        match launches {
            Launches::NormThenUpdate => {
                k.grad_sq_norm(stream, &table, &grads, &mut scratch, &mut sq_norm)?;
                k.adam_clip_update(stream, &table, &mut slots, &sq_norm, scalars, hyper)
            }
            Launches::Fused => k.grad_norm_adam(
                stream,
                &table,
                &mut slots,
                &mut scratch,
                &mut sq_norm,
                scalars,
                hyper,
            ),
        }
    })?;
    let down = |bufs: &[DeviceBuffer<f32>]| -> Result<Vec<Vec<f32>>> {
        bufs.iter().map(|b| device.download(b)).collect()
    };
    let after = State {
        param: down(&param)?,
        grad: x.grad.clone(),
        m: down(&m)?,
        v: down(&v)?,
    };
    Ok((device.download(&sq_norm)?[0], after))
}

/// The CPU references' norm and state after the update.
fn reference(x: &State, scalars: AdamScalars, hyper: AdamHyper) -> (f32, State) {
    let grads: Vec<&[f32]> = x.grad.iter().map(Vec::as_slice).collect();
    let sq_norm = grad_sq_norm_reference(&grads);
    let mut after = x.clone();
    for i in 0..LENGTHS.len() {
        adam_clip_update_reference(
            &mut after.param[i],
            &x.grad[i],
            &mut after.m[i],
            &mut after.v[i],
            sq_norm,
            scalars,
            hyper,
        );
    }
    (sq_norm, after)
}

fn flat(v: &[Vec<f32>]) -> Vec<f32> {
    v.concat()
}

#[test]
fn gpu_grad_norm_and_adam_match_the_cpu_reference() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let hyper = AdamHyper::default();
    // Gradients of scale 1e-3 (norm ~0.15: no clipping) and 1 (norm ~150: clipped to 10),
    // at the first step (bias corrections 0.1 and 0.001) and a later one.
    for (case, seed, grad_scale, t) in [
        ("unclipped, t = 1", 1, 1e-3, 1),
        ("clipped, t = 1", 2, 1.0, 1),
        ("clipped, t = 7", 3, 1.0, 7),
    ] {
        let x = state(seed, grad_scale);
        let scalars = AdamScalars::at_step(LR, &hyper, t);
        let (norm, got) = run(&device, &k, &x, scalars, hyper)?;
        // The norm finished in the update's blocks: the same bits, norm and state.
        let staged = Scalars::Staged(scalars);
        let (fused_norm, fused) = run_with(&device, &k, &x, hyper, staged, Launches::Fused)?;
        assert_eq!(
            fused_norm.to_bits(),
            norm.to_bits(),
            "{case}: fused sq_norm"
        );
        for (what, a, b) in [
            ("param", &fused.param, &got.param),
            ("m", &fused.m, &got.m),
            ("v", &fused.v, &got.v),
        ] {
            assert_eq!(bits(&[&flat(a)]), bits(&[&flat(b)]), "{case}: fused {what}");
        }
        let (want_norm, want) = reference(&x, scalars, hyper);
        let clipped = (hyper.max_norm as f32) < want_norm.sqrt();
        assert_eq!(
            clipped,
            grad_scale == 1.0,
            "{case}: the case clips as intended"
        );
        check_within(case, "sq_norm", &[norm], &[want_norm], 0.0, NORM_BOUND);
        for (what, g, w) in [
            ("param", &got.param, &want.param),
            ("m", &got.m, &want.m),
            ("v", &got.v, &want.v),
        ] {
            let (g, w) = (flat(g), flat(w));
            check_within(case, what, &g, &w, rms(&w), UPDATE_BOUND);
        }
        // The update itself, which the parameters' bound cannot see (an update is ~lr
        // beside parameters of order 1): a chunk the kernel skipped or updated twice is
        // off by the size of its updates. Rounding the parameter costs an ulp of it,
        // about 1e-3 of a typical update.
        let delta = |after: &[Vec<f32>]| -> Vec<f32> {
            flat(after)
                .iter()
                .zip(flat(&x.param))
                .map(|(a, b)| a - b)
                .collect()
        };
        let (got_delta, want_delta) = (delta(&got.param), delta(&want.param));
        check_within(
            case,
            "param - param before",
            &got_delta,
            &want_delta,
            rms(&want_delta),
            DELTA_BOUND,
        );
    }
    Ok(())
}

#[test]
fn gpu_adam_skips_a_step_whose_gradient_is_not_finite() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let hyper = AdamHyper::default();
    let scalars = AdamScalars::at_step(LR, &hyper, 2);
    for (case, bad) in [
        ("a NaN gradient", f32::NAN),
        ("an infinite gradient", f32::INFINITY),
        ("a gradient whose square overflows", 3e19),
    ] {
        let mut x = state(4, 1e-3);
        // In the long tensor, past the first chunk: the blocks that hold no bad element
        // must skip too.
        x.grad[6][40_000] = bad;
        for launches in [Launches::NormThenUpdate, Launches::Fused] {
            let staged = Scalars::Staged(scalars);
            let (norm, got) = run_with(&device, &k, &x, hyper, staged, launches)?;
            if bad.is_nan() {
                assert!(
                    norm.is_nan(),
                    "{case}, {launches:?}: sq_norm {norm} should be NaN"
                );
            } else {
                assert_eq!(norm, f32::INFINITY, "{case}, {launches:?}: sq_norm");
            }
            for (what, g, w) in [
                ("param", &got.param, &x.param),
                ("m", &got.m, &x.m),
                ("v", &got.v, &x.v),
            ] {
                let (g, w) = (flat(g), flat(w));
                assert_eq!(
                    bits(&[&g]),
                    bits(&[&w]),
                    "{case}, {launches:?}: {what} changed by a skipped step"
                );
            }
        }
        let (_, want) = reference(&x, scalars, hyper);
        assert_eq!(
            bits(&[&flat(&want.param)]),
            bits(&[&flat(&x.param)]),
            "{case}: the reference skips too"
        );
    }
    Ok(())
}

/// The scalars of `ticks` ticks of a clock that starts at `t0`, one row of three per
/// tick, and the count it ends at, from one eager run.
fn tick_history(
    device: &Device,
    k: &Kernels,
    t0: u64,
    ticks: usize,
    lr: f32,
    hyper: AdamHyper,
) -> Result<(Vec<f32>, u64)> {
    let mut clock = AdamClock::new(device, t0)?;
    let mut history = super::nan_buffer(device, "scalars per tick", ticks * ADAM_SCALARS)?;
    run_one_op(device, |stream| {
        for i in 0..ticks {
            k.adam_tick(stream, &mut clock, lr, hyper)?;
            let mut row = history.view_mut(i * ADAM_SCALARS..(i + 1) * ADAM_SCALARS)?;
            stream.copy(clock.scalars(), &mut row)?;
        }
        Ok(())
    })?;
    Ok((device.download(&history)?, device.download(clock.t())?[0]))
}

#[test]
fn gpu_adam_clock_ticks_equal_at_step_bit_for_bit() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let mut rng = Rng::new(71);
    let custom = AdamHyper {
        beta1: 0.95,
        beta2: 0.9999,
        ..AdamHyper::default()
    };
    for hyper in [AdamHyper::default(), custom] {
        let lr = 1e-4 + rng.next_f32() * 1e-3;
        // Steps 1..=2000 from a fresh clock.
        let (history, t) = tick_history(&device, &k, 0, 2000, lr, hyper)?;
        assert_eq!(t, 2000);
        let want: Vec<f32> = (1..=2000u32)
            .flat_map(|t| AdamScalars::at_step(lr, &hyper, t).values())
            .collect();
        assert_eq!(bits(&[&history]), bits(&[&want]), "{hyper:?}");
        // Resumed clocks: where beta2^t is still far from 0, where beta1^t underflows,
        // and either side of the count the exponent stops at.
        for t0 in [
            12_345u64,
            700_000,
            (i32::MAX - 1) as u64,
            i32::MAX as u64,
            1 << 40,
        ] {
            let (history, t) = tick_history(&device, &k, t0, 2, lr, hyper)?;
            assert_eq!(t, t0 + 2, "from {t0}");
            let (t1, s1) = adam_tick_reference(t0, lr, &hyper);
            let (t2, s2) = adam_tick_reference(t1, lr, &hyper);
            assert_eq!(t2, t);
            let want = [s1.values(), s2.values()].concat();
            assert_eq!(bits(&[&history]), bits(&[&want]), "from {t0}, {hyper:?}");
        }
    }
    // A beta outside [0, 1) is refused before anything runs.
    let bad = AdamHyper {
        beta2: 1.0,
        ..AdamHyper::default()
    };
    let err = tick_history(&device, &k, 0, 1, 1e-3, bad).unwrap_err();
    assert!(
        err.chain()
            .contains("adam_tick: expected beta2 in [0, 1), found 1"),
        "{}",
        err.chain()
    );
    Ok(())
}

/// A step that ticks the clock and updates with its scalars, as a trainer's would.
#[stepgraph::step(streams(main), kernels = Kernels)]
mod clocked {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub clock: AdamClock,
        pub scalars_seen: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub lr: f32,
    }

    fn tick(
        s: &stepgraph::CaptureStream<'_>,
        k: &Kernels,
        clock: &mut AdamClock,
        lr: f32,
    ) -> Result<()> {
        k.adam_tick(s, clock, lr, AdamHyper::default())
    }

    fn record(
        s: &stepgraph::CaptureStream<'_>,
        clock: &AdamClock,
        scalars_seen: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(clock.scalars(), scalars_seen)
    }
}

#[test]
fn gpu_adam_clock_advances_at_every_replay_from_a_resumed_count() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let (lr, hyper, t0) = (3e-4f32, AdamHyper::default(), 41u64);
    let buffers = clocked::Buffers {
        clock: AdamClock::new(&device, t0)?,
        scalars_seen: super::nan_buffer(&device, "scalars seen", ADAM_SCALARS)?,
    };
    let mut step = clocked::Step::new(&device, k, buffers, clocked::Config { lr })?;
    for replay in 1..=5u64 {
        step.replay()?;
        let seen = step.download(|b| &b.scalars_seen)?;
        let want = AdamScalars::at_step(lr, &hyper, (t0 + replay) as u32).values();
        assert_eq!(bits(&[&seen]), bits(&[&want]), "replay {replay}");
        assert_eq!(step.download(|b| b.clock.t())?, [t0 + replay]);
    }
    Ok(())
}

#[test]
fn gpu_adam_update_with_the_clock_matches_the_one_with_staged_scalars() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let hyper = AdamHyper::default();
    let x = state(5, 1.0);
    let t = 9u32;
    let staged = run(&device, &k, &x, AdamScalars::at_step(LR, &hyper, t), hyper)?;
    let clocked = run_with(
        &device,
        &k,
        &x,
        hyper,
        Scalars::Clock {
            after: u64::from(t) - 1,
        },
        // The fused launches here: the same bits as the staged two.
        Launches::Fused,
    )?;
    assert_eq!(staged.0.to_bits(), clocked.0.to_bits(), "sq_norm");
    for (what, a, b) in [
        ("param", &staged.1.param, &clocked.1.param),
        ("m", &staged.1.m, &clocked.1.m),
        ("v", &staged.1.v, &clocked.1.v),
    ] {
        assert_eq!(bits(&[&flat(a)]), bits(&[&flat(b)]), "{what}");
    }
    Ok(())
}
