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
//! Without a GPU it prints the steps' plans and says what it would do.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use stepgraph::Device;
use stepgraph_agents::pendulum::{Agent, AgentKernels, EVAL_EPISODES};
use stepgraph_agents::sac::SacConfig;
use stepgraph_picture::{Curves, Series, curves_csv, curves_svg};

/// Pendulum-v1's solve threshold, rejax's.
const SOLVED: f64 = -200.0;

#[derive(Debug, Parser)]
#[command(
    about = "Trains SAC agents on Pendulum-v1 on the GPU (rejax's configuration), the whole loop in CUDA graphs"
)]
struct Args {
    /// Agents side by side, each with its own seed (agent `a` draws from `(seed, a)`).
    #[arg(long, default_value_t = 1)]
    agents: usize,
    /// The run's seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Environment steps per agent (rejax: 10,000).
    #[arg(long, default_value_t = 10_000)]
    steps: u64,
    /// Environment steps per agent between evaluations (rejax: 100).
    #[arg(long, default_value_t = 100)]
    eval_freq: u64,
    /// Where the curves and the summary go.
    #[arg(long, default_value = "target/pendulum")]
    out: PathBuf,
    /// After training, time this many launches of the training loop alone (each one
    /// evaluation interval) for the environment steps per second without evaluations and
    /// the host's cost per launch; 0 skips it.
    #[arg(long, default_value_t = 0)]
    time_launches: u32,
    /// After training, print the training step's timeline: each op's GPU time, the median
    /// of this many replays; 0 skips it.
    #[arg(long, default_value_t = 0)]
    profile: usize,
    /// No progress bar (logs and benchmarks).
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let start = Instant::now();
    let args = Args::parse();
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            no_gpu(&args, &e);
            return ExitCode::SUCCESS;
        }
    };
    match run(&args, &device, start) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pendulum failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn no_gpu(args: &Args, e: &stepgraph::Error) {
    for plan in Agent::plans() {
        println!("{plan}");
    }
    let cfg = SacConfig::rejax_pendulum(args.seed);
    println!(
        "With a CUDA GPU of 145 KiB of shared memory per block (A100, H100, H200) this trains {} \
         SAC agent(s) on Pendulum-v1 for {} environment steps each ({} environment(s), batch \
         {}, {} update(s) per iteration, rejax's configuration): the `train` step above as \
         device loops of {} iterations, an evaluation of {EVAL_EPISODES} episodes per agent \
         every {} steps (`eval_reset`, then `eval_run` looped 200 times), and writes the \
         learning curves into {}. No GPU here: {}",
        args.agents,
        args.steps,
        cfg.num_envs,
        cfg.batch_size,
        cfg.epochs,
        args.eval_freq / cfg.num_envs as u64,
        args.eval_freq,
        args.out.display(),
        e.chain()
    );
}

/// One evaluation: after `steps` environment steps per agent, seen by the host `seconds`
/// after process start.
struct Eval {
    steps: u64,
    seconds: f64,
    returns: Vec<f64>,
}

fn run(args: &Args, device: &Device, start: Instant) -> Result<()> {
    let cfg = SacConfig::rejax_pendulum(args.seed);
    let chunk = u32::try_from(args.eval_freq / cfg.num_envs as u64)
        .ok()
        .filter(|&c| c > 0)
        .context(
            "--eval-freq: expected at least one iteration of the environments between evaluations",
        )?;
    let chunks = args.steps / args.eval_freq;
    let kernels = Arc::new(AgentKernels::load(device)?);
    anyhow::ensure!(
        kernels.agents.sac_update_ready(),
        "the SAC update needs {} bytes of shared memory per block, more than this GPU grants",
        stepgraph_agents::sac::sac_update_smem_bytes()
    );
    let mut agent = Agent::new(device, kernels, cfg, args.agents, EVAL_EPISODES)?;
    let ready = start.elapsed().as_secs_f64();

    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(args.steps).with_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        )
    };
    let mut evals = Vec::new();
    let mut solved_at: Vec<Option<(u64, f64)>> = vec![None; args.agents];
    let train_start = Instant::now();
    // rejax evaluates before training too. Each evaluation is launched behind the
    // training before it, and the next training launch is queued before the host reads
    // the evaluation: the GPU never waits for the host.
    agent.evaluate()?;
    for k in 0..=chunks {
        let steps = agent.steps();
        if k < chunks {
            agent.train(chunk)?;
            agent.evaluate()?;
        }
        let returns = agent.eval_returns()?;
        let seconds = start.elapsed().as_secs_f64();
        for (a, r) in returns.iter().enumerate() {
            if *r >= SOLVED && solved_at[a].is_none() {
                solved_at[a] = Some((steps, seconds));
                bar.println(format!(
                    "agent {a} solved Pendulum-v1 at step {steps}: mean return {r:.1}, {seconds:.2} s after process start"
                ));
            }
        }
        let mean = returns.iter().sum::<f64>() / returns.len().max(1) as f64;
        let rate =
            (agent.steps() * args.agents as u64) as f64 / train_start.elapsed().as_secs_f64();
        bar.set_position(steps);
        bar.set_message(format!("return {mean:.1}, {:.0}k env steps/s", rate / 1e3));
        evals.push(Eval {
            steps,
            seconds,
            returns,
        });
    }
    agent.wait()?;
    let train_seconds = train_start.elapsed().as_secs_f64();
    bar.finish();

    let total_steps = agent.steps() * args.agents as u64;
    let last = evals.last().map(|e| e.returns.clone()).unwrap_or_default();
    let solved_final = last.iter().filter(|&&r| r >= SOLVED).count();
    println!(
        "{} agent(s), {} environment steps each in {train_seconds:.2} s with evaluations: {:.0} \
         environment steps/s; ready to train {ready:.2} s after process start",
        args.agents,
        agent.steps(),
        total_steps as f64 / train_seconds
    );
    println!(
        "final mean returns {:?}; {solved_final} of {} at or above {SOLVED}",
        last.iter()
            .map(|r| (r * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        args.agents
    );
    if args.profile > 0 {
        println!("{}", agent.profile(args.profile)?);
    }
    let timing = if args.time_launches > 0 {
        Some(time_training(
            &mut agent,
            chunk,
            args.time_launches,
            cfg.num_envs,
        )?)
    } else {
        None
    };
    write_outputs(
        args,
        &evals,
        &solved_at,
        ready,
        train_seconds,
        total_steps,
        timing.as_ref(),
    )
}

/// The training loop alone: environment steps per second over `launches` launches of
/// `chunk` iterations, and the host's time per launch against the GPU's.
struct Timing {
    steps_per_s: f64,
    gpu_ms_per_launch: f64,
    host_ms_per_launch: f64,
}

fn time_training(agent: &mut Agent, chunk: u32, launches: u32, envs: usize) -> Result<Timing> {
    // Throughput: launches back to back, as training runs them.
    agent.wait()?;
    let t0 = Instant::now();
    for _ in 0..launches {
        agent.train(chunk)?;
    }
    agent.wait()?;
    let gpu = t0.elapsed().as_secs_f64();
    // The host's cost of a launch: the call alone, made while nothing is in flight. Back
    // to back, a call that finds the read-back ring full waits for the oldest launch to
    // finish, and that wait is the GPU's time, not the host's work.
    let mut host = 0.0;
    for _ in 0..launches {
        let call = Instant::now();
        agent.train(chunk)?;
        host += call.elapsed().as_secs_f64();
        agent.wait()?;
    }
    let steps = f64::from(launches) * f64::from(chunk) * envs as f64 * agent.agents() as f64;
    let timing = Timing {
        steps_per_s: steps / gpu,
        gpu_ms_per_launch: gpu * 1e3 / f64::from(launches),
        host_ms_per_launch: host * 1e3 / f64::from(launches),
    };
    println!(
        "training alone: {:.0} environment steps/s; a launch of {chunk} iterations takes {:.3} ms, \
         of which the host spends {:.4} ms queuing it ({:.2}%)",
        timing.steps_per_s,
        timing.gpu_ms_per_launch,
        timing.host_ms_per_launch,
        100.0 * timing.host_ms_per_launch / timing.gpu_ms_per_launch
    );
    Ok(timing)
}

fn write_outputs(
    args: &Args,
    evals: &[Eval],
    solved_at: &[Option<(u64, f64)>],
    ready: f64,
    train_seconds: f64,
    total_steps: u64,
    timing: Option<&Timing>,
) -> Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let name = format!("stepgraph SAC, {} agent(s)", args.agents);
    let runs = |x: &dyn Fn(&Eval) -> f64| -> Vec<Vec<(f64, f64)>> {
        (0..args.agents)
            .map(|a| evals.iter().map(|e| (x(e), e.returns[a])).collect())
            .collect()
    };
    for (file, x_label, x) in [
        (
            "steps",
            "environment steps",
            &(|e: &Eval| e.steps as f64) as &dyn Fn(&Eval) -> f64,
        ),
        ("seconds", "seconds from process start", &|e: &Eval| {
            e.seconds
        }),
    ] {
        let chart = Curves {
            title: format!(
                "Pendulum-v1, SAC (rejax's configuration), {} seed(s)",
                args.agents
            ),
            x_label: x_label.into(),
            y_label: format!("mean return over {EVAL_EPISODES} episodes"),
            threshold: Some((SOLVED, "solved".into())),
            series: vec![Series::over_runs(name.clone(), &runs(x))],
        };
        let base = args.out.join(format!("pendulum-{file}"));
        std::fs::write(base.with_extension("csv"), curves_csv(&chart))?;
        std::fs::write(base.with_extension("svg"), curves_svg(&chart))?;
    }
    let summary = serde_json::json!({
        "task": "Pendulum-v1",
        "algorithm": "SAC (rejax 0.1.3 configs/gymnax/pendulum.yaml)",
        "agents": args.agents,
        "seed": args.seed,
        "steps_per_agent": args.steps,
        "ready_s": ready,
        "train_s_with_evaluations": train_seconds,
        "env_steps_per_s_with_evaluations": total_steps as f64 / train_seconds,
        "env_steps_per_s_training_alone": timing.map(|t| t.steps_per_s),
        "launch_gpu_ms": timing.map(|t| t.gpu_ms_per_launch),
        "launch_host_ms": timing.map(|t| t.host_ms_per_launch),
        "solved": solved_at.iter().map(|s| s.map(|(step, seconds)| serde_json::json!({"step": step, "seconds_from_start": seconds, "seconds_from_ready": seconds - ready}))).collect::<Vec<_>>(),
        "final_returns": evals.last().map(|e| e.returns.clone()),
        "solved_at_end": evals.last().map(|e| e.returns.iter().filter(|&&r| r >= SOLVED).count()),
        "curve": evals.iter().map(|e| serde_json::json!({"step": e.steps, "seconds": e.seconds, "returns": e.returns})).collect::<Vec<_>>(),
    });
    let path = args
        .out
        .join(format!("pendulum-{}agents.json", args.agents));
    std::fs::write(&path, serde_json::to_string_pretty(&summary)?)?;
    println!("wrote the curves and {}", path.display());
    Ok(())
}
