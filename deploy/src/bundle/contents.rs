//! Writing a bundle folder from executables already built: `bin/`, `data/`, `run.sh`,
//! `preflight.sh`, `build-info.json` and, last, `SHA256SUMS` over all of them.
//!
//! Separate from the cargo builds so that the deploy tests bundle a job that needs no GPU
//! (and no nvcc) with exactly the scripts a real bundle gets.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::build_info::{self, BundledFile, Identity, Revision};
use super::job_sh::{DATA_DIR, JobScript};
use super::manifest::{self, Manifest};
use super::preflight_sh::Preflight;
use super::run_sh::RunScript;
use super::{Artifact, Kind, Runner};
use crate::cmd;
use crate::project::{Data, Needs};

/// The script that runs the bundle, at its top.
pub const RUN_SH: &str = "run.sh";
/// The script that checks a host can run the bundle, at its top.
pub const PREFLIGHT_SH: &str = "preflight.sh";
pub use super::build_info::FILE as BUILD_INFO;

/// The program name of a GPU-test bundle's release.
pub const GPU_TESTS_PROGRAM: &str = "gpu-tests";

/// Marks a folder as written by `cargo xtask bundle`, so a rebuild may clear it.
const MARKER: &str = ".stepgraph-bundle";

/// Above this, the bundle is too big to ship comfortably to the GPU host.
const SIZE_WARNING_BYTES: u64 = 40 << 20;

/// `strip` flags: drop debug info but keep the symbol table, so a panic's backtrace on
/// the host still names functions.
const STRIP_ARGS: &[&str] = &["--strip-debug"];

/// What goes into one bundle folder.
#[derive(Debug)]
pub struct Contents<'a> {
    /// The bundle folder.
    pub out: &'a Path,
    /// Executables by their name in `bin/`. ELF files are stripped of debug info; other
    /// files (scripts) are copied as they are.
    pub bins: &'a BTreeMap<String, Artifact>,
    /// What `run.sh` runs.
    pub runner: &'a Runner,
    /// What `preflight.sh` checks the host for.
    pub needs: &'a Needs,
    /// Data files and folders, copied under `data/`.
    pub data: &'a [Data],
    /// Facts the project's build setup adds to `build-info.json`.
    pub info: &'a serde_json::Map<String, serde_json::Value>,
}

impl Contents<'_> {
    /// Clears `out` (only if it is a bundle), writes every file and the manifest.
    /// `root` is the workspace's, whose git revision `build-info.json` records.
    pub fn write(&self, root: &Path, dry_run: bool) -> Result<()> {
        if let Runner::Job { job, .. } = self.runner
            && !dry_run
            && !self.bins.contains_key(job)
        {
            bail!("the job `{job}` is not among the bundle's executables");
        }
        prepare_out(self.out, dry_run)?;
        let bin_dir = self.out.join("bin");
        let mut files = Vec::new();
        for (name, artifact) in self.bins {
            let dest = bin_dir.join(name);
            if dry_run || is_elf(&artifact.path)? {
                let mut strip = Command::new("strip");
                strip
                    .args(STRIP_ARGS)
                    .arg("-o")
                    .arg(&dest)
                    .arg(&artifact.path);
                cmd::run(&mut strip, dry_run)?;
            } else {
                eprintln!("$ cp {} {}", artifact.path.display(), dest.display());
                fs::copy(&artifact.path, &dest).with_context(|| {
                    format!("could not copy {} into the bundle", artifact.path.display())
                })?;
            }
            let bytes = if dry_run {
                0
            } else {
                fs::metadata(&dest)
                    .with_context(|| format!("could not read {}", dest.display()))?
                    .len()
            };
            files.push(BundledFile {
                name: name.clone(),
                kind: match artifact.kind {
                    Kind::Test => "test",
                    Kind::Program => "program",
                },
                bytes,
            });
        }

        let script = match self.runner {
            Runner::Suite { sanitize } => {
                let names = |kind| -> Vec<String> {
                    self.bins
                        .iter()
                        .filter(|(_, a)| a.kind == kind)
                        .map(|(n, _)| n.clone())
                        .collect()
                };
                let (tests, examples) = (names(Kind::Test), names(Kind::Program));
                if let Some(s) = sanitize
                    && !dry_run
                    && !examples.contains(&s.example)
                {
                    eprintln!(
                        "warning: the sanitize example `{}` is not in the bundle; `run.sh sanitize` will say so",
                        s.example
                    );
                }
                RunScript {
                    tests: &tests,
                    examples: &examples,
                    sanitize: sanitize
                        .as_ref()
                        .map(|s| (s.example.as_str(), s.args.as_slice())),
                }
                .render()
            }
            Runner::Job { job, args } => JobScript { job, args }.render(),
        };
        write(&self.out.join(RUN_SH), &script, 0o755, dry_run)?;
        let data = self.copy_data(dry_run)?;
        let preflight = Preflight { needs: self.needs }.render();
        write(&self.out.join(PREFLIGHT_SH), &preflight, 0o755, dry_run)?;

        let program = match self.runner {
            Runner::Job { job, .. } => job.clone(),
            Runner::Suite { .. } => GPU_TESTS_PROGRAM.to_string(),
        };
        let content_sha256 = if dry_run {
            "<hash>".to_string()
        } else {
            let mut listed = Vec::new();
            manifest::list_files(self.out, "", &mut listed)?;
            manifest::content_hash(&manifest::hash_files(self.out, &listed)?)?
        };
        let identity = Identity {
            program,
            revision: Revision::of(root),
            content_sha256,
        };
        let info = build_info::render(root, &identity, self.info, &files, &data, self.needs);
        write(
            &self.out.join(BUILD_INFO),
            &format!("{}\n", serde_json::to_string_pretty(&info)?),
            0o644,
            dry_run,
        )?;
        Manifest::write(self.out, dry_run)?;

        let total: u64 = files.iter().map(|f| f.bytes).sum();
        for f in &files {
            eprintln!("  bin/{:<28} {:>6} KiB  {}", f.name, f.bytes >> 10, f.kind);
        }
        eprintln!(
            "bundle: {} ({} KiB in bin/, release {})",
            self.out.display(),
            total >> 10,
            info["release"].as_str().unwrap_or("?"),
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

impl Contents<'_> {
    /// Copies the data files under `data/`, returning their paths there (relative to
    /// the bundle, `/`-separated).
    fn copy_data(&self, dry_run: bool) -> Result<Vec<String>> {
        let mut copied = Vec::new();
        for data in self.data {
            let dest = self.out.join(DATA_DIR).join(&data.rel);
            eprintln!("$ cp -r {} {}", data.path.display(), dest.display());
            if !dry_run {
                copy_tree(
                    &data.path,
                    &dest,
                    &mut copied,
                    &format!("{DATA_DIR}/{}", data.rel),
                )?;
            }
        }
        Ok(copied)
    }
}

/// Copies the file or folder `from` to `to`, plain files and folders only (a bundle's
/// manifest lists only plain files), recording each file's bundle path in `copied`.
fn copy_tree(from: &Path, to: &Path, copied: &mut Vec<String>, rel: &str) -> Result<()> {
    let kind = fs::symlink_metadata(from)
        .with_context(|| format!("could not read {}", from.display()))?
        .file_type();
    if kind.is_file() {
        if rel.contains(['\\', '\n']) {
            bail!(
                "data {}: expected a file name without a backslash or a line break, which \
                 SHA256SUMS cannot hold as is",
                from.display()
            );
        }
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("could not create {}", parent.display()))?;
        }
        fs::copy(from, to)
            .with_context(|| format!("could not copy {} into the bundle", from.display()))?;
        copied.push(rel.to_string());
    } else if kind.is_dir() {
        fs::create_dir_all(to).with_context(|| format!("could not create {}", to.display()))?;
        let mut entries = fs::read_dir(from)
            .with_context(|| format!("could not list {}", from.display()))?
            .collect::<std::io::Result<Vec<_>>>()
            .with_context(|| format!("could not list {}", from.display()))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            copy_tree(
                &entry.path(),
                &to.join(&name),
                copied,
                &format!("{rel}/{name}"),
            )?;
        }
    } else {
        bail!(
            "data {}: expected plain files and folders, found a link or a special file",
            from.display()
        );
    }
    Ok(())
}

/// Whether `path` starts with the ELF magic (what `strip` accepts).
fn is_elf(path: &Path) -> Result<bool> {
    let mut magic = [0u8; 4];
    let mut file =
        fs::File::open(path).with_context(|| format!("could not open {}", path.display()))?;
    let n = file.read(&mut magic)?;
    Ok(n == 4 && magic == *b"\x7fELF")
}

/// Empties `out`, refusing to touch a folder this command did not write. The whole
/// folder goes, not only `bin/`: the manifest lists every file in it, so a file left
/// over from an earlier bundle would travel unlisted and fail the check on the host.
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
    eprintln!("$ rm -rf {0} && mkdir -p {1}", out.display(), bin.display());
    if dry_run {
        return Ok(());
    }
    if out.exists() {
        fs::remove_dir_all(out).with_context(|| format!("could not clear {}", out.display()))?;
    }
    fs::create_dir_all(&bin).with_context(|| format!("could not create {}", bin.display()))?;
    let marker = out.join(MARKER);
    fs::write(&marker, "written by `cargo xtask bundle`\n")
        .with_context(|| format!("could not write {}", marker.display()))?;
    Ok(())
}

fn write(path: &Path, text: &str, mode: u32, dry_run: bool) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    eprintln!("write {}", path.display());
    if dry_run {
        return Ok(());
    }
    fs::write(path, text).with_context(|| format!("could not write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("could not set the mode of {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_job_bundle_holds_its_scripts_and_a_manifest_of_everything() {
        let tmp = tempfile::tempdir().unwrap();
        let job = tmp.path().join("job.sh");
        fs::write(&job, "#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(&job, fs::Permissions::from_mode(0o755)).unwrap();
        let out = tmp.path().join("bundle");
        let bins = BTreeMap::from([(
            "job".to_string(),
            Artifact {
                kind: Kind::Program,
                target: "job".into(),
                path: job,
            },
        )]);
        let root = tmp.path().join("ws");
        fs::create_dir_all(root.join("configs/sub")).unwrap();
        fs::write(root.join("configs/a.toml"), "a = 1\n").unwrap();
        fs::write(root.join("configs/sub/b.toml"), "b = 2\n").unwrap();
        let data = [Data {
            path: root.join("configs"),
            rel: "configs".into(),
        }];
        let info = serde_json::Map::from_iter([("nvcc".to_string(), "none (test)".into())]);
        let contents = Contents {
            out: &out,
            bins: &bins,
            runner: &Runner::Job {
                job: "job".into(),
                args: Vec::new(),
            },
            needs: &Needs::new().library("libc.so.6"),
            data: &data,
            info: &info,
        };
        contents.write(&root, false).unwrap();
        // Rewriting clears the old bundle, stray files included.
        fs::write(out.join("stray"), "x").unwrap();
        contents.write(&root, false).unwrap();

        let listed = Manifest::read(&out).unwrap();
        assert_eq!(
            listed.entries.keys().collect::<Vec<_>>(),
            [
                MARKER,
                "bin/job",
                BUILD_INFO,
                "data/configs/a.toml",
                "data/configs/sub/b.toml",
                PREFLIGHT_SH,
                RUN_SH
            ]
        );
        assert_eq!(
            fs::read_to_string(out.join("data/configs/sub/b.toml")).unwrap(),
            "b = 2\n"
        );
        assert_eq!(
            fs::read_to_string(out.join("bin/job")).unwrap(),
            "#!/bin/sh\necho hi\n"
        );
        let ok = Command::new("sha256sum")
            .args(["-c", "--quiet", manifest::FILE])
            .current_dir(&out)
            .status()
            .unwrap();
        assert!(ok.success());
        let info: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(out.join(BUILD_INFO)).unwrap()).unwrap();
        assert_eq!(info["needs"]["libraries"][1], "libc.so.6");
        assert_eq!(info["nvcc"], "none (test)");
        assert_eq!(info["data"][1], "data/configs/sub/b.toml");
        assert!(info["release"].as_str().is_some_and(|r| !r.is_empty()));
    }

    #[test]
    fn a_folder_that_is_not_a_bundle_is_not_cleared() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("precious"), "x").unwrap();
        let err = prepare_out(tmp.path(), false).unwrap_err();
        assert!(err.to_string().contains("refusing to clear it"), "{err}");
        assert!(tmp.path().join("precious").exists());
    }
}
