//! Trains DQN agents on CartPole-v1 with rejax's configuration, the whole loop on the GPU:
//! acting, the environments, the replay, the updates and the evaluations are device loops
//! of three captured steps. Prints a progress bar (the last evaluation's mean return and
//! environment steps per second), when each agent solved the task (a mean return of 475
//! over 128 evaluation episodes) and how long that took from process start, and writes
//! the learning curves (CSV and SVG, against environment steps and against wall-clock)
//! and a JSON summary into `--out`.
//!
//! Without a GPU it prints the steps' plans and the training loop (DOT, and SVG in
//! `--out`) and says what it would do.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use stepgraph_agents::DqnConfig;
use stepgraph_agents::cartpole::{Agent, EVAL_EPISODES};
use stepgraph_agents::trainer::{self, Flags, Settings, Task};

#[derive(Debug, Parser)]
#[command(
    about = "Trains DQN agents on CartPole-v1 on the GPU (rejax's configuration), the whole loop in CUDA graphs"
)]
struct Args {
    #[command(flatten)]
    flags: Flags,
    /// Environment steps per agent (rejax: 100,000).
    #[arg(long, default_value_t = 100_000)]
    steps: u64,
    /// Environment steps per agent between evaluations (rejax: 2,500).
    #[arg(long, default_value_t = 2_500)]
    eval_freq: u64,
    /// Where the curves and the summary go.
    #[arg(long, default_value = "target/cartpole")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let start = Instant::now();
    let args = Args::parse();
    let cfg = DqnConfig::rejax_cartpole(args.flags.seed);
    let task = Task {
        name: "cartpole",
        rejax_config: "configs/gymnax/cartpole.yaml",
        // CartPole-v1's solve threshold, rejax's.
        solved: 475.0,
        envs: cfg.num_envs,
    };
    let with_gpu = format!(
        "With a CUDA GPU (compute capability 8.0 or newer) this trains {} DQN agent(s) on \
         CartPole-v1 for {} environment steps each ({} environments, batch {}, {} updates per \
         iteration, rejax's configuration): the `train` step above as device loops of {} \
         iterations, an evaluation of {EVAL_EPISODES} episodes per agent every {} steps \
         (`eval_reset`, then `eval_run` looped 500 times), and writes the learning curves \
         into {}.",
        args.flags.agents,
        args.steps,
        cfg.num_envs,
        cfg.batch_size,
        cfg.epochs,
        args.eval_freq / cfg.num_envs as u64,
        args.eval_freq,
        args.out.display(),
    );
    let settings = Settings {
        flags: args.flags,
        steps: args.steps,
        eval_freq: args.eval_freq,
        out: args.out,
    };
    trainer::main(start, &task, &settings, &with_gpu, |device, kernels| {
        Ok(Agent::new(
            device,
            kernels,
            cfg,
            settings.flags.agents,
            EVAL_EPISODES,
        )?)
    })
}
