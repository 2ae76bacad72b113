//! One soft actor-critic update with twin critics as a stepgraph step (MODEL.md has the
//! exact math): builds and captures the step, replays it and prints the losses.
//!
//! ```text
//! cargo run --release -p stepgraph-sac -- [--steps N] [--batch B] [--obs S] [--action A]
//!                                         [--hidden H] [--seed N] [--one-stream]
//!                                         [--critic-sms whole|share|1/N|N]
//! cargo run --release -p stepgraph-sac -- --check DIR [--steps 3] [sizes] [--one-stream]
//! cargo run --release -p stepgraph-sac -- --bench DIR [--replays N] [sizes]
//! cargo run --release -p stepgraph-sac -- --print-plan dot|svg
//! ```
//! With no GPU it prints the plan and says what the run needs. `--check DIR` writes the
//! seeded state and each step's inputs and outputs for `reference.py check DIR`;
//! `--bench DIR` times eager, the one-stream graph and the planned graph against the
//! critical-path and work bounds (`bench.rs`) and writes its records into DIR.
//! `--critic-sms` plans the critics' matmuls for the whole GPU (the default), for their
//! share of it beside the other critics, for 1/N of it, or for N SMs (stepgraph's
//! `SmTarget`).

mod bench;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use stepgraph::{Device, Result, Schedule, SmTarget};

use stepgraph_sac::host::{Trainer, losses_line};
use stepgraph_sac::kernels::Kernels;
use stepgraph_sac::layers::Sizes;
use stepgraph_sac::model::{CRITICS, sac};

/// Command-line options.
#[derive(Debug)]
struct Options {
    sizes: Sizes,
    /// Steps to train, or to check with `--check` (100 and 3 when not given).
    steps: Option<usize>,
    seed: u64,
    one_stream: bool,
    /// `--check DIR`: write the check's tensors there instead of training.
    check: Option<PathBuf>,
    /// `--bench DIR`: time the variants and bounds instead of training.
    bench: Option<PathBuf>,
    /// Replays per timing.
    replays: usize,
    /// Transitions in the replay buffer.
    replay: usize,
    /// What the critics' matmuls are planned for.
    critic_sms: SmTarget,
}

impl Options {
    fn schedule(&self) -> Schedule {
        if self.one_stream {
            Schedule::OneStream
        } else {
            Schedule::Planned
        }
    }

    /// The step's config: the sizes and the critics' SM target given.
    fn config(&self) -> sac::Config {
        sac::Config {
            critic_sms: self.critic_sms,
            ..stepgraph_sac::host::config(self.sizes)
        }
    }
}

/// `--critic-sms`: `share` (the GPU over the critics), or an `SmTarget` as it writes
/// itself (`whole`, `1/N`, a count of SMs).
fn critic_sms(value: &str) -> std::result::Result<SmTarget, String> {
    match value {
        "share" => Ok(SmTarget::Share(CRITICS as u32)),
        v => v.parse().map_err(|e| format!("--critic-sms: {e}")),
    }
}

const USAGE: &str = "usage: sac [--steps N] [--batch B] [--obs S] [--action A] [--hidden H] \
                     [--seed N] [--replay N] [--one-stream] [--critic-sms whole|share|1/N|N] \
                     [--check DIR] [--bench DIR [--replays N]] \
                     | --print-plan dot|svg";

fn parse_options(mut args: impl Iterator<Item = String>) -> std::result::Result<Options, String> {
    let mut o = Options {
        sizes: Sizes::default(),
        steps: None,
        seed: 42,
        one_stream: false,
        check: None,
        bench: None,
        replays: 200,
        replay: stepgraph_sac::host::DEFAULT_REPLAY,
        critic_sms: SmTarget::Whole,
    };
    while let Some(flag) = args.next() {
        if flag == "--one-stream" {
            o.one_stream = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.into());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |name: &str| -> std::result::Result<usize, String> {
            match value.parse::<usize>() {
                Ok(0) => Err(format!("{name} must be at least 1, found 0")),
                Ok(v) => Ok(v),
                Err(_) => Err(format!("{name} takes a positive integer, found `{value}`")),
            }
        };
        match flag.as_str() {
            "--steps" => o.steps = Some(number("--steps")?),
            "--check" => o.check = Some(PathBuf::from(&value)),
            "--batch" => o.sizes.batch = number("--batch")?,
            "--obs" => o.sizes.obs = number("--obs")?,
            "--action" => o.sizes.action = number("--action")?,
            "--hidden" => o.sizes.hidden = number("--hidden")?,
            "--replays" => o.replays = number("--replays")?,
            "--replay" => o.replay = number("--replay")?,
            "--bench" => o.bench = Some(PathBuf::from(&value)),
            "--critic-sms" => o.critic_sms = critic_sms(&value)?,
            "--seed" => {
                o.seed = value
                    .parse()
                    .map_err(|_| format!("--seed takes an unsigned integer, found `{value}`"))?
            }
            _ => return Err(format!("unknown flag `{flag}`\n{USAGE}")),
        }
    }
    if o.check.is_some() && o.bench.is_some() {
        return Err(format!(
            "--check and --bench are two runs: give one\n{USAGE}"
        ));
    }
    o.sizes.check().map_err(|e| e.to_string())?;
    Ok(o)
}

fn main() -> ExitCode {
    if let Some(code) = stepgraph_picture::print_plan_if_asked(&sac::PLAN) {
        return code;
    }
    let options = match parse_options(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sac: {e}");
            return ExitCode::from(2);
        }
    };
    println!("{}", sac::PLAN);
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!(
                "the update needs a CUDA GPU with compute capability 9.0 and the CUDA 13 \
                 libraries: {}",
                e.chain()
            );
            // Training without a GPU is a plan print; a check without one wrote nothing.
            return if options.check.is_some() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // parse_options refuses --check with --bench.
    let run = match (&options.check, &options.bench) {
        (Some(dir), _) => Kernels::load(&device).and_then(|k| {
            stepgraph_sac::check::run(
                &device,
                Arc::new(k),
                options.config(),
                options.seed,
                options.schedule(),
                options.steps.unwrap_or(3),
                dir,
            )
        }),
        (None, Some(dir)) => Kernels::load(&device).and_then(|k| {
            bench::run(
                &device,
                &Arc::new(k),
                options.config(),
                options.replay,
                options.seed,
                options.replays,
                dir,
            )
        }),
        (None, None) => train(&device, &options),
    };
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sac failed: {}", e.chain());
            ExitCode::FAILURE
        }
    }
}

fn train(device: &Device, o: &Options) -> Result<()> {
    let kernels = Arc::new(Kernels::load(device)?);
    let mut trainer =
        Trainer::with_config(device, kernels, o.config(), o.replay, o.seed, o.schedule())?;
    let steps = o.steps.unwrap_or(100);
    for i in 0..steps {
        trainer.update()?;
        if i == 0 || i + 1 == steps {
            println!("step {:>5}: {}", i + 1, losses_line(&trainer.losses()?));
        }
    }
    let mut times = trainer.step.time_replays(5, 20)?;
    println!(
        "replay: median {:.3} ms over {} replays",
        stepgraph::stats::median(&mut times),
        times.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> std::result::Result<Options, String> {
        parse_options(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn the_flags_set_the_sizes_and_bad_ones_say_why() {
        let o = parse(&["--batch", "512", "--hidden", "64", "--one-stream"]).unwrap();
        assert_eq!(
            (o.sizes.batch, o.sizes.hidden, o.one_stream),
            (512, 64, true)
        );
        assert_eq!(o.sizes.action, 8);
        assert_eq!((o.steps, o.check.as_ref()), (None, None));
        let o = parse(&["--check", "/tmp/d", "--steps", "2"]).unwrap();
        assert_eq!(o.check, Some(PathBuf::from("/tmp/d")));
        assert_eq!(o.steps, Some(2));
        assert!(parse(&["--check"]).unwrap_err().contains("needs a value"));
        let o = parse(&["--bench", "/tmp/b", "--replays", "50", "--replay", "1000"]).unwrap();
        assert_eq!(
            (o.bench, o.replays, o.replay),
            (Some(PathBuf::from("/tmp/b")), 50, 1000)
        );
        assert!(
            parse(&["--bench", "/tmp/b", "--check", "/tmp/d"])
                .unwrap_err()
                .contains("two runs")
        );
        assert!(
            parse(&["--replay", "0"])
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(parse(&["--batch", "0"]).unwrap_err().contains("at least 1"));
        assert!(parse(&["--obs", "x"]).unwrap_err().contains("`x`"));
        assert!(parse(&["--steps"]).unwrap_err().contains("needs a value"));
        assert_eq!(parse(&[]).unwrap().critic_sms, SmTarget::Whole);
        assert_eq!(
            parse(&["--critic-sms", "share"]).unwrap().critic_sms,
            SmTarget::Share(CRITICS as u32)
        );
        assert_eq!(
            parse(&["--critic-sms", "40"]).unwrap().config().critic_sms,
            SmTarget::Count(40)
        );
        assert_eq!(
            parse(&["--critic-sms", "1/3"]).unwrap().critic_sms,
            SmTarget::Share(3)
        );
        for bad in ["0", "half", "-3"] {
            let msg = parse(&["--critic-sms", bad]).unwrap_err();
            assert!(msg.contains(&format!("found `{bad}`")), "{msg}");
        }
        assert!(
            parse(&["--nope", "1"])
                .unwrap_err()
                .contains("unknown flag")
        );
    }
}
