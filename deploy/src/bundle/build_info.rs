//! The bundle's `build-info.json`: what was built, from which tree, with which tools.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::project::Needs;

/// The file's name, at the bundle's top.
pub const FILE: &str = "build-info.json";

/// One file of the bundle's `bin/`.
#[derive(Debug)]
pub struct BundledFile {
    /// Its name in `bin/`.
    pub name: String,
    /// `program` or `test`.
    pub kind: &'static str,
    /// Its size.
    pub bytes: u64,
}

/// What a bundle is, for its `build-info.json`: the program (or `gpu-tests`), the tree
/// it was built from, and the hash of its content ([`super::manifest::content_hash`]).
#[derive(Debug, Clone)]
pub struct Identity {
    /// The program (`gpu-tests` for a GPU-test bundle).
    pub program: String,
    /// The tree's revision.
    pub revision: Revision,
    /// The hash of the bundle's content.
    pub content_sha256: String,
}

impl Identity {
    /// The name of the bundle's release folder on a host: the program, the revision
    /// (`-dirty` when the tree had changes) and the first 12 hex digits of the content
    /// hash, `dqn-3e675b0-1f2e3d4c5b6a`. The hash is there even for a clean tree: a
    /// revision rebuilt with another toolchain is other bytes, and a release folder,
    /// once made, never changes.
    pub fn release(&self) -> String {
        release_name(&self.program, &self.revision, Some(&self.content_sha256))
    }
}

/// [`Identity::release`] from its parts; without the hash (a dry run that builds
/// nothing), `<hash>` stands in for it.
pub fn release_name(program: &str, revision: &Revision, content_sha256: Option<&str>) -> String {
    let hash = content_sha256.map_or("<hash>", |h| &h[..h.len().min(RELEASE_HASH_DIGITS)]);
    let dirty = if revision.dirty { "-dirty" } else { "" };
    format!("{program}-{}{dirty}-{hash}", revision.short)
}

/// How many hex digits of the content hash a release name carries.
pub const RELEASE_HASH_DIGITS: usize = 12;

/// The git revision of a tree and whether it had changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    /// The full hash (`None` outside a repository).
    pub full: Option<String>,
    /// The short hash, or `nogit`.
    pub short: String,
    /// Uncommitted changes, untracked files included (ignored ones are not).
    pub dirty: bool,
}

impl Revision {
    /// The revision of the tree at `root` (`nogit` outside a repository).
    pub fn of(root: &Path) -> Revision {
        let Some(short) = git(root, &["rev-parse", "--short", "HEAD"]) else {
            return Revision {
                full: None,
                short: "nogit".into(),
                dirty: false,
            };
        };
        // A file not yet added changes the build as much as an edited one.
        let dirty = git(root, &["status", "--porcelain", "--untracked-files=normal"])
            .is_none_or(|changes| !changes.is_empty());
        Revision {
            full: git(root, &["rev-parse", "HEAD"]),
            short,
            dirty,
        }
    }
}

/// The bundle's `build-info.json`: the identity, the tree and the tools it was built
/// with, what the host needs, the files of `bin/` and `data/`, and the facts `extra` adds
/// (the project's build setup: a kernel compiler's version, say).
pub fn render(
    root: &Path,
    identity: &Identity,
    extra: &Map<String, Value>,
    files: &[BundledFile],
    data: &[String],
    needs: &Needs,
) -> Value {
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap_or_default();
    let built_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut info = json!({
        "release": identity.release(),
        "program": identity.program,
        "content_sha256": identity.content_sha256,
        "git_revision": identity.revision.full,
        // Bundles are often built from an uncommitted tree; say so.
        "git_dirty": identity.revision.dirty,
        "cudarc": locked_version(&lock, "cudarc"),
        "rustc": command_line(Command::new("rustc").arg("--version")),
        "built_at_unix_s": built_at,
        "needs": {
            "compute_capability": needs.compute_capability,
            "driver": needs.driver.as_ref().map(|(version, _)| version),
            "libraries": needs.libraries,
        },
        "files": files
            .iter()
            .map(|f| json!({ "name": f.name, "kind": f.kind, "bytes": f.bytes }))
            .collect::<Vec<_>>(),
        "data": data,
    });
    if let Some(map) = info.as_object_mut() {
        for (key, value) in extra {
            map.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    info
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
    fn release_names_carry_the_program_the_revision_and_the_content() {
        let clean = Revision {
            full: Some("3e675b0f".into()),
            short: "3e675b0".into(),
            dirty: false,
        };
        let hash = "1f2e3d4c5b6a79880000000000000000000000000000000000000000000000ff";
        assert_eq!(
            release_name("dqn", &clean, Some(hash)),
            "dqn-3e675b0-1f2e3d4c5b6a"
        );
        let dirty = Revision {
            dirty: true,
            ..clean
        };
        assert_eq!(
            release_name("fork_join", &dirty, Some(hash)),
            "fork_join-3e675b0-dirty-1f2e3d4c5b6a"
        );
        assert_eq!(
            release_name("dqn", &dirty, None),
            "dqn-3e675b0-dirty-<hash>"
        );
    }

    #[test]
    fn untracked_files_make_a_tree_dirty() {
        let tmp = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let ok = Command::new("git")
                .current_dir(tmp.path())
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .output()
                .unwrap()
                .status
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        std::fs::write(tmp.path().join("a"), "a").unwrap();
        git(&["add", "a"]);
        git(&["commit", "-q", "-m", "a"]);
        assert!(!Revision::of(tmp.path()).dirty);
        std::fs::write(tmp.path().join("new"), "b").unwrap();
        assert!(Revision::of(tmp.path()).dirty);
    }

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
