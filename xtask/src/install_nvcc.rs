//! `cargo xtask install-nvcc`: nvcc 13.0 without root, from pinned Python wheels.
//!
//! The kernels must be built by nvcc 13.0: a newer nvcc writes PTX that the H100 host's
//! CUDA 13.0 driver refuses. NVIDIA publishes the toolkit pieces as wheels; every one is
//! pinned, because the nvcc wheel's own requirements are unpinned and would pull a newer
//! toolkit (hence `--no-deps`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::cmd::{self, Workspace};

/// The wheels, pinned. Keep in step with the GPU host's CUDA toolkit (nvcc 13.0).
pub const PINNED_WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
];

/// The nvcc release the kernels need (what `nvcc --version` prints after `release`).
pub const NVCC_RELEASE: &str = "13.0";

/// Where the wheels go, relative to the workspace root. `kernels/build.rs` looks here
/// too, so it stays under `target/` whatever `CARGO_TARGET_DIR` says.
pub const INSTALL_DIR: &str = "target/nvcc";

/// nvcc inside the wheel layout.
const NVCC_IN_LAYOUT: &str = "nvidia/cu13/bin/nvcc";

/// Written after a good install; its content is [`marker_text`].
const MARKER: &str = ".stepgraph-nvcc-pins";

/// Installs nvcc 13.0.88 into `target/nvcc` (skipped when already there) and prints
/// its path.
#[derive(Debug, Args)]
pub struct InstallNvcc {
    /// Print what would run without installing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Reinstall even when the marker says the pinned versions are there.
    #[arg(long)]
    pub force: bool,
    /// The Python that runs pip.
    #[arg(long, default_value = "python3")]
    pub python: String,
}

/// An nvcc that reported the right release.
#[derive(Debug)]
pub struct Nvcc {
    pub path: PathBuf,
    /// The `Cuda compilation tools, release 13.0, V13.0.88` line.
    pub version: String,
}

impl InstallNvcc {
    /// What the other commands use: install quietly unless needed, no reinstall.
    pub fn with_dry_run(dry_run: bool) -> InstallNvcc {
        InstallNvcc {
            dry_run,
            force: false,
            python: "python3".into(),
        }
    }

    pub fn run(self, ws: &Workspace) -> Result<()> {
        let nvcc = self.ensure(ws)?;
        // The path alone on stdout, so `NVCC=$(cargo xtask install-nvcc)` works.
        println!("{}", nvcc.path.display());
        Ok(())
    }

    /// Makes sure nvcc 13.0 is installed and returns it.
    pub fn ensure(&self, ws: &Workspace) -> Result<Nvcc> {
        let dir = ws.root.join(INSTALL_DIR);
        let nvcc = dir.join(NVCC_IN_LAYOUT);
        let marker = dir.join(MARKER);

        if !self.force && fs::read_to_string(&marker).ok().as_deref() == Some(&marker_text()) {
            match version_line(&nvcc) {
                Ok(version) if release_of(&version) == Some(NVCC_RELEASE) => {
                    eprintln!("nvcc {NVCC_RELEASE} is installed: {version}");
                    return Ok(Nvcc {
                        path: nvcc,
                        version,
                    });
                }
                Ok(version) => eprintln!("{} reports `{version}`; reinstalling", nvcc.display()),
                Err(e) => eprintln!("{} does not run ({e:#}); reinstalling", nvcc.display()),
            }
        }

        self.check_pip()?;
        if dir.exists() {
            // Our own folder under target/: a partial or stale install is thrown away
            // whole, because `pip install --target` will not replace what is there.
            eprintln!("$ rm -r {}", dir.display());
            if !self.dry_run {
                fs::remove_dir_all(&dir)
                    .with_context(|| format!("could not remove {}", dir.display()))?;
            }
        }
        let mut pip = Command::new(&self.python);
        pip.args(["-m", "pip", "install", "--no-deps", "--only-binary=:all:"])
            .args(["--disable-pip-version-check", "--no-input", "--target"])
            .arg(&dir)
            .args(PINNED_WHEELS)
            // pip's progress on stderr: stdout carries only the path (see `run`).
            .stdout(std::io::stderr());
        cmd::run(&mut pip, self.dry_run)?;

        // nvcc's profile looks for libraries in `lib64`; the wheel names the folder `lib`.
        let lib64 = dir.join("nvidia/cu13/lib64");
        eprintln!("$ ln -s lib {}", lib64.display());
        if self.dry_run {
            return Ok(Nvcc {
                path: nvcc,
                version: format!("(dry run: nvcc {NVCC_RELEASE} not installed)"),
            });
        }
        if fs::symlink_metadata(&lib64).is_err() {
            std::os::unix::fs::symlink("lib", &lib64)
                .with_context(|| format!("could not link {} -> lib", lib64.display()))?;
        }

        let version = version_line(&nvcc).with_context(|| {
            format!(
                "pip installed the wheels, but {} does not run",
                nvcc.display()
            )
        })?;
        if release_of(&version) != Some(NVCC_RELEASE) {
            bail!(
                "{} reports `{version}`, expected release {NVCC_RELEASE}",
                nvcc.display()
            );
        }
        fs::write(&marker, marker_text())
            .with_context(|| format!("could not write {}", marker.display()))?;
        eprintln!("installed {version}");
        Ok(Nvcc {
            path: nvcc,
            version,
        })
    }

    fn check_pip(&self) -> Result<()> {
        let mut probe = Command::new(&self.python);
        probe.args(["-m", "pip", "--version"]);
        let why = match probe.output() {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                format!("`{}` is not on PATH", self.python)
            }
            Err(e) => e.to_string(),
        };
        bail!(
            "pip is not available: `{}` failed: {why}\n\
             nvcc {NVCC_RELEASE} is installed from pinned Python wheels with pip. Install pip \
             (Debian/Ubuntu: `apt-get install python3-pip`, or `{py} -m ensurepip --user`), \
             pass `--python` naming a Python that has it, or set NVCC to an existing nvcc \
             {NVCC_RELEASE}.",
            cmd::display(&probe),
            py = self.python,
        )
    }
}

/// The marker's content: the pins and the release, so a change of pins reinstalls.
fn marker_text() -> String {
    let mut text = PINNED_WHEELS.join("\n");
    text.push_str(&format!("\nrelease {NVCC_RELEASE}\n"));
    text
}

/// Runs `nvcc --version` and returns its `release` line.
pub fn version_line(nvcc: &Path) -> Result<String> {
    let out = cmd::stdout_of(Command::new(nvcc).arg("--version"))?;
    out.lines()
        .find(|l| l.contains("release"))
        .map(|l| l.trim().to_string())
        .with_context(|| {
            format!(
                "`{} --version` printed no release line:\n{out}",
                nvcc.display()
            )
        })
}

/// `13.0` from `Cuda compilation tools, release 13.0, V13.0.88`.
pub fn release_of(version_line: &str) -> Option<&str> {
    let rest = &version_line[version_line.find("release ")? + "release ".len()..];
    Some(rest.split(',').next().unwrap_or(rest).trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_is_read_from_the_version_line() {
        let line = "Cuda compilation tools, release 13.0, V13.0.88";
        assert_eq!(release_of(line), Some("13.0"));
        assert_eq!(
            release_of("Cuda compilation tools, release 13.5, V13.5.1"),
            Some("13.5")
        );
        assert_eq!(release_of("nvcc: NVIDIA (R) Cuda compiler driver"), None);
    }

    #[test]
    fn every_wheel_is_pinned_and_the_marker_names_them() {
        for wheel in PINNED_WHEELS {
            assert!(wheel.contains("=="), "{wheel} is not pinned");
            assert!(marker_text().contains(wheel));
        }
    }
}
