//! The migration's figures: the before's one-stream graph against the after's step, timed
//! the same way (CUDA events around each replay, after warm-up), round by round.

use std::fmt;

use cudarc::driver::sys::CUevent_flags;

use crate::after::step;
use crate::before::Trainer;
use crate::error::{Error, Result};

/// Device time of `iters` replays of the before's captured step, in milliseconds each,
/// after `warmup` unmeasured ones: events recorded around each replay on its stream.
pub fn before_replays(t: &Trainer, warmup: usize, iters: usize) -> Result<Vec<f64>> {
    for _ in 0..warmup {
        t.replay()?;
    }
    t.sync()?;
    let ctx = t.stream().context();
    let event = || {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(Error::driver("cuEventCreate"))
    };
    let starts = (0..iters).map(|_| event()).collect::<Result<Vec<_>>>()?;
    let ends = (0..iters).map(|_| event()).collect::<Result<Vec<_>>>()?;
    for (s, e) in starts.iter().zip(&ends) {
        s.record(t.stream())
            .map_err(Error::driver("cuEventRecord"))?;
        t.replay()?;
        e.record(t.stream())
            .map_err(Error::driver("cuEventRecord"))?;
    }
    t.sync()?;
    starts
        .iter()
        .zip(&ends)
        .map(|(s, e)| {
            s.elapsed_ms(e)
                .map(f64::from)
                .map_err(Error::driver("cuEventElapsedTime"))
        })
        .collect()
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Round by round: the median replay time of each, and their ratio.
#[derive(Clone, Debug)]
pub struct Figures {
    /// Per round: (before, after) median replay time in ms.
    pub rounds: Vec<(f64, f64)>,
    /// Replays timed per round and side.
    pub iters: usize,
}

impl Figures {
    /// The median over rounds of before ÷ after.
    pub fn speedup(&self) -> f64 {
        median(self.rounds.iter().map(|(b, a)| b / a).collect())
    }

    /// The median over rounds of each side's median, in ms.
    pub fn medians(&self) -> (f64, f64) {
        (
            median(self.rounds.iter().map(|r| r.0).collect()),
            median(self.rounds.iter().map(|r| r.1).collect()),
        )
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, a) = self.medians();
        writeln!(
            f,
            "migration: before (one-stream cudarc graph) {b:.4} ms, after (stepgraph step) {a:.4} ms, speedup {:.3}x (median of {} rounds of {} replays each)",
            self.speedup(),
            self.rounds.len(),
            self.iters
        )?;
        for (i, (b, a)) in self.rounds.iter().enumerate() {
            writeln!(
                f,
                "  round {i}: before {b:.4} ms, after {a:.4} ms, ratio {:.3}",
                b / a
            )?;
        }
        Ok(())
    }
}

/// Times both, alternating, `rounds` times: the before's graph, then the step.
pub fn compare(
    before: &Trainer,
    after: &mut step::Step,
    warmup: usize,
    iters: usize,
    rounds: usize,
) -> stepgraph::Result<Figures> {
    let mut out = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let b = before_replays(before, warmup, iters).map_err(stepgraph::Error::external)?;
        let a = after.time_replays(warmup, iters)?;
        out.push((median(b), median(a)));
    }
    Ok(Figures { rounds: out, iters })
}
