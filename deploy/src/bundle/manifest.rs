//! The bundle's `SHA256SUMS`: the sha256 of every other file in it, in the format
//! `sha256sum` writes and checks (`sha256sum -c SHA256SUMS` in the bundle folder).
//!
//! The hashes come from `sha256sum` itself rather than a hashing crate: the manifest must
//! be exactly what `sha256sum -c` reads on the host, coreutils is on every machine this
//! runs on, and the host side of `cargo xtask deploy` hashes with it too.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cmd;

/// The manifest's file name, at the top of the bundle.
pub const FILE: &str = "SHA256SUMS";

/// Paths (relative to the bundle, `/`-separated) and their sha256 in lowercase hex.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Each file's sha256, by its path.
    pub entries: BTreeMap<String, String>,
}

/// One way a folder differs from its manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // The fields are what the variants' names say.
pub enum Mismatch {
    /// A file's hash differs from the manifest's.
    Changed {
        path: String,
        expected: String,
        found: String,
    },
    /// A file of the manifest is not there.
    Missing { path: String, expected: String },
    /// A file is there that the manifest does not list.
    Unlisted { path: String, found: String },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Changed {
                path,
                expected,
                found,
            } => write!(f, "{path}: expected sha256 {expected}, found {found}"),
            Mismatch::Missing { path, expected } => {
                write!(f, "{path}: expected sha256 {expected}, found no such file")
            }
            Mismatch::Unlisted { path, found } => write!(
                f,
                "{path}: expected no such file (it is not in {FILE}), found one with sha256 {found}"
            ),
        }
    }
}

impl Manifest {
    /// Hashes every file under `bundle` except the manifest itself and writes the
    /// manifest (in a dry run, only says so).
    pub fn write(bundle: &Path, dry_run: bool) -> Result<Manifest> {
        let path = bundle.join(FILE);
        eprintln!("write {}", path.display());
        if dry_run {
            return Ok(Manifest::default());
        }
        let mut files = Vec::new();
        list_files(bundle, "", &mut files)?;
        files.retain(|f| f != FILE);
        let manifest = hash_files(bundle, &files)?;
        fs::write(&path, manifest.render())
            .with_context(|| format!("could not write {}", path.display()))?;
        Ok(manifest)
    }

    /// Reads the manifest of the bundle at `bundle`.
    pub fn read(bundle: &Path) -> Result<Manifest> {
        let path = bundle.join(FILE);
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "could not read {}: expected the checksum manifest that `cargo xtask bundle` writes",
                path.display()
            )
        })?;
        Manifest::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses `sha256sum` output (`<hex>  <path>`, or `<hex> *<path>` for binary mode).
    pub fn parse(text: &str) -> Result<Manifest> {
        let mut entries = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            if line.is_empty() {
                continue;
            }
            let parsed = line.split_once(' ').and_then(|(hash, rest)| {
                let path = rest.strip_prefix(' ').or_else(|| rest.strip_prefix('*'))?;
                let hex = hash.len() == 64
                    && hash
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                (hex && !path.is_empty()).then(|| (path.to_string(), hash.to_string()))
            });
            let Some((path, hash)) = parsed else {
                bail!(
                    "line {}: expected `<sha256 hex>  <path>`, found `{line}`",
                    n + 1
                );
            };
            entries.insert(path, hash);
        }
        Ok(Manifest { entries })
    }

    /// The manifest as `sha256sum` writes it.
    pub fn render(&self) -> String {
        self.entries
            .iter()
            .map(|(path, hash)| format!("{hash}  {path}\n"))
            .collect()
    }

    /// How `found` (the same folder hashed elsewhere) differs from this manifest.
    pub fn compare(&self, found: &Manifest) -> Vec<Mismatch> {
        let mut out = Vec::new();
        for (path, expected) in &self.entries {
            match found.entries.get(path) {
                Some(f) if f == expected => {}
                Some(f) => out.push(Mismatch::Changed {
                    path: path.clone(),
                    expected: expected.clone(),
                    found: f.clone(),
                }),
                None => out.push(Mismatch::Missing {
                    path: path.clone(),
                    expected: expected.clone(),
                }),
            }
        }
        for (path, f) in &found.entries {
            if !self.entries.contains_key(path) {
                out.push(Mismatch::Unlisted {
                    path: path.clone(),
                    found: f.clone(),
                });
            }
        }
        out
    }
}

/// The files a bundle's content hash leaves out: its `build-info.json`, which holds the
/// hash (and the time of the build), and the manifest, which holds the file's hash.
pub const NOT_CONTENT: &[&str] = &[super::build_info::FILE, FILE];

/// The sha256 (hex) of a bundle's content: of the manifest lines of every file but
/// [`NOT_CONTENT`]. Two bundles with the same programs and scripts have the same one,
/// whenever they were built; it is computed from a manifest, so the host's hashes of an
/// upload give it too.
pub fn content_hash(manifest: &Manifest) -> Result<String> {
    let mut content = manifest.clone();
    content
        .entries
        .retain(|path, _| !NOT_CONTENT.contains(&path.as_str()));
    let mut sha = Command::new("sha256sum");
    sha.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = sha.spawn().context("could not start `sha256sum`")?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        stdin
            .write_all(content.render().as_bytes())
            .context("writing to `sha256sum`")?;
    }
    let out = child.wait_with_output().context("running `sha256sum`")?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().next() {
        Some(hex) if out.status.success() && hex.len() == 64 => Ok(hex.to_string()),
        _ => bail!("`sha256sum` of a manifest wrote `{}`", text.trim()),
    }
}

/// Runs `sha256sum` on `files` (relative to `dir`).
pub fn hash_files(dir: &Path, files: &[String]) -> Result<Manifest> {
    let mut sha = Command::new("sha256sum");
    sha.current_dir(dir).arg("--").args(files);
    Manifest::parse(&cmd::stdout_of(&mut sha)?)
        .with_context(|| format!("reading the output of `{}`", cmd::display(&sha)))
}

/// Every regular file under `dir/prefix`, as `/`-separated paths relative to `dir`.
pub fn list_files(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<()> {
    let here = dir.join(prefix);
    let mut entries = fs::read_dir(&here)
        .with_context(|| format!("could not list {}", here.display()))?
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("could not list {}", here.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let kind = entry
            .file_type()
            .with_context(|| format!("could not read {}", entry.path().display()))?;
        if kind.is_dir() {
            list_files(dir, &rel, out)?;
        } else if kind.is_file() {
            out.push(rel);
        } else {
            bail!(
                "{} is neither a file nor a folder: a bundle holds only plain files",
                entry.path().display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0000000000000000000000000000000000000000000000000000000000000000";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn manifest(pairs: &[(&str, &str)]) -> Manifest {
        Manifest {
            entries: pairs
                .iter()
                .map(|(p, h)| (p.to_string(), h.to_string()))
                .collect(),
        }
    }

    #[test]
    fn sha256sum_output_round_trips() {
        let text = format!("{A}  bin/fork_join\n{B} *run.sh\n");
        let m = Manifest::parse(&text).unwrap();
        assert_eq!(m, manifest(&[("bin/fork_join", A), ("run.sh", B)]));
        assert_eq!(m.render(), format!("{A}  bin/fork_join\n{B}  run.sh\n"));
        let err = Manifest::parse("abc  run.sh\n").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }

    #[test]
    fn every_difference_names_what_was_expected_and_found() {
        let expected = manifest(&[("bin/job", A), ("run.sh", A), ("preflight.sh", A)]);
        let found = manifest(&[("bin/job", B), ("run.sh", A), ("extra", B)]);
        let text: Vec<String> = expected
            .compare(&found)
            .iter()
            .map(|m| m.to_string())
            .collect();
        assert_eq!(
            text,
            [
                format!("bin/job: expected sha256 {A}, found {B}"),
                format!("preflight.sh: expected sha256 {A}, found no such file"),
                format!(
                    "extra: expected no such file (it is not in SHA256SUMS), found one with sha256 {B}"
                ),
            ]
        );
        assert!(expected.compare(&expected).is_empty());
    }

    #[test]
    fn the_content_hash_leaves_out_the_build_info_and_the_manifest() {
        let content = manifest(&[("bin/job", A), ("run.sh", B)]);
        let mut bundle = content.clone();
        bundle.entries.insert("build-info.json".into(), A.into());
        bundle.entries.insert(FILE.into(), B.into());
        let hash = content_hash(&content).unwrap();
        assert_eq!(hash.len(), 64);
        assert_eq!(content_hash(&bundle).unwrap(), hash);
        let other = manifest(&[("bin/job", B), ("run.sh", B)]);
        assert_ne!(content_hash(&other).unwrap(), hash);
    }

    #[test]
    fn a_written_manifest_is_what_sha256sum_checks() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::write(dir.join("bin/job"), "job\n").unwrap();
        fs::write(dir.join("run.sh"), "run\n").unwrap();
        let m = Manifest::write(dir, false).unwrap();
        assert_eq!(m.entries.keys().collect::<Vec<_>>(), ["bin/job", "run.sh"]);
        assert_eq!(Manifest::read(dir).unwrap(), m);
        let check = Command::new("sha256sum")
            .args(["-c", "--quiet", FILE])
            .current_dir(dir)
            .status()
            .unwrap();
        assert!(check.success());
    }
}
