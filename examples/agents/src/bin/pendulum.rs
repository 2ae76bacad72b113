//! Trains SAC agents on Pendulum-v1 with rejax's configuration, the whole loop on the GPU:
//! acting, the environments, the replay, the updates and the evaluations are device loops
//! of three captured steps. Prints a progress bar (the last evaluation's mean return and
//! environment steps per second), when each agent solved the task (a mean return of -200
//! over 128 evaluation episodes) and how long that took from process start, and writes
//! the learning curves (CSV and SVG, against environment steps and against wall-clock)
//! and a JSON summary into `--out`.
//!
//! The SAC update needs 145 KiB of shared memory per block (A100, H100, H200); on compute
//! capability 9.0 each agent's update spreads over a cluster of 8 SMs.
//!
//! Without a GPU it prints the steps' plans and the training loop (DOT, and SVG in
//! `--out`) and says what it would do.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use stepgraph_agents::pendulum::{Agent, EVAL_EPISODES};
use stepgraph_agents::sac::{SacConfig, sac_update_smem_bytes};
use stepgraph_agents::trainer::{self, Flags, Settings, Task};

#[derive(Debug, Parser)]
#[command(
    about = "Trains SAC agents on Pendulum-v1 on the GPU (rejax's configuration), the whole loop in CUDA graphs"
)]
struct Args {
    #[command(flatten)]
    flags: Flags,
    /// Environment steps per agent (rejax: 10,000).
    #[arg(long, default_value_t = 10_000)]
    steps: u64,
    /// Environment steps per agent between evaluations (rejax: 100).
    #[arg(long, default_value_t = 100)]
    eval_freq: u64,
    /// Where the curves and the summary go.
    #[arg(long, default_value = "target/pendulum")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let start = Instant::now();
    let args = Args::parse();
    let cfg = SacConfig::rejax_pendulum(args.flags.seed);
    let task = Task {
        name: "pendulum",
        rejax_config: "configs/gymnax/pendulum.yaml",
        // Pendulum-v1's solve threshold, rejax's.
        solved: -200.0,
        envs: cfg.num_envs,
    };
    let with_gpu = format!(
        "With a CUDA GPU of 145 KiB of shared memory per block (A100, H100, H200) this trains {} \
         SAC agent(s) on Pendulum-v1 for {} environment steps each ({} environment(s), batch \
         {}, {} update(s) per iteration, rejax's configuration): the `train` step above as \
         device loops of {} iterations, an evaluation of {EVAL_EPISODES} episodes per agent \
         every {} steps (`eval_reset`, then `eval_run` looped 200 times), and writes the \
         learning curves into {}.",
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
        anyhow::ensure!(
            kernels.agents.sac_update_ready(),
            "the SAC update needs {} bytes of shared memory per block, more than this GPU grants",
            sac_update_smem_bytes()
        );
        Ok(Agent::new(
            device,
            kernels,
            cfg,
            settings.flags.agents,
            EVAL_EPISODES,
        )?)
    })
}
