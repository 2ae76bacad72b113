//! Data parallel (`--gpus N`): one thread per GPU, each training on its slice of every
//! batch, the gradients averaged over the ranks by NCCL all-reduces captured in the step
//! (the `reduce_*` ops on the `comm` stream, each right after the backward that writes
//! its bucket).
//!
//! It runs three things:
//! 1. the check: three steps on N ranks against three steps of one GPU on the whole batch,
//!    every gradient and updated parameter compared (the bounds of reference.py: the two
//!    differ only in how the batch's sums are split and rounded);
//! 2. the timing: median step time of the N ranks, against one GPU on the whole batch;
//! 3. the overlap: how much of rank 0's all-reduce time ran while other streams still
//!    computed, from a profiled replay.

use std::sync::{Condvar, Mutex};

use stepgraph::stats::median;
use stepgraph::{CommId, Communicator, Device, Profile, Result, Schedule};

use super::{
    Options, Source, Transitions, build, build_rank, check_finite, initialise, losses,
    set_step_count,
};
use stepgraph_dqn::model::dqn;
use stepgraph_testkit::{Rng, rel_err};

/// Relative-error bounds of the check, as in reference.py.
const GRAD_BOUND: f64 = 1e-2;
const PARAM_BOUND: f64 = 1e-3;
const LOSS_BOUND: f64 = 1e-3;
/// Steps of the check.
const CHECK_STEPS: u32 = 3;
/// Replays before the timed ones, on the ranks and on the one-GPU reference alike.
const TIMING_WARMUP: usize = 30;

/// Rows `[rank · B/N, (rank + 1) · B/N)` of every tensor of a whole-batch `t`.
fn slice(t: &Transitions, rank: usize, ranks: usize, batch: usize) -> Transitions {
    fn rows<T: Clone>(v: &[T], rank: usize, ranks: usize, batch: usize) -> Vec<T> {
        let per_sample = v.len() / batch;
        let n = batch / ranks * per_sample;
        v[rank * n..(rank + 1) * n].to_vec()
    }
    Transitions {
        s: rows(&t.s, rank, ranks, batch),
        s2: rows(&t.s2, rank, ranks, batch),
        act: rows(&t.act, rank, ranks, batch),
        r: rows(&t.r, rank, ranks, batch),
        done: rows(&t.done, rank, ranks, batch),
        win: rows(&t.win, rank, ranks, batch),
        tau: rows(&t.tau, rank, ranks, batch),
    }
}

/// The check's steps 1..=[`CHECK_STEPS`], step t on batch t of `batches` (cycling), each
/// checked for a non-finite loss or gradient norm ([`check_finite`]). Every step runs
/// even after a bad one, so that every rank issues the same collectives; the first bad
/// step's report is returned at the end.
fn check_steps(step: &mut dqn::Step, batches: &[Transitions]) -> Result<()> {
    let mut first_bad = None;
    for t in 1..=CHECK_STEPS {
        batches[t as usize % batches.len()].stage(step)?;
        set_step_count(step, t)?;
        step.replay()?;
        step.wait()?;
        if first_bad.is_none() {
            first_bad = check_finite(step).err();
        }
    }
    first_bad.map_or(Ok(()), Err)
}

/// Every gradient, then every parameter, with its name, after the last replay.
fn snapshot(step: &dqn::Step) -> Result<Vec<(String, Vec<f32>)>> {
    let b = step.buffers();
    let mut out = Vec::new();
    for (name, buf) in b.grads() {
        out.push((format!("grad {name}"), step.executor().download(buf)?));
    }
    for (name, buf) in b.params.named() {
        out.push((format!("param {name}"), step.executor().download(buf)?));
    }
    Ok(out)
}

/// What one rank reports back.
struct RankResult {
    /// Gradients and parameters after the check's last step (rank 0 only).
    snapshot: Option<Vec<(String, Vec<f32>)>>,
    /// The check's last losses, this rank's mean over its slice.
    losses: [f32; 7],
    /// Step times of the timed run, ms.
    times: Vec<f64>,
    /// A profiled replay (rank 0 only).
    profile: Option<Profile>,
}

/// Where the ranks meet before a call that waits for all of them: NCCL's init waits for
/// every rank to join, and the first replay's all-reduce for every rank's. A rank whose
/// setup failed must not leave the others waiting there forever: each rank reports in,
/// and all go on only if all are ready; a failure releases every rank at once.
pub struct Rendezvous {
    ranks: usize,
    /// Ranks arrived ready, and whether one arrived failed.
    state: Mutex<(usize, bool)>,
    changed: Condvar,
}

impl Rendezvous {
    pub fn new(ranks: usize) -> Rendezvous {
        Rendezvous {
            ranks,
            state: Mutex::new((0, false)),
            changed: Condvar::new(),
        }
    }

    /// Reports this rank ready (`ok`) or failed; returns whether every rank is ready.
    pub fn arrive(&self, ok: bool) -> bool {
        let Ok(mut st) = self.state.lock() else {
            return false;
        };
        if ok {
            st.0 += 1;
        } else {
            st.1 = true;
        }
        self.changed.notify_all();
        loop {
            if st.1 {
                return false;
            }
            if st.0 == self.ranks {
                return true;
            }
            st = match self.changed.wait(st) {
                Ok(st) => st,
                Err(_) => return false,
            };
        }
    }
}

/// This rank's own error, or that another one failed at the meeting point `what`.
fn meet<T>(point: &Rendezvous, mine: Result<T>, what: &str) -> Result<T> {
    let all_ready = point.arrive(mine.is_ok());
    match mine {
        Err(e) => Err(e),
        Ok(_) if !all_ready => Err(stepgraph::Error::Invalid(format!(
            "another rank failed before {what}; this one stops too"
        ))),
        ok => ok,
    }
}

/// One rank: join the communicator, run the check's steps, then the timed steps.
fn rank_main(
    o: &Options,
    rank: usize,
    ranks: usize,
    id: CommId,
    pool: &[Transitions],
    steps: usize,
    points: &[Rendezvous; 4],
) -> Result<RankResult> {
    let device = meet(&points[0], Device::new(rank), "joining NCCL")?;
    let mut s = o.sizes;
    s.batch /= ranks;
    let built = Communicator::join(&device, id, rank, ranks)
        .and_then(|comm| build_rank(&device, o, &s, Schedule::Planned, Source::Host, comm));
    let mut step = meet(&points[1], built, "the first all-reduce")?;
    // Where each rank is, on stderr: a rank that waits on a collective shows how far it got.
    eprintln!("rank {rank}: joined NCCL and captured the step");
    // Verification captures the step again, and with NCCL a capture is collective: NCCL
    // registers the buckets with the peer ranks as it captures an all-reduce, so a rank
    // that captured alone would wait for the others forever. Every rank verifies, and the
    // ranks meet before the first replay: a rank whose verification or upload failed
    // releases the others instead of leaving them in an all-reduce it will never join.
    let ready = step.verify().and_then(|report| {
        initialise(&mut Rng::new(o.seed), &s, &mut step)?;
        Ok(report)
    });
    let report = meet(&points[2], ready, "the first replay")?;
    eprintln!("rank {rank}: verified");
    if rank == 0 {
        println!("{report}");
        println!("rank 0 graph: {:?}", step.executor().node_counts()?);
    }
    let slices: Vec<Transitions> = pool
        .iter()
        .map(|t| slice(t, rank, ranks, o.sizes.batch))
        .collect();
    // A rank whose check found a non-finite step must not leave the others in the timed
    // replays' all-reduces: all stop together.
    let checked = check_steps(&mut step, &slices);
    meet(&points[3], checked, "the timed replays")?;
    eprintln!("rank {rank}: ran the check's {CHECK_STEPS} steps");
    let snap = if rank == 0 {
        Some(snapshot(&step)?)
    } else {
        None
    };
    let check_losses = losses(&step)?;
    // Timed like the one-GPU reference: CUDA events around back-to-back replays, after
    // the same warm-up. Every rank replays the same number of times, so their collectives
    // match.
    let times = step.executor().time_replays(TIMING_WARMUP, steps)?;
    // Every rank profiles (the collectives must match across ranks); rank 0 reports.
    let profile = step.profile(20)?;
    Ok(RankResult {
        snapshot: snap,
        losses: check_losses,
        times,
        profile: (rank == 0).then_some(profile),
    })
}

/// `--gpus N`.
pub fn run(device: &Device, o: &Options, ranks: usize) -> Result<()> {
    let s = &o.sizes;
    let count = Device::count()?;
    if ranks == 0 || ranks > count {
        return Err(stepgraph::Error::Invalid(format!(
            "--gpus {ranks}: expected 1 to {count} (the GPUs this machine has)"
        )));
    }
    if !s.batch.is_multiple_of(ranks) {
        return Err(stepgraph::Error::Invalid(format!(
            "--gpus {ranks}: the batch {} must split evenly over the GPUs",
            s.batch
        )));
    }
    println!(
        "data parallel: {ranks} GPU(s), {} samples each; NCCL {}",
        s.batch / ranks,
        Communicator::nccl_version()?
    );
    let mut rng = Rng::new(o.seed ^ 0xDA7A);
    let pool: Vec<Transitions> = (0..4).map(|_| Transitions::generate(&mut rng, s)).collect();
    let steps = o.steps.unwrap_or(200).max(1);
    let id = CommId::new()?;
    let results: Mutex<Vec<(usize, Result<RankResult>)>> = Mutex::new(Vec::new());
    let points = [
        Rendezvous::new(ranks),
        Rendezvous::new(ranks),
        Rendezvous::new(ranks),
        Rendezvous::new(ranks),
    ];
    std::thread::scope(|scope| {
        for rank in 0..ranks {
            let (pool, results, points) = (&pool, &results, &points);
            scope.spawn(move || {
                let r = rank_main(o, rank, ranks, id, pool, steps, points);
                if let Ok(mut all) = results.lock() {
                    all.push((rank, r));
                }
            });
        }
    });
    let mut results = results
        .into_inner()
        .map_err(|_| stepgraph::Error::Invalid("a rank's thread panicked".into()))?;
    results.sort_by_key(|(r, _)| *r);
    let mut ok = Vec::new();
    for (rank, r) in results {
        ok.push(r.map_err(|e| stepgraph::Error::Invalid(format!("rank {rank}: {}", e.chain())))?);
    }
    if ok.len() != ranks {
        return Err(stepgraph::Error::Invalid(format!(
            "{} of {ranks} ranks reported back",
            ok.len()
        )));
    }

    // One GPU, the whole batch, no NCCL: the reference of the check and of the speed-up.
    let mut whole = build(device, o, s, Schedule::Planned, Source::Host)?;
    initialise(&mut Rng::new(o.seed), s, &mut whole)?;
    check_steps(&mut whole, &pool)?;
    let want = snapshot(&whole)?;
    let want_losses = losses(&whole)?;
    let got = ok[0].snapshot.as_ref().ok_or_else(|| {
        stepgraph::Error::Invalid("rank 0 returned no gradients and parameters".into())
    })?;
    let (mut passed, mut failed) = (0, 0);
    let mut worst = (0.0f64, "none: all equal".to_string());
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        let e = rel_err(g, w);
        let bound = if name.starts_with("grad") {
            GRAD_BOUND
        } else {
            PARAM_BOUND
        };
        if e.is_finite() && e <= bound {
            passed += 1;
        } else {
            failed += 1;
            println!("  FAIL {name}: relative error {e:.3e} > {bound:.0e}");
        }
        if e > worst.0 {
            worst = (e, name.clone());
        }
    }
    // The ranks' losses are means over their slices: their mean is the whole batch's.
    for (i, want) in want_losses.iter().enumerate() {
        let mean = ok.iter().map(|r| f64::from(r.losses[i])).sum::<f64>() / ranks as f64;
        let w = f64::from(*want);
        let e = (mean - w).abs() / w.abs().max(1e-12);
        if e <= LOSS_BOUND {
            passed += 1;
        } else {
            failed += 1;
            println!("  FAIL loss[{i}]: {mean} against {w} (relative {e:.3e})");
        }
    }
    println!(
        "data-parallel check, {CHECK_STEPS} steps on {ranks} GPU(s) against one GPU on the whole batch: \
         {passed} passed, {failed} failed; largest relative error {:.3e} ({})",
        worst.0, worst.1
    );

    let whole_ms = median(&mut whole.executor().time_replays(TIMING_WARMUP, steps)?);
    let rank_ms = ok
        .iter()
        .map(|r| median(&mut r.times.clone()))
        .fold(0.0f64, f64::max);
    let b = s.batch as f64;
    println!(
        "step time: {rank_ms:.3} ms on {ranks} GPU(s) (slowest rank's median), {whole_ms:.3} ms on one GPU; \
         throughput {:.0} against {:.0} samples/s: {:.2}x",
        b / rank_ms * 1e3,
        b / whole_ms * 1e3,
        whole_ms / rank_ms
    );
    if let Some(p) = &ok[0].profile {
        let busy: f64 = p
            .ops
            .iter()
            .filter(|op| op.func.starts_with("reduce_"))
            .map(|op| op.duration_ms())
            .sum();
        match p.hidden_fraction("comm") {
            Some(f) => println!(
                "all-reduce on rank 0: {busy:.3} ms in the profiled step, {:.0}% of it hidden behind other streams' work",
                100.0 * f
            ),
            None => println!("all-reduce on rank 0: no time on the comm stream"),
        }
    }
    if failed > 0 {
        return Err(stepgraph::Error::Invalid(format!(
            "the data-parallel step differs from one GPU: {failed} comparisons out of bound"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepgraph_dqn::layers::Sizes;

    #[test]
    fn a_rendezvous_releases_everyone_when_all_are_ready_or_one_failed() {
        let all = Rendezvous::new(3);
        let ready: Vec<bool> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3).map(|_| s.spawn(|| all.arrive(true))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(ready, [true, true, true]);
        // One rank fails while two wait: nobody is left waiting, nobody goes on.
        let one_failed = Rendezvous::new(3);
        let ready: Vec<bool> = std::thread::scope(|s| {
            let waiting: Vec<_> = (0..2)
                .map(|_| s.spawn(|| one_failed.arrive(true)))
                .collect();
            let failed = s.spawn(|| one_failed.arrive(false));
            let mut r: Vec<bool> = waiting.into_iter().map(|h| h.join().unwrap()).collect();
            r.push(failed.join().unwrap());
            r
        });
        assert_eq!(ready, [false, false, false]);
        let err = meet(&one_failed, Ok(()), "the first all-reduce").unwrap_err();
        assert!(
            err.to_string()
                .contains("another rank failed before the first all-reduce")
        );
    }

    #[test]
    fn slices_split_every_tensor_by_rows() {
        let s = Sizes {
            batch: 4,
            ..Sizes::default()
        };
        let t = Transitions::generate(&mut Rng::new(3), &s);
        let parts: Vec<Transitions> = (0..2).map(|r| slice(&t, r, 2, 4)).collect();
        assert_eq!(parts[0].s.len(), 2 * s.state);
        assert_eq!([parts[0].r.clone(), parts[1].r.clone()].concat(), t.r);
        assert_eq!([parts[0].win.clone(), parts[1].win.clone()].concat(), t.win);
        assert_eq!([parts[0].act.clone(), parts[1].act.clone()].concat(), t.act);
    }
}
