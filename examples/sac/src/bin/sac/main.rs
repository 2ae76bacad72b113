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

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

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
        v => v.parse().map_err(|e| format!("{e}")),
    }
}

/// A count that must be at least 1.
fn positive(value: &str) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1, found 0".into()),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("takes a positive integer, found `{value}`")),
    }
}

/// One soft actor-critic update with twin critics as a stepgraph step: trains and prints
/// the losses, writes the check's tensors for reference.py (`--check`), times the
/// variants against their bounds (`--bench`) or prints the plan (`--print-plan`). With no
/// GPU it prints the plan and says what the run needs.
#[derive(Debug, Parser)]
#[command(name = "sac")]
struct Cli {
    /// Steps to train, or to check with --check [default: 100, or 3 with --check].
    #[arg(long, value_parser = positive)]
    steps: Option<usize>,
    /// The seed of the initial weights and generated transitions.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Capture every op on one stream instead of the planned streams.
    #[arg(long)]
    one_stream: bool,
    /// Write the seeded state and each step's tensors to DIR for `reference.py check DIR`.
    #[arg(long, value_name = "DIR", conflicts_with = "bench")]
    check: Option<PathBuf>,
    /// Time eager, the one-stream graph and the planned graph against the critical-path
    /// and work bounds, and write the records into DIR.
    #[arg(long, value_name = "DIR")]
    bench: Option<PathBuf>,
    /// Replays per timing of --bench.
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = positive)]
    replays: usize,
    /// Transitions in the replay buffer.
    #[arg(long, value_name = "N", default_value_t = stepgraph_sac::host::DEFAULT_REPLAY, value_parser = positive)]
    replay: usize,
    /// What the critics' matmuls are planned for: whole (the default), share (the GPU
    /// over the critics), 1/N of the GPU, or N SMs.
    #[arg(long, value_name = "whole|share|1/N|N", default_value = "whole", value_parser = critic_sms, allow_hyphen_values = true)]
    critic_sms: SmTarget,
    /// Print the step's plan as Graphviz DOT or SVG, and exit.
    #[arg(long, value_name = "dot|svg")]
    print_plan: Option<String>,
    /// B: transitions per step.
    #[arg(long, default_value_t = Sizes::default().batch, value_parser = positive)]
    batch: usize,
    /// S: observation features.
    #[arg(long, default_value_t = Sizes::default().obs, value_parser = positive)]
    obs: usize,
    /// A: action dimensions.
    #[arg(long, default_value_t = Sizes::default().action, value_parser = positive)]
    action: usize,
    /// H: the hidden width of every network.
    #[arg(long, default_value_t = Sizes::default().hidden, value_parser = positive)]
    hidden: usize,
}

impl Options {
    /// The run the command line asks for, its sizes checked.
    fn from_cli(cli: Cli) -> std::result::Result<Options, String> {
        let sizes = Sizes {
            batch: cli.batch,
            obs: cli.obs,
            action: cli.action,
            hidden: cli.hidden,
        };
        sizes.check().map_err(|e| e.to_string())?;
        Ok(Options {
            sizes,
            steps: cli.steps,
            seed: cli.seed,
            one_stream: cli.one_stream,
            check: cli.check,
            bench: cli.bench,
            replays: cli.replays,
            replay: cli.replay,
            critic_sms: cli.critic_sms,
        })
    }
}

fn main() -> ExitCode {
    if let Some(code) = stepgraph_picture::print_plan_if_asked(&sac::PLAN) {
        return code;
    }
    // --help and malformed options exit here, as clap does (status 2 on error).
    let options = match Options::from_cli(Cli::parse()) {
        Ok(o) => o,
        Err(e) => Cli::command().error(ErrorKind::ValueValidation, e).exit(),
    };
    println!("{}", sac::PLAN);
    println!("{}", sac::AUTO_PLAN);
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
    // clap refuses --check with --bench.
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
        let cli = Cli::try_parse_from(std::iter::once("sac").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        Options::from_cli(cli)
    }

    #[test]
    fn the_command_line_is_consistent_and_has_help() {
        Cli::command().debug_assert();
        let help = Cli::try_parse_from(["sac", "--help"]).unwrap_err();
        assert_eq!(help.kind(), clap::error::ErrorKind::DisplayHelp);
        for flag in [
            "--steps",
            "--check",
            "--bench",
            "--critic-sms",
            "--print-plan",
        ] {
            assert!(help.to_string().contains(flag), "{flag}");
        }
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
        assert!(
            parse(&["--check"])
                .unwrap_err()
                .contains("a value is required for '--check <DIR>'")
        );
        let o = parse(&["--bench", "/tmp/b", "--replays", "50", "--replay", "1000"]).unwrap();
        assert_eq!(
            (o.bench, o.replays, o.replay),
            (Some(PathBuf::from("/tmp/b")), 50, 1000)
        );
        assert!(
            parse(&["--bench", "/tmp/b", "--check", "/tmp/d"])
                .unwrap_err()
                .contains("cannot be used with")
        );
        assert!(
            parse(&["--replay", "0"])
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(parse(&["--batch", "0"]).unwrap_err().contains("at least 1"));
        assert!(parse(&["--obs", "x"]).unwrap_err().contains("`x`"));
        assert!(
            parse(&["--steps"])
                .unwrap_err()
                .contains("a value is required for '--steps <STEPS>'")
        );
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
                .contains("unexpected argument '--nope' found")
        );
    }
}
