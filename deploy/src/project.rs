//! What a workspace ships: its programs, the one a deploy runs, its data files, the
//! job's default arguments, what the host must have, and how its builds are set up.

use std::ffi::OsString;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};

use crate::cmd::{self, Workspace};

/// A workspace's deployable programs and what goes with them: the description that
/// [`Cli`](crate::Cli), [`Bundle`](crate::Bundle) and [`Deploy`](crate::Deploy) work
/// from.
///
/// A bundle holds one program, the job: by default the one [`Project::new`] names, or
/// another of the project's programs chosen on the command line (`bundle eval`,
/// `deploy --program eval`). Its release on the host is named after it.
///
/// ```
/// use stepgraph_deploy::{Needs, Program, Project};
///
/// let project = Project::new("trainer")
///     .bin("trainer")
///     .program(Program::example("smoke").package("trainer-examples"))
///     .data("configs/")
///     .args(["--steps", "1000"])
///     .needs(Needs::new().library("libcublasLt.so.13").compute_capability("8.0"));
/// assert_eq!(project.job(), "trainer");
/// ```
pub struct Project {
    job: String,
    programs: Vec<Program>,
    data: Vec<PathBuf>,
    args: Vec<String>,
    needs: Needs,
    gpu_tests: Option<GpuTests>,
    root: Option<PathBuf>,
    bundle_dir: PathBuf,
    remote_dir: Option<String>,
    setup: Option<Box<SetupFn>>,
}

type SetupFn = dyn Fn(&mut BuildSetup<'_>) -> Result<()>;

impl fmt::Debug for Project {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Project")
            .field("job", &self.job)
            .field("programs", &self.programs)
            .field("data", &self.data)
            .field("args", &self.args)
            .field("needs", &self.needs)
            .field("gpu_tests", &self.gpu_tests)
            .field("root", &self.root)
            .field("bundle_dir", &self.bundle_dir)
            .field("remote_dir", &self.remote_dir)
            .field("before_build", &self.setup.is_some())
            .finish()
    }
}

impl Project {
    /// A project whose job, the program a deploy runs unless told otherwise, is `job`.
    /// If no program of that name is added ([`Project::bin`], [`Project::program`]),
    /// it is taken to be a binary target of the workspace.
    pub fn new(job: impl Into<String>) -> Project {
        Project {
            job: job.into(),
            programs: Vec::new(),
            data: Vec::new(),
            args: Vec::new(),
            needs: Needs::new(),
            gpu_tests: None,
            root: None,
            bundle_dir: PathBuf::from(DEFAULT_BUNDLE_DIR),
            remote_dir: None,
            setup: None,
        }
    }

    /// Adds a binary target of the workspace (`src/main.rs`, `src/bin/NAME.rs`, a
    /// `[[bin]]`) as a program the command line may choose; its package is found with
    /// `cargo metadata`.
    pub fn bin(self, name: impl Into<String>) -> Project {
        self.program(Program::bin(name))
    }

    /// Adds a program: a binary or an example target, of a named package or of
    /// whichever workspace member has it.
    pub fn program(mut self, program: Program) -> Project {
        self.programs.retain(|p| p.name != program.name);
        self.programs.push(program);
        self
    }

    /// Ships a file or a folder of the workspace (a path relative to its root) with
    /// every job bundle, under `data/` with the same relative path. The job runs in its
    /// results folder, so it finds the data through `$DEPLOY_DATA`
    /// (`$DEPLOY_DATA/configs/a.toml`).
    pub fn data(mut self, path: impl Into<PathBuf>) -> Project {
        self.data.push(path.into());
        self
    }

    /// The job's default arguments, written into the bundle's `run.sh`: they are used
    /// when the job is run without arguments, and arguments given after `--`
    /// (`deploy --host H -- --steps 10`, `run.sh --steps 10`) replace them all.
    pub fn args<I, S>(mut self, args: I) -> Project
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// What the host must have, checked by the bundle's `preflight.sh` before a
    /// release goes live (default: [`Needs::new`]).
    pub fn needs(mut self, needs: Needs) -> Project {
        self.needs = needs;
        self
    }

    /// The GPU tests that `bundle --gpu-tests` (and `deploy --gpu-tests`) ship, with
    /// every program of the project.
    pub fn gpu_tests(mut self, tests: GpuTests) -> Project {
        self.gpu_tests = Some(tests);
        self
    }

    /// The workspace root (default: the workspace around the current folder, as
    /// `cargo locate-project --workspace` finds it).
    pub fn root(mut self, root: impl Into<PathBuf>) -> Project {
        self.root = Some(root.into());
        self
    }

    /// Where bundles are written, relative to the workspace root (default
    /// `target/bundles`): `<DIR>/bundle-<program>`, and `<DIR>/bundle` for the GPU
    /// tests.
    pub fn bundle_dir(mut self, dir: impl Into<PathBuf>) -> Project {
        self.bundle_dir = dir.into();
        self
    }

    /// The deploy folder on the host unless `--dir` says otherwise (default: the job's
    /// name), relative to the remote home.
    pub fn remote_dir(mut self, dir: impl Into<String>) -> Project {
        self.remote_dir = Some(dir.into());
        self
    }

    /// Runs `setup` before every bundle's builds (also in a dry run, which it can ask
    /// [`BuildSetup::dry_run`]): to make sure a tool the build needs is there, and to give
    /// the builds environment variables and `build-info.json` facts about it.
    pub fn before_build<F>(mut self, setup: F) -> Project
    where
        F: Fn(&mut BuildSetup<'_>) -> Result<()> + 'static,
    {
        self.setup = Some(Box::new(setup));
        self
    }

    /// The program a deploy runs by default.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The job's default arguments.
    pub fn default_args(&self) -> &[String] {
        &self.args
    }

    /// The deploy folder on the host unless `--dir` says otherwise.
    pub fn default_remote_dir(&self) -> &str {
        self.remote_dir.as_deref().unwrap_or(&self.job)
    }

    /// Sets the defaults that come from the project on `command` and on every
    /// subcommand under it: the job (`bundle [PROGRAM]`, `deploy --program`) and the
    /// deploy folder (`--dir`). For a command line that embeds [`Bundle`](crate::Bundle)
    /// or [`Deploy`](crate::Deploy) in its own `clap` parser; [`Cli`](crate::Cli) does it
    /// itself.
    pub fn set_defaults(&self, command: clap::Command) -> clap::Command {
        let mut command = command;
        for (id, value) in [
            ("example", self.job.clone()),
            ("dir", self.default_remote_dir().to_string()),
        ] {
            if command.get_arguments().any(|a| a.get_id() == id) {
                command = command.mut_arg(id, |a| a.default_value(value));
            }
        }
        let names: Vec<String> = command
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        for name in names {
            command = command.mut_subcommand(name, |sub| self.set_defaults(sub));
        }
        command
    }

    /// The workspace: [`Project::root`], else the one around the current folder.
    pub fn workspace(&self) -> Result<Workspace> {
        match &self.root {
            Some(root) => Ok(Workspace::new(root.clone())),
            None => Workspace::find(),
        }
    }

    pub(crate) fn bundle_out(&self, ws: &Workspace, name: &str) -> PathBuf {
        ws.root.join(&self.bundle_dir).join(name)
    }

    pub(crate) fn needs_of(&self) -> &Needs {
        &self.needs
    }

    pub(crate) fn gpu_tests_of(&self) -> Result<&GpuTests> {
        self.gpu_tests.as_ref().context(
            "--gpu-tests: expected a project that names its GPU tests (`Project::gpu_tests`), \
             found none",
        )
    }

    /// The project's programs, the job among them.
    pub(crate) fn programs(&self) -> Vec<Program> {
        let mut all = self.programs.clone();
        if !all.iter().any(|p| p.name == self.job) {
            all.insert(0, Program::bin(self.job.clone()));
        }
        all
    }

    /// The program called `name`, or an error listing the programs there are.
    pub(crate) fn find(&self, name: &str) -> Result<Program> {
        let all = self.programs();
        if let Some(p) = all.iter().find(|p| p.name == name) {
            return Ok(p.clone());
        }
        let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
        bail!(
            "no program `{name}` in this project: expected one of {}",
            names.join(", ")
        )
    }

    /// Runs the [`Project::before_build`] step, if any.
    pub(crate) fn setup(&self, ws: &Workspace, dry_run: bool) -> Result<Setup> {
        let mut setup = BuildSetup {
            ws,
            dry_run,
            env: Vec::new(),
            info: Map::new(),
        };
        if let Some(f) = &self.setup {
            f(&mut setup)?;
        }
        Ok(Setup {
            env: setup.env,
            info: setup.info,
        })
    }

    /// The data files and folders, checked: each must exist inside the workspace.
    pub(crate) fn data_in(&self, ws: &Workspace) -> Result<Vec<Data>> {
        self.data.iter().map(|p| Data::check(ws, p)).collect()
    }
}

/// Where bundles go unless [`Project::bundle_dir`] says otherwise.
pub const DEFAULT_BUNDLE_DIR: &str = "target/bundles";

/// A program of the workspace: a binary or an example target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    name: String,
    kind: TargetKind,
    package: Option<String>,
}

/// The kind of a program's cargo target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// `--bin NAME`.
    Bin,
    /// `--example NAME`.
    Example,
}

impl TargetKind {
    fn flag(self) -> &'static str {
        match self {
            TargetKind::Bin => "--bin",
            TargetKind::Example => "--example",
        }
    }

    fn cargo_kind(self) -> &'static str {
        match self {
            TargetKind::Bin => "bin",
            TargetKind::Example => "example",
        }
    }
}

impl Program {
    /// A binary target.
    pub fn bin(name: impl Into<String>) -> Program {
        Program {
            name: name.into(),
            kind: TargetKind::Bin,
            package: None,
        }
    }

    /// An example target.
    pub fn example(name: impl Into<String>) -> Program {
        Program {
            name: name.into(),
            kind: TargetKind::Example,
            package: None,
        }
    }

    /// The package the target belongs to (default: the one workspace member that has a
    /// target of this name and kind).
    pub fn package(mut self, package: impl Into<String>) -> Program {
        self.package = Some(package.into());
        self
    }

    /// The target's name, the name the command line takes.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cargo arguments that select it (`-p PACKAGE --bin NAME`), its package found
    /// with `cargo metadata` in `ws` if it was not given.
    pub(crate) fn cargo_args(&self, ws: &Workspace) -> Result<Vec<String>> {
        let package = match &self.package {
            Some(p) => p.clone(),
            None => self.find_package(ws)?,
        };
        Ok(vec![
            "-p".into(),
            package,
            self.kind.flag().into(),
            self.name.clone(),
        ])
    }

    fn find_package(&self, ws: &Workspace) -> Result<String> {
        let mut metadata = ws.cargo();
        metadata.args(["metadata", "--no-deps", "--format-version", "1"]);
        let text = cmd::stdout_of(&mut metadata)?;
        self.package_in(&text, &ws.root)
    }

    /// The one package of `metadata` (`cargo metadata --no-deps` output) with a target
    /// of this name and kind.
    fn package_in(&self, metadata: &str, root: &Path) -> Result<String> {
        let metadata: Value =
            serde_json::from_str(metadata).context("`cargo metadata` wrote invalid JSON")?;
        let kind = self.kind.cargo_kind();
        let mut owners = Vec::new();
        let mut others = Vec::new();
        for package in metadata["packages"].as_array().into_iter().flatten() {
            let name = package["name"].as_str().unwrap_or_default();
            for target in package["targets"].as_array().into_iter().flatten() {
                let is_kind = target["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == kind));
                let target_name = target["name"].as_str().unwrap_or_default();
                if !is_kind {
                    continue;
                }
                if target_name == self.name {
                    owners.push(name.to_string());
                } else {
                    others.push(target_name.to_string());
                }
            }
        }
        match owners.as_slice() {
            [one] => Ok(one.clone()),
            [] => {
                others.sort();
                others.dedup();
                let found = if others.is_empty() {
                    format!("no {kind} target at all")
                } else {
                    format!("only {}", others.join(", "))
                };
                bail!(
                    "no {kind} target `{}` in the workspace at {}: expected a package with one, \
                     found {found}",
                    self.name,
                    root.display()
                )
            }
            several => bail!(
                "the {kind} target `{}` is in several packages ({}): expected one; name its \
                 package with `Program::{kind}(\"{}\").package(..)`",
                self.name,
                several.join(", "),
                self.name
            ),
        }
    }
}

/// What the host must have to run a bundle, checked by its `preflight.sh` (each check
/// says what it expected and what it found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    pub(crate) libraries: Vec<String>,
    pub(crate) compute_capability: Option<String>,
    pub(crate) driver: Option<(String, String)>,
}

impl Default for Needs {
    fn default() -> Needs {
        Needs::new()
    }
}

impl Needs {
    /// A GPU that `nvidia-smi` lists and the driver's `libcuda.so.1`; no minimum compute
    /// capability or driver version.
    pub fn new() -> Needs {
        Needs {
            libraries: vec!["libcuda.so.1".into()],
            compute_capability: None,
            driver: None,
        }
    }

    /// A shared library the job loads (`libcublasLt.so.13`), looked up where `run.sh`
    /// puts the CUDA folders on `LD_LIBRARY_PATH` and on the loader cache.
    pub fn library(mut self, file_name: impl Into<String>) -> Needs {
        let name = file_name.into();
        if !self.libraries.contains(&name) {
            self.libraries.push(name);
        }
        self
    }

    /// The shared libraries the job loads, replacing the list so far (`libcuda.so.1`
    /// unless changed).
    pub fn libraries<I, S>(mut self, file_names: I) -> Needs
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.libraries = file_names.into_iter().map(Into::into).collect();
        self
    }

    /// At least one GPU of this compute capability or newer (`8.0`): the oldest the
    /// job's kernels are built for.
    pub fn compute_capability(mut self, at_least: impl Into<String>) -> Needs {
        self.compute_capability = Some(at_least.into());
        self
    }

    /// A driver of at least this version (`580.65.06`), the oldest that loads what the
    /// kernels were compiled with; `for_what` says what that is, for the check's line
    /// (`CUDA 13.0`).
    pub fn driver(mut self, at_least: impl Into<String>, for_what: impl Into<String>) -> Needs {
        self.driver = Some((at_least.into(), for_what.into()));
        self
    }
}

/// A bundle of GPU tests: each package's integration tests whose names match
/// [`GpuTests::tests`], built with [`GpuTests::feature`], with every program of the
/// project. Its `run.sh` runs every test binary (one test at a time, ignored tests
/// included), then every program; `run.sh sanitize` runs one program under
/// compute-sanitizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTests {
    pub(crate) packages: Vec<String>,
    pub(crate) feature: String,
    pub(crate) tests: String,
    pub(crate) sanitize: Option<(String, Vec<String>)>,
}

impl Default for GpuTests {
    fn default() -> GpuTests {
        GpuTests::new()
    }
}

impl GpuTests {
    /// No packages yet; the feature `gpu-tests`, the tests `gpu*`, no sanitize program.
    pub fn new() -> GpuTests {
        GpuTests {
            packages: Vec::new(),
            feature: "gpu-tests".into(),
            tests: "gpu*".into(),
            sanitize: None,
        }
    }

    /// A package whose GPU tests go into the bundle.
    pub fn package(mut self, package: impl Into<String>) -> GpuTests {
        self.packages.push(package.into());
        self
    }

    /// The feature that compiles the GPU tests in (default `gpu-tests`).
    pub fn feature(mut self, feature: impl Into<String>) -> GpuTests {
        self.feature = feature.into();
        self
    }

    /// The integration tests to bundle, as a cargo target pattern (default `gpu*`).
    pub fn tests(mut self, pattern: impl Into<String>) -> GpuTests {
        self.tests = pattern.into();
        self
    }

    /// The program `run.sh sanitize` runs under compute-sanitizer, with its arguments.
    pub fn sanitize<I, S>(mut self, program: impl Into<String>, args: I) -> GpuTests
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.sanitize = Some((program.into(), args.into_iter().map(Into::into).collect()));
        self
    }
}

/// What [`Project::before_build`]'s step sees and gives: the workspace, whether this is
/// a dry run, and the environment and `build-info.json` facts for the builds.
#[derive(Debug)]
pub struct BuildSetup<'a> {
    ws: &'a Workspace,
    dry_run: bool,
    env: Vec<(OsString, OsString)>,
    info: Map<String, Value>,
}

impl BuildSetup<'_> {
    /// The workspace being built.
    pub fn workspace(&self) -> &Workspace {
        self.ws
    }

    /// Whether this is a dry run, which should change nothing.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Sets an environment variable for every cargo build of the bundle.
    pub fn env(&mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> &mut Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Records a fact in the bundle's `build-info.json` (`"nvcc": "13.0.88"`).
    pub fn info(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        self.info.insert(key.into(), value.into());
        self
    }
}

/// A [`BuildSetup`]'s outcome.
#[derive(Debug, Default)]
pub(crate) struct Setup {
    pub env: Vec<(OsString, OsString)>,
    pub info: Map<String, Value>,
}

/// A data file or folder of a job bundle, checked to be in the workspace.
#[derive(Debug, Clone)]
pub struct Data {
    /// Where it is.
    pub path: PathBuf,
    /// Its path relative to the workspace root, `/`-separated: its place under `data/`.
    pub rel: String,
}

impl Data {
    fn check(ws: &Workspace, given: &Path) -> Result<Data> {
        let joined = ws.root.join(given);
        let root = ws
            .root
            .canonicalize()
            .with_context(|| format!("could not resolve {}", ws.root.display()))?;
        let path = joined.canonicalize().map_err(|e| {
            anyhow::anyhow!(
                "data {}: expected a file or folder in the workspace at {}, found none ({})",
                given.display(),
                root.display(),
                e.to_string().to_lowercase()
            )
        })?;
        let Ok(rel) = path.strip_prefix(&root) else {
            bail!(
                "data {}: expected a path inside the workspace at {}, found {}, which is outside it",
                given.display(),
                root.display(),
                path.display()
            );
        };
        let parts: Vec<String> = rel
            .components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        if parts.is_empty() {
            bail!(
                "data {}: expected a file or folder inside the workspace at {}, found the \
                 workspace root itself",
                given.display(),
                root.display()
            );
        }
        Ok(Data {
            path,
            rel: parts.join("/"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METADATA: &str = r#"{"packages": [
        {"name": "trainer", "targets": [
            {"kind": ["bin"], "name": "trainer"}, {"kind": ["lib"], "name": "trainer"},
            {"kind": ["example"], "name": "smoke"}]},
        {"name": "tools", "targets": [{"kind": ["bin"], "name": "eval"},
            {"kind": ["bin"], "name": "smoke"}]},
        {"name": "more", "targets": [{"kind": ["bin"], "name": "eval"}]}
    ]}"#;

    #[test]
    fn a_target_s_package_is_found_by_name_and_kind() {
        let root = Path::new("/ws");
        assert_eq!(
            Program::bin("trainer").package_in(METADATA, root).unwrap(),
            "trainer"
        );
        assert_eq!(
            Program::example("smoke")
                .package_in(METADATA, root)
                .unwrap(),
            "trainer"
        );
        assert_eq!(
            Program::bin("smoke").package_in(METADATA, root).unwrap(),
            "tools"
        );
        let err = Program::bin("trainr")
            .package_in(METADATA, root)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "no bin target `trainr` in the workspace at /ws: expected a package with one, found \
             only eval, smoke, trainer"
        );
        let err = Program::bin("eval")
            .package_in(METADATA, root)
            .unwrap_err()
            .to_string();
        assert!(err.contains("in several packages (tools, more)"), "{err}");
    }

    #[test]
    fn the_job_is_a_program_and_others_are_named_when_one_is_missing() {
        let project = Project::new("trainer").program(Program::example("smoke").package("x"));
        assert_eq!(project.find("trainer").unwrap(), Program::bin("trainer"));
        assert_eq!(
            project
                .find("smoke")
                .unwrap()
                .cargo_args(&Workspace::new("/ws".into()))
                .unwrap(),
            ["-p", "x", "--example", "smoke"]
        );
        let err = project.find("eval").unwrap_err().to_string();
        assert_eq!(
            err,
            "no program `eval` in this project: expected one of trainer, smoke"
        );
    }

    #[test]
    fn data_must_exist_inside_the_workspace() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir_all(root.join("configs")).unwrap();
        std::fs::write(tmp.path().join("outside"), "x").unwrap();
        let ws = Workspace::new(root.clone());
        let ok = Data::check(&ws, Path::new("configs/")).unwrap();
        assert_eq!(ok.rel, "configs");
        let missing = Data::check(&ws, Path::new("nope")).unwrap_err().to_string();
        assert!(
            missing.starts_with("data nope: expected a file or folder in the workspace at"),
            "{missing}"
        );
        assert!(missing.contains("found none"), "{missing}");
        let outside = Data::check(&ws, Path::new("../outside"))
            .unwrap_err()
            .to_string();
        assert!(
            outside.contains("expected a path inside the workspace"),
            "{outside}"
        );
        assert!(outside.contains("which is outside it"), "{outside}");
        assert!(Data::check(&ws, Path::new(".")).is_err());
    }
}
