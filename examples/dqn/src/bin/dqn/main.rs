//! The DQN trainer of the mission, written with stepgraph: a trunk, four dueling GLU
//! branches on four streams, the double-DQN target, IQL, IQN and Attention heads, CQL and
//! an agreement term, global-norm clipping and Adam (MODEL.md has the exact math).
//!
//! ```text
//! cargo run --release -p stepgraph-dqn -- [--steps N] [--batch B] [--hidden H] ...
//! cargo run --release -p stepgraph-dqn -- [--source replay|host] [--replay N]
//!                                         [--target-sync K] [--polyak TAU]
//!                                         [--branch-sms whole|share|1/N|N]
//!                                         [--iqn-kernel auto|wgmma|mma]
//!                                         [--attention auto|fused|unfused]
//! cargo run --release -p stepgraph-dqn -- --check DIR [--steps 3]   # for reference.py check DIR
//! cargo run --release -p stepgraph-dqn -- --gpus N [--steps N]    # data parallel, NCCL
//! cargo run --release -p stepgraph-dqn -- --print-plan dot|svg
//! ```
//! With no GPU it prints the plan and says what the timed run needs.

mod parallel;

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, ValueEnum};

use stepgraph::stats::{Bounds, Ceilings, Floor, median};
use stepgraph::{Communicator, Device, Result, Schedule, SmTarget};
use stepgraph_dqn::floor;
use stepgraph_dqn::kernels::{
    AttentionKernel, BadReplay, IqnFusedKernel, Kernels, LossSlot, Watch,
};
use stepgraph_dqn::layers::{D, Sizes};
use stepgraph_dqn::model::{self, dqn};
use stepgraph_dqn::replay::{BatchSource, HostBatch, ReplayBuffer};
use stepgraph_kernels::{AdamHyper, AdamScalars};
use stepgraph_testkit::{Rng, npy};

const LR: f32 = 3e-4;
const GAMMA: f32 = 0.99;
const HYPER: AdamHyper = AdamHyper {
    max_norm: 10.0,
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
};

/// Command-line options.
#[derive(Debug)]
struct Options {
    sizes: Sizes,
    /// Steps to train, or to check with `--check` (200 and 3 when not given).
    steps: Option<usize>,
    check: Option<PathBuf>,
    seed: u64,
    /// Data parallel over this many GPUs (`parallel.rs`).
    gpus: Option<usize>,
    /// Replay the one-stream step once and exit: the run Nsight Compute profiles for
    /// each kernel's DRAM bytes (`dram_bound.py`).
    serial_replay: bool,
    /// Put a NaN into one past state of this training step's batch: shows the guard that
    /// stops training at a non-finite loss or gradient, names the tensors, and keeps the
    /// state of the step before. Needs the host-fed batch, which it implies.
    inject_nan: Option<usize>,
    /// Where the training run's batches come from (`--source`); `None`: the replay
    /// buffer, or the host with `--inject-nan`. `--check` and `--gpus` feed the host's.
    source: Option<Source>,
    /// The replay buffer's rows (`--replay`).
    replay: usize,
    /// K of `--target-sync`: the target network is updated at every K-th step.
    target_sync: u32,
    /// τ of `--polyak`; 0 (the default) copies the parameters.
    polyak: f32,
    /// `--report-every N`: the training loop reads the step's watch (losses, the finite
    /// check) back every N steps, a few replays late and without waiting.
    report_every: usize,
    /// `--branch-sms`: what the branches' matmuls are planned for.
    branch_sms: SmTarget,
    /// `--iqn-kernel auto|wgmma|mma`: the fused IQN head's kernel (`auto`: what the sizes
    /// and the GPU take).
    iqn_kernel: Option<IqnFusedKernel>,
    /// `--attention auto|fused|unfused`: how the attention head runs (`auto`: what the
    /// sizes and the GPU take).
    attention_kernel: Option<AttentionKernel>,
}

/// `--source`: where the training run's batches come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Source {
    /// The replay buffer on the device, sampled inside the graph.
    Replay,
    /// Generated transitions uploaded before each step.
    Host,
}

/// `--iqn-kernel`: the fused IQN head's kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum IqnKernelChoice {
    /// What the sizes and the GPU take.
    Auto,
    /// The wgmma kernel (Hopper).
    Wgmma,
    /// The mma.sync kernel.
    Mma,
}

/// `--attention`: how the attention head runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum AttentionChoice {
    /// What the sizes and the GPU take.
    Auto,
    /// One fused kernel.
    Fused,
    /// Separate kernels.
    Unfused,
}

/// The DQN trainer written with stepgraph: trains, checks against reference.py
/// (`--check`), runs data parallel (`--gpus`) or prints its plan (`--print-plan`). With
/// no GPU it prints the plan and says what the timed run needs.
#[derive(Debug, Parser)]
#[command(name = "dqn")]
struct Cli {
    /// Steps to train, or to check with --check [default: 200, or 3 with --check].
    #[arg(long)]
    steps: Option<usize>,
    /// Write the seeded state and each step's tensors to DIR for `reference.py check DIR`.
    #[arg(long, value_name = "DIR")]
    check: Option<PathBuf>,
    /// Train data parallel over N GPUs (NCCL).
    #[arg(long, value_name = "N")]
    gpus: Option<usize>,
    /// Replay the one-stream step once and exit (the run Nsight Compute profiles).
    #[arg(long)]
    serial_replay: bool,
    /// The seed of the initial weights and generated transitions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Put a NaN into one past state of this step's batch, to show the non-finite guard.
    #[arg(long, value_name = "STEP")]
    inject_nan: Option<usize>,
    /// Where the training run's batches come from [default: replay, or host with
    /// --inject-nan].
    #[arg(long, value_enum)]
    source: Option<Source>,
    /// The replay buffer's capacity, in transitions.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    replay: usize,
    /// Update the target network at every K-th step.
    #[arg(long, value_name = "K", default_value_t = 100)]
    target_sync: usize,
    /// Polyak τ of the target update, 0 < τ ≤ 1 [default: a hard copy].
    #[arg(long, value_name = "TAU", allow_negative_numbers = true)]
    polyak: Option<f32>,
    /// Read the losses and the finite check back every N steps.
    #[arg(long, value_name = "N", default_value_t = 20)]
    report_every: usize,
    /// What the branches' matmuls are planned for: whole, share (the GPU over the
    /// branches), 1/N of the GPU, or N SMs.
    #[arg(long, value_name = "whole|share|1/N|N", default_value = "share", value_parser = branch_sms)]
    branch_sms: SmTarget,
    /// The fused IQN head's kernel.
    #[arg(long, value_enum, default_value_t = IqnKernelChoice::Auto)]
    iqn_kernel: IqnKernelChoice,
    /// How the attention head runs.
    #[arg(long, value_enum, default_value_t = AttentionChoice::Auto)]
    attention: AttentionChoice,
    /// Print the step's plan as Graphviz DOT or SVG, and exit.
    #[arg(long, value_name = "dot|svg")]
    print_plan: Option<String>,
    /// B: transitions per step.
    #[arg(long, default_value_t = Sizes::default().batch)]
    batch: usize,
    /// The state's features.
    #[arg(long, default_value_t = Sizes::default().state)]
    state: usize,
    /// The trunk's hidden width.
    #[arg(long, default_value_t = Sizes::default().hidden)]
    hidden: usize,
    /// The GLU branches' width.
    #[arg(long, default_value_t = Sizes::default().glu)]
    glu: usize,
    /// Actions per branch.
    #[arg(long, default_value_t = Sizes::default().actions)]
    actions: usize,
    /// The IQN head's quantiles.
    #[arg(long, default_value_t = Sizes::default().quantiles)]
    quantiles: usize,
    /// The IQN head's cosine features.
    #[arg(long, default_value_t = Sizes::default().cosines)]
    cosines: usize,
    /// The attention head's window of past states.
    #[arg(long, default_value_t = Sizes::default().window)]
    window: usize,
    /// The attention head's width.
    #[arg(long, default_value_t = Sizes::default().width)]
    width: usize,
    /// The attention head's heads.
    #[arg(long, default_value_t = Sizes::default().heads)]
    heads: usize,
}

/// `--branch-sms`: `share` (the GPU over the branches), or an `SmTarget` as it writes
/// itself (`whole`, `1/N`, a count of SMs).
fn branch_sms(value: &str) -> std::result::Result<SmTarget, String> {
    match value {
        "share" => Ok(SmTarget::Share(dqn::BRANCH_WIDTH as u32)),
        v => v.parse().map_err(|e| format!("{e}")),
    }
}

impl Options {
    /// The training run's source.
    fn source(&self) -> Source {
        self.source.unwrap_or(if self.inject_nan.is_some() {
            Source::Host
        } else {
            Source::Replay
        })
    }
}

impl Options {
    /// The run the command line asks for, after the checks that involve several options.
    fn from_cli(cli: Cli) -> std::result::Result<Options, String> {
        let o = Options {
            sizes: Sizes {
                batch: cli.batch,
                state: cli.state,
                hidden: cli.hidden,
                glu: cli.glu,
                actions: cli.actions,
                quantiles: cli.quantiles,
                cosines: cli.cosines,
                window: cli.window,
                width: cli.width,
                heads: cli.heads,
            },
            steps: cli.steps,
            check: cli.check,
            seed: cli.seed,
            gpus: cli.gpus,
            serial_replay: cli.serial_replay,
            inject_nan: cli.inject_nan,
            source: cli.source,
            replay: match cli.replay {
                0 => return Err("--replay 0: expected a capacity of at least 1 transition".into()),
                n => n,
            },
            target_sync: match u32::try_from(cli.target_sync) {
                Ok(k) if k >= 1 => k,
                _ => {
                    return Err(format!(
                        "--target-sync {}: expected a count of steps from 1 to {}",
                        cli.target_sync,
                        u32::MAX
                    ));
                }
            },
            polyak: match cli.polyak {
                None => 0.0,
                Some(tau) if tau > 0.0 && tau <= 1.0 => tau,
                Some(tau) => {
                    return Err(format!(
                        "--polyak {tau}: expected τ with 0 < τ ≤ 1 (leave it out for a hard copy)"
                    ));
                }
            },
            report_every: match cli.report_every {
                0 => return Err("--report-every 0: expected a count of steps of at least 1".into()),
                n => n,
            },
            branch_sms: cli.branch_sms,
            iqn_kernel: match cli.iqn_kernel {
                IqnKernelChoice::Auto => None,
                IqnKernelChoice::Wgmma => Some(IqnFusedKernel::Wgmma),
                IqnKernelChoice::Mma => Some(IqnFusedKernel::MmaSync),
            },
            attention_kernel: match cli.attention {
                AttentionChoice::Auto => None,
                AttentionChoice::Fused => Some(AttentionKernel::Fused),
                AttentionChoice::Unfused => Some(AttentionKernel::Unfused),
            },
        };
        o.check_combination()?;
        Ok(o)
    }

    /// The rules that involve several options.
    fn check_combination(&self) -> std::result::Result<(), String> {
        let o = self;
        if o.source == Some(Source::Replay) {
            if o.check.is_some() || o.gpus.is_some() {
                // Both compare steps on batches that must be the same on both sides: the ones
                // the host generated, wrote to disk (`--check`) and split over the ranks.
                return Err(
                    "--source replay applies to the training run: --check and --gpus feed the \
                 host's batches"
                        .into(),
                );
            }
            if o.inject_nan.is_some() {
                return Err(
                    "--inject-nan poisons an uploaded batch: expected --source host or no --source"
                        .into(),
                );
            }
        }
        if let Some(dir) = &o.check {
            let steps = o.steps.unwrap_or(3);
            let k = o.target_sync as usize;
            if k <= steps {
                // reference.py recomputes every step against the target it read before step
                // 1 (target/): an update inside the checked steps would fail rows that are
                // right.
                return Err(format!(
                    "--check {} with --target-sync {k}: the target would be updated at step {k} \
                 of the {steps} checked, and reference.py checks every step against the \
                 target before step 1; expected --target-sync above {steps}",
                    dir.display()
                ));
            }
        }
        if let Some(t) = o.inject_nan {
            let steps = o.steps.unwrap_or(200).max(1);
            if o.check.is_some() || o.gpus.is_some() || o.serial_replay {
                return Err(
                "--inject-nan applies to the training run: expected it without --check, --gpus \
                 and --serial-replay"
                    .into(),
            );
            }
            if t == 0 || t > steps {
                return Err(format!(
                    "--inject-nan {t}: expected a step of the run, 1 to {steps} (--steps)"
                ));
            }
        }
        if !o.sizes.width.is_multiple_of(o.sizes.heads) {
            return Err(format!(
                "--width {} must be a multiple of --heads {}",
                o.sizes.width, o.sizes.heads
            ));
        }
        Ok(())
    }
}

fn main() -> std::process::ExitCode {
    if let Some(code) = stepgraph_picture::print_plan_if_asked(&dqn::PLAN) {
        return code;
    }
    // --help, --version and malformed options exit here, as clap does (status 2 on error).
    let options = match Options::from_cli(Cli::parse()) {
        Ok(o) => o,
        Err(e) => Cli::command().error(ErrorKind::ValueValidation, e).exit(),
    };
    println!("{}", dqn::PLAN);
    println!("{}", dqn::AUTO_PLAN);
    let device = match Device::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!(
                "the training run needs a CUDA GPU with compute capability 9.0 and the CUDA 13 \
                 libraries: {}",
                e.chain()
            );
            return std::process::ExitCode::SUCCESS;
        }
    };
    let run = match (&options.check, options.gpus) {
        _ if options.serial_replay => serial_replay(&device, &options),
        (Some(dir), _) => write_check(&device, &options, dir),
        (None, Some(n)) => parallel::run(&device, &options, n),
        (None, None) => train(&device, &options),
    };
    match run {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dqn failed: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            std::process::ExitCode::FAILURE
        }
    }
}

/// The shape of a parameter, by its MODEL.md name.
fn shape(name: &str, s: &Sizes) -> Vec<usize> {
    let base = name.split('.').next().unwrap_or(name);
    match base {
        "w1" => vec![s.hidden, s.state],
        "w2" => vec![s.hidden, s.hidden],
        "wv" | "we_hi" | "we_lo" | "wq" => vec![1, s.hidden],
        "wg" => vec![2 * s.glu, s.hidden],
        "bg" => vec![2 * s.glu],
        "wa" => vec![s.actions, s.glu],
        "ba" => vec![s.actions],
        "wphi" => vec![s.hidden, s.cosines],
        "wemb" => vec![s.width, s.state],
        "wqkv" => vec![3 * s.width, s.width],
        "wo" => vec![s.width, s.width],
        "wp" => vec![1, s.width],
        "b1" | "b2" | "bphi" => vec![s.hidden],
        "bemb" => vec![s.width],
        _ => vec![1], // bv, be_hi, be_lo, bq, bp
    }
}

/// The fan-in of the layer a parameter belongs to (PyTorch's Linear initialisation).
fn fan_in(name: &str, s: &Sizes) -> usize {
    let base = name.split('.').next().unwrap_or(name);
    match base {
        "w1" | "b1" | "wemb" | "bemb" => s.state,
        "wa" | "ba" => s.glu,
        "wphi" | "bphi" => s.cosines,
        "wqkv" | "wo" | "wp" | "bp" => s.width,
        _ => s.hidden,
    }
}

/// Uniform ±1/sqrt(fan_in) parameters; the target network is a perturbed copy.
fn initialise(rng: &mut Rng, s: &Sizes, step: &mut dqn::Step) -> Result<Vec<(String, Vec<f32>)>> {
    let mut init = Vec::new();
    for (name, buf) in step.buffers().params.named() {
        let bound = 1.0 / (fan_in(&name, s) as f32).sqrt();
        let v: Vec<f32> = (0..buf.len())
            .map(|_| (rng.next_f32() * 2.0 - 1.0) * bound)
            .collect();
        init.push((name, v));
    }
    // `named()` lists the tensors in one fixed order, for the parameters and the target.
    for (i, (name, v)) in init.iter().enumerate() {
        step.upload(|b| b.params.named()[i].1, v)?;
        let bound = 0.1 / (fan_in(name, s) as f32).sqrt();
        let t: Vec<f32> = v
            .iter()
            .map(|x| x + (rng.next_f32() * 2.0 - 1.0) * bound)
            .collect();
        step.upload(|b| b.target.named()[i].1, &t)?;
    }
    Ok(init)
}

/// One batch of generated transitions (MODEL.md's inputs), uploaded into the step.
#[derive(Clone)]
struct Transitions {
    s: Vec<f32>,
    s2: Vec<f32>,
    act: Vec<i32>,
    r: Vec<f32>,
    done: Vec<f32>,
    win: Vec<f32>,
    tau: Vec<f32>,
}

impl Transitions {
    fn generate(rng: &mut Rng, s: &Sizes) -> Transitions {
        let b = s.batch;
        let mut normals = |n: usize| (0..n).map(|_| rng.normal()).collect::<Vec<f32>>();
        let st = normals(b * s.state);
        let s2 = normals(b * s.state);
        let win = normals(b * s.window * s.state);
        let r = normals(b);
        let act = (0..b * D)
            .map(|_| (rng.next_u64() % s.actions as u64) as i32)
            .collect();
        let done = (0..b)
            .map(|_| if rng.next_f32() < 0.1 { 1.0 } else { 0.0 })
            .collect();
        let tau = (0..b * s.quantiles)
            .map(|_| 0.02 + 0.96 * rng.next_f32())
            .collect();
        Transitions {
            s: st,
            s2,
            act,
            r,
            done,
            win,
            tau,
        }
    }

    /// Into the step's host-fed staging slots, which its load ops copy into its batch at
    /// the next replay (waiting only for the replay that last read those slots); fails
    /// for a step that samples its replay buffer.
    fn stage(&self, step: &mut dqn::Step) -> Result<()> {
        self.stage_timed(step).map(|_| ())
    }

    /// [`Transitions::stage`], returning the milliseconds spent waiting for the slots.
    fn stage_timed(&self, step: &mut dqn::Step) -> Result<f64> {
        if step.buffers().source.host().is_none() {
            return Err(stepgraph::Error::Invalid(
                "a staged batch needs a step built with the host-fed source (--source host)".into(),
            ));
        }
        fn host(b: &dqn::Buffers) -> &HostBatch {
            b.source
                .host()
                .expect("checked above: the step is host-fed")
        }
        Ok(fill_from(step, |b| &host(b).s, &self.s)?
            + fill_from(step, |b| &host(b).s2, &self.s2)?
            + fill_from(step, |b| &host(b).act, &self.act)?
            + fill_from(step, |b| &host(b).r, &self.r)?
            + fill_from(step, |b| &host(b).done, &self.done)?
            + fill_from(step, |b| &host(b).win, &self.win)?
            + fill_from(step, |b| &host(b).tau, &self.tau)?)
    }

    fn write(&self, dir: &Path, s: &Sizes) -> std::result::Result<(), npy::NpyError> {
        let b = s.batch;
        npy::write(&dir.join("s.npy"), &[b, s.state], &self.s)?;
        npy::write(&dir.join("s2.npy"), &[b, s.state], &self.s2)?;
        npy::write(&dir.join("act.npy"), &[b, D], &self.act)?;
        npy::write(&dir.join("r.npy"), &[b], &self.r)?;
        npy::write(&dir.join("done.npy"), &[b], &self.done)?;
        npy::write(&dir.join("win.npy"), &[b, s.window, s.state], &self.win)?;
        npy::write(&dir.join("tau.npy"), &[b, s.quantiles], &self.tau)
    }
}

/// Fills the next staging slot of the input `select` picks with `data`, copied by as many
/// threads as the host has (a 33 MB window batch is several milliseconds for one);
/// returns the milliseconds spent waiting for the slot.
fn fill_from<T: Copy + Send + Sync>(
    step: &mut dqn::Step,
    select: impl FnOnce(&dqn::Buffers) -> &stepgraph::HostInput<T>,
    data: &[T],
) -> Result<f64> {
    let called = Instant::now();
    step.fill(select, |slot| {
        let waited = called.elapsed().as_secs_f64() * 1e3;
        if slot.len() != data.len() {
            return Err(stepgraph::Error::LengthMismatch {
                what: "a staged batch tensor".into(),
                expected: slot.len(),
                found: data.len(),
            });
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = data.len().div_ceil(threads).max(1 << 16);
        std::thread::scope(|scope| {
            for (d, s) in slot.chunks_mut(chunk).zip(data.chunks(chunk)) {
                scope.spawn(move || d.copy_from_slice(s));
            }
        });
        Ok(waited)
    })?
}

/// The step for `s` under `schedule`, its batches from `source` (a replay buffer of
/// `o.replay` rows filled from `o.seed`, the same for every step built with that seed),
/// its target updated as `o` says.
fn build(
    device: &Device,
    o: &Options,
    s: &Sizes,
    schedule: Schedule,
    source: Source,
) -> Result<dqn::Step> {
    build_rank(device, o, s, schedule, source, Communicator::single())
}

/// The step of one data-parallel rank (`s.batch` is this rank's slice of the batch).
fn build_rank(
    device: &Device,
    o: &Options,
    s: &Sizes,
    schedule: Schedule,
    source: Source,
    comm: Communicator,
) -> Result<dqn::Step> {
    let options = stepgraph::Options::from_env()?.with_schedule(schedule);
    build_with(device, o, s, options, source, comm)
}

/// [`build_rank`] with the step's options given whole.
fn build_with(
    device: &Device,
    o: &Options,
    s: &Sizes,
    options: stepgraph::Options,
    source: Source,
    comm: Communicator,
) -> Result<dqn::Step> {
    let kernels = std::sync::Arc::new(Kernels::load(device)?);
    let source = match source {
        Source::Replay => BatchSource::Replay(ReplayBuffer::generated(
            device, &kernels, s, o.replay, o.seed,
        )?),
        Source::Host => BatchSource::Host(HostBatch::new(device, s)?),
    };
    let attention = model::attention_path(&kernels, s, o.attention_kernel);
    let buffers = model::allocate(device, s, source, comm, attention)?;
    let config = dqn::Config {
        sizes: *s,
        gamma: GAMMA,
        hyper: HYPER,
        replay_seed: o.seed,
        target_sync: o.target_sync,
        polyak: o.polyak,
        branch_sms: o.branch_sms,
        iqn_kernel: o.iqn_kernel,
        attention_kernel: Some(attention),
    };
    dqn::Step::with_options(device, kernels, buffers, config, options)
}

/// What the capture guard costs: the planned step captured again (dry pass, capture,
/// instantiate) with the guard on and with it off, alternated, and both steps' replays,
/// alternated too. Medians in ms: (capture on, capture off, replay on, replay off).
fn guard_cost(device: &Device, o: &Options) -> Result<[f64; 4]> {
    let s = &o.sizes;
    let options = stepgraph::Options::from_env()?.with_schedule(Schedule::Planned);
    let mut steps = Vec::new();
    for guard in [true, false] {
        let options = options.clone().with_capture_guard(guard);
        let mut step = build_with(device, o, s, options, o.source(), Communicator::single())?;
        initialise(&mut Rng::new(o.seed), s, &mut step)?;
        set_step_count(&mut step, 1)?;
        steps.push(step);
    }
    let (mut capture, mut replay) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..10 {
        for (i, step) in steps.iter_mut().enumerate() {
            step.wait()?;
            let t = Instant::now();
            step.rebind(|_| ())?;
            capture[i].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    for _ in 0..5 {
        for (i, step) in steps.iter_mut().enumerate() {
            replay[i].extend(step.time_replays(10, 40)?);
        }
    }
    let [c_on, c_off] = capture.each_mut().map(|v| median(v));
    let [r_on, r_off] = replay.each_mut().map(|v| median(v));
    Ok([c_on, c_off, r_on, r_off])
}

/// Stages Adam's step count `t` (lr and the bias corrections) for the next replay: it
/// waits only for the replay two back, which read the slot it writes.
fn set_step_count(step: &mut dqn::Step, t: u32) -> Result<()> {
    let values = AdamScalars::at_step(LR, &HYPER, t).values();
    step.stage(|b| &b.optim.scalars_in, &values)
}

/// The seven loss values of the last replay: L, L_td, L_iql, L_iqn, L_attn, L_cql, L_conf.
fn losses(step: &dqn::Step) -> Result<[f32; 7]> {
    Ok(watch(step)?.losses)
}

/// The step's watch after the last replay (one small download; `watch_step` sums L from
/// the three loss buffers in the order the host would).
fn watch(step: &dqn::Step) -> Result<Watch> {
    let words = step.download(|b| &b.health.watch)?;
    Watch::parse(&words, step.buffers().grads().len())
}

/// The last replay's losses, from the step's watch ([`Watch`]); fails with the report of
/// the first replay that was not finite ([`non_finite_report`]) once there was one. One
/// small download.
pub(crate) fn check_finite(step: &dqn::Step) -> Result<[f32; 7]> {
    let watch = watch(step)?;
    match &watch.bad {
        Some(bad) => Err(stepgraph::Error::Invalid(non_finite_report(
            bad,
            &tensors(step),
        ))),
        None => Ok(watch.losses),
    }
}

/// Every gradient's name and length, in the parameter table's order (the watch's).
fn tensors(step: &dqn::Step) -> Vec<(String, usize)> {
    step.buffers()
        .grads()
        .into_iter()
        .map(|(name, buf)| (name, buf.len()))
        .collect()
}

/// What went non-finite in the replay the watch latched, by MODEL.md's names: its
/// losses, its gradients with their NaN and Inf elements, or a sum of squares that
/// overflowed. The watch applied neither it nor any later replay.
fn non_finite_report(bad: &BadReplay, tensors: &[(String, usize)]) -> String {
    let t = bad.replay;
    let mut parts = Vec::new();
    let bad_losses: Vec<String> = LossSlot::ALL
        .iter()
        .zip(&bad.losses)
        .filter(|(_, x)| !x.is_finite())
        .map(|(slot, x)| format!("{} = {x}", slot.model_name()))
        .collect();
    if !bad_losses.is_empty() {
        parts.push(format!("loss {}", bad_losses.join(", ")));
    }
    let bad_grads: Vec<String> = tensors
        .iter()
        .zip(&bad.non_finite)
        .filter(|(_, (nan, inf))| nan + inf > 0)
        .map(|((name, len), (nan, inf))| format!("{name} ({nan} NaN, {inf} Inf of {len})"))
        .collect();
    if !bad_grads.is_empty() {
        parts.push(format!(
            "{} of {} gradients: {}",
            bad_grads.len(),
            tensors.len(),
            bad_grads.join(", ")
        ));
    } else if !bad.sq_norm.is_finite() {
        parts.push(format!(
            "the gradients' sum of squares ({}), though every gradient is finite",
            bad.sq_norm
        ));
    }
    format!(
        "step {t} is not finite: {}; it was not applied, nor any step after it: the \
         parameters and Adam's moments are those after step {}; training stopped",
        parts.join("; "),
        t - 1
    )
}

/// Every parameter and Adam moment, host side: what `--inject-nan` compares across the
/// step it poisons.
fn optimizer_state(step: &dqn::Step) -> Result<Vec<Vec<f32>>> {
    step.buffers()
        .state()
        .into_iter()
        .flat_map(|(_, named)| named)
        .map(|(_, buf)| step.executor().download(buf))
        .collect()
}

fn io_error(e: impl std::fmt::Display) -> stepgraph::Error {
    stepgraph::Error::Invalid(e.to_string())
}

/// Runs `steps` steps from a generated initialisation and writes everything reference.py
/// needs to check them (its layout is described at the top of reference.py).
fn write_check(device: &Device, o: &Options, dir: &Path) -> Result<()> {
    let s = &o.sizes;
    let steps = o.steps.unwrap_or(3);
    let mut rng = Rng::new(o.seed);
    let mut step = build(device, o, s, Schedule::Planned, Source::Host)?;
    let init = initialise(&mut rng, s, &mut step)?;
    for (name, v) in &init {
        npy::write(
            &dir.join("init").join(format!("{name}.npy")),
            &shape(name, s),
            v,
        )
        .map_err(io_error)?;
    }
    for (name, buf) in step.buffers().target.named() {
        let trainable_only = [
            "we_", "be_", "wphi", "bphi", "wq", "bq", "wemb", "bemb", "wqkv", "wo", "wp", "bp",
        ];
        if trainable_only.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let v = step.executor().download(buf)?;
        npy::write(
            &dir.join("target").join(format!("{name}.npy")),
            &shape(&name, s),
            &v,
        )
        .map_err(io_error)?;
    }
    let sizes_json = format!(
        "{{\"B\": {}, \"S\": {}, \"H\": {}, \"D\": {D}, \"G\": {}, \"A\": {}, \"N\": {}, \"C\": {}, \"W\": {}, \"E\": {}, \"Hh\": {}, \
         \"gamma\": {GAMMA}, \"lr\": {LR}, \"beta1\": {}, \"beta2\": {}, \"eps\": {}, \"max_norm\": {}, \
         \"c_iql\": 0.5, \"c_iqn\": 0.5, \"c_attn\": 0.1, \"c_cql\": 0.1, \"c_conf\": 0.05, \"steps\": {steps}, \"seed\": {}}}\n",
        s.batch,
        s.state,
        s.hidden,
        s.glu,
        s.actions,
        s.quantiles,
        s.cosines,
        s.window,
        s.width,
        s.heads,
        HYPER.beta1,
        HYPER.beta2,
        HYPER.eps,
        HYPER.max_norm,
        o.seed
    );
    std::fs::write(dir.join("sizes.json"), sizes_json).map_err(io_error)?;
    for k in 1..=steps {
        let batch = Transitions::generate(&mut rng, s);
        batch
            .write(&dir.join(format!("step{k}/in")), s)
            .map_err(io_error)?;
        batch.stage(&mut step)?;
        set_step_count(&mut step, k as u32)?;
        step.replay()?;
        let out = dir.join(format!("step{k}/out"));
        let l = losses(&step)?;
        npy::write(&out.join("loss.npy"), &[7], &l).map_err(io_error)?;
        // The state after the step too (parameters and Adam's moments): reference.py
        // starts its step k+1 from exactly what this side started it from.
        let bufs = step.buffers();
        for (kind, named) in std::iter::once(("grad", bufs.grads())).chain(bufs.state()) {
            for (name, buf) in named {
                let v = step.executor().download(buf)?;
                npy::write(
                    &out.join(kind).join(format!("{name}.npy")),
                    &shape(&name, s),
                    &v,
                )
                .map_err(io_error)?;
            }
        }
        println!(
            "check step {k}: loss {:.6} (td {:.5} iql {:.5} iqn {:.5} attn {:.5} cql {:.5} conf {:.5})",
            l[0], l[1], l[2], l[3], l[4], l[5], l[6]
        );
    }
    println!(
        "wrote {}; check it with: python3 examples/dqn/reference.py check {}",
        dir.display(),
        dir.display()
    );
    Ok(())
}

/// A step under `schedule`, initialised from `o.seed`, with the first generated batch
/// uploaded (host-fed) or its replay buffer filled from the seed (sampled), and the step
/// count at 1: the same values for every schedule compared.
fn seeded_step(device: &Device, o: &Options, schedule: Schedule) -> Result<dqn::Step> {
    seeded_step_from(device, o, schedule, o.source())
}

/// [`seeded_step`] with its batches from `source`.
fn seeded_step_from(
    device: &Device,
    o: &Options,
    schedule: Schedule,
    source: Source,
) -> Result<dqn::Step> {
    let s = &o.sizes;
    let mut step = build(device, o, s, schedule, source)?;
    let mut rng = Rng::new(o.seed);
    initialise(&mut rng, s, &mut step)?;
    if source == Source::Host {
        Transitions::generate(&mut rng, s).stage(&mut step)?;
    }
    set_step_count(&mut step, 1)?;
    Ok(step)
}

/// One replay of the one-stream step, nothing else launched after it: under Nsight
/// Compute the last kernels profiled are the graph's, in capture order.
fn serial_replay(device: &Device, o: &Options) -> Result<()> {
    let mut serial = seeded_step(device, o, Schedule::OneStream)?;
    serial.replay()?;
    serial.wait()?;
    let counts = serial.executor().node_counts()?;
    println!(
        "replayed the one-stream step once: {} kernel nodes",
        counts.kernels
    );
    Ok(())
}

/// The main job: trains on generated transitions, then compares the schedules.
fn train(device: &Device, o: &Options) -> Result<()> {
    let s = &o.sizes;
    println!("device: {}; sizes {s:?}", device.name());
    let source = o.source();
    match source {
        Source::Replay => println!(
            "batches: sampled inside the graph from a replay buffer of {} transitions",
            o.replay
        ),
        Source::Host => println!("batches: generated on the host and uploaded before each step"),
    }
    let target = if o.polyak > 0.0 {
        format!("Polyak update with τ = {}", o.polyak)
    } else {
        "copy".to_string()
    };
    println!("target network: {target} every {} steps", o.target_sync);
    let mut rng = Rng::new(o.seed);
    let t0 = Instant::now();
    let mut step = build(device, o, s, Schedule::Planned, source)?;
    println!(
        "built and captured the step in {:.1} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    println!("{}", step.verify()?);
    initialise(&mut rng, s, &mut step)?;
    let pool: Vec<Transitions> = match source {
        Source::Host => (0..4).map(|_| Transitions::generate(&mut rng, s)).collect(),
        Source::Replay => Vec::new(),
    };
    let steps = o.steps.unwrap_or(200).max(1);
    let every = o.report_every;
    let samples = s.batch as f64;
    let bar = indicatif::ProgressBar::new(steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("[{bar:40}] step {pos:>5}/{len}  {msg}  eta {eta}")
            .map_err(io_error)?
            .progress_chars("#>."),
    );
    // Without a terminal (a log) the bar draws nothing: a line per report instead.
    let lines = bar.is_hidden();
    // The step `--inject-nan` poisons and the state before it, to show that it is kept.
    let mut poisoned: Option<(usize, Vec<Vec<f32>>)> = None;
    let start = Instant::now();
    for t in 1..=steps {
        if o.inject_nan == Some(t) {
            // The one wait of the loop: the state before the poisoned step.
            step.wait()?;
            poisoned = Some((t, optimizer_state(&step)?));
            let mut batch = pool[t % pool.len()].clone();
            batch.win[0] = f32::NAN;
            batch.stage(&mut step)?;
        } else if !pool.is_empty() {
            pool[t % pool.len()].stage(&mut step)?;
        }
        set_step_count(&mut step, t as u32)?;
        step.replay()?;
        // Every `every` steps the newest finished replay's watch, without waiting (the
        // last step waits for its own): the losses, and the bad step if there was one.
        if t % every == 0 || t == steps {
            let watch = read_watch(&step, t == steps)?;
            if let Some(w) = watch {
                let rate = t as f64 / start.elapsed().as_secs_f64();
                let msg = format!(
                    "loss {:.5} (step {})  {rate:.0} steps/s  {:.2}M samples/s",
                    w.losses[0],
                    w.replays,
                    rate * samples / 1e6
                );
                bar.set_position(t as u64);
                bar.set_message(msg.clone());
                if lines {
                    println!("step {t:>5}/{steps}  {msg}");
                }
                if let Some(bad) = &w.bad {
                    bar.abandon();
                    return Err(stopped_at(&step, bad, poisoned.take())?);
                }
            }
        }
    }
    step.wait()?;
    let wall = start.elapsed().as_secs_f64() * 1e3;
    bar.finish();
    if let Some((t, _)) = poisoned {
        return Err(stepgraph::Error::Invalid(format!(
            "--inject-nan {t}: the step with a NaN in its batch passed the finite check"
        )));
    }
    let e2e = wall / steps as f64;
    println!(
        "end to end: {e2e:.3} ms per training step ({steps} steps in {:.2} s, {:.0} steps/s, \
         {:.2}M samples/s), batches {}",
        wall / 1e3,
        1e3 / e2e,
        samples / e2e / 1e3,
        match source {
            Source::Replay => "sampled inside the graph",
            Source::Host => "staged by the host",
        }
    );
    compare(device, o, &mut step, e2e)
}

/// The step's watch as the newest finished replay left it, without waiting (`None` if
/// none has finished), or with `latest` as the latest replay did, waiting for it.
fn read_watch(step: &dqn::Step, latest: bool) -> Result<Option<Watch>> {
    let n = tensors(step).len();
    if latest {
        let w = step.read_back_latest(|b| &b.health.watch_out)?;
        return Watch::parse(&w, n).map(Some);
    }
    step.read_back(|b| &b.health.watch_out)?
        .map(|w| Watch::parse(&w, n))
        .transpose()
}

/// The error that stops training at the bad step the watch latched: its report, and
/// for `--inject-nan`, whether the state is the one before it, bit for bit.
fn stopped_at(
    step: &dqn::Step,
    bad: &BadReplay,
    poisoned: Option<(usize, Vec<Vec<f32>>)>,
) -> Result<stepgraph::Error> {
    if let Some((t, before)) = poisoned {
        step.wait()?;
        let kept = before == optimizer_state(step)?;
        println!(
            "--inject-nan {t}: the parameters and Adam's moments now {} those after step {} \
             (bit for bit); the watch latched step {}",
            if kept { "are" } else { "are NOT" },
            t - 1,
            bad.replay
        );
    }
    Ok(stepgraph::Error::Invalid(non_finite_report(
        bad,
        &tensors(step),
    )))
}

/// The end-to-end time per training step of one way of feeding the step: the wall time
/// of the main loop's steps divided by their number, fresh data every step, the watch
/// read back every `--report-every` steps; next to the replay time of the same graph.
struct EndToEnd {
    source: Source,
    steps: usize,
    /// Wall time per step of the loop.
    e2e_ms: f64,
    /// Median replay time of the same graph (CUDA events), sampling or staged copies
    /// included.
    replay_ms: f64,
    /// Host time per step spent staging the batch (waiting for its slot included).
    staging_ms: f64,
    /// Host time per step spent waiting for a slot (the replay two back to finish).
    waiting_ms: f64,
    /// The first steps as the host saw them: (staging began, staged, replay launched), ms
    /// from the loop's start.
    timeline: Vec<(f64, f64, f64)>,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Replay => "device-sampled",
            Source::Host => "host-fed",
        }
    }
}

impl EndToEnd {
    fn name(&self) -> &'static str {
        self.source.name()
    }

    fn json(&self) -> String {
        format!(
            "{{\"source\": \"{}\", \"steps\": {}, \"end_to_end_ms\": {}, \"replay_ms\": {}, \"staging_ms\": {}, \"waiting_ms\": {}}}",
            self.name(),
            self.steps,
            self.e2e_ms,
            self.replay_ms,
            self.staging_ms,
            self.waiting_ms
        )
    }
}

impl std::fmt::Display for EndToEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "end to end, {}: {:.3} ms per step over {} steps; its graph replays in {:.3} ms \
             ((e)/(c) = {:.3}); host staging {:.3} ms per step, {:.3} of it waiting for a slot",
            self.name(),
            self.e2e_ms,
            self.steps,
            self.replay_ms,
            self.e2e_ms / self.replay_ms,
            self.staging_ms,
            self.waiting_ms
        )?;
        if self.source == Source::Host {
            // Staging n+1 while replay n runs: each staging ends long before the replay
            // it feeds could start, since replay n takes `replay_ms` after its launch.
            writeln!(f, "host timeline (ms from the loop's start):")?;
            for (k, (a, b, l)) in self.timeline.iter().enumerate() {
                writeln!(
                    f,
                    "  step {:>2}: staged {a:8.3} .. {b:8.3}, launched {l:8.3}",
                    k + 1
                )?;
            }
        }
        Ok(())
    }
}

/// The main loop on a step of its own, fed from `source`: warm-up steps, then `steps`
/// timed ones. Host-fed, every step stages one of eight generated batches in turn (a
/// fresh copy into the staging slot: what a host-side replay's gather costs at least).
fn end_to_end(device: &Device, o: &Options, source: Source, steps: usize) -> Result<EndToEnd> {
    let s = &o.sizes;
    let mut step = seeded_step_from(device, o, Schedule::Planned, source)?;
    let mut rng = Rng::new(o.seed ^ 0xe2e);
    let pool: Vec<Transitions> = match source {
        Source::Host => (0..8).map(|_| Transitions::generate(&mut rng, s)).collect(),
        Source::Replay => Vec::new(),
    };
    let every = o.report_every;
    let run = |step: &mut dqn::Step, n: usize, record: bool| -> Result<EndToEnd> {
        let start = Instant::now();
        let ms = |t: Instant| t.duration_since(start).as_secs_f64() * 1e3;
        let (mut staging, mut waiting) = (0.0, 0.0);
        let mut timeline = Vec::new();
        for t in 1..=n {
            let a = Instant::now();
            if !pool.is_empty() {
                waiting += pool[t % pool.len()].stage_timed(step)?;
            }
            set_step_count(step, t as u32)?;
            let b = Instant::now();
            staging += (b - a).as_secs_f64() * 1e3;
            step.replay()?;
            if record && timeline.len() < 8 {
                timeline.push((ms(a), ms(b), ms(Instant::now())));
            }
            if t % every == 0 {
                read_watch(step, false)?;
            }
        }
        step.wait()?;
        let per = |x: f64| x / n as f64;
        Ok(EndToEnd {
            source,
            steps: n,
            e2e_ms: per(ms(Instant::now())),
            replay_ms: 0.0,
            staging_ms: per(staging),
            waiting_ms: per(waiting),
            timeline,
        })
    };
    run(&mut step, 20, false)?;
    let mut e2e = run(&mut step, steps, true)?;
    e2e.replay_ms = median(&mut step.executor().time_replays(30, steps)?);
    if let Some(bad) = read_watch(&step, true)?.and_then(|w| w.bad) {
        return Err(stepgraph::Error::Invalid(non_finite_report(
            &bad,
            &tensors(&step),
        )));
    }
    Ok(e2e)
}

/// A part of the step whose floor the benchmark reports: its count, and its kernels'
/// time alone and share of the work bound.
struct FloorRow {
    part: &'static str,
    floor: Floor,
    alone_ms: f64,
    work_ms: f64,
}

impl FloorRow {
    fn json(&self, c: &Ceilings) -> String {
        format!(
            "{{\"part\": \"{}\", \"tensor_flop\": {}, \"bytes\": {}, \"floor_ms\": {}, \"kernels_alone_ms\": {}, \"work_ms\": {}}}",
            self.part,
            self.floor.tensor_flop,
            self.floor.bytes,
            self.floor.ms(c),
            self.alone_ms,
            self.work_ms
        )
    }
}

/// IQN, attention and the whole step: counted floors beside the measured work.
fn floor_rows(s: &Sizes, work: &stepgraph::WorkBound) -> [FloorRow; 3] {
    let ops = |names: &[&str]| {
        work.ops
            .iter()
            .filter(|o| names.contains(&o.name.as_str()))
            .fold((0.0, 0.0), |(a, w), o| (a + o.alone_ms(), w + o.work_ms()))
    };
    let row = |part, floor, (alone_ms, work_ms)| FloorRow {
        part,
        floor,
        alone_ms,
        work_ms,
    };
    [
        row("IQN (iqn_head)", floor::iqn(s), ops(&["iqn_head"])),
        row(
            "attention (attention_head, attention_wgrad)",
            floor::attention(s),
            ops(&["attention_head", "attention_wgrad"]),
        ),
        row(
            "the step",
            floor::step(s),
            (work.alone_ms(), work.bound_ms()),
        ),
    ]
}

/// Prints the floors of IQN, attention and the step at `ceilings` beside their kernels'
/// time and work, and (c) against the step's; returns them as JSON objects.
fn print_floors(
    s: &Sizes,
    work: &stepgraph::WorkBound,
    ceilings: &Ceilings,
    c: f64,
) -> Vec<String> {
    let floors = floor_rows(s, work);
    println!("ceilings: {ceilings}");
    println!(
        "| part | counted | floor ms (arithmetic, bytes) | kernels alone ms | work ms | alone / floor | rate alone, share of the TF32 matmul rate | rate at the SMs held (work ms), share |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &floors {
        let rate = r.floor.tensor_flop / (r.alone_ms * 1e-3);
        // A kernel that holds fewer SMs than the GPU has (the step's persistent heads) is
        // also judged against those SMs' part of the rate: its work is its time alone
        // times the share of the GPU its grid holds.
        let rate_held = r.floor.tensor_flop / (r.work_ms * 1e-3);
        println!(
            "| {} | {} | {:.4} ({:.4}, {:.4}) | {:.4} | {:.4} | {:.2} | {:.1} TFLOP/s, {:.0}% | {:.1} TFLOP/s, {:.0}% |",
            r.part,
            r.floor,
            r.floor.ms(ceilings),
            r.floor.compute_ms(ceilings),
            r.floor.memory_ms(ceilings),
            r.alone_ms,
            r.work_ms,
            r.alone_ms / r.floor.ms(ceilings),
            rate / 1e12,
            100.0 * rate / ceilings.tf32_flop_per_s,
            rate_held / 1e12,
            100.0 * rate_held / ceilings.tf32_flop_per_s
        );
    }
    let step = floors[2].floor.ms(ceilings);
    println!(
        "| (c) against the step's floor | | {step:.4} | | | (c)/floor = {:.2} | | |",
        c / step
    );
    floors.iter().map(|r| r.json(ceilings)).collect()
}

/// (a) eager, (b) one-stream graph, (c) stepgraph graph, (d) the critical-path bound.
fn compare(device: &Device, o: &Options, planned: &mut dqn::Step, trained_e2e: f64) -> Result<()> {
    let s = &o.sizes;
    let reps = 200;
    let c = median(&mut planned.executor().time_replays(30, reps)?);
    // End to end, both ways of feeding the step, each on a step of its own.
    let feeds = [Source::Replay, Source::Host]
        .into_iter()
        .map(|source| end_to_end(device, o, source, reps))
        .collect::<Result<Vec<EndToEnd>>>()?;
    for f in &feeds {
        println!("{f}");
    }
    // The same step on one stream, from the same initialisation and batch (or replay
    // buffer, filled from the same seed).
    let mut serial = seeded_step(device, o, Schedule::OneStream)?;
    let b = median(&mut serial.executor().time_replays(30, reps)?);
    // The planned step with the declared stream priorities ignored: what they buy.
    let c_flat = median(
        &mut seeded_step(device, o, Schedule::PlannedEqualPriority)?
            .executor()
            .time_replays(30, reps)?,
    );
    // The same ops placed wholly by the planner (`compare(auto)`), from the costs file.
    let c_auto = median(
        &mut seeded_step(device, o, Schedule::Automatic)?
            .executor()
            .time_replays(30, reps)?,
    );
    let mut eager = Vec::new();
    for _ in 0..30 {
        serial.run_eager()?;
    }
    serial.wait()?;
    for _ in 0..reps {
        let t = Instant::now();
        serial.run_eager()?;
        serial.wait()?;
        eager.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let a = median(&mut eager);
    let [cap_on, cap_off, rep_on, rep_off] = guard_cost(device, o)?;
    println!(
        "capture guard: the step captured again (dry pass, capture, instantiate) in {cap_on:.2} ms \
         with it, {cap_off:.2} ms without ({:.2}x); replayed in {rep_on:.4} ms with it, \
         {rep_off:.4} ms without ({:.3}x)",
        cap_on / cap_off,
        rep_on / rep_off
    );
    // Each op's time alone: the one-stream profile runs one op at a time.
    let alone = serial.profile(50)?;
    let (path, d) = dqn::PLAN.longest_path(&alone.durations_ms());
    let profile = planned.profile(50)?;
    println!("{profile}");
    println!(
        "critical path (ops alone): {}",
        path.iter()
            .map(|o| dqn::PLAN.ops[o.index()].name)
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    // Each op alone (one-stream profile) and inside the parallel run: where the parallel
    // ops contend for the GPU.
    print!("{}", profile.contention_table(&alone));
    // The work bound, last: it runs every kernel of the one-stream step many times over,
    // and that step's values are not used again.
    let work = serial.work_bound()?;
    println!("{work}");
    // The measured costs, as the file `compare(auto)` reads (`examples/dqn/src/dqn.costs`).
    let costs = std::path::Path::new(&std::env::var_os("OUT").unwrap_or_else(|| ".".into()))
        .join("dqn.costs");
    match std::fs::write(&costs, work.op_costs().to_string()) {
        Ok(()) => println!("op costs written to {}", costs.display()),
        Err(e) => eprintln!("dqn: could not write {}: {e}", costs.display()),
    }
    for op in [
        "attention_head",
        "attention_wgrad",
        "iqn_head",
        "branch_backward[0]",
        "branch_wgrad[0]",
        "iql_high",
        "trunk_backward",
    ] {
        print!("{}", work.kernel_table(op));
    }
    let bounds =
        Bounds::of_plan(c, &dqn::PLAN, &alone.durations_ms(), &work).with_automatic(c_auto);
    let (w, wg, bound) = (bounds.work_ms, bounds.grid_work_ms, bounds.larger_ms());
    let p = bounds.chains.map_or(0.0, |p| p.ms);
    println!("| variant | median ms | ratio |");
    println!("| --- | --- | --- |");
    println!("| (a) eager, one stream | {a:.3} | |");
    println!("| (b) one-stream graph | {b:.3} | |");
    println!("| (c) stepgraph graph | {c:.3} | (c)/(b) = {:.3} |", c / b);
    println!(
        "| (c') stepgraph graph, equal stream priorities | {c_flat:.3} | (c)/(c') = {:.3} |",
        c / c_flat
    );
    println!(
        "(c-auto) saves {:.0}% of what (c) saves over (b)",
        100.0 * (b - c_auto) / (b - c)
    );
    for f in &feeds {
        println!(
            "| (e) end to end per training step, {} | {:.3} | (e)/(c) of its graph ({:.3}) = {:.3} |",
            f.name(),
            f.e2e_ms,
            f.replay_ms,
            f.e2e_ms / f.replay_ms
        );
    }
    // The grid bound weights each kernel by the share of the GPU its grid occupies,
    // min(1, blocks / resident): (w'). (w) is the stricter reading.
    print!("{bounds}");
    // How much of what the DAG and the GPU allow (from (b) down to the larger bound) the
    // planned schedule took.
    let allowed = b - bound;
    let taken = if allowed > 0.0 {
        (b - c) / allowed
    } else {
        f64::NAN
    };
    println!(
        "(c) saves {:.3} ms of the {:.3} ms between (b) and the larger bound: {:.0}%",
        b - c,
        allowed,
        100.0 * taken
    );
    let parts = breakdown(&profile);
    println!("step breakdown: {parts}");
    // The floors (floor.rs) beside the kernels' time: what kernels could reach at this
    // GPU's ceilings, measured last so that nothing above runs beside its 3 GB.
    let (ceilings_json, floors_json) = match Ceilings::measure(device) {
        Ok(ceilings) => (
            format!(
                "{{\"tf32_flop_per_s\": {}, \"copy_bytes_per_s\": {}}}",
                ceilings.tf32_flop_per_s, ceilings.copy_bytes_per_s
            ),
            print_floors(s, &work, &ceilings, c),
        ),
        // The figures above stand without the floors.
        Err(e) => {
            println!(
                "floors left out: the ceilings could not be measured: {}",
                e.chain()
            );
            ("null".to_string(), Vec::new())
        }
    };
    println!(
        "end to end in the training run above: {trained_e2e:.3} ms per step ({})",
        o.source().name()
    );
    let feeds_json: Vec<String> = feeds.iter().map(EndToEnd::json).collect();
    let dir = PathBuf::from(std::env::var_os("OUT").unwrap_or_else(|| ".".into()));
    let ops: Vec<String> = alone
        .ops
        .iter()
        .zip(&profile.ops)
        .zip(&work.ops)
        .map(|((a, p), k)| {
            format!(
                "{{\"op\": \"{}\", \"alone_ms\": {}, \"in_parallel_ms\": {}, \"kernels_alone_ms\": {}, \"work_ms\": {}}}",
                a.name,
                a.duration_ms(),
                p.duration_ms(),
                k.alone_ms(),
                k.work_ms()
            )
        })
        .collect();
    // Every kernel node in capture order, for a bound that also counts each kernel's
    // share of DRAM bandwidth (examples/dqn/dram_bound.py, with bytes from Nsight Compute).
    let kernels: Vec<String> = work
        .ops
        .iter()
        .flat_map(|o| o.kernels.iter().map(move |k| (o, k)))
        .map(|(o, k)| {
            format!(
                "{{\"op\": \"{}\", \"name\": \"{}\", \"blocks\": {}, \"threads\": {}, \"resident\": {}, \"share\": {}, \"grid_share\": {}, \"alone_ms\": {}}}",
                o.name, k.name, k.blocks, k.threads, k.resident, k.share, k.grid_share, k.alone_ms
            )
        })
        .collect();
    let json = format!(
        "{{\"device\": \"{}\", \"sizes\": \"{s:?}\", \"batch\": {}, \"reps\": {reps}, \"eager_ms\": {a}, \"one_stream_graph_ms\": {b}, \"stepgraph_graph_ms\": {c}, \"equal_priority_graph_ms\": {c_flat}, \"auto_graph_ms\": {c_auto}, \"critical_path_bound_ms\": {d}, \"work_bound_ms\": {w}, \"grid_work_bound_ms\": {wg}, \"chains_bound_ms\": {p}, \"kernels_alone_ms\": {}, \"larger_bound_ms\": {bound}, \"c_over_b\": {}, \"c_over_d\": {}, \"c_over_larger_bound\": {}, \"share_of_allowed_saving_taken\": {}, \"breakdown\": \"{}\", \"trained_end_to_end_ms\": {trained_e2e}, \"end_to_end\": [{}], \"ceilings\": {}, \"floors\": [{}], \"ops\": [{}], \"kernels\": [{}]}}\n",
        device.name(),
        s.batch,
        work.alone_ms(),
        c / b,
        c / d,
        c / bound,
        if taken.is_finite() {
            taken.to_string()
        } else {
            "null".into()
        },
        parts,
        feeds_json.join(", "),
        ceilings_json,
        floors_json.join(", "),
        ops.join(", "),
        kernels.join(", ")
    );
    let _ = std::fs::write(dir.join("dqn_bench.json"), json);
    match stepgraph_picture::record::to_string(&profile) {
        Ok(text) => {
            let _ = std::fs::write(dir.join("dqn.profile.json"), text);
        }
        Err(e) => eprintln!("dqn: could not record the profile: {e}"),
    }
    let _ = std::fs::write(
        dir.join("dqn.timeline.svg"),
        stepgraph_picture::timeline_svg(&profile),
    );
    match stepgraph_picture::trace_json(&profile) {
        Ok(text) => {
            let _ = std::fs::write(dir.join("dqn.trace.json"), text);
        }
        Err(e) => eprintln!("dqn: could not write the trace: {e}"),
    }
    Ok(())
}

/// The part of the step an op belongs to, for the one-line breakdown.
fn part_of(func: &str) -> &'static str {
    match func {
        "begin" | "trunk_forward_s" | "trunk_backward" => "trunk",
        "draw_sample" | "load_batch" | "load_window" => "batch",
        "branch_forward" | "branch_backward" | "branch_wgrad" => "branches",
        "trunk_forward_next" | "branch_forward_next" | "double_dqn_target" | "dueling_losses" => {
            "ddqn"
        }
        "clip_and_adam" | "update_target" | "report" => "adam",
        f if f.starts_with("reduce_") => "allreduce",
        _ => "aux",
    }
}

/// `trunk=.. branches=.. ddqn=.. aux=.. adam=.. allreduce=.. batch=..`: each part's summed
/// op time in ms, from a profile (ops on parallel streams add up, so the parts can sum to
/// more than the step). `allreduce` is the data-parallel collectives (about nothing on one
/// GPU); `batch` the draw and the loads of the batch.
fn breakdown(profile: &stepgraph::Profile) -> String {
    let names = [
        "trunk",
        "branches",
        "ddqn",
        "aux",
        "adam",
        "allreduce",
        "batch",
    ];
    let mut ms = [0.0f64; 7];
    for op in &profile.ops {
        if let Some(i) = names.iter().position(|&n| n == part_of(&op.func)) {
            ms[i] += op.duration_ms();
        }
    }
    names
        .iter()
        .zip(ms)
        .map(|(n, t)| format!("{n}={t:.3}ms"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> std::result::Result<Options, String> {
        let cli = Cli::try_parse_from(std::iter::once("dqn").chain(line.split_whitespace()))
            .map_err(|e| e.to_string())?;
        Options::from_cli(cli)
    }

    #[test]
    fn the_command_line_is_consistent_and_has_help() {
        Cli::command().debug_assert();
        let help = Cli::try_parse_from(["dqn", "--help"]).unwrap_err();
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        for flag in [
            "--steps",
            "--check",
            "--branch-sms",
            "--print-plan",
            "--heads",
        ] {
            assert!(help.to_string().contains(flag), "{flag}");
        }
    }

    #[test]
    fn options_parse_and_bad_ones_say_what_was_expected() {
        let o = parse("--steps 30 --inject-nan 17 --batch 1024 --glu 48").unwrap();
        assert_eq!((o.steps, o.inject_nan), (Some(30), Some(17)));
        assert_eq!((o.sizes.batch, o.sizes.glu), (1024, 48));
        // --inject-nan uploads its poisoned batch: the host-fed source, unless told.
        assert_eq!(o.source(), Source::Host);
        let o = parse("").unwrap();
        assert_eq!(o.source(), Source::Replay);
        assert_eq!((o.replay, o.target_sync, o.polyak), (1_000_000, 100, 0.0));
        let o = parse("--source host --replay 4096 --target-sync 4 --polyak 0.005").unwrap();
        assert_eq!(o.source(), Source::Host);
        assert_eq!((o.replay, o.target_sync, o.polyak), (4096, 4, 0.005));
        assert_eq!(parse("--polyak 1").unwrap().polyak, 1.0);
        assert_eq!(
            parse("").unwrap().branch_sms,
            SmTarget::Share(dqn::BRANCH_WIDTH as u32)
        );
        assert_eq!(
            parse("--branch-sms whole").unwrap().branch_sms,
            SmTarget::Whole
        );
        assert_eq!(
            parse("--branch-sms share").unwrap().branch_sms,
            SmTarget::Share(dqn::BRANCH_WIDTH as u32)
        );
        assert_eq!(
            parse("--branch-sms 33").unwrap().branch_sms,
            SmTarget::Count(33)
        );
        assert_eq!(parse("").unwrap().attention_kernel, None);
        assert_eq!(parse("--attention auto").unwrap().attention_kernel, None);
        assert_eq!(
            parse("--attention fused").unwrap().attention_kernel,
            Some(AttentionKernel::Fused)
        );
        assert_eq!(
            parse("--attention unfused").unwrap().attention_kernel,
            Some(AttentionKernel::Unfused)
        );
        let msg = parse("--attention flash").unwrap_err();
        assert!(
            msg.contains("invalid value 'flash' for '--attention")
                && msg.contains("[possible values: auto, fused, unfused]"),
            "{msg}"
        );
        assert_eq!(parse("").unwrap().iqn_kernel, None);
        assert_eq!(parse("--iqn-kernel auto").unwrap().iqn_kernel, None);
        assert_eq!(
            parse("--iqn-kernel wgmma").unwrap().iqn_kernel,
            Some(IqnFusedKernel::Wgmma)
        );
        assert_eq!(
            parse("--iqn-kernel mma").unwrap().iqn_kernel,
            Some(IqnFusedKernel::MmaSync)
        );
        let msg = parse("--iqn-kernel tma").unwrap_err();
        assert!(
            msg.contains("invalid value 'tma' for '--iqn-kernel")
                && msg.contains("[possible values: auto, wgmma, mma]"),
            "{msg}"
        );
        let msg = parse("--branch-sms 1/0").unwrap_err();
        assert!(
            msg.contains("for '--branch-sms") && msg.contains("found `1/0`"),
            "{msg}"
        );
        // The default K, 100, is far above the 3 checked steps.
        assert!(parse("--check /tmp/x").is_ok());
        assert!(parse("--check /tmp/x --target-sync 4 --source host").is_ok());
        for (line, want) in [
            (
                "--batch",
                "error: a value is required for '--batch <BATCH>'",
            ),
            (
                "--batch 1k",
                "error: invalid value '1k' for '--batch <BATCH>'",
            ),
            (
                "--frobnicate",
                "error: unexpected argument '--frobnicate' found",
            ),
            (
                "--width 48 --heads 5",
                "--width 48 must be a multiple of --heads 5",
            ),
            (
                "--inject-nan 0",
                "--inject-nan 0: expected a step of the run, 1 to 200",
            ),
            (
                "--steps 10 --inject-nan 11",
                "--inject-nan 11: expected a step of the run, 1 to 10",
            ),
            (
                "--inject-nan 3 --gpus 1",
                "--inject-nan applies to the training run",
            ),
            (
                "--inject-nan 3 --check /tmp/x",
                "--inject-nan applies to the training run",
            ),
            (
                "--target-sync 0",
                "--target-sync 0: expected a count of steps from 1 to",
            ),
            (
                "--target-sync 5000000000",
                "--target-sync 5000000000: expected a count of steps from 1 to",
            ),
            ("--polyak 0", "--polyak 0: expected τ with 0 < τ ≤ 1"),
            ("--polyak 1.5", "--polyak 1.5: expected τ with 0 < τ ≤ 1"),
            ("--polyak -0.1", "--polyak -0.1: expected τ with 0 < τ ≤ 1"),
            ("--polyak NaN", "--polyak NaN: expected τ with 0 < τ ≤ 1"),
            (
                "--polyak x",
                "error: invalid value 'x' for '--polyak <TAU>'",
            ),
            (
                "--source disk",
                "error: invalid value 'disk' for '--source <SOURCE>'",
            ),
            (
                "--replay 0",
                "--replay 0: expected a capacity of at least 1 transition",
            ),
            (
                "--source replay --check /tmp/x --target-sync 10",
                "--source replay applies to the training run",
            ),
            (
                "--source replay --gpus 2",
                "--source replay applies to the training run",
            ),
            (
                "--source replay --inject-nan 3",
                "--inject-nan poisons an uploaded batch",
            ),
            (
                "--check /tmp/x --target-sync 3",
                "--check /tmp/x with --target-sync 3: the target would be updated at step 3 of \
                 the 3 checked",
            ),
            (
                "--check /tmp/x --steps 10 --target-sync 10",
                "--check /tmp/x with --target-sync 10",
            ),
        ] {
            let err = parse(line)
                .err()
                .unwrap_or_else(|| panic!("{line}: accepted"));
            assert!(err.starts_with(want), "{line}: {err}");
        }
    }

    /// Four tensors of ten elements, with `bad` (name, NaN count, Inf count) latched.
    fn latched(
        replay: u32,
        losses: [f32; 7],
        sq_norm: f32,
        bad: &[(&str, u32, u32)],
    ) -> (BadReplay, Vec<(String, usize)>) {
        let names = ["w1", "b1", "wqkv", "bp"];
        let non_finite = names
            .iter()
            .map(|&n| {
                bad.iter()
                    .find(|(name, ..)| *name == n)
                    .map_or((0, 0), |&(_, nan, inf)| (nan, inf))
            })
            .collect();
        let bad = BadReplay {
            replay,
            losses,
            sq_norm,
            non_finite,
        };
        (bad, names.iter().map(|n| (n.to_string(), 10)).collect())
    }

    #[test]
    fn a_non_finite_step_is_reported_by_tensor_name() {
        let mut l = [0.5f32; 7];
        l[4] = f32::NAN;
        l[0] = f32::NAN;
        let (bad, tensors) = latched(17, l, f32::NAN, &[("wqkv", 2, 0), ("bp", 0, 1)]);
        let msg = non_finite_report(&bad, &tensors);
        assert_eq!(
            msg,
            "step 17 is not finite: loss L = NaN, L_attn = NaN; 2 of 4 gradients: \
             wqkv (2 NaN, 0 Inf of 10), bp (0 NaN, 1 Inf of 10); it was not applied, nor any \
             step after it: the parameters and Adam's moments are those after step 16; \
             training stopped"
        );
    }

    #[test]
    fn a_non_finite_loss_with_finite_gradients_is_named_alone() {
        let mut l = [0.5f32; 7];
        l[5] = f32::INFINITY;
        let (bad, tensors) = latched(3, l, 2.0, &[]);
        let msg = non_finite_report(&bad, &tensors);
        assert!(
            msg.starts_with("step 3 is not finite: loss L_cql = inf; it was not applied"),
            "{msg}"
        );
        assert!(msg.contains("those after step 2"), "{msg}");
    }

    #[test]
    fn an_overflowing_norm_of_finite_gradients_is_named_as_such() {
        let (bad, tensors) = latched(5, [0.5; 7], f32::INFINITY, &[]);
        let msg = non_finite_report(&bad, &tensors);
        assert!(
            msg.contains("the gradients' sum of squares (inf), though every gradient is finite"),
            "{msg}"
        );
        assert!(msg.contains("those after step 4"), "{msg}");
    }

    /// The breakdown of the profile recorded on the H200 (the fixture below): every op
    /// lands in one of the seven parts, and the parts add up to the ops.
    #[test]
    fn breakdown_of_the_recorded_profile_covers_every_op() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/dqn.profile.json"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let profile = stepgraph_picture::record::from_str(&text).unwrap();
        let line = breakdown(&profile);
        let parts: Vec<(&str, f64)> = line
            .split(' ')
            .map(|p| {
                let (name, ms) = p.split_once('=').unwrap();
                (name, ms.trim_end_matches("ms").parse().unwrap())
            })
            .collect();
        let names: Vec<&str> = parts.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "trunk",
                "branches",
                "ddqn",
                "aux",
                "adam",
                "allreduce",
                "batch"
            ]
        );
        let total: f64 = profile.ops.iter().map(|o| o.duration_ms()).sum();
        let summed: f64 = parts.iter().map(|(_, t)| t).sum();
        assert!(
            (total - summed).abs() < 5e-3,
            "{line}: parts {summed} vs ops {total}"
        );
        // One GPU: the collectives issue nothing, but their ops still take their events'
        // time; the first five parts hold the model's work.
        assert!(parts[..5].iter().all(|(_, t)| *t > 0.0), "{line}");
        // Every op of the step is named in `part_of`'s table or is an auxiliary head.
        for op in dqn::PLAN.ops {
            let part = part_of(op.func);
            let aux = [
                "iql_high",
                "iql_low",
                "iqn_head",
                "attention_head",
                "attention_wgrad",
            ];
            assert!(
                part != "aux" || aux.contains(&op.func),
                "{} fell through to aux",
                op.func
            );
        }
    }
}
