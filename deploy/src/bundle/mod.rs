//! `cargo xtask bundle`: release binaries, a `run.sh`, a `preflight.sh`, a
//! `build-info.json` and a `SHA256SUMS` manifest in one small folder that is copied to the
//! GPU host and run there unchanged.
//!
//! Two kinds of bundle: a job (`cargo xtask bundle fork_join`: one program, which `run.sh`
//! runs in a fresh results folder; what `cargo xtask deploy` ships) and the GPU tests
//! (`--gpu-tests`: every GPU test binary and program, run one after the other).
//!
//! [`Plan`] is the reusable part: which cargo builds to run, which of their executables
//! to keep, what `run.sh` runs, and where the bundle goes. The command only chooses a
//! plan; [`Contents`] writes the folder.

mod artifacts;
pub mod build_info;
pub mod contents;
pub mod job_sh;
pub mod manifest;
pub mod preflight_sh;
mod run_sh;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use clap::Args;

pub use self::artifacts::{Artifact, Kind};
pub use self::contents::Contents;
use self::preflight_sh::CUDA_LIBRARIES;
use crate::cmd::{self, Workspace};
use crate::install_nvcc::{InstallNvcc, Nvcc};
use crate::interrupt;
use crate::lock::{self, FolderLock};
use crate::programs::{DEMO, GPU_TEST_PACKAGES, GPU_TESTS, PROGRAMS, Program};

/// Where the GPU-test bundle goes by default, relative to the workspace root
/// (git-ignored); a job bundle goes to `.device/bundle-<example>`.
pub const DEFAULT_OUT: &str = ".device/bundle";

/// Builds a program (the job) or the GPU tests and the programs in release mode and
/// writes them, with `run.sh`, `preflight.sh`, `build-info.json` and `SHA256SUMS`, to a
/// bundle folder for the GPU host.
#[derive(Debug, Args)]
pub struct Bundle {
    /// The program to bundle as the job (`dqn`, `fork_join`, `capture_cost`): `run.sh
    /// ARGS` runs it in a fresh results folder.
    #[arg(required_unless_present = "gpu_tests", conflicts_with = "gpu_tests")]
    pub example: Option<String>,
    /// Bundle the GPU test binaries (`tests/gpu*.rs` of the suite and the other crates of
    /// `GPU_TEST_PACKAGES`)
    /// and every program, built with `--features gpu-tests`, instead of one job.
    #[arg(long)]
    pub gpu_tests: bool,
    /// The bundle folder (relative paths are taken from the workspace root; default:
    /// `.device/bundle-<EXAMPLE>`, or `.device/bundle` with --gpu-tests). Cleared of a
    /// previous bundle first; a folder that is not a bundle is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the commands and files without building or writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

impl Bundle {
    pub fn run(self, ws: &Workspace) -> Result<()> {
        self.build(ws, lock::Wait::Upto(lock::DEFAULT_WAIT))
            .map(drop)
    }

    /// Builds the bundle under its folder's lock (see [`crate::lock`]: a deploy reading
    /// the folder holds it too), doing `wait`'s bidding while another command holds it,
    /// and returns the folder with the lock still held (none in a dry run).
    pub fn build(&self, ws: &Workspace, wait: lock::Wait) -> Result<Built> {
        let plan = self.plan(ws)?;
        let what = match &self.example {
            Some(example) if !self.gpu_tests => format!("cargo xtask bundle {example}"),
            _ => "cargo xtask bundle --gpu-tests".to_string(),
        };
        eprintln!("$ lock {}", lock::lock_path(&plan.out).display());
        let lock = if self.dry_run {
            None
        } else {
            Some(FolderLock::take(&plan.out, &what, wait)?)
        };
        let nvcc = InstallNvcc::with_dry_run(self.dry_run).ensure(ws)?;
        plan.execute(ws, &nvcc, self.dry_run)?;
        Ok(Built {
            dir: plan.out,
            lock,
        })
    }

    /// Where the bundle goes, without building it.
    pub fn out(&self, ws: &Workspace) -> PathBuf {
        let default = match &self.example {
            Some(example) if !self.gpu_tests => format!("{DEFAULT_OUT}-{example}"),
            _ => DEFAULT_OUT.to_string(),
        };
        ws.root
            .join(self.out.clone().unwrap_or_else(|| default.into()))
    }

    fn plan(&self, ws: &Workspace) -> Result<Plan> {
        let out = self.out(ws);
        if self.gpu_tests {
            let mut builds: Vec<CargoBuild> = GPU_TEST_PACKAGES
                .iter()
                .map(|p| CargoBuild::gpu_tests(p))
                .collect();
            builds.extend(PROGRAMS.iter().map(CargoBuild::program));
            return Ok(Plan {
                out,
                builds,
                runner: Runner::Suite {
                    sanitize: Some(SanitizeTarget {
                        example: SANITIZE_EXAMPLE.to_string(),
                        args: vec!["--quick".to_string()],
                    }),
                },
            });
        }
        let program = Program::find(self.example.as_deref().unwrap_or(DEMO))?;
        Ok(Plan {
            out,
            builds: vec![CargoBuild::program(program)],
            runner: Runner::Job {
                job: program.name.to_string(),
            },
        })
    }
}

/// A bundle folder just written, and its lock, held until this is dropped.
#[derive(Debug)]
pub struct Built {
    pub dir: PathBuf,
    pub lock: Option<FolderLock>,
}

/// One cargo invocation of a bundle and the kind of executable kept from it.
#[derive(Debug, Clone)]
pub struct CargoBuild {
    /// Arguments after `cargo` (the JSON message format is added).
    pub args: Vec<String>,
    pub keep: Kind,
}

impl CargoBuild {
    /// A package's GPU test binaries (integration tests named [`GPU_TESTS`]), with the
    /// GPU tests compiled in.
    pub fn gpu_tests(package: &str) -> CargoBuild {
        CargoBuild {
            args: strings(&[
                "test",
                "--release",
                "-p",
                package,
                "--features",
                "gpu-tests",
                "--no-run",
                "--test",
                GPU_TESTS,
            ]),
            keep: Kind::Test,
        }
    }

    /// One program, the job of a job bundle or one of a GPU-test bundle's.
    pub fn program(program: &Program) -> CargoBuild {
        let mut args = strings(&["build", "--release"]);
        args.extend(program.cargo_args());
        CargoBuild {
            args,
            keep: Kind::Program,
        }
    }

    /// Runs the build (diagnostics to the terminal) and returns the executables it
    /// names of the kind kept. In a dry run, only prints the command.
    fn run(&self, ws: &Workspace, nvcc: &Nvcc, dry_run: bool) -> Result<Vec<Artifact>> {
        let mut cargo = ws.cargo();
        // `json-render-diagnostics`: JSON on stdout, warnings and errors rendered as usual
        // on stderr (plain `json` would hide them inside the JSON).
        cargo
            .args(&self.args)
            .arg("--message-format=json-render-diagnostics")
            .env("NVCC", &nvcc.path);
        eprintln!("$ {}", cmd::display(&cargo));
        if dry_run {
            return Ok(Vec::new());
        }
        let mut child = cargo
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start `{}`", cmd::display(&cargo)))?;
        let mut out = child.stdout.take().expect("stdout is piped");
        let reader = std::thread::spawn(move || {
            let mut stdout = String::new();
            out.read_to_string(&mut stdout).map(|_| stdout)
        });
        // A deploy asked to stop (SIGTERM reaches xtask alone) stops the build too.
        let status = match interrupt::wait(&mut child, None, true)? {
            interrupt::Waited::Exited(status) => status,
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("interrupted: `{}` was stopped", cmd::display(&cargo));
            }
        };
        let stdout = reader
            .join()
            .expect("the stdout reader does not panic")
            .context("reading cargo's JSON messages")?;
        if !status.success() {
            bail!("`{}` failed: {status}", cmd::display(&cargo));
        }
        Ok(artifacts::parse_stream(&stdout)
            .into_iter()
            .filter(|a| a.kind == self.keep)
            .collect())
    }
}

/// The example a GPU-test bundle's `run.sh sanitize` runs under compute-sanitizer: the
/// fork-join step, small enough for racecheck to finish in seconds. (It is not the demo
/// example, which trains at full size.)
pub const SANITIZE_EXAMPLE: &str = "fork_join";

/// The example `run.sh sanitize` runs under compute-sanitizer.
#[derive(Debug, Clone)]
pub struct SanitizeTarget {
    pub example: String,
    pub args: Vec<String>,
}

/// What a bundle's `run.sh` runs.
#[derive(Debug, Clone)]
pub enum Runner {
    /// Every test binary, then every example; `run.sh sanitize` runs `sanitize` under
    /// compute-sanitizer.
    Suite { sanitize: Option<SanitizeTarget> },
    /// The one executable `job`, with `run.sh`'s arguments, in a fresh results folder.
    Job { job: String },
}

/// What goes into a bundle and where.
#[derive(Debug)]
pub struct Plan {
    pub out: PathBuf,
    pub builds: Vec<CargoBuild>,
    pub runner: Runner,
}

impl Plan {
    pub fn execute(&self, ws: &Workspace, nvcc: &Nvcc, dry_run: bool) -> Result<()> {
        let mut found = Vec::new();
        for build in &self.builds {
            found.extend(build.run(ws, nvcc, dry_run)?);
        }
        let bins = by_stable_name(found)?;
        if !dry_run && bins.is_empty() {
            bail!("the builds named no executables to bundle");
        }

        let libraries: Vec<String> = CUDA_LIBRARIES.iter().map(|l| l.to_string()).collect();
        Contents {
            out: &self.out,
            bins: &bins,
            runner: &self.runner,
            libraries: &libraries,
        }
        .write(&ws.root, nvcc, dry_run)
    }
}

/// Keys executables by their name in `bin/`; a build may name the same file twice (an
/// example built by both `cargo test` and `cargo build`), but two different files may
/// not share a name.
fn by_stable_name(found: Vec<Artifact>) -> Result<BTreeMap<String, Artifact>> {
    let mut bins: BTreeMap<String, Artifact> = BTreeMap::new();
    for artifact in found {
        let name = artifact.stable_name();
        if !is_plain_name(&name) {
            bail!(
                "{} has a name run.sh cannot hold safely",
                artifact.path.display()
            );
        }
        if let Some(prev) = bins.get(&name)
            && prev.path != artifact.path
        {
            bail!(
                "two executables would both be bin/{name}: {} and {}",
                prev.path.display(),
                artifact.path.display()
            );
        }
        bins.insert(name, artifact);
    }
    Ok(bins)
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(kind: Kind, path: &str) -> Artifact {
        Artifact {
            kind,
            target: String::new(),
            path: PathBuf::from(path),
        }
    }

    #[test]
    fn the_same_file_named_twice_is_kept_once() {
        let bins = by_stable_name(vec![
            artifact(Kind::Program, "/t/release/examples/fork_join"),
            artifact(Kind::Test, "/t/release/deps/gpu-0123456789abcdef"),
            artifact(Kind::Program, "/t/release/examples/fork_join"),
        ])
        .unwrap();
        assert_eq!(bins.keys().collect::<Vec<_>>(), ["fork_join", "gpu"]);
    }

    #[test]
    fn two_files_with_one_stable_name_are_refused() {
        let err = by_stable_name(vec![
            artifact(Kind::Test, "/t/release/deps/gpu-0123456789abcdef"),
            artifact(Kind::Program, "/t/release/examples/gpu"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("bin/gpu"), "{err}");
    }

    #[test]
    fn gpu_test_build_is_a_release_no_run_with_the_feature() {
        let b = CargoBuild::gpu_tests("stepgraph-dqn");
        assert_eq!(
            b.args.join(" "),
            "test --release -p stepgraph-dqn --features gpu-tests --no-run --test gpu*"
        );
        assert_eq!(b.keep, Kind::Test);
        let dqn = Program::find("dqn").unwrap();
        assert_eq!(
            CargoBuild::program(dqn).args.join(" "),
            "build --release -p stepgraph-dqn --bin dqn"
        );
    }

    #[test]
    fn a_job_bundle_builds_its_one_example_into_its_own_folder() {
        let ws = Workspace {
            root: PathBuf::from("/ws"),
            cargo: "cargo".into(),
        };
        let bundle = Bundle {
            example: Some("fork_join".into()),
            gpu_tests: false,
            out: None,
            dry_run: true,
        };
        let plan = bundle.plan(&ws).unwrap();
        assert_eq!(plan.out, PathBuf::from("/ws/.device/bundle-fork_join"));
        assert_eq!(plan.builds.len(), 1);
        assert_eq!(
            plan.builds[0].args.join(" "),
            "build --release -p stepgraph-suite --example fork_join"
        );
        assert!(matches!(&plan.runner, Runner::Job { job } if job == "fork_join"));

        let gpu = Bundle {
            example: None,
            gpu_tests: true,
            out: None,
            dry_run: true,
        };
        assert_eq!(gpu.out(&ws), PathBuf::from("/ws/.device/bundle"));
        // Both packages' GPU tests, then every program.
        let builds: Vec<String> = gpu
            .plan(&ws)
            .unwrap()
            .builds
            .iter()
            .map(|b| b.args.join(" "))
            .collect();
        assert_eq!(builds.len(), GPU_TEST_PACKAGES.len() + PROGRAMS.len());
        assert!(builds[1].contains("-p stepgraph-dqn"), "{builds:?}");
        let odd = Bundle {
            example: Some("a b".into()),
            gpu_tests: false,
            ..gpu
        };
        assert!(odd.plan(&ws).is_err());
    }
}
