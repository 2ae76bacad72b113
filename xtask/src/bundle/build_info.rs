//! The bundle's `build-info.json`: what was built, from which tree, with which tools.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::preflight_sh::{MIN_COMPUTE_CAPABILITY, MIN_DRIVER};
use crate::install_nvcc::Nvcc;

/// The GPU architecture the kernels are compiled for (`kernels/build.rs`).
pub const SM_TARGET: &str = "sm_90";

/// One file of the bundle's `bin/`.
#[derive(Debug)]
pub struct BundledFile {
    pub name: String,
    pub kind: &'static str,
    pub bytes: u64,
}

/// The bundle's `build-info.json`. `libraries` are what `preflight.sh` requires.
pub fn render(root: &Path, nvcc: &Nvcc, files: &[BundledFile], libraries: &[String]) -> Value {
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap_or_default();
    let built_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({
        "release": release_name(root),
        "git_revision": git(root, &["rev-parse", "HEAD"]),
        // Bundles are often built from an uncommitted tree; say so.
        "git_dirty": git(root, &["status", "--porcelain", "--untracked-files=no"])
            .map(|s| !s.is_empty()),
        "nvcc": nvcc.version,
        "sm_target": SM_TARGET,
        "cudarc": locked_version(&lock, "cudarc"),
        "rustc": command_line(Command::new("rustc").arg("--version")),
        "built_at_unix_s": built_at,
        "needs": {
            "compute_capability": MIN_COMPUTE_CAPABILITY,
            "driver": MIN_DRIVER,
            "libraries": libraries,
        },
        "files": files
            .iter()
            .map(|f| json!({ "name": f.name, "kind": f.kind, "bytes": f.bytes }))
            .collect::<Vec<_>>(),
    })
}

/// The name a deploy gives the bundle's release folder on the host: git's short hash,
/// with `-dirty` when tracked files have uncommitted changes (`nogit` outside a
/// repository).
pub fn release_name(root: &Path) -> String {
    let Some(hash) = git(root, &["rev-parse", "--short", "HEAD"]) else {
        return "nogit".to_string();
    };
    match git(root, &["status", "--porcelain", "--untracked-files=no"]) {
        Some(changes) if changes.is_empty() => hash,
        _ => format!("{hash}-dirty"),
    }
}

fn git(root: &Path, args: &[&str]) -> Option<String> {
    command_line(Command::new("git").current_dir(root).args(args))
}

fn command_line(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The version of `package` in a `Cargo.lock`.
///
/// Read by hand rather than with the `toml` crate: a lock file's package entries are
/// always a `[[package]]` header followed by `name = "…"` and `version = "…"` lines, and
/// this is the only place the workspace reads TOML.
pub fn locked_version(lock: &str, package: &str) -> Option<String> {
    let wanted = format!("name = \"{package}\"");
    let mut lines = lock.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line == wanted {
            let version = lines.next()?.strip_prefix("version = \"")?;
            return Some(version.strip_suffix('"')?.to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cudarc_version_is_read_from_the_lock_file() {
        let lock = r#"
[[package]]
name = "cudarc"
version = "0.19.10"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "cudarc-extra"
version = "9.9.9"
"#;
        assert_eq!(locked_version(lock, "cudarc").as_deref(), Some("0.19.10"));
        assert_eq!(locked_version(lock, "half"), None);
    }

    #[test]
    fn the_workspace_lock_file_names_cudarc() {
        let lock = include_str!("../../../Cargo.lock");
        assert!(locked_version(lock, "cudarc").is_some());
    }
}
