//! The migration's benchmark: the original trainer's one-stream graph against the same
//! functions as a stepgraph step, the heads side by side, and as a stepgraph step on one
//! stream (what stepgraph itself adds to the original). Every side is checked to give the
//! original's bits first, then timed with CUDA events around each replay, after warm-up,
//! in alternating rounds; the figures are medians.
//!
//! `migrate [--rounds N] [--iters N] [--warmup N]`

use std::process::ExitCode;

use cudarc::driver::CudaContext;
use stepgraph_migrate::bench::{before_replays, median};
use stepgraph_migrate::{After, Dims, Trainer};

struct Args {
    rounds: usize,
    iters: usize,
    warmup: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        rounds: 5,
        iters: 500,
        warmup: 50,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag}: expected a number after it"))?;
        let n: usize = value
            .parse()
            .map_err(|_| format!("{flag}: expected a number, found `{value}`"))?;
        match flag.as_str() {
            "--rounds" => a.rounds = n.max(1),
            "--iters" => a.iters = n.max(1),
            "--warmup" => a.warmup = n,
            other => {
                return Err(format!(
                    "unknown argument `{other}`: expected --rounds, --iters or --warmup"
                ));
            }
        }
    }
    Ok(a)
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
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("migrate: {e}");
            return ExitCode::from(2);
        }
    };
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
