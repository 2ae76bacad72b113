//! The trainer binaries' driver, one for both agents: the flags they share, the loop that
//! trains and evaluates with a progress bar, when each agent solved its task, the
//! training loop timed alone, and the outputs (the loop as a picture, the learning curves
//! as CSV and SVG, a JSON summary). A binary names its task ([`Task`]), parses its
//! arguments into [`Settings`] and calls [`main`] with a way to build its [`Agent`].
//!
//! Without a GPU [`main`] prints the steps' plans and the training loop (Graphviz DOT,
//! and SVG in the output folder), and says what it would do.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use stepgraph::Device;
use stepgraph_picture::{
    Curves, Program, Series, curves_csv, curves_svg, program_dot, program_svg,
};

use crate::agent::{Agent, AgentKernels, Algorithm, EVAL_EPISODES};

/// The flags both trainers take, with the same defaults.
#[derive(Clone, Debug, clap::Args)]
pub struct Flags {
    /// Agents side by side, each with its own seed (agent `a` draws from `(seed, a)`).
    #[arg(long, default_value_t = 1)]
    pub agents: usize,
    /// The run's seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// After training, time this many launches of the training loop alone (each one
    /// evaluation interval) for the environment steps per second without evaluations and
    /// the host's cost per launch; 0 skips it.
    #[arg(long, default_value_t = 0)]
    pub time_launches: u32,
    /// After training, print the training step's timeline: each op's GPU time, the median
    /// of this many replays; 0 skips it.
    #[arg(long, default_value_t = 0)]
    pub profile: usize,
    /// No progress bar (logs and benchmarks).
    #[arg(long)]
    pub quiet: bool,
}

/// A run: the shared flags and the ones whose defaults are the task's.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The flags both trainers take.
    pub flags: Flags,
    /// Environment steps per agent.
    pub steps: u64,
    /// Environment steps per agent between evaluations.
    pub eval_freq: u64,
    /// Where the curves and the summary go.
    pub out: PathBuf,
}

/// What a trainer says of its task beyond its [`Algorithm`].
#[derive(Clone, Debug)]
pub struct Task {
    /// The program's name, and the prefix of what it writes: `cartpole` writes
    /// `cartpole-loop.svg`, `cartpole-steps.csv`, `cartpole-1agents.json`.
    pub name: &'static str,
    /// rejax's configuration file: `configs/gymnax/cartpole.yaml`.
    pub rejax_config: &'static str,
    /// The mean evaluation return at or above which an agent has solved the task.
    pub solved: f64,
    /// Training environments per agent (the configuration's `num_envs`).
    pub envs: usize,
}

/// Trains as `settings` say, with the agent `build` makes on the GPU with the kernels
/// loaded there, or, where there is none, prints the plans and the loop and then `with_gpu` (what it would do) and why it
/// did not. `start` is the process's start, which the timings count from.
pub fn main<A: Algorithm>(
    start: Instant,
    task: &Task,
    settings: &Settings,
    with_gpu: &str,
    build: impl FnOnce(&Device, Arc<AgentKernels>) -> Result<Agent<A>>,
) -> ExitCode {
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            no_gpu::<A>(task, settings);
            println!("{with_gpu} No GPU here: {}", e.chain());
            return ExitCode::SUCCESS;
        }
    };
    match run(start, task, settings, &device, build) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{} failed: {e:#}", task.name);
            ExitCode::FAILURE
        }
    }
}

/// The plans and the training loop, for a reader without a GPU.
fn no_gpu<A: Algorithm>(task: &Task, settings: &Settings) {
    for plan in Agent::<A>::plans() {
        println!("{plan}");
    }
    let program = Agent::<A>::program(
        (settings.eval_freq / task.envs as u64).max(1) as u32,
        settings.steps / settings.eval_freq.max(1),
    );
    println!(
        "The training loop, as Graphviz DOT:\n{}",
        program_dot(&program)
    );
    match write_program(task, &settings.out, &program) {
        Ok(path) => println!("(drawn as SVG in {})", path.display()),
        Err(e) => eprintln!(
            "could not draw the training loop into {}: {e:#}",
            settings.out.display()
        ),
    }
}

/// Draws the training loop into `out/<name>-loop.svg`.
fn write_program(task: &Task, out: &Path, program: &Program<'_>) -> Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join(format!("{}-loop.svg", task.name));
    std::fs::write(&path, program_svg(program))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// One evaluation: after `steps` environment steps per agent, seen by the host `seconds`
/// after process start.
#[derive(Clone, Debug, PartialEq)]
struct Eval {
    steps: u64,
    seconds: f64,
    returns: Vec<f64>,
}

/// The evaluations so far and when each agent first reached the threshold.
#[derive(Debug)]
struct Record {
    threshold: f64,
    evals: Vec<Eval>,
    /// Per agent: the step and the seconds after process start of its first evaluation
    /// at or above the threshold.
    solved_at: Vec<Option<(u64, f64)>>,
}

impl Record {
    fn new(agents: usize, threshold: f64) -> Record {
        Record {
            threshold,
            evals: Vec::new(),
            solved_at: vec![None; agents],
        }
    }

    /// Adds `eval`; returns the agents that solved the task with it, and their returns.
    fn push(&mut self, eval: Eval) -> Vec<(usize, f64)> {
        let mut solved = Vec::new();
        for (a, &r) in eval.returns.iter().enumerate() {
            if r >= self.threshold && self.solved_at[a].is_none() {
                self.solved_at[a] = Some((eval.steps, eval.seconds));
                solved.push((a, r));
            }
        }
        self.evals.push(eval);
        solved
    }

    /// The last evaluation's returns.
    fn last(&self) -> Vec<f64> {
        self.evals
            .last()
            .map(|e| e.returns.clone())
            .unwrap_or_default()
    }
}

/// What training took.
#[derive(Clone, Copy, Debug)]
struct Totals {
    /// Seconds from process start to the agent built.
    ready: f64,
    /// Seconds of training with its evaluations.
    train: f64,
    /// Environment steps of all agents together.
    steps: u64,
    /// The training loop timed alone, where asked for.
    timing: Option<Timing>,
}

fn run<A: Algorithm>(
    start: Instant,
    task: &Task,
    settings: &Settings,
    device: &Device,
    build: impl FnOnce(&Device, Arc<AgentKernels>) -> Result<Agent<A>>,
) -> Result<()> {
    let chunk = u32::try_from(settings.eval_freq / task.envs as u64)
        .ok()
        .filter(|&c| c > 0)
        .context(
            "--eval-freq: expected at least one iteration of the environments between evaluations",
        )?;
    let chunks = settings.steps / settings.eval_freq;
    write_program(task, &settings.out, &Agent::<A>::program(chunk, chunks))?;
    let mut agent = build(device, Arc::new(AgentKernels::load(device)?))?;
    let ready = start.elapsed().as_secs_f64();
    let (record, train) = train_and_evaluate(&mut agent, task, settings, start, chunk, chunks)?;
    let mut totals = Totals {
        ready,
        train,
        steps: agent.steps() * settings.flags.agents as u64,
        timing: None,
    };
    report(agent.steps(), task, settings, &record, &totals);
    if settings.flags.profile > 0 {
        println!("{}", agent.profile(settings.flags.profile)?);
    }
    if settings.flags.time_launches > 0 {
        totals.timing = Some(time_training(
            &mut agent,
            chunk,
            settings.flags.time_launches,
            task.envs,
        )?);
    }
    write_outputs::<A>(task, settings, &record, &totals)
}

/// `chunks` launches of `chunk` training iterations, each followed by an evaluation, with
/// one before them all, as rejax evaluates; the progress bar shows each. Returns the
/// evaluations and the seconds it all took.
fn train_and_evaluate<A: Algorithm>(
    agent: &mut Agent<A>,
    task: &Task,
    settings: &Settings,
    start: Instant,
    chunk: u32,
    chunks: u64,
) -> Result<(Record, f64)> {
    let bar = progress_bar(settings);
    let mut record = Record::new(settings.flags.agents, task.solved);
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
        let mean = returns.iter().sum::<f64>() / returns.len().max(1) as f64;
        for (a, r) in record.push(Eval {
            steps,
            seconds,
            returns,
        }) {
            // Through `suspend`, not `bar.println`: a hidden bar (--quiet, or output that
            // is not a terminal) drops what its `println` is given.
            bar.suspend(|| {
                println!(
                    "agent {a} solved {} at step {steps}: mean return {r:.1}, {seconds:.2} s after process start",
                    A::TASK
                )
            });
        }
        let rate = (agent.steps() * settings.flags.agents as u64) as f64
            / train_start.elapsed().as_secs_f64();
        bar.set_position(steps);
        bar.set_message(format!("return {mean:.1}, {:.0}k env steps/s", rate / 1e3));
    }
    agent.wait()?;
    let train_seconds = train_start.elapsed().as_secs_f64();
    bar.finish();
    Ok((record, train_seconds))
}

fn progress_bar(settings: &Settings) -> ProgressBar {
    if settings.flags.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(settings.steps).with_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        )
    }
}

/// The throughput with evaluations and the final returns, after `steps` environment
/// steps per agent.
fn report(steps: u64, task: &Task, settings: &Settings, record: &Record, totals: &Totals) {
    let last = record.last();
    let solved_final = last.iter().filter(|&&r| r >= task.solved).count();
    println!(
        "{} agent(s), {} environment steps each in {:.2} s with evaluations: {:.0} \
         environment steps/s; ready to train {:.2} s after process start",
        settings.flags.agents,
        steps,
        totals.train,
        totals.steps as f64 / totals.train,
        totals.ready
    );
    println!(
        "final mean returns {:?}; {solved_final} of {} at or above {}",
        last.iter()
            .map(|r| (r * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        settings.flags.agents,
        task.solved
    );
}

/// The training loop alone: environment steps per second over `launches` launches of
/// `chunk` iterations, and the host's time per launch against the GPU's.
#[derive(Clone, Copy, Debug)]
struct Timing {
    steps_per_s: f64,
    gpu_ms_per_launch: f64,
    host_ms_per_launch: f64,
}

fn time_training<A: Algorithm>(
    agent: &mut Agent<A>,
    chunk: u32,
    launches: u32,
    envs: usize,
) -> Result<Timing> {
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

/// The learning curves (CSV and SVG, against environment steps and against seconds from
/// process start) and the JSON summary, into `settings.out`.
fn write_outputs<A: Algorithm>(
    task: &Task,
    settings: &Settings,
    record: &Record,
    totals: &Totals,
) -> Result<()> {
    let out = &settings.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (file, chart) in curves::<A>(task, settings.flags.agents, &record.evals) {
        let base = out.join(format!("{}-{file}", task.name));
        std::fs::write(base.with_extension("csv"), curves_csv(&chart))?;
        std::fs::write(base.with_extension("svg"), curves_svg(&chart))?;
    }
    let summary = summary::<A>(task, settings, record, totals);
    let path = out.join(format!(
        "{}-{}agents.json",
        task.name, settings.flags.agents
    ));
    std::fs::write(&path, serde_json::to_string_pretty(&summary)?)?;
    println!("wrote the curves and {}", path.display());
    Ok(())
}

/// Each agent's evaluation returns against environment steps (`steps`) and against
/// seconds from process start (`seconds`).
fn curves<A: Algorithm>(task: &Task, agents: usize, evals: &[Eval]) -> [(&'static str, Curves); 2] {
    let name = format!("stepgraph {}, {agents} agent(s)", A::NAME);
    let chart = |x_label: &str, x: fn(&Eval) -> f64| {
        let runs: Vec<Vec<(f64, f64)>> = (0..agents)
            .map(|a| evals.iter().map(|e| (x(e), e.returns[a])).collect())
            .collect();
        Curves {
            title: format!(
                "{}, {} (rejax's configuration), {agents} seed(s)",
                A::TASK,
                A::NAME
            ),
            x_label: x_label.into(),
            y_label: format!("mean return over {EVAL_EPISODES} episodes"),
            threshold: Some((task.solved, "solved".into())),
            series: vec![Series::over_runs(name.clone(), &runs)],
        }
    };
    [
        ("steps", chart("environment steps", |e| e.steps as f64)),
        (
            "seconds",
            chart("seconds from process start", |e| e.seconds),
        ),
    ]
}

/// The run's JSON summary.
fn summary<A: Algorithm>(
    task: &Task,
    settings: &Settings,
    record: &Record,
    totals: &Totals,
) -> serde_json::Value {
    let Totals {
        ready,
        train,
        steps,
        timing,
    } = *totals;
    let evals = &record.evals;
    serde_json::json!({
        "task": A::TASK,
        "algorithm": format!("{} (rejax 0.1.3 {})", A::NAME, task.rejax_config),
        "agents": settings.flags.agents,
        "seed": settings.flags.seed,
        "steps_per_agent": settings.steps,
        "ready_s": ready,
        "train_s_with_evaluations": train,
        "env_steps_per_s_with_evaluations": steps as f64 / train,
        "env_steps_per_s_training_alone": timing.map(|t| t.steps_per_s),
        "launch_gpu_ms": timing.map(|t| t.gpu_ms_per_launch),
        "launch_host_ms": timing.map(|t| t.host_ms_per_launch),
        "solved": record.solved_at.iter().map(|s| s.map(|(step, seconds)| serde_json::json!({"step": step, "seconds_from_start": seconds, "seconds_from_ready": seconds - ready}))).collect::<Vec<_>>(),
        "final_returns": evals.last().map(|e| e.returns.clone()),
        "solved_at_end": evals.last().map(|e| e.returns.iter().filter(|&&r| r >= task.solved).count()),
        "curve": evals.iter().map(|e| serde_json::json!({"step": e.steps, "seconds": e.seconds, "returns": e.returns})).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cartpole::CartPoleDqn;

    fn eval(steps: u64, returns: &[f64]) -> Eval {
        Eval {
            steps,
            seconds: steps as f64 / 100.0,
            returns: returns.to_vec(),
        }
    }

    fn cartpole() -> Task {
        Task {
            name: "cartpole",
            rejax_config: "configs/gymnax/cartpole.yaml",
            solved: 475.0,
            envs: 10,
        }
    }

    #[test]
    fn an_agent_solves_once_at_its_first_evaluation_at_the_threshold() {
        let mut record = Record::new(2, 475.0);
        assert_eq!(record.push(eval(0, &[20.0, 30.0])), vec![]);
        assert_eq!(record.push(eval(100, &[400.0, 480.0])), vec![(1, 480.0)]);
        // At the threshold counts; agent 1 solved already and is not named again.
        assert_eq!(record.push(eval(200, &[475.0, 500.0])), vec![(0, 475.0)]);
        assert_eq!(record.push(eval(300, &[500.0, 10.0])), vec![]);
        assert_eq!(record.solved_at, vec![Some((200, 2.0)), Some((100, 1.0))]);
        assert_eq!(record.last(), vec![500.0, 10.0]);
        assert_eq!(record.evals.len(), 4);
    }

    #[test]
    fn the_summary_names_the_task_and_keeps_its_keys() {
        let task = cartpole();
        let settings = Settings {
            flags: Flags {
                agents: 2,
                seed: 7,
                time_launches: 0,
                profile: 0,
                quiet: true,
            },
            steps: 300,
            eval_freq: 100,
            out: PathBuf::from("unused"),
        };
        let mut record = Record::new(2, task.solved);
        record.push(eval(0, &[20.0, 30.0]));
        record.push(eval(100, &[480.0, 30.0]));
        let totals = Totals {
            ready: 0.25,
            train: 2.0,
            steps: 200,
            timing: None,
        };
        let s = summary::<CartPoleDqn>(&task, &settings, &record, &totals);
        let keys: Vec<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
        let mut expected = vec![
            "task",
            "algorithm",
            "agents",
            "seed",
            "steps_per_agent",
            "ready_s",
            "train_s_with_evaluations",
            "env_steps_per_s_with_evaluations",
            "env_steps_per_s_training_alone",
            "launch_gpu_ms",
            "launch_host_ms",
            "solved",
            "final_returns",
            "solved_at_end",
            "curve",
        ];
        expected.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, expected);
        assert_eq!(s["task"], "CartPole-v1");
        assert_eq!(
            s["algorithm"],
            "DQN (rejax 0.1.3 configs/gymnax/cartpole.yaml)"
        );
        assert_eq!(s["seed"], 7);
        assert_eq!(s["env_steps_per_s_with_evaluations"], 100.0);
        assert!(s["launch_gpu_ms"].is_null());
        assert_eq!(s["solved"][0]["step"], 100);
        assert_eq!(s["solved"][0]["seconds_from_ready"], 0.75);
        assert!(s["solved"][1].is_null());
        assert_eq!(s["solved_at_end"], 1);
        assert_eq!(s["curve"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn the_curves_run_against_steps_and_seconds() {
        let evals = [eval(0, &[20.0, 30.0]), eval(100, &[480.0, 30.0])];
        let [(steps, by_steps), (seconds, by_seconds)] =
            curves::<CartPoleDqn>(&cartpole(), 2, &evals);
        assert_eq!((steps, seconds), ("steps", "seconds"));
        assert_eq!(
            by_steps.title,
            "CartPole-v1, DQN (rejax's configuration), 2 seed(s)"
        );
        assert_eq!(by_steps.x_label, "environment steps");
        assert_eq!(by_seconds.x_label, "seconds from process start");
        assert_eq!(by_steps.y_label, "mean return over 128 episodes");
        assert_eq!(by_steps.threshold, Some((475.0, "solved".to_string())));
        assert_eq!(by_steps.series[0].name, "stepgraph DQN, 2 agent(s)");
        // The mean over the agents at each evaluation, at its step or its second.
        let at = |c: &Curves| -> Vec<(f64, f64)> {
            c.series[0].points.iter().map(|p| (p.x, p.mean)).collect()
        };
        assert_eq!(at(&by_steps), vec![(0.0, 25.0), (100.0, 255.0)]);
        assert_eq!(at(&by_seconds), vec![(0.0, 25.0), (1.0, 255.0)]);
    }

    #[test]
    fn the_loop_is_drawn_under_the_task_name() {
        let out = std::env::temp_dir().join(format!("stepgraph-agents-{}", std::process::id()));
        let program = Agent::<CartPoleDqn>::program(250, 40);
        assert_eq!(program.title, "CartPole-v1 DQN: the training loop");
        let path = write_program(&cartpole(), &out, &program).unwrap();
        assert_eq!(path, out.join("cartpole-loop.svg"));
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.starts_with("<svg") || svg.starts_with("<?xml"),
            "{svg:.40}"
        );
        std::fs::remove_dir_all(&out).unwrap();
    }
}
