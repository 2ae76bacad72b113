//! `cargo xtask test`: the whole test suite, with nvcc 13.0 so the kernels build, the
//! system tools the tests run (Chromium for the picture tests; sshd, ssh and rsync for the
//! deploy tests), and gymnasium in a virtual environment (the environments' comparison).
//! The tests themselves install nothing: they fail, naming what is missing and this
//! command, when a tool is not there.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::cmd::{self, Workspace};
use crate::install_nvcc::InstallNvcc;
use crate::programs::{GPU_TEST_PACKAGES, GPU_TESTS};

/// Installs nvcc, rustfmt and clippy and the tests' system tools if needed
/// ([`TEST_TOOLS`], with apt-get, as root) and gymnasium into a virtual environment
/// ([`GYMNASIUM_VENV`], [`GYMNASIUM_PINS`]), whose Python the tests get as
/// `STEPGRAPH_PYTHON`; checks the formatting; checks the published
/// crates with the toolchain each names as its `rust-version` (installed with rustup if
/// missing); runs `cargo test --workspace`; compiles (does not run) the GPU tests; runs clippy on every
/// target, GPU tests included, and builds the docs, both with warnings denied; and runs
/// the DQN results merger's tests (Python standard library only).
#[derive(Debug, Args)]
pub struct Test {
    /// Print the commands without running them.
    #[arg(long)]
    pub dry_run: bool,
    /// Passed to `cargo test --workspace` after its own arguments
    /// (`cargo xtask test -- -p stepgraph -- --nocapture`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

impl Test {
    pub fn run(self, ws: &Workspace) -> Result<()> {
        let nvcc = InstallNvcc::with_dry_run(self.dry_run).ensure(ws)?;
        install_tools(TEST_TOOLS, self.dry_run)?;
        let python = ensure_gymnasium(ws, self.dry_run)?;
        for component in RUST_COMPONENTS {
            ensure_component(ws, component, self.dry_run)?;
        }

        // What a reviewer checks first, and the cheapest: formatting.
        let mut fmt = ws.cargo();
        fmt.args(["fmt", "--all", "--check"]);
        cmd::run(&mut fmt, self.dry_run)?;

        // A `rust-version` nothing checks drifts: each published crate is built (checked
        // only: that is where a newer API or syntax shows) with the toolchain it names.
        let metadata =
            cmd::stdout_of(
                ws.cargo()
                    .args(["metadata", "--no-deps", "--format-version", "1"]),
            )?;
        for (version, packages) in msrv_groups(&metadata)? {
            ensure_toolchain(&version, self.dry_run)?;
            let mut check = Command::new("rustup");
            check
                .current_dir(&ws.root)
                .args(["run", &version, "cargo", "check"])
                .args(packages.iter().flat_map(|p| ["-p", p]))
                .env("NVCC", &nvcc.path);
            cmd::run(&mut check, self.dry_run)?;
        }

        let mut all = ws.cargo();
        all.args(["test", "--workspace"])
            .args(&self.args)
            .env("NVCC", &nvcc.path)
            .env(PYTHON_VAR, &python);
        cmd::run(&mut all, self.dry_run)?;

        // GPU tests cannot run without a GPU; this proves they compile. Only the GPU test
        // binaries read the feature: the packages' other targets were built above.
        for package in GPU_TEST_PACKAGES {
            let mut gpu = ws.cargo();
            gpu.args(["test", "-p", package, "--features", "gpu-tests", "--no-run"])
                .args(["--test", GPU_TESTS])
                .env("NVCC", &nvcc.path);
            cmd::run(&mut gpu, self.dry_run)?;
        }

        // Lints on every target, the GPU tests' code included, and docs whose links and
        // examples hold: both with warnings denied, as a reviewer would read them.
        let gpu_features = GPU_TEST_PACKAGES
            .iter()
            .map(|p| format!("{p}/gpu-tests"))
            .collect::<Vec<_>>()
            .join(",");
        for features in [vec![], vec!["--features".to_string(), gpu_features]] {
            let mut clippy = ws.cargo();
            clippy
                .args(["clippy", "--workspace", "--all-targets"])
                .args(&features)
                .args(["--", "-D", "warnings"])
                .env("NVCC", &nvcc.path);
            cmd::run(&mut clippy, self.dry_run)?;
        }
        let mut doc = ws.cargo();
        doc.args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings")
            .env("NVCC", &nvcc.path);
        cmd::run(&mut doc, self.dry_run)?;

        // The PyTorch oracle's own tests need torch and run on the GPU host; the results
        // merger needs only python3, which every machine here has.
        let mut combine = std::process::Command::new("python3");
        combine
            .args([
                "-m",
                "unittest",
                "-v",
                "examples/dqn/test_combine.py",
                "examples/dqn/test_dram_bound.py",
            ])
            .current_dir(&ws.root);
        cmd::run(&mut combine, self.dry_run)
    }
}

/// The toolchain components the checks run (`cargo fmt`, `cargo clippy`).
pub const RUST_COMPONENTS: &[(&str, &str)] = &[("fmt", "rustfmt"), ("clippy", "clippy")];

/// Makes sure `cargo <subcommand>` runs, adding its rustup component when it does not.
fn ensure_component(
    ws: &Workspace,
    (subcommand, component): &(&str, &str),
    dry_run: bool,
) -> Result<()> {
    let mut probe = ws.cargo();
    probe.args([subcommand, "--version"]);
    let mut add = Command::new("rustup");
    add.args(["component", "add", component]);
    probe_or_install(probe, add, dry_run, || {
        format!(
            "`cargo {subcommand}` is not installed and `rustup component add {component}` failed: install the {component} component of the toolchain"
        )
    })
}

/// The published packages of a workspace (`cargo metadata --no-deps` output), grouped by
/// their `rust-version`, oldest first; a published package without one is an error, since
/// its minimum would go unchecked.
pub fn msrv_groups(metadata: &str) -> Result<Vec<(String, Vec<String>)>> {
    let metadata: serde_json::Value =
        serde_json::from_str(metadata).context("`cargo metadata` wrote invalid JSON")?;
    let packages = metadata["packages"]
        .as_array()
        .context("`cargo metadata` wrote no `packages` list")?;
    let mut groups: Vec<(Vec<u64>, String, Vec<String>)> = Vec::new();
    for package in packages {
        let name = package["name"]
            .as_str()
            .context("a package in `cargo metadata` has no name")?;
        // `publish = false` is an empty list of registries; absent (null) is crates.io.
        if package["publish"].as_array().is_some_and(|r| r.is_empty()) {
            continue;
        }
        let Some(version) = package["rust_version"].as_str() else {
            bail!("{name} is published but states no `rust-version` to check it against");
        };
        let key = version
            .split('.')
            .map(|n| n.parse::<u64>())
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("{name}'s rust-version `{version}` is not a version"))?;
        match groups.iter_mut().find(|(_, v, _)| v == version) {
            Some((_, _, names)) => names.push(name.to_string()),
            None => groups.push((key, version.to_string(), vec![name.to_string()])),
        }
    }
    groups.sort();
    Ok(groups
        .into_iter()
        .map(|(_, version, mut names)| {
            names.sort();
            (version, names)
        })
        .collect())
}

/// Makes sure rustup has the toolchain `version`, installing it (minimal profile: only
/// `cargo check` runs with it) when it does not.
fn ensure_toolchain(version: &str, dry_run: bool) -> Result<()> {
    let mut probe = Command::new("rustup");
    // Probed without rustup installing it on the spot, with a default profile.
    probe
        .args(["run", version, "cargo", "--version"])
        .env("RUSTUP_AUTO_INSTALL", "0");
    let mut install = Command::new("rustup");
    install.args(["toolchain", "install", version, "--profile", "minimal"]);
    probe_or_install(probe, install, dry_run, || {
        format!(
            "Rust {version} checks the crates that name it as their rust-version, and `rustup toolchain install {version}` failed: install it"
        )
    })
}

/// Where `cargo xtask test` puts the virtual environment with gymnasium, relative to the
/// workspace root: under `target/` whatever `CARGO_TARGET_DIR` says, as nvcc is.
pub const GYMNASIUM_VENV: &str = "target/gymnasium";

/// What the environments' comparison with gymnasium (`envs/tests/gymnasium.rs`) runs,
/// every package pinned (gymnasium's own requirements are not), installed without
/// dependency resolution so that nothing else comes in. Keep gymnasium's version in
/// step with `GYMNASIUM` in that test, which refuses another.
pub const GYMNASIUM_PINS: &[&str] = &[
    "gymnasium==1.2.3",
    "numpy==2.3.5",
    "cloudpickle==3.1.3",
    "typing-extensions==4.16.0",
    "farama-notifications==0.0.6",
];

/// The variable that names the Python with gymnasium to the tests.
pub const PYTHON_VAR: &str = "STEPGRAPH_PYTHON";

/// The virtual environment's Python.
pub fn gymnasium_python(ws: &Workspace) -> PathBuf {
    ws.root.join(GYMNASIUM_VENV).join("bin/python")
}

/// Makes sure [`GYMNASIUM_VENV`] exists (`python3 -m venv`) and holds
/// [`GYMNASIUM_PINS`] (pip, binary wheels only), and returns its Python.
fn ensure_gymnasium(ws: &Workspace, dry_run: bool) -> Result<PathBuf> {
    let python = gymnasium_python(ws);
    let mut probe = Command::new(&python);
    probe.arg("--version");
    let mut venv = Command::new("python3");
    venv.args(["-m", "venv"]).arg(ws.root.join(GYMNASIUM_VENV));
    probe_or_install(probe, venv, dry_run, || {
        format!(
            "the gymnasium comparison needs a virtual environment in {GYMNASIUM_VENV}, and \
             `python3 -m venv` failed: install Python 3 with venv (Debian: `apt-get install \
             python3-venv`)"
        )
    })?;
    let mut probe = Command::new(&python);
    probe.args(["-c", &pins_probe(GYMNASIUM_PINS)]);
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "install", "--no-deps", "--only-binary=:all:"])
        .args(["--disable-pip-version-check", "--no-input"])
        .args(GYMNASIUM_PINS);
    probe_or_install(probe, pip, dry_run, || {
        format!(
            "the gymnasium comparison needs {} in {GYMNASIUM_VENV}, and pip could not \
             install them",
            GYMNASIUM_PINS.join(" ")
        )
    })?;
    Ok(python)
}

/// A Python one-liner that fails unless every `name==version` of `pins` is installed at
/// that version.
fn pins_probe(pins: &[&str]) -> String {
    let pairs: Vec<String> = pins
        .iter()
        .map(|p| {
            let (name, version) = p.split_once("==").unwrap_or((p, ""));
            format!("({name:?}, {version:?})")
        })
        .collect();
    format!(
        "import importlib.metadata as m, sys; sys.exit(any(m.version(n) != v for n, v in [{}]))",
        pairs.join(", ")
    )
}

/// Runs `install` unless `probe` succeeds; `--dry-run` shows both without running either.
fn probe_or_install(
    mut probe: Command,
    mut install: Command,
    dry_run: bool,
    failed: impl FnOnce() -> String,
) -> Result<()> {
    if dry_run {
        eprintln!(
            "$ {} (else `{}`)",
            cmd::display(&probe),
            cmd::display(&install)
        );
        return Ok(());
    }
    let present = probe
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return Ok(());
    }
    cmd::run(&mut install, false).with_context(failed)
}

/// A program some tests run, and the Debian packages that provide it.
#[derive(Clone, Copy, Debug)]
pub struct SystemTool {
    /// A name looked up on `PATH`, or an absolute path.
    pub program: &'static str,
    /// What `apt-get install` needs for the tests to use it.
    pub packages: &'static [&'static str],
    /// The tests that run it, for messages.
    pub needed_by: &'static str,
}

/// What the picture tests (`picture/tests/picture.rs`) run: headless Chromium, and the
/// font the SVGs ask for first, so that the screenshots have glyphs.
pub const PICTURE_TOOLS: &[SystemTool] = &[SystemTool {
    program: "chromium",
    packages: &["chromium", "fonts-dejavu-core"],
    needed_by: "the picture tests",
}];

/// What the deploy tests (`xtask/tests/deploy.rs`) run: an sshd of their own, the
/// client side of a deploy, and what a deploy runs on the host (here, the same machine).
pub const DEPLOY_TOOLS: &[SystemTool] = &[
    SystemTool {
        program: SSHD,
        packages: &["openssh-server"],
        needed_by: "the deploy tests",
    },
    SystemTool {
        program: "ssh",
        packages: &["openssh-client"],
        needed_by: "the deploy tests",
    },
    SystemTool {
        program: "ssh-keygen",
        packages: &["openssh-client"],
        needed_by: "the deploy tests",
    },
    SystemTool {
        program: "rsync",
        packages: &["rsync"],
        needed_by: "the deploy tests",
    },
    // The tests signal the deploy with it, and a stopped deploy kills a step's process
    // group with it.
    SystemTool {
        program: "kill",
        packages: &["procps"],
        needed_by: "the deploy tests",
    },
    // The deploy folder's lock on the host, which in the tests is this machine.
    SystemTool {
        program: "flock",
        packages: &["util-linux"],
        needed_by: "the deploy tests",
    },
];

/// Everything `cargo xtask test` installs before it runs the tests.
pub const TEST_TOOLS: &[&[SystemTool]] = &[PICTURE_TOOLS, DEPLOY_TOOLS];

/// Where Debian's openssh-server puts sshd.
pub const SSHD: &str = "/usr/sbin/sshd";

/// The privilege separation folder sshd wants when root starts it. The service scripts
/// make it at boot; the deploy tests start sshd without them, and `/run` is emptied at
/// each boot, so [`install_tools`] makes it.
pub const SSHD_PRIVSEP_DIR: &str = "/run/sshd";

/// Where `program` is: itself when it is an absolute path that exists, else the first
/// match on `PATH`.
pub fn find(program: &str) -> Option<PathBuf> {
    let path = Path::new(program);
    if path.is_absolute() {
        return path.is_file().then(|| path.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// The tools of `tools` that are not installed.
pub fn missing(tools: &[SystemTool]) -> Vec<SystemTool> {
    tools
        .iter()
        .filter(|t| find(t.program).is_none())
        .copied()
        .collect()
}

/// Whether this process runs as root (`id -u` says 0).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// What a test says when a tool it needs is missing: which, for what, and how to get it.
pub fn missing_message(missing: &[SystemTool]) -> String {
    format!(
        "{}: run `cargo xtask test`, which installs {} with apt-get when run as root, or \
         install the Debian packages yourself (`sudo apt-get install {}`)",
        what_is_missing(missing),
        if missing.len() == 1 { "it" } else { "them" },
        packages_of(missing).join(" ")
    )
}

/// `the deploy tests need ssh, rsync, which are not installed`.
fn what_is_missing(missing: &[SystemTool]) -> String {
    let programs: Vec<&str> = missing.iter().map(|t| t.program).collect();
    let mut needed_by: Vec<&str> = missing.iter().map(|t| t.needed_by).collect();
    needed_by.dedup();
    format!(
        "{} need {}, which {} not installed",
        needed_by.join(" and "),
        programs.join(", "),
        if programs.len() == 1 { "is" } else { "are" },
    )
}

/// The packages that provide `tools`, each once, in order.
fn packages_of(tools: &[SystemTool]) -> Vec<&'static str> {
    let mut packages: Vec<&'static str> = Vec::new();
    for p in tools.iter().flat_map(|t| t.packages) {
        if !packages.contains(p) {
            packages.push(p);
        }
    }
    packages
}

/// Installs the tools of `groups` that are missing, with apt-get (root only: otherwise
/// the error says what to install), and makes sshd's privilege separation folder when
/// root. In a dry run, prints what it would run.
pub fn install_tools(groups: &[&[SystemTool]], dry_run: bool) -> Result<()> {
    let tools: Vec<SystemTool> = groups.iter().flat_map(|g| g.iter().copied()).collect();
    let absent = missing(&tools);
    let root = is_root();
    if absent.is_empty() {
        let programs: Vec<&str> = tools.iter().map(|t| t.program).collect();
        eprintln!("test tools are installed: {}", programs.join(", "));
    } else if !root {
        bail!(
            "{}, and this command installs system packages only as root: install them \
             (`sudo apt-get install {}`), or run it as root",
            what_is_missing(&absent),
            packages_of(&absent).join(" ")
        );
    } else {
        let packages = packages_of(&absent);
        let install = || {
            let mut apt = Command::new("apt-get");
            apt.args(["install", "-y", "--no-install-recommends"])
                .args(&packages)
                .env("DEBIAN_FRONTEND", "noninteractive");
            apt
        };
        if dry_run {
            cmd::run(&mut install(), true)?;
        } else if cmd::run(&mut install(), false).is_err() {
            // A fresh machine has no package lists yet.
            let mut update = Command::new("apt-get");
            update
                .arg("update")
                .env("DEBIAN_FRONTEND", "noninteractive");
            cmd::run(&mut update, false)?;
            cmd::run(&mut install(), false)?;
        }
        let still = if dry_run {
            Vec::new()
        } else {
            missing(&absent)
        };
        if !still.is_empty() {
            let programs: Vec<&str> = still.iter().map(|t| t.program).collect();
            bail!(
                "apt-get installed {}, but {} still cannot be found",
                packages.join(" "),
                programs.join(", ")
            );
        }
    }
    let wants_sshd = tools.iter().any(|t| t.program == SSHD);
    if root && wants_sshd && !Path::new(SSHD_PRIVSEP_DIR).is_dir() {
        eprintln!("$ mkdir -p {SSHD_PRIVSEP_DIR}");
        if !dry_run {
            fs::create_dir_all(SSHD_PRIVSEP_DIR)
                .with_context(|| format!("could not create {SSHD_PRIVSEP_DIR}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_packages_are_grouped_by_rust_version_oldest_first() {
        let metadata = r#"{"packages": [
            {"name": "b", "publish": null, "rust_version": "1.88"},
            {"name": "tool", "publish": [], "rust_version": "1.95"},
            {"name": "c", "publish": null, "rust_version": "1.9"},
            {"name": "a", "publish": null, "rust_version": "1.88"},
            {"name": "d", "publish": ["crates-io"], "rust_version": "1.85"}
        ]}"#;
        let groups = msrv_groups(metadata).unwrap();
        let expected: Vec<(String, Vec<String>)> = vec![
            ("1.9".into(), vec!["c".into()]),
            ("1.85".into(), vec!["d".into()]),
            ("1.88".into(), vec!["a".into(), "b".into()]),
        ];
        assert_eq!(groups, expected);

        let unstated = r#"{"packages": [{"name": "a", "publish": null, "rust_version": null}]}"#;
        assert_eq!(
            msrv_groups(unstated).unwrap_err().to_string(),
            "a is published but states no `rust-version` to check it against"
        );
    }

    #[test]
    fn every_library_crate_of_the_workspace_is_checked_at_its_rust_version() {
        let ws = crate::workspace();
        let metadata =
            cmd::stdout_of(
                ws.cargo()
                    .args(["metadata", "--no-deps", "--format-version", "1"]),
            )
            .unwrap();
        let mut checked: Vec<String> = msrv_groups(&metadata)
            .unwrap()
            .into_iter()
            .flat_map(|(_, names)| names)
            .collect();
        checked.sort();
        assert_eq!(
            checked,
            [
                "stepgraph",
                "stepgraph-build",
                "stepgraph-envs",
                "stepgraph-kernels",
                "stepgraph-macros",
                "stepgraph-picture",
                "stepgraph-plan"
            ]
        );
    }

    #[test]
    fn every_gymnasium_package_is_pinned_and_probed() {
        for pin in GYMNASIUM_PINS {
            let (name, version) = pin.split_once("==").expect("name==version");
            assert!(!name.is_empty() && !version.is_empty(), "{pin}");
        }
        let probe = pins_probe(&["gymnasium==1.2.3", "numpy==2.3.5"]);
        assert_eq!(
            probe,
            "import importlib.metadata as m, sys; sys.exit(any(m.version(n) != v for n, v in \
             [(\"gymnasium\", \"1.2.3\"), (\"numpy\", \"2.3.5\")]))"
        );
        // The probe says no for a package that is not there (python3 is on every machine
        // that runs these tests, as for the results merger's).
        let status = Command::new("python3")
            .args(["-c", &pins_probe(&["stepgraph-no-such-package==1.0"])])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success());
    }

    #[test]
    fn programs_are_found_by_absolute_path_or_on_path() {
        assert_eq!(find("/bin/sh"), Some(PathBuf::from("/bin/sh")));
        assert!(find("sh").is_some_and(|p| p.ends_with("sh")));
        assert_eq!(find("/no/such/program"), None);
        assert_eq!(find("no-such-program-stepgraph"), None);
    }

    #[test]
    fn a_missing_tool_is_named_with_its_tests_and_packages() {
        let absent = [
            SystemTool {
                program: "no-such-program-stepgraph",
                packages: &["a", "b"],
                needed_by: "the picture tests",
            },
            SystemTool {
                program: "/no/such/sshd",
                packages: &["b", "c"],
                needed_by: "the deploy tests",
            },
        ];
        assert_eq!(missing(&absent).len(), 2);
        assert_eq!(
            missing_message(&absent),
            "the picture tests and the deploy tests need no-such-program-stepgraph, \
             /no/such/sshd, which are not installed: run `cargo xtask test`, which installs \
             them with apt-get when run as root, or install the Debian packages yourself \
             (`sudo apt-get install a b c`)"
        );
        let one = missing_message(&absent[..1]);
        assert!(
            one.contains("which is not installed") && one.contains("installs it"),
            "{one}"
        );
    }

    #[test]
    fn every_tool_the_tests_run_has_a_package() {
        for tool in TEST_TOOLS.iter().flat_map(|g| g.iter()) {
            assert!(!tool.packages.is_empty(), "{tool:?}");
        }
        assert_eq!(
            packages_of(DEPLOY_TOOLS),
            [
                "openssh-server",
                "openssh-client",
                "rsync",
                "procps",
                "util-linux"
            ]
        );
    }

    #[test]
    fn installed_tools_need_no_apt_get() {
        let present = [SystemTool {
            program: "/bin/sh",
            packages: &["never-installed"],
            needed_by: "this test",
        }];
        install_tools(&[&present], true).unwrap();
    }
}
