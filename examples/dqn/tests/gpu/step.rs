//! GPU tests of the whole DQN step at batch 512 (the other sizes the defaults): the batch
//! drawn from the replay buffer inside the graph, the host-fed batch, and the target
//! network's update at every K-th replay (a conditional node), copied or Polyak; the
//! graph of each verified against its plan; and the attention head fused against
//! unfused. They need a CUDA GPU of compute capability 9.0.
//!
//! The references are computed another way on the host: the drawn indices and fractions
//! by the CPU generator (`replay_draw_reference`, the same integers), the gathered rows by
//! indexing the downloaded buffer, the target by a model of the schedule over the
//! downloaded parameters. Parameters, targets and host batches are random.

use std::sync::Arc;

use stepgraph::{Communicator, Device, Result, Schedule, SmTarget};
use stepgraph_dqn::kernels::{AttentionKernel, Kernels, LossSlot, ReplayTensor, Watch};
use stepgraph_dqn::layers::{D, Sizes};
use stepgraph_dqn::model::{self, Model, dqn};
use stepgraph_dqn::reference::{
    replay_draw_reference, replay_fill_actions_reference, replay_fill_bernoulli_reference,
    replay_fill_normal_reference,
};
use stepgraph_dqn::replay::{BatchSource, HostBatch, ReplayBuffer};
use stepgraph_kernels::{AdamHyper, AdamScalars};

use super::{Rng, bits};
use stepgraph_testkit::max_err;

/// Rows of the tests' replay buffer: fewer than two batches, so rows repeat within a
/// batch and across replays, which the gathers must get right too.
const CAPACITY: usize = 1000;

const HYPER: AdamHyper = AdamHyper {
    max_norm: 10.0,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
};

fn sizes() -> Sizes {
    Sizes {
        batch: 512,
        ..Sizes::default()
    }
}

fn device() -> Device {
    Device::new(0).expect("these tests need a CUDA GPU of compute capability 9.0")
}

#[derive(Clone, Copy, Debug)]
enum Feed {
    Replay,
    Host,
}

/// The step with random parameters and a target near them, its batches from `feed`
/// (a replay buffer of [`CAPACITY`] rows filled from `seed`, drawn with `seed`).
fn build(
    device: &Device,
    feed: Feed,
    target_sync: u32,
    polyak: f32,
    seed: u64,
) -> Result<dqn::Step> {
    build_with(
        device,
        feed,
        target_sync,
        polyak,
        seed,
        Schedule::Planned,
        None,
    )
}

/// [`build`] under `schedule`, with the attention head as `attention` says (`None`: what
/// the sizes and the GPU take).
fn build_with(
    device: &Device,
    feed: Feed,
    target_sync: u32,
    polyak: f32,
    seed: u64,
    schedule: Schedule,
    attention: Option<AttentionKernel>,
) -> Result<dqn::Step> {
    let s = sizes();
    let k = Arc::new(Kernels::load(device)?);
    let source = match feed {
        Feed::Replay => {
            BatchSource::Replay(ReplayBuffer::generated(device, &k, &s, CAPACITY, seed)?)
        }
        Feed::Host => BatchSource::Host(HostBatch::new(device, &s)?),
    };
    let attention = model::attention_path(&k, &s, attention);
    let buffers = model::allocate(device, &s, source, Communicator::single(), attention)?;
    let config = dqn::Config {
        sizes: s,
        gamma: 0.99,
        hyper: HYPER,
        replay_seed: seed,
        target_sync,
        polyak,
        // The binary's default (`--branch-sms share`).
        branch_sms: SmTarget::Share(dqn::BRANCH_WIDTH as u32),
        iqn_kernel: None,
        attention_kernel: Some(attention),
    };
    let mut step = dqn::Step::with_schedule(device, k, buffers, config, schedule)?;
    let mut rng = Rng::new(seed ^ 0x1417);
    let n = step.buffers().params.named().len();
    for i in 0..n {
        let len = step.buffers().params.named()[i].1.len();
        let p = rng.fill(len, 0.05);
        let t: Vec<f32> = p
            .iter()
            .map(|x| x + 0.01 * (rng.next_f32() - 0.5))
            .collect();
        step.upload(|b| b.params.named()[i].1, &p)?;
        step.upload(|b| b.target.named()[i].1, &t)?;
    }
    Ok(step)
}

/// Adam's step count `t` for the next replay (lr 3e-4 and the bias corrections).
fn set_step_count(step: &mut dqn::Step, t: u32) -> Result<()> {
    let values = AdamScalars::at_step(3e-4, &HYPER, t).values();
    step.stage(|b| &b.optim.scalars_in, &values)
}

/// One training step: step count `t`, a replay, and its end.
fn train_step(step: &mut dqn::Step, t: u32) -> Result<()> {
    set_step_count(step, t)?;
    step.replay()?;
    step.wait()
}

/// Every tensor of a model of the step (the parameters or the target), host side.
fn tensors(step: &dqn::Step, which: fn(&dqn::Buffers) -> &Model) -> Result<Vec<Vec<f32>>> {
    which(step.buffers())
        .named()
        .into_iter()
        .map(|(_, buf)| step.executor().download(buf))
        .collect()
}

fn params(b: &dqn::Buffers) -> &Model {
    &b.params
}

fn target(b: &dqn::Buffers) -> &Model {
    &b.target
}

/// The replay buffer's tensors, host side.
struct Rows {
    s: Vec<f32>,
    s2: Vec<f32>,
    act: Vec<i32>,
    r: Vec<f32>,
    done: Vec<f32>,
    win: Vec<f32>,
}

fn replay_rows(step: &dqn::Step) -> Result<Rows> {
    let replay = step
        .buffers()
        .source
        .replay()
        .expect("a step that samples its replay buffer");
    let ex = step.executor();
    Ok(Rows {
        s: ex.download(&replay.s)?,
        s2: ex.download(&replay.s2)?,
        act: ex.download(&replay.act)?,
        r: ex.download(&replay.r)?,
        done: ex.download(&replay.done)?,
        win: ex.download(&replay.win)?,
    })
}

/// `got` row by row equals `all`'s rows `idx` (`width` elements each), bit for bit.
fn check_rows<T: Copy + PartialEq + std::fmt::Debug + ToBits>(
    what: &str,
    got: &[T],
    all: &[T],
    idx: &[u32],
    width: usize,
) {
    assert_eq!(got.len(), idx.len() * width, "{what}: length");
    for (b, &row) in idx.iter().enumerate() {
        let row = row as usize;
        let want = &all[row * width..(row + 1) * width];
        let have = &got[b * width..(b + 1) * width];
        assert!(
            have.iter()
                .zip(want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: batch row {b} is not the buffer's row {row}: {have:?} against {want:?}"
        );
    }
}

trait ToBits {
    fn to_bits(self) -> u32;
}

impl ToBits for f32 {
    fn to_bits(self) -> u32 {
        f32::to_bits(self)
    }
}

impl ToBits for i32 {
    fn to_bits(self) -> u32 {
        self as u32
    }
}

/// The fill: every action and done flag as the CPU generator gives them, the normals
/// within the f32 functions' rounding of the f64 ones.
#[test]
fn gpu_the_replay_buffer_is_filled_with_the_generated_distributions() -> Result<()> {
    let device = device();
    let s = sizes();
    let seed = 40;
    let step = build(&device, Feed::Replay, 1000, 0.0, seed)?;
    let rows = replay_rows(&step)?;
    let act =
        replay_fill_actions_reference(CAPACITY * D, s.actions as u32, seed, ReplayTensor::Act.id());
    assert_eq!(rows.act, act, "actions");
    let done = replay_fill_bernoulli_reference(CAPACITY, 0.1, seed, ReplayTensor::Done.id());
    assert_eq!(bits(&[&rows.done]), bits(&[&done]), "done");
    for (what, got, tensor) in [
        ("s", &rows.s, ReplayTensor::S),
        ("s2", &rows.s2, ReplayTensor::S2),
        ("r", &rows.r, ReplayTensor::R),
        ("win", &rows.win, ReplayTensor::Win),
    ] {
        let want = replay_fill_normal_reference(got.len(), seed, tensor.id());
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
            .fold(0.0f32, f32::max);
        eprintln!("fill {what}: largest error {worst:.3e} against the f64 reference");
        assert!(worst <= 1e-5, "fill {what}: largest error {worst:e}");
    }
    // The tensors are independent draws.
    assert_ne!(bits(&[&rows.s]), bits(&[&rows.s2[..rows.s.len()]]));
    Ok(())
}

/// Three replays: each draws the rows and fractions the CPU generator gives for its
/// counter (bit for bit), moves the counter on, and gathers exactly those rows of the
/// buffer into the batch and the windows; each batch differs from the one before.
#[test]
fn gpu_each_replay_draws_and_gathers_fresh_rows_of_the_replay_buffer() -> Result<()> {
    let device = device();
    let s = sizes();
    let seed = 41;
    let mut step = build(&device, Feed::Replay, 1000, 0.0, seed)?;
    let rows = replay_rows(&step)?;
    let mut last: Option<(Vec<u32>, Vec<f32>)> = None;
    for t in 1..=3u32 {
        train_step(&mut step, t)?;
        let counter = step.download(|b| &b.sampler.counter)?;
        assert_eq!(counter, [u64::from(t)], "replay {t}: the counter");
        let idx = step.download(|b| &b.sampler.idx)?;
        let (want_idx, want_tau) = replay_draw_reference(
            seed,
            u64::from(t - 1),
            CAPACITY as u32,
            s.batch,
            s.batch * s.quantiles,
        );
        assert_eq!(idx, want_idx, "replay {t}: the drawn rows");
        let tau = step.download(|b| &b.batch.tau)?;
        assert_eq!(bits(&[&tau]), bits(&[&want_tau]), "replay {t}: tau");
        assert!(
            tau.iter().all(|x| (0.02..=0.98).contains(x)),
            "replay {t}: a fraction outside [0.02, 0.98]"
        );
        let bs = step.download(|b| &b.batch.s)?;
        check_rows("s", &bs, &rows.s, &idx, s.state);
        check_rows(
            "s2",
            &step.download(|b| &b.batch.s2)?,
            &rows.s2,
            &idx,
            s.state,
        );
        check_rows("act", &step.download(|b| &b.batch.act)?, &rows.act, &idx, D);
        check_rows("r", &step.download(|b| &b.batch.r)?, &rows.r, &idx, 1);
        check_rows(
            "done",
            &step.download(|b| &b.batch.done)?,
            &rows.done,
            &idx,
            1,
        );
        let win = s.window * s.state;
        check_rows("win", &step.download(|b| &b.win)?, &rows.win, &idx, win);
        if let Some((prev_idx, prev_s)) = &last {
            let same = idx.iter().zip(prev_idx).filter(|(a, b)| a == b).count();
            // By chance about B / CAPACITY = 0.5 rows alike.
            assert!(
                same < 16,
                "replay {t}: {same} of {} rows as before",
                s.batch
            );
            assert_ne!(bits(&[&bs]), bits(&[prev_s]), "replay {t}: the same states");
        }
        last = Some((idx, bs));
    }
    Ok(())
}

/// Random transitions as the host would upload them.
struct HostData {
    s: Vec<f32>,
    s2: Vec<f32>,
    act: Vec<i32>,
    r: Vec<f32>,
    done: Vec<f32>,
    win: Vec<f32>,
    tau: Vec<f32>,
}

fn host_data(rng: &mut Rng, s: &Sizes) -> HostData {
    let b = s.batch;
    HostData {
        s: rng.vec_nonzero(b * s.state, -2.0, 2.0),
        s2: rng.vec_nonzero(b * s.state, -2.0, 2.0),
        act: (0..b * D)
            .map(|_| ((rng.next_f32() * s.actions as f32) as i32).min(s.actions as i32 - 1))
            .collect(),
        r: rng.vec_nonzero(b, -1.0, 1.0),
        done: (0..b)
            .map(|_| f32::from(u8::from(rng.next_f32() < 0.1)))
            .collect(),
        win: rng.vec_nonzero(b * s.window * s.state, -2.0, 2.0),
        tau: rng.vec(b * s.quantiles, 0.02, 0.98),
    }
}

fn host(b: &dqn::Buffers) -> &HostBatch {
    b.source.host().expect("a host-fed step")
}

/// Stages `x` as the host-fed step's next batch.
fn stage_host(step: &mut dqn::Step, x: &HostData) -> Result<()> {
    step.stage(|b| &host(b).s, &x.s)?;
    step.stage(|b| &host(b).s2, &x.s2)?;
    step.stage(|b| &host(b).act, &x.act)?;
    step.stage(|b| &host(b).r, &x.r)?;
    step.stage(|b| &host(b).done, &x.done)?;
    step.stage(|b| &host(b).win, &x.win)?;
    step.stage(|b| &host(b).tau, &x.tau)
}

/// The step with its attention head fused and unfused (`Config::attention_kernel`), from
/// the same parameters and host batch, one replay each: the attention head's gradients
/// and `L_attn` agree within what tests/gpu/attention.rs allows the fused kernel against
/// the unfused path (2e-3 of each tensor's largest magnitude; TF32 operands rounded
/// differently), `L_attn` within 1e-3 of itself (one tile of 64 lost would move it by
/// 1/64), and every other gradient is the same bits: no op but the update reads
/// what the head writes, and each of the other kernels is deterministic. A fused head
/// that wrote into another head's buffer, or a finish ordered before the kernel it adds
/// up, fails one or the other.
#[test]
fn gpu_the_fused_attention_head_trains_as_the_unfused_one() -> Result<()> {
    let device = device();
    let s = sizes();
    let x = host_data(&mut Rng::new(46), &s);
    let mut runs = Vec::new();
    for attention in [AttentionKernel::Fused, AttentionKernel::Unfused] {
        let mut step = build_with(
            &device,
            Feed::Host,
            1000,
            0.0,
            46,
            Schedule::Planned,
            Some(attention),
        )?;
        stage_host(&mut step, &x)?;
        train_step(&mut step, 1)?;
        let grads = step
            .buffers()
            .grads()
            .into_iter()
            .map(|(name, buf)| Ok((name, step.executor().download(buf)?)))
            .collect::<Result<Vec<(String, Vec<f32>)>>>()?;
        let losses = step.download(|b| &b.attn_losses)?;
        runs.push((grads, losses[LossSlot::Attn.index()]));
    }
    let ((fused, fused_loss), (unfused, unfused_loss)) = (&runs[0], &runs[1]);
    let (fused_loss, unfused_loss) = (*fused_loss, *unfused_loss);
    let mut attention_tensors = 0;
    for ((name, f), (_, u)) in fused.iter().zip(unfused) {
        if ["wemb", "bemb", "wqkv", "wo", "wp", "bp"].contains(&name.as_str()) {
            attention_tensors += 1;
            let scale = u.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let err = f
                .iter()
                .zip(u)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            eprintln!(
                "{name}: fused against unfused {:.2e} of {scale:.2e}",
                err / scale
            );
            assert!(
                scale > 0.0 && err <= 2e-3 * scale,
                "{name}: {err:e} of {scale:e}"
            );
        } else {
            assert!(bits(&[f]) == bits(&[u]), "{name}: not the same bits");
        }
    }
    assert_eq!(attention_tensors, 6);
    assert!(
        (fused_loss - unfused_loss).abs() <= 1e-3 * unfused_loss.abs() && unfused_loss > 0.0,
        "L_attn: fused {fused_loss}, unfused {unfused_loss}"
    );
    Ok(())
}

/// The host-fed step: each replay's batch and windows are the batch uploaded before it,
/// copied device to device; no rows are drawn.
#[test]
fn gpu_a_host_fed_step_trains_on_the_batch_uploaded_before_each_replay() -> Result<()> {
    let device = device();
    let s = sizes();
    let mut step = build(&device, Feed::Host, 1000, 0.0, 42)?;
    let mut rng = Rng::new(42);
    for t in 1..=2u32 {
        let x = host_data(&mut rng, &s);
        stage_host(&mut step, &x)?;
        train_step(&mut step, t)?;
        for (what, got, want) in [
            ("s", step.download(|b| &b.batch.s)?, &x.s),
            ("s2", step.download(|b| &b.batch.s2)?, &x.s2),
            ("r", step.download(|b| &b.batch.r)?, &x.r),
            ("done", step.download(|b| &b.batch.done)?, &x.done),
            ("tau", step.download(|b| &b.batch.tau)?, &x.tau),
            ("win", step.download(|b| &b.win)?, &x.win),
        ] {
            assert_eq!(bits(&[&got]), bits(&[want]), "replay {t}: {what}");
        }
        assert_eq!(step.download(|b| &b.batch.act)?, x.act, "replay {t}: act");
        let idx = step.download(|b| &b.sampler.idx)?;
        assert!(idx.iter().all(|&i| i == 0), "replay {t}: rows drawn");
        let losses = step.download(|b| &b.losses)?;
        assert!(losses[0].is_finite(), "replay {t}: loss {}", losses[0]);
    }
    Ok(())
}
/// `2K + 1` training steps with the target updated at every K-th: after every step the
/// target is what a model of the schedule gives from the downloaded parameters. A copy
/// is compared bit for bit; a Polyak update `fmaf(τ, θ, (1 − τ) θ⁻)` within 1e-6 (the
/// host computes the same f32 operations; one Polyak update moves the target by about
/// τ · 5e-3 here, far above the bound).
fn check_target_sync(polyak: f32) -> Result<()> {
    const K: u32 = 4;
    let device = device();
    let mut step = build(&device, Feed::Replay, K, polyak, 43)?;
    let initial = tensors(&step, target)?;
    let mut want = initial.clone();
    let mut before = tensors(&step, params)?;
    for t in 1..=2 * K + 1 {
        train_step(&mut step, t)?;
        let p = tensors(&step, params)?;
        let got = tensors(&step, target)?;
        assert_ne!(p, before, "step {t} moved no parameter");
        if t % K == 0 {
            for (w, p) in want.iter_mut().zip(&p) {
                for (w, &p) in w.iter_mut().zip(p) {
                    *w = if polyak == 0.0 {
                        p
                    } else {
                        polyak.mul_add(p, (1.0 - polyak) * *w)
                    };
                }
            }
        }
        let err = max_err(&got.concat(), &want.concat(), 1.0);
        eprintln!("polyak {polyak}, step {t}: target against the model {err:.3e}");
        if polyak == 0.0 {
            assert!(got == want, "step {t}: the target is not the model's");
        } else {
            assert!(
                err <= 1e-6,
                "step {t}: the target is {err:e} off the model's"
            );
        }
        // The cases the schedule turns on, stated once more on their own.
        if t == K - 1 {
            assert!(got == initial, "step {t}: the target changed before step K");
        }
        if t == K + 1 {
            let synced_at_k = max_err(&got.concat(), &want.concat(), 1.0);
            assert!(synced_at_k <= 1e-6, "step {t}: not the target of step K");
            assert!(
                max_err(&got.concat(), &p.concat(), 1.0) > 1e-5,
                "step {t}: the target followed the parameters after step K"
            );
        }
        before = p;
    }
    Ok(())
}

#[test]
fn gpu_the_target_is_copied_from_the_parameters_exactly_every_k_replays() -> Result<()> {
    check_target_sync(0.0)
}

#[test]
fn gpu_the_target_gets_a_polyak_update_exactly_every_k_replays() -> Result<()> {
    check_target_sync(0.25)
}

/// The captured graph of each variant (sampled or host-fed; the target copied or
/// Polyak-updated in its conditional node) against the plan.
#[test]
fn gpu_the_dqn_graph_with_its_conditional_target_update_verifies() -> Result<()> {
    let device = device();
    for (feed, polyak) in [(Feed::Replay, 0.0), (Feed::Replay, 0.5), (Feed::Host, 0.0)] {
        let mut step = build(&device, feed, 3, polyak, 44)?;
        let report = step.verify()?;
        eprintln!("{feed:?}, polyak {polyak}: {report}");
    }
    Ok(())
}

/// Every parameter and Adam moment, host side.
fn optimizer_state(step: &dqn::Step) -> Result<Vec<Vec<f32>>> {
    step.buffers()
        .state()
        .into_iter()
        .flat_map(|(_, named)| named)
        .map(|(_, buf)| step.executor().download(buf))
        .collect()
}

/// The watch inside the graph: a host-fed step whose third batch holds a NaN in one past
/// state. Replays run without a wait; the watch read back afterwards (a few replays
/// late) names replay 3, its non-finite attention loss and the gradients the NaN reached,
/// and the parameters and moments are still those after replay 2, bit for bit, though
/// three more replays ran after it. Before replay 3 the read-backs say all is finite.
#[test]
fn gpu_the_watch_latches_the_first_bad_replay_and_applies_none_after_it() -> Result<()> {
    let device = device();
    let s = sizes();
    let mut step = build(&device, Feed::Host, 1000, 0.0, 44)?;
    let mut rng = Rng::new(44);
    let tensors = step.buffers().grads().len();
    let mut after_two = None;
    for t in 1..=6u32 {
        let mut x = host_data(&mut rng, &s);
        if t == 3 {
            x.win[0] = f32::NAN;
            // The one wait: the state the bad replay must leave as it is.
            step.wait()?;
            after_two = Some(optimizer_state(&step)?);
            let w = Watch::parse(&step.read_back_latest(|b| &b.health.watch_out)?, tensors)?;
            assert_eq!((w.replays, w.bad.clone()), (2, None), "after replay 2");
            assert!(w.losses.iter().all(|l| l.is_finite()), "{:?}", w.losses);
        }
        stage_host(&mut step, &x)?;
        set_step_count(&mut step, t)?;
        step.replay()?;
    }
    let w = Watch::parse(&step.read_back_latest(|b| &b.health.watch_out)?, tensors)?;
    assert_eq!(w.replays, 6);
    let bad = w.bad.expect("replay 3 latched");
    assert_eq!(bad.replay, 3);
    assert!(
        bad.losses[4].is_nan(),
        "L_attn of replay 3: {:?}",
        bad.losses
    );
    assert!(!bad.sq_norm.is_finite());
    // The NaN entered through the attention head's window: its gradients are named, and
    // the counts add up to no more than each tensor's length.
    let names = step.buffers().grads();
    let reached: Vec<&str> = names
        .iter()
        .zip(&bad.non_finite)
        .filter(|(_, (nan, inf))| nan + inf > 0)
        .map(|((name, _), _)| name.as_str())
        .collect();
    assert!(!reached.is_empty(), "no gradient named");
    for ((name, buf), (nan, inf)) in names.iter().zip(&bad.non_finite) {
        assert!((nan + inf) as usize <= buf.len(), "{name}: {nan} + {inf}");
    }
    assert!(
        optimizer_state(&step)? == after_two.expect("taken before replay 3"),
        "the parameters and moments after replay 6 are those after replay 2; named: {reached:?}"
    );
    Ok(())
}

/// The work bound of the whole step, both feeds and both schedules, after eager runs and
/// a profile as the benchmark does them: every kernel timed alone.
#[test]
fn gpu_the_work_bound_times_every_kernel_of_the_step() -> Result<()> {
    let device = device();
    for schedule in [Schedule::Planned, Schedule::OneStream] {
        for feed in [Feed::Replay, Feed::Host] {
            eprintln!("work bound: {schedule:?} {feed:?}");
            let mut step = build_with(&device, feed, 4, 0.0, 45, schedule, None)?;
            set_step_count(&mut step, 1)?;
            step.replay()?;
            for _ in 0..5 {
                step.run_eager()?;
            }
            step.wait()?;
            let profile = step.profile(3)?;
            assert_eq!(profile.ops.len(), dqn::PLAN.ops.len());
            let work = step.work_bound()?;
            assert!(work.bound_ms() > 0.0, "{schedule:?} {feed:?}: {work}");
            let adam = work
                .ops
                .iter()
                .find(|o| o.name == "clip_and_adam")
                .expect("clip_and_adam");
            assert!(
                adam.kernels.iter().any(|k| k.name == "watch_step"),
                "{schedule:?} {feed:?}: {work}"
            );
        }
    }
    Ok(())
}
