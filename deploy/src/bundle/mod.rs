//! `bundle`: release binaries, a `run.sh`, a `preflight.sh`, a `build-info.json` and a
//! `SHA256SUMS` manifest in one small folder that is copied to the GPU host and run
//! there unchanged.
//!
//! Two kinds of bundle: a job (`bundle trainer`: one program of the [`Project`], with
//! its data files, which `run.sh` runs in a fresh results folder; what `deploy` ships)
//! and the GPU tests (`--gpu-tests`: every GPU test binary and program, run one after
//! the other).
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
use crate::cmd::{self, Workspace};
use crate::interrupt;
use crate::lock::{self, FolderLock};
pub use crate::project::Data;
use crate::project::{GpuTests, Program, Project, Setup};

/// The name of the GPU-test bundle's folder in the bundle folder; a job bundle's is
/// `bundle-<program>`.
pub const GPU_TESTS_OUT: &str = "bundle";

/// Builds a program of the project (the job) or its GPU tests and programs in release
/// mode and writes them, with `run.sh`, `preflight.sh`, `build-info.json` and
/// `SHA256SUMS` (and, for a job, the project's data files), to a bundle folder for the
/// GPU host.
#[derive(Debug, Args)]
pub struct Bundle {
    /// The program to bundle as the job (default: the project's job): `run.sh ARGS`
    /// runs it in a fresh results folder.
    #[arg(value_name = "PROGRAM", conflicts_with = "gpu_tests")]
    pub example: Option<String>,
    /// Bundle the project's GPU test binaries and every program, built with their
    /// feature, instead of one job.
    #[arg(long)]
    pub gpu_tests: bool,
    /// The bundle folder (relative paths are taken from the workspace root; default:
    /// `bundle-<PROGRAM>`, or `bundle` with --gpu-tests, in the project's bundle
    /// folder). Cleared of a previous bundle first; a folder that is not a bundle is
    /// refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the commands and files without building or writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

impl Bundle {
    /// Runs the command.
    pub fn run(self, project: &Project, ws: &Workspace) -> Result<()> {
        self.build(project, ws, lock::Wait::Upto(lock::DEFAULT_WAIT))
            .map(drop)
    }

    /// Builds the bundle under its folder's lock (see [`crate::lock`]: a deploy reading
    /// the folder holds it too), doing `wait`'s bidding while another command holds it,
    /// and returns the folder with the lock still held (none in a dry run).
    pub fn build(&self, project: &Project, ws: &Workspace, wait: lock::Wait) -> Result<Built> {
        let plan = self.plan(project, ws)?;
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
        let setup = project.setup(ws, self.dry_run)?;
        plan.execute(project, ws, &setup, self.dry_run)?;
        Ok(Built {
            dir: plan.out,
            lock,
        })
    }

    /// The program bundled as the job: the one named, else the project's.
    pub fn program<'a>(&'a self, project: &'a Project) -> &'a str {
        self.example.as_deref().unwrap_or(project.job())
    }

    /// Where the bundle goes, without building it.
    pub fn out(&self, project: &Project, ws: &Workspace) -> PathBuf {
        match &self.out {
            Some(out) => ws.root.join(out),
            None if self.gpu_tests => project.bundle_out(ws, GPU_TESTS_OUT),
            None => project.bundle_out(ws, &format!("bundle-{}", self.program(project))),
        }
    }

    fn plan(&self, project: &Project, ws: &Workspace) -> Result<Plan> {
        let out = self.out(project, ws);
        if self.gpu_tests {
            let tests = project.gpu_tests_of()?;
            let mut builds: Vec<CargoBuild> = tests
                .packages
                .iter()
                .map(|p| CargoBuild::gpu_tests(p, tests))
                .collect();
            for program in project.programs() {
                builds.push(CargoBuild::program(&program, ws)?);
            }
            return Ok(Plan {
                out,
                builds,
                runner: Runner::Suite {
                    sanitize: tests
                        .sanitize
                        .as_ref()
                        .map(|(example, args)| SanitizeTarget {
                            example: example.clone(),
                            args: args.clone(),
                        }),
                },
                data: Vec::new(),
            });
        }
        let program = project.find(self.program(project))?;
        let data = project.data_in(ws)?;
        Ok(Plan {
            out,
            builds: vec![CargoBuild::program(&program, ws)?],
            runner: Runner::Job {
                job: program.name().to_string(),
                args: project.default_args().to_vec(),
            },
            data,
        })
    }
}

/// A bundle folder just written, and its lock, held until this is dropped.
#[derive(Debug)]
pub struct Built {
    /// The bundle folder.
    pub dir: PathBuf,
    /// Its lock (none in a dry run).
    pub lock: Option<FolderLock>,
}

/// One cargo invocation of a bundle and the kind of executable kept from it.
#[derive(Debug, Clone)]
pub struct CargoBuild {
    /// Arguments after `cargo` (the JSON message format is added).
    pub args: Vec<String>,
    /// The kind of executable kept from its output.
    pub keep: Kind,
}

impl CargoBuild {
    /// A package's GPU test binaries (its integration tests that `tests` names), with
    /// the GPU tests compiled in.
    pub fn gpu_tests(package: &str, tests: &GpuTests) -> CargoBuild {
        CargoBuild {
            args: strings(&[
                "test",
                "--release",
                "-p",
                package,
                "--features",
                &tests.feature,
                "--no-run",
                "--test",
                &tests.tests,
            ]),
            keep: Kind::Test,
        }
    }

    /// One program, the job of a job bundle or one of a GPU-test bundle's.
    pub fn program(program: &Program, ws: &Workspace) -> Result<CargoBuild> {
        let mut args = strings(&["build", "--release"]);
        args.extend(program.cargo_args(ws)?);
        Ok(CargoBuild {
            args,
            keep: Kind::Program,
        })
    }

    /// Runs the build (diagnostics to the terminal) and returns the executables it
    /// names of the kind kept. In a dry run, only prints the command.
    fn run(&self, ws: &Workspace, setup: &Setup, dry_run: bool) -> Result<Vec<Artifact>> {
        let mut cargo = ws.cargo();
        // `json-render-diagnostics`: JSON on stdout, warnings and errors rendered as usual
        // on stderr (plain `json` would hide them inside the JSON).
        cargo
            .args(&self.args)
            .arg("--message-format=json-render-diagnostics")
            .envs(setup.env.iter().map(|(k, v)| (k, v)));
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

/// The example `run.sh sanitize` runs under compute-sanitizer.
#[derive(Debug, Clone)]
pub struct SanitizeTarget {
    /// The program, in `bin/`.
    pub example: String,
    /// Its arguments.
    pub args: Vec<String>,
}

/// What a bundle's `run.sh` runs.
#[derive(Debug, Clone)]
pub enum Runner {
    /// Every test binary, then every example; `run.sh sanitize` runs `sanitize` under
    /// compute-sanitizer.
    Suite {
        /// What `run.sh sanitize` runs.
        sanitize: Option<SanitizeTarget>,
    },
    /// The one executable `job`, with `run.sh`'s arguments (`args` when it has none),
    /// in a fresh results folder.
    Job {
        /// The executable, in `bin/`.
        job: String,
        /// Its default arguments.
        args: Vec<String>,
    },
}

/// What goes into a bundle and where.
#[derive(Debug)]
pub struct Plan {
    /// The bundle folder.
    pub out: PathBuf,
    /// The builds whose executables go into `bin/`.
    pub builds: Vec<CargoBuild>,
    /// What `run.sh` runs.
    pub runner: Runner,
    /// Data files and folders, copied under `data/`.
    pub(crate) data: Vec<Data>,
}

impl Plan {
    /// Runs the builds and writes the bundle.
    pub(crate) fn execute(
        &self,
        project: &Project,
        ws: &Workspace,
        setup: &Setup,
        dry_run: bool,
    ) -> Result<()> {
        let mut found = Vec::new();
        for build in &self.builds {
            found.extend(build.run(ws, setup, dry_run)?);
        }
        let bins = by_stable_name(found)?;
        if !dry_run && bins.is_empty() {
            bail!("the builds named no executables to bundle");
        }

        Contents {
            out: &self.out,
            bins: &bins,
            runner: &self.runner,
            needs: project.needs_of(),
            data: &self.data,
            info: &setup.info,
        }
        .write(&ws.root, dry_run)
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

    fn project() -> Project {
        Project::new("trainer")
            .program(Program::bin("trainer").package("app"))
            .program(Program::example("fork_join").package("suite"))
            .bundle_dir(".device")
            .args(["--steps", "3"])
            .gpu_tests(
                GpuTests::new()
                    .package("suite")
                    .package("app")
                    .sanitize("fork_join", ["--quick"]),
            )
    }

    #[test]
    fn gpu_test_build_is_a_release_no_run_with_the_feature() {
        let b = CargoBuild::gpu_tests("app", &GpuTests::new());
        assert_eq!(
            b.args.join(" "),
            "test --release -p app --features gpu-tests --no-run --test gpu*"
        );
        assert_eq!(b.keep, Kind::Test);
        let ws = Workspace::new(PathBuf::from("/ws"));
        let app = project().find("trainer").unwrap();
        assert_eq!(
            CargoBuild::program(&app, &ws).unwrap().args.join(" "),
            "build --release -p app --bin trainer"
        );
    }

    #[test]
    fn a_job_bundle_builds_its_one_program_into_its_own_folder() {
        let ws = Workspace::new(PathBuf::from("/ws"));
        let project = project();
        let bundle = Bundle {
            example: Some("fork_join".into()),
            gpu_tests: false,
            out: None,
            dry_run: true,
        };
        let plan = bundle.plan(&project, &ws).unwrap();
        assert_eq!(plan.out, PathBuf::from("/ws/.device/bundle-fork_join"));
        assert_eq!(plan.builds.len(), 1);
        assert_eq!(
            plan.builds[0].args.join(" "),
            "build --release -p suite --example fork_join"
        );
        assert!(
            matches!(&plan.runner, Runner::Job { job, args } if job == "fork_join" && args == &["--steps", "3"])
        );
        let default = Bundle {
            example: None,
            ..bundle
        };
        assert_eq!(
            default.out(&project, &ws),
            PathBuf::from("/ws/.device/bundle-trainer")
        );

        let gpu = Bundle {
            example: None,
            gpu_tests: true,
            out: None,
            dry_run: true,
        };
        assert_eq!(gpu.out(&project, &ws), PathBuf::from("/ws/.device/bundle"));
        // Each package's GPU tests, then every program.
        let plan = gpu.plan(&project, &ws).unwrap();
        let builds: Vec<String> = plan.builds.iter().map(|b| b.args.join(" ")).collect();
        assert_eq!(builds.len(), 4, "{builds:?}");
        assert!(
            builds[1].contains("-p app --features gpu-tests"),
            "{builds:?}"
        );
        assert!(
            builds[3].ends_with("-p suite --example fork_join"),
            "{builds:?}"
        );
        assert!(matches!(
            &plan.runner,
            Runner::Suite { sanitize: Some(s) } if s.example == "fork_join" && s.args == ["--quick"]
        ));
        let err = gpu.plan(&Project::new("x"), &ws).unwrap_err().to_string();
        assert!(err.contains("Project::gpu_tests"), "{err}");
        let odd = Bundle {
            example: Some("a b".into()),
            gpu_tests: false,
            ..gpu
        };
        let err = odd.plan(&project, &ws).unwrap_err().to_string();
        assert!(err.starts_with("no program `a b` in this project"), "{err}");
    }
}
