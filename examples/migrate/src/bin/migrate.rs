//! The migration's benchmark: the original trainer's one-stream graph against the same
//! functions as a stepgraph step, the heads side by side, and as a stepgraph step on one
//! stream (what stepgraph itself adds to the original). Every side is checked to give the
//! original's bits first, then timed with CUDA events around each replay, after warm-up,
//! in alternating rounds; the figures are medians.
//!
//! `migrate [--rounds N] [--iters N] [--warmup N]`

use std::process::ExitCode;

use clap::Parser;
use cudarc::driver::CudaContext;
use stepgraph_migrate::bench::{before_replays, median};
use stepgraph_migrate::{After, Dims, Trainer};

/// The migration's benchmark: the original one-stream graph against the migrated step,
/// on its planned streams and on one stream, checked for the original's bits first, then
/// timed in alternating rounds (medians).
#[derive(Debug, Parser)]
#[command(name = "migrate")]
struct Args {
    /// Rounds of the three sides in turn.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = positive)]
    rounds: usize,
    /// Timed replays per side and round.
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = positive)]
    iters: usize,
    /// Untimed replays before each side's timed ones.
    #[arg(long, value_name = "N", default_value_t = 50)]
    warmup: usize,
}

/// A count that must be at least 1.
fn positive(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("expected at least 1, found 0".into()),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("expected a whole number, found `{value}`")),
    }
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(0)?;
    let dims = Dims::default();
    let seed = 17;
    let mut before = Trainer::new(ctx.clone(), dims, seed)?;
    before.capture()?;
    let mut after = After::new(ctx.clone(), dims, seed)?;
    let mut one = After::one_stream(ctx.clone(), dims, seed)?;
    // Same bits from one step of each, before anything is timed.
    before.replay()?;
    after.step.replay()?;
    one.step.replay()?;
    before.sync()?;
    let want = before.stream().clone_dtoh(&before.state().attn_acts.pred)?;
    for (name, s) in [("after", &after), ("one-stream after", &one)] {
        let got = s.device.download(&s.step.buffers().attn_acts.pred)?;
        if got
            .iter()
            .map(|x| x.to_bits())
            .ne(want.iter().map(|x| x.to_bits()))
        {
            return Err(format!("the {name} step's outputs differ from the original's").into());
        }
    }
    println!(
        "migration benchmark on {}: {:?}, {} rounds of {} replays after {} warm-up",
        after.device.name(),
        dims,
        a.rounds,
        a.iters,
        a.warmup
    );
    let mut ratios = Vec::new();
    let mut overhead = Vec::new();
    for r in 0..a.rounds {
        let b = median(before_replays(&before, a.warmup, a.iters)?);
        let s = median(after.step.time_replays(a.warmup, a.iters)?);
        let o = median(one.step.time_replays(a.warmup, a.iters)?);
        println!(
            "  round {r}: before {b:.4} ms  after {s:.4} ms  after on one stream {o:.4} ms  before/after {:.3}",
            b / s
        );
        ratios.push(b / s);
        overhead.push(o / b);
    }
    println!(
        "speedup (before / after, median of rounds): {:.3}x; one-stream step / before: {:.3}",
        median(ratios),
        median(overhead)
    );
    Ok(())
}

fn main() -> ExitCode {
    // --help and malformed options exit here, as clap does (status 2 on error).
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("migrate: {msg}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(line: &str) -> Result<Args, String> {
        Args::try_parse_from(std::iter::once("migrate").chain(line.split_whitespace()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn options_keep_their_defaults_and_refuse_what_cannot_run() {
        Args::command().debug_assert();
        let a = parse("").unwrap();
        assert_eq!((a.rounds, a.iters, a.warmup), (5, 500, 50));
        let a = parse("--rounds 2 --iters 10 --warmup 0").unwrap();
        assert_eq!((a.rounds, a.iters, a.warmup), (2, 10, 0));
        let e = parse("--rounds 0").unwrap_err();
        assert!(e.contains("expected at least 1, found 0"), "{e}");
        let e = parse("--iters x").unwrap_err();
        assert!(e.contains("found `x`"), "{e}");
        let e = parse("--speed 3").unwrap_err();
        assert!(e.contains("unexpected argument '--speed'"), "{e}");
    }
}
