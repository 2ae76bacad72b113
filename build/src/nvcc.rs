//! Finding nvcc, checking its version, and running it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::env::Cargo;

/// Where CUDA installers put the toolkit on Linux; the last place looked at.
pub(crate) const DEFAULT_NVCC: &str = "/usr/local/cuda/bin/nvcc";

/// An nvcc found, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub path: PathBuf,
    /// `NVCC`, `CUDA_HOME`, `PATH`, ...: for messages.
    pub how: String,
}

/// Looks for nvcc, in order: `NVCC` (an explicit choice: if it is not a file, that is an
/// error, not a reason to look elsewhere), `$CUDA_HOME/bin/nvcc`, `$CUDA_PATH/bin/nvcc`,
/// `nvcc` on `PATH`, then [`DEFAULT_NVCC`] (where CUDA's installers put it, often left off
/// `PATH`). A workspace that installs its own nvcc names it in `NVCC`.
pub(crate) fn find(cargo: &Cargo<'_>, min: (u32, u32)) -> Result<Found, String> {
    find_or(cargo, Path::new(DEFAULT_NVCC), min)
}

/// [`find`], with `default` in place of [`DEFAULT_NVCC`].
fn find_or(cargo: &Cargo<'_>, default: &Path, min: (u32, u32)) -> Result<Found, String> {
    let exe = format!("nvcc{}", std::env::consts::EXE_SUFFIX);
    if let Some(nvcc) = cargo.var("NVCC") {
        let nvcc = PathBuf::from(nvcc);
        if nvcc.is_file() {
            return Ok(Found {
                path: nvcc,
                how: "NVCC".into(),
            });
        }
        return Err(format!(
            "NVCC is set to {}, which is not a file. Point it at nvcc {}.{} or newer, or unset it \
             to let stepgraph-build look for one (CUDA_HOME, CUDA_PATH, PATH, {}).",
            nvcc.display(),
            min.0,
            min.1,
            default.display()
        ));
    }
    let mut tried = vec!["NVCC: not set".to_string()];
    for key in ["CUDA_HOME", "CUDA_PATH"] {
        match cargo.var(key) {
            Some(home) => {
                let nvcc = Path::new(&home).join("bin").join(&exe);
                if nvcc.is_file() {
                    return Ok(Found {
                        path: nvcc,
                        how: key.into(),
                    });
                }
                tried.push(format!("{key}: {} is not a file", nvcc.display()));
            }
            None => tried.push(format!("{key}: not set")),
        }
    }
    match cargo.var("PATH") {
        Some(path) => {
            let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
            for dir in &dirs {
                let nvcc = dir.join(&exe);
                if nvcc.is_file() {
                    return Ok(Found {
                        path: nvcc,
                        how: "PATH".into(),
                    });
                }
            }
            tried.push(format!(
                "PATH: no {exe} in {}",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        None => tried.push("PATH: not set".into()),
    }
    if default.is_file() {
        return Ok(Found {
            path: default.to_path_buf(),
            how: "the default CUDA install folder".into(),
        });
    }
    tried.push(format!("{}: not a file", default.display()));
    Err(format!(
        "no nvcc found to compile this crate's CUDA kernels. Looked at:\n  {}\n\
         Set NVCC to an nvcc {}.{} or newer, set CUDA_HOME to a CUDA toolkit, or put nvcc on \
         PATH.",
        tried.join("\n  "),
        min.0,
        min.1
    ))
}

/// What `nvcc --version` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Version {
    /// `(13, 0)`.
    pub release: (u32, u32),
    /// `13.0`.
    pub release_text: String,
    /// `V13.0.88`, or the release if nvcc printed none.
    pub full: String,
}

/// Reads `Cuda compilation tools, release 13.0, V13.0.88`.
pub(crate) fn parse_version(text: &str) -> Option<Version> {
    let line = text.lines().find(|l| l.contains("release "))?;
    let after = line.split("release ").nth(1)?;
    let mut parts = after.split(',');
    let release_text = parts.next()?.trim().to_string();
    let (major, minor) = release_text.split_once('.')?;
    let release = (major.trim().parse().ok()?, minor.trim().parse().ok()?);
    let full = parts
        .next()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .unwrap_or(&release_text)
        .to_string();
    Some(Version {
        release,
        release_text,
        full,
    })
}

/// Runs `nvcc --version` and checks the release against `min`.
pub(crate) fn version(nvcc: &Found, min: (u32, u32)) -> Result<Version, String> {
    let out = Command::new(&nvcc.path)
        .arg("--version")
        .output()
        .map_err(|e| format!("could not run `{} --version`: {e}", nvcc.path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = parse_version(&text).filter(|_| out.status.success());
    let Some(version) = version else {
        return Err(format!(
            "`{} --version` (found through {}) printed no release ({}):\n{text}{}",
            nvcc.path.display(),
            nvcc.how,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    };
    check_min(nvcc, &version, min)?;
    Ok(version)
}

pub(crate) fn check_min(nvcc: &Found, version: &Version, min: (u32, u32)) -> Result<(), String> {
    if version.release >= min {
        return Ok(());
    }
    Err(format!(
        "{} (found through {}) is nvcc {}; this crate's kernels need nvcc {}.{} or newer \
         (`Builder::min_nvcc_version`). Point NVCC at a newer nvcc.",
        nvcc.path.display(),
        nvcc.how,
        version.release_text,
        min.0,
        min.1
    ))
}

/// What nvcc writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// Machine code for one GPU architecture (`-cubin -arch=sm_90`).
    Cubin,
    /// PTX, which the driver JIT-compiles for the GPU it runs on (`-ptx -arch=compute_90`).
    Ptx,
}

/// A compilation target: `sm_90` (a cubin), `compute_90` (PTX), `sm_90a`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub kind: Kind,
    /// As nvcc spells it: `sm_90`.
    pub arch: String,
    pub number: u32,
    /// `a` or `f`, or empty.
    pub suffix: String,
}

impl Target {
    pub fn parse(spec: &str) -> Result<Target, String> {
        let bad = || {
            format!(
                "`{spec}` is not a CUDA target: expected `sm_<NN>` (a cubin), `compute_<NN>` \
                 (PTX), optionally with an `a` or `f` suffix (`sm_90a`)"
            )
        };
        let (kind, rest) = if let Some(r) = spec.strip_prefix("sm_") {
            (Kind::Cubin, r)
        } else if let Some(r) = spec.strip_prefix("compute_") {
            (Kind::Ptx, r)
        } else {
            return Err(bad());
        };
        let digits = rest.trim_end_matches(['a', 'f']);
        let suffix = &rest[digits.len()..];
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || suffix.len() > 1 {
            return Err(bad());
        }
        Ok(Target {
            kind,
            arch: spec.to_string(),
            number: digits.parse().map_err(|_| bad())?,
            suffix: suffix.to_string(),
        })
    }

    /// The PTX target of the same architecture (for the parameter check of a build that
    /// embeds only cubins).
    pub fn ptx_twin(&self) -> Target {
        Target {
            kind: Kind::Ptx,
            arch: format!("compute_{}{}", self.number, self.suffix),
            number: self.number,
            suffix: self.suffix.clone(),
        }
    }
}

/// Parses a list of targets (`sm_90,compute_90`, commas or spaces) and puts them in the
/// order the loader tries them: cubins before PTX, newer architectures first, and an
/// architecture-specific variant (`sm_90a`) before the plain one.
pub(crate) fn targets<S: AsRef<str>>(specs: &[S]) -> Result<Vec<Target>, String> {
    let mut out: Vec<Target> = Vec::new();
    for spec in specs {
        for one in spec
            .as_ref()
            .split([',', ' ', '\t'])
            .filter(|s| !s.is_empty())
        {
            let t = Target::parse(one)?;
            if !out.contains(&t) {
                out.push(t);
            }
        }
    }
    if out.is_empty() {
        return Err("no CUDA targets: give at least one, such as `sm_90` or `compute_90`".into());
    }
    out.sort_by(|a, b| {
        (a.kind, std::cmp::Reverse(a.number), a.suffix.is_empty()).cmp(&(
            b.kind,
            std::cmp::Reverse(b.number),
            b.suffix.is_empty(),
        ))
    });
    Ok(out)
}

/// One nvcc run: a source to one output.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    pub source: PathBuf,
    /// For messages: `cuda/elementwise.cu`.
    pub source_name: String,
    pub target: Target,
    pub output: PathBuf,
    /// Where `-MD -MF` writes the dependencies, for one job per source.
    pub deps: Option<PathBuf>,
}

/// nvcc and the arguments every job shares.
#[derive(Clone, Debug)]
pub(crate) struct Compiler {
    pub nvcc: PathBuf,
    /// Flags before the include directories: `-O3 -lineinfo` unless changed.
    pub flags: Vec<String>,
    pub include_dirs: Vec<PathBuf>,
    /// `Builder::nvcc_arg`s.
    pub extra: Vec<String>,
    /// `NVCC_CCBIN`: the host compiler.
    pub ccbin: Option<OsString>,
}

impl Compiler {
    pub fn args(&self, job: &Job) -> Vec<OsString> {
        let mode = match job.target.kind {
            Kind::Cubin => "-cubin",
            Kind::Ptx => "-ptx",
        };
        let mut args: Vec<OsString> =
            vec![mode.into(), format!("-arch={}", job.target.arch).into()];
        args.extend(self.flags.iter().map(OsString::from));
        for dir in &self.include_dirs {
            args.push("-I".into());
            args.push(dir.into());
        }
        args.extend(self.extra.iter().map(OsString::from));
        if let Some(ccbin) = &self.ccbin {
            args.push("-ccbin".into());
            args.push(ccbin.clone());
        }
        if let Some(deps) = &job.deps {
            args.push("-MD".into());
            args.push("-MF".into());
            args.push(deps.into());
        }
        // Always a file: nvcc writing to /dev/stdout hangs.
        args.push("-o".into());
        args.push(job.output.clone().into());
        args.push(job.source.clone().into());
        args
    }

    /// Runs one job; nvcc's diagnostics on success are its warnings.
    pub fn run(&self, job: &Job) -> Result<Vec<String>, String> {
        let out = Command::new(&self.nvcc)
            .args(self.args(job))
            .output()
            .map_err(|e| format!("could not run {}: {e}", self.nvcc.display()))?;
        let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stdout));
        let lines: Vec<String> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect();
        if !out.status.success() {
            return Err(format!(
                "nvcc failed on {} ({} {}, {}):\n{}",
                job.source_name,
                job.target.arch,
                match job.target.kind {
                    Kind::Cubin => "cubin",
                    Kind::Ptx => "PTX",
                },
                out.status,
                lines.join("\n")
            ));
        }
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn fake_nvcc(dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join(format!("nvcc{}", std::env::consts::EXE_SUFFIX));
        std::fs::write(&path, "").unwrap();
        path
    }

    fn env(vars: &[(&str, &Path)]) -> BTreeMap<String, OsString> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
            .collect()
    }

    #[test]
    fn nvcc_is_an_explicit_choice() {
        let tmp = tempfile::tempdir().unwrap();
        let nvcc = fake_nvcc(&tmp.path().join("mine/bin"));
        let home = tmp.path().join("home");
        fake_nvcc(&home.join("bin"));
        let vars = env(&[("NVCC", &nvcc), ("CUDA_HOME", &home)]);
        let cargo = Cargo::with_vars(&vars);
        let found = find(&cargo, (12, 0)).unwrap();
        assert_eq!((found.path, found.how.as_str()), (nvcc, "NVCC"));
        assert_eq!(cargo.directives(), ["cargo::rerun-if-env-changed=NVCC"]);

        // Set to something that is not a file: an error, not a fall back to CUDA_HOME.
        let missing = tmp.path().join("nope/nvcc");
        let vars = env(&[("NVCC", &missing), ("CUDA_HOME", &home)]);
        let e = find(&Cargo::with_vars(&vars), (12, 0)).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "NVCC is set to {}, which is not a file.",
                missing.display()
            )),
            "{e}"
        );
    }

    #[test]
    fn cuda_home_then_cuda_path_then_path_then_the_default_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let home = t.join("home");
        let cuda_path = t.join("cuda_path");
        let on_path = t.join("bin");
        let default = t.join("usr/local/cuda/bin/nvcc");
        let all = [
            ("CUDA_HOME", home.as_path()),
            ("CUDA_PATH", cuda_path.as_path()),
            ("PATH", on_path.as_path()),
        ];
        let find_with = |vars: &[(&str, &Path)]| {
            let vars = env(vars);
            find_or(&Cargo::with_vars(&vars), &default, (12, 0)).map(|f| (f.path, f.how))
        };
        assert!(find_with(&all).is_err());
        fake_nvcc(default.parent().unwrap());
        assert_eq!(
            find_with(&all).unwrap(),
            (default.clone(), "the default CUDA install folder".into())
        );
        let p = fake_nvcc(&on_path);
        assert_eq!(find_with(&all).unwrap(), (p, "PATH".into()));
        let c = fake_nvcc(&cuda_path.join("bin"));
        assert_eq!(find_with(&all).unwrap(), (c, "CUDA_PATH".into()));
        let h = fake_nvcc(&home.join("bin"));
        assert_eq!(find_with(&all).unwrap(), (h, "CUDA_HOME".into()));
    }

    #[test]
    fn none_found_lists_every_place_tried_and_how_to_get_one() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let home = t.join("home");
        let bin = t.join("bin");
        let vars = env(&[("CUDA_HOME", &home), ("PATH", &bin)]);
        let cargo = Cargo::with_vars(&vars);
        let default = t.join("cuda/bin/nvcc");
        let e = find_or(&cargo, &default, (12, 0)).unwrap_err();
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(
            lines[0],
            "no nvcc found to compile this crate's CUDA kernels. Looked at:"
        );
        assert_eq!(lines[1], "  NVCC: not set");
        assert_eq!(
            lines[2],
            format!(
                "  CUDA_HOME: {} is not a file",
                home.join("bin/nvcc").display()
            )
        );
        assert_eq!(lines[3], "  CUDA_PATH: not set");
        assert_eq!(lines[4], format!("  PATH: no nvcc in {}", bin.display()));
        assert_eq!(lines[5], format!("  {}: not a file", default.display()));
        assert!(
            lines[6].starts_with("Set NVCC to an nvcc 12.0 or newer"),
            "{}",
            lines[6]
        );
        assert!(
            !e.contains("xtask"),
            "a user's crate is told of no workspace's tools: {e}"
        );
        assert_eq!(
            cargo.directives(),
            [
                "cargo::rerun-if-env-changed=NVCC",
                "cargo::rerun-if-env-changed=CUDA_HOME",
                "cargo::rerun-if-env-changed=CUDA_PATH",
                "cargo::rerun-if-env-changed=PATH"
            ]
        );
    }

    #[test]
    fn the_version_is_read_and_checked_against_a_minimum() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\nBuilt on Wed_Aug_20_01:58:59_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0\n";
        let v = parse_version(text).unwrap();
        assert_eq!(v.release, (13, 0));
        assert_eq!(v.release_text, "13.0");
        assert_eq!(v.full, "V13.0.88");
        assert_eq!(parse_version("release 12.4").unwrap().full, "12.4");
        assert_eq!(parse_version("nvcc, no version here"), None);

        let nvcc = Found {
            path: "/opt/cuda/bin/nvcc".into(),
            how: "CUDA_HOME".into(),
        };
        check_min(&nvcc, &v, (12, 0)).unwrap();
        check_min(&nvcc, &v, (13, 0)).unwrap();
        let old = parse_version("Cuda compilation tools, release 11.8, V11.8.89").unwrap();
        assert_eq!(
            check_min(&nvcc, &old, (12, 0)).unwrap_err(),
            "/opt/cuda/bin/nvcc (found through CUDA_HOME) is nvcc 11.8; this crate's kernels \
             need nvcc 12.0 or newer (`Builder::min_nvcc_version`). Point NVCC at a newer nvcc."
        );
        let v12_10 = parse_version("release 12.10, V12.10.1").unwrap();
        check_min(&nvcc, &v12_10, (12, 9)).unwrap();
    }

    #[test]
    fn targets_are_parsed_and_ordered_for_loading() {
        let t = targets(&["compute_90, sm_80 sm_90", "sm_90a", "sm_90"]).unwrap();
        let arch: Vec<&str> = t.iter().map(|t| t.arch.as_str()).collect();
        assert_eq!(arch, ["sm_90a", "sm_90", "sm_80", "compute_90"]);
        assert_eq!(t[1].ptx_twin().arch, "compute_90");
        for bad in ["sm90", "compute_", "sm_9x", "-O3", "sm_90ab"] {
            assert!(
                targets(&[bad])
                    .unwrap_err()
                    .contains("is not a CUDA target"),
                "{bad}"
            );
        }
        assert!(
            targets::<&str>(&[])
                .unwrap_err()
                .starts_with("no CUDA targets")
        );
    }

    #[test]
    fn nvcc_arguments_write_to_a_file() {
        let c = Compiler {
            nvcc: "nvcc".into(),
            flags: vec!["-O3".into(), "-lineinfo".into()],
            include_dirs: vec!["/k/cuda".into(), "/dep/cuda".into()],
            extra: vec!["--use_fast_math".into()],
            ccbin: Some("g++-12".into()),
        };
        let job = Job {
            source: "/k/cuda/a.cu".into(),
            source_name: "cuda/a.cu".into(),
            target: Target::parse("sm_90").unwrap(),
            output: "/out/a.sm_90.cubin".into(),
            deps: Some("/out/a.d".into()),
        };
        let args: Vec<String> = c
            .args(&job)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args.join(" "),
            "-cubin -arch=sm_90 -O3 -lineinfo -I /k/cuda -I /dep/cuda --use_fast_math -ccbin g++-12 \
             -MD -MF /out/a.d -o /out/a.sm_90.cubin /k/cuda/a.cu"
        );
    }
}
