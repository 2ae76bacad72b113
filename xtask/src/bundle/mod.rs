//! `cargo xtask bundle`: release binaries, a `run.sh` and a `build-info.json` in one
//! small folder that is copied to the GPU host and run there unchanged.
//!
//! [`Plan`] is the reusable part: which cargo builds to run, which of their executables
//! to keep, what `run.sh sanitize` runs, and where the bundle goes. The command only
//! chooses a plan.

mod artifacts;
mod build_info;
mod run_sh;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use clap::Args;

pub use self::artifacts::{Artifact, Kind};
use self::build_info::BundledFile;
use self::run_sh::RunScript;
use crate::cmd::{self, Workspace};
use crate::demo::DEMO_EXAMPLE;
use crate::install_nvcc::{InstallNvcc, Nvcc};

/// The package that holds the examples and the GPU tests.
pub const SUITE: &str = "stepgraph-suite";

/// The integration tests that need a GPU, by name (a cargo target pattern, passed as is:
/// no shell expands it). The suite's other test binaries stay home: `ui` runs trybuild,
/// which needs the Rust toolchain the GPU host lacks.
pub const GPU_TESTS: &str = "gpu*";

/// Where bundles go by default, relative to the workspace root (git-ignored).
pub const DEFAULT_OUT: &str = ".device/bundle";

/// Marks a folder as written by this command, so a rebuild may clear it.
const MARKER: &str = ".stepgraph-bundle";

/// Above this, the bundle is too big to ship comfortably to the GPU host.
const SIZE_WARNING_BYTES: u64 = 40 << 20;

/// `strip` flags: drop debug info but keep the symbol table, so a panic's backtrace on
/// the host still names functions.
const STRIP_ARGS: &[&str] = &["--strip-debug"];

/// Builds the GPU tests and the examples in release mode and writes them, with `run.sh`
/// and `build-info.json`, to a bundle folder for the GPU host.
#[derive(Debug, Args)]
pub struct Bundle {
    /// Bundle the GPU test binaries (`tests/gpu*.rs`) and every example, built with
    /// `--features gpu-tests`.
    #[arg(long)]
    pub gpu_tests: bool,
    /// The bundle folder (relative paths are taken from the workspace root). Cleared of a
    /// previous bundle first; a folder that is not a bundle is refused.
    #[arg(long, default_value = DEFAULT_OUT)]
    pub out: PathBuf,
    /// Print the commands and files without building or writing anything.
    #[arg(long)]
    pub dry_run: bool,
}

impl Bundle {
    pub fn run(self, ws: &Workspace) -> Result<()> {
        if !self.gpu_tests {
            bail!("say what to bundle: `cargo xtask bundle --gpu-tests` (tests and examples)");
        }
        let plan = Plan {
            out: ws.root.join(&self.out),
            builds: vec![
                CargoBuild::gpu_tests(),
                CargoBuild::examples(&["gpu-tests"]),
            ],
            sanitize: Some(SanitizeTarget {
                example: DEMO_EXAMPLE.to_string(),
                args: vec!["--quick".to_string()],
            }),
        };
        let nvcc = InstallNvcc::with_dry_run(self.dry_run).ensure(ws)?;
        plan.execute(ws, &nvcc, self.dry_run)
    }
}

/// One cargo invocation of a bundle and the kind of executable kept from it.
#[derive(Debug, Clone)]
pub struct CargoBuild {
    /// Arguments after `cargo` (the JSON message format is added).
    pub args: Vec<String>,
    pub keep: Kind,
}

impl CargoBuild {
    /// The suite's GPU test binaries (integration tests named [`GPU_TESTS`]), with the
    /// GPU tests compiled in.
    pub fn gpu_tests() -> CargoBuild {
        CargoBuild {
            args: strings(&[
                "test",
                "--release",
                "-p",
                SUITE,
                "--features",
                "gpu-tests",
                "--no-run",
                "--test",
                GPU_TESTS,
            ]),
            keep: Kind::Test,
        }
    }

    /// Every example of the suite, with `features` on.
    pub fn examples(features: &[&str]) -> CargoBuild {
        let mut args = strings(&["build", "--release", "-p", SUITE, "--examples"]);
        if !features.is_empty() {
            args.extend(["--features".to_string(), features.join(",")]);
        }
        CargoBuild {
            args,
            keep: Kind::Example,
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
        let mut stdout = String::new();
        child
            .stdout
            .take()
            .expect("stdout is piped")
            .read_to_string(&mut stdout)
            .context("reading cargo's JSON messages")?;
        let status = child.wait()?;
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
    pub example: String,
    pub args: Vec<String>,
}

/// What goes into a bundle and where.
#[derive(Debug)]
pub struct Plan {
    pub out: PathBuf,
    pub builds: Vec<CargoBuild>,
    pub sanitize: Option<SanitizeTarget>,
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

        prepare_out(&self.out, dry_run)?;
        let bin_dir = self.out.join("bin");
        let mut files = Vec::new();
        for (name, artifact) in &bins {
            let dest = bin_dir.join(name);
            let mut strip = Command::new("strip");
            strip
                .args(STRIP_ARGS)
                .arg("-o")
                .arg(&dest)
                .arg(&artifact.path);
            cmd::run(&mut strip, dry_run)?;
            let bytes = if dry_run {
                0
            } else {
                fs::metadata(&dest)?.len()
            };
            files.push(BundledFile {
                name: name.clone(),
                kind: match artifact.kind {
                    Kind::Test => "test",
                    Kind::Example => "example",
                },
                bytes,
            });
        }

        let names = |kind| -> Vec<String> {
            bins.iter()
                .filter(|(_, a)| a.kind == kind)
                .map(|(n, _)| n.clone())
                .collect()
        };
        let (tests, examples) = (names(Kind::Test), names(Kind::Example));
        if let Some(s) = &self.sanitize
            && !dry_run
            && !examples.contains(&s.example)
        {
            eprintln!(
                "warning: the sanitize example `{}` is not in the bundle; `run.sh sanitize` will say so",
                s.example
            );
        }
        let script = RunScript {
            tests: &tests,
            examples: &examples,
            sanitize: self
                .sanitize
                .as_ref()
                .map(|s| (s.example.as_str(), s.args.as_slice())),
        }
        .render();
        write(&self.out.join("run.sh"), &script, 0o755, dry_run)?;

        let info = build_info::render(&ws.root, nvcc, &files);
        write(
            &self.out.join("build-info.json"),
            &format!("{}\n", serde_json::to_string_pretty(&info)?),
            0o644,
            dry_run,
        )?;

        let total: u64 = files.iter().map(|f| f.bytes).sum();
        for f in &files {
            eprintln!("  bin/{:<28} {:>6} KiB  {}", f.name, f.bytes >> 10, f.kind);
        }
        eprintln!(
            "bundle: {} ({} KiB in bin/)",
            self.out.display(),
            total >> 10
        );
        if total > SIZE_WARNING_BYTES {
            eprintln!(
                "warning: the bundle's binaries take {} MiB; it must stay well under 50 MiB",
                total >> 20
            );
        }
        Ok(())
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

/// Makes `out/bin` empty, refusing to touch a folder this command did not write.
fn prepare_out(out: &Path, dry_run: bool) -> Result<()> {
    let non_empty = fs::read_dir(out)
        .map(|mut entries| entries.next().is_some())
        .unwrap_or(false);
    if non_empty && !out.join(MARKER).exists() {
        bail!(
            "{} is not empty and was not written by `cargo xtask bundle` (no {MARKER}); \
             refusing to clear it: pick another --out",
            out.display()
        );
    }
    let bin = out.join("bin");
    eprintln!("$ rm -rf {0} && mkdir -p {0}", bin.display());
    if dry_run {
        return Ok(());
    }
    if bin.exists() {
        fs::remove_dir_all(&bin).with_context(|| format!("could not clear {}", bin.display()))?;
    }
    fs::create_dir_all(&bin).with_context(|| format!("could not create {}", bin.display()))?;
    fs::write(out.join(MARKER), "written by `cargo xtask bundle`\n")?;
    Ok(())
}

fn write(path: &Path, text: &str, mode: u32, dry_run: bool) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    eprintln!("write {}", path.display());
    if dry_run {
        return Ok(());
    }
    fs::write(path, text).with_context(|| format!("could not write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
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
            artifact(Kind::Example, "/t/release/examples/fork_join"),
            artifact(Kind::Test, "/t/release/deps/gpu-0123456789abcdef"),
            artifact(Kind::Example, "/t/release/examples/fork_join"),
        ])
        .unwrap();
        assert_eq!(bins.keys().collect::<Vec<_>>(), ["fork_join", "gpu"]);
    }

    #[test]
    fn two_files_with_one_stable_name_are_refused() {
        let err = by_stable_name(vec![
            artifact(Kind::Test, "/t/release/deps/gpu-0123456789abcdef"),
            artifact(Kind::Example, "/t/release/examples/gpu"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("bin/gpu"), "{err}");
    }

    #[test]
    fn gpu_test_build_is_a_release_no_run_with_the_feature() {
        let b = CargoBuild::gpu_tests();
        assert_eq!(
            b.args.join(" "),
            "test --release -p stepgraph-suite --features gpu-tests --no-run --test gpu*"
        );
        assert_eq!(b.keep, Kind::Test);
        assert_eq!(
            CargoBuild::examples(&["gpu-tests"]).args.join(" "),
            "build --release -p stepgraph-suite --examples --features gpu-tests"
        );
    }
}
