//! Compiles every `cuda/*.cu` with nvcc 13.0, to a cubin for sm_90 and to PTX for
//! compute_90, and writes `$OUT_DIR/kernels.rs`: the embedded images and the module
//! registry (`ModuleId`). See the top of `src/lib.rs` for why cubins are embedded.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs, thread};

/// The nvcc release required: a newer nvcc writes PTX (and cubins) that the CUDA 13.0
/// driver on the H100 host refuses.
const NVCC_RELEASE: &str = "13.0";
const CUBIN_ARCH: &str = "-arch=sm_90";
const PTX_ARCH: &str = "-arch=compute_90";
/// Where `cargo xtask install-nvcc` puts nvcc, relative to the workspace root.
const XTASK_NVCC: &str = "target/nvcc/nvidia/cu13/bin/nvcc";

fn main() {
    if let Err(message) = run() {
        // `cargo::error` shows each line as an error of this crate, without the build
        // script's backtrace noise, and fails the build.
        for line in message.lines() {
            println!("cargo::error={line}");
        }
    }
}

/// A `.cu` file and the names derived from its stem.
struct Source {
    path: PathBuf,
    /// File stem, `elementwise`: the module's name at run time.
    stem: String,
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env_var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env_var("OUT_DIR")?);
    let cuda_dir = manifest_dir.join("cuda");

    println!("cargo::rerun-if-env-changed=NVCC");
    println!("cargo::rerun-if-env-changed=CUDA_HOME");
    println!("cargo::rerun-if-env-changed=NVCC_CCBIN");
    // The folder itself, so an added file reruns the script; then every file, headers
    // included, since any of them can change a kernel.
    println!("cargo::rerun-if-changed={}", cuda_dir.display());
    let mut sources = Vec::new();
    for entry in
        fs::read_dir(&cuda_dir).map_err(|e| format!("reading {}: {e}", cuda_dir.display()))?
    {
        let path = entry.map_err(|e| e.to_string())?.path();
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or_default();
        if matches!(ext, "cu" | "cuh" | "h" | "hpp") {
            println!("cargo::rerun-if-changed={}", path.display());
        }
        if ext == "cu" {
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            if !is_module_name(&stem) {
                return Err(format!(
                    "{}: a kernel file's name must be lowercase letters, digits and `_`, \
                     starting with a letter (it becomes a Rust identifier)",
                    path.display()
                ));
            }
            sources.push(Source { path, stem });
        }
    }
    sources.sort_by(|a, b| a.stem.cmp(&b.stem));
    if sources.is_empty() {
        return Err(format!("no .cu files in {}", cuda_dir.display()));
    }

    let workspace_root = manifest_dir.parent().unwrap_or(&manifest_dir);
    let nvcc = find_nvcc(workspace_root)?;
    println!("cargo::rerun-if-changed={}", nvcc.display());
    check_version(&nvcc)?;
    let ccbin = env::var_os("NVCC_CCBIN");

    // nvcc takes about half a second a file and runs on one core: one thread per output.
    let jobs: Vec<(&Source, &str, PathBuf)> = sources
        .iter()
        .flat_map(|s| {
            [
                (s, "-cubin", out_dir.join(format!("{}.cubin", s.stem))),
                (s, "-ptx", out_dir.join(format!("{}.ptx", s.stem))),
            ]
        })
        .collect();
    let results: Vec<Result<(), String>> = thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(source, mode, output)| {
                let (nvcc, cuda_dir, ccbin) = (&nvcc, &cuda_dir, &ccbin);
                scope.spawn(move || compile(nvcc, ccbin.as_deref(), cuda_dir, source, mode, output))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("an nvcc thread panicked".into()))
            })
            .collect()
    });
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }

    // cuModuleLoadData reads PTX as a C string: terminate it.
    for source in &sources {
        let ptx = out_dir.join(format!("{}.ptx", source.stem));
        let mut text = fs::read(&ptx).map_err(|e| format!("reading {}: {e}", ptx.display()))?;
        text.push(0);
        fs::write(&ptx, text).map_err(|e| format!("writing {}: {e}", ptx.display()))?;
    }

    let generated = out_dir.join("kernels.rs");
    fs::write(&generated, registry(&sources))
        .map_err(|e| format!("writing {}: {e}", generated.display()))
}

fn env_var(key: &str) -> Result<String, String> {
    env::var(key).map_err(|_| format!("cargo did not set {key}"))
}

fn is_module_name(stem: &str) -> bool {
    stem.starts_with(|c: char| c.is_ascii_lowercase())
        && stem
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// `NVCC`, else `$CUDA_HOME/bin/nvcc`, else the one `cargo xtask install-nvcc` installs.
fn find_nvcc(workspace_root: &Path) -> Result<PathBuf, String> {
    if let Some(nvcc) = env::var_os("NVCC") {
        let nvcc = PathBuf::from(nvcc);
        // An explicit choice is not second-guessed by falling back to another nvcc.
        if nvcc.is_file() {
            return Ok(nvcc);
        }
        return Err(format!(
            "NVCC is set to {}, which is not a file.\n\
             Point NVCC at nvcc 13.0, or unset it and run `cargo xtask install-nvcc`.",
            nvcc.display()
        ));
    }
    let mut tried = vec!["NVCC: not set".to_string()];
    match env::var_os("CUDA_HOME") {
        Some(home) => {
            let nvcc = Path::new(&home).join("bin/nvcc");
            if nvcc.is_file() {
                return Ok(nvcc);
            }
            tried.push(format!(
                "$CUDA_HOME/bin/nvcc: {} does not exist",
                nvcc.display()
            ));
        }
        None => tried.push("$CUDA_HOME/bin/nvcc: CUDA_HOME not set".to_string()),
    }
    let nvcc = workspace_root.join(XTASK_NVCC);
    if nvcc.is_file() {
        return Ok(nvcc);
    }
    tried.push(format!("{}: does not exist", nvcc.display()));
    Err(format!(
        "stepgraph-kernels needs nvcc {NVCC_RELEASE} to compile its CUDA kernels, and found none.\n\
         Looked at:\n  {}\n\
         Run `cargo xtask install-nvcc` (installs nvcc {NVCC_RELEASE} from pinned NVIDIA wheels into \
         target/nvcc, no root needed), or set NVCC to an nvcc {NVCC_RELEASE}.",
        tried.join("\n  ")
    ))
}

fn check_version(nvcc: &Path) -> Result<(), String> {
    let out = Command::new(nvcc)
        .arg("--version")
        .output()
        .map_err(|e| format!("could not run `{} --version`: {e}", nvcc.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("release")).map(str::trim);
    let release = line
        .and_then(|l| l.split("release ").nth(1))
        .and_then(|r| r.split(',').next())
        .map(str::trim);
    if out.status.success() && release == Some(NVCC_RELEASE) {
        return Ok(());
    }
    let found = match line {
        Some(line) => format!("it reports `{line}`"),
        None => format!(
            "`nvcc --version` printed no release ({}):\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    };
    Err(format!(
        "{} is not nvcc {NVCC_RELEASE}: {found}.\n\
         The kernels must be built by nvcc {NVCC_RELEASE}: a newer nvcc writes PTX that the \
         H100 host's CUDA {NVCC_RELEASE} driver refuses. Run `cargo xtask install-nvcc` and \
         unset NVCC/CUDA_HOME (or set NVCC to the path it prints).",
        nvcc.display()
    ))
}

/// Runs nvcc on one source; its warnings become cargo warnings (cargo hides a build
/// script's output otherwise).
fn compile(
    nvcc: &Path,
    ccbin: Option<&std::ffi::OsStr>,
    include_dir: &Path,
    source: &Source,
    mode: &str,
    output: &Path,
) -> Result<(), String> {
    let arch = if mode == "-cubin" {
        CUBIN_ARCH
    } else {
        PTX_ARCH
    };
    let mut cmd = Command::new(nvcc);
    // Always a file as output: nvcc writing to /dev/stdout hangs.
    cmd.args([mode, arch, "-O3", "-lineinfo", "-I"])
        .arg(include_dir)
        .arg("-o")
        .arg(output)
        .arg(&source.path);
    if let Some(ccbin) = ccbin {
        cmd.arg("-ccbin").arg(ccbin);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("could not run {}: {e}", nvcc.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "nvcc {mode} {} failed ({}):\n{stderr}",
            source.path.display(),
            out.status
        ));
    }
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        println!("cargo::warning=nvcc {mode}: {line}");
    }
    Ok(())
}

/// `elementwise` -> `Elementwise`, `fused_adam` -> `FusedAdam`.
fn variant_name(stem: &str) -> String {
    stem.split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut chars = w.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn registry(sources: &[Source]) -> String {
    let mut rs = String::from("// Generated by kernels/build.rs. Do not edit.\n\n");
    for s in sources {
        let upper = s.stem.to_ascii_uppercase();
        let _ = write!(
            rs,
            "/// `cuda/{stem}.cu` compiled for sm_90 (an ELF cubin).\n\
             pub const {upper}_CUBIN: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{stem}.cubin\"));\n\
             /// `cuda/{stem}.cu` as PTX for compute_90, NUL-terminated (`cuModuleLoadData` reads a C string).\n\
             pub const {upper}_PTX: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{stem}.ptx\"));\n\n",
            stem = s.stem,
        );
    }
    let variants: Vec<String> = sources.iter().map(|s| variant_name(&s.stem)).collect();
    rs.push_str(
        "/// A module of this crate: one `cuda/*.cu` file. [`Kernels`](crate::Kernels) loads each \
         once, into slot [`ModuleId::index`].\n\
         #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]\n\
         pub enum ModuleId {\n",
    );
    for (s, v) in sources.iter().zip(&variants) {
        let _ = writeln!(rs, "    /// `cuda/{}.cu`.\n    {v},", s.stem);
    }
    rs.push_str("}\n\nimpl ModuleId {\n");
    let _ = writeln!(
        rs,
        "    /// Every module, in slot order.\n    pub const ALL: [ModuleId; {n}] = [{all}];\n\
         \x20   /// How many modules there are.\n    pub const COUNT: usize = {n};\n",
        n = sources.len(),
        all = variants
            .iter()
            .map(|v| format!("ModuleId::{v}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    rs.push_str(
        "    /// The module's slot in [`ModuleId::ALL`].\n    pub const fn index(self) -> usize {\n        self as usize\n    }\n\n",
    );
    let arms = |f: &dyn Fn(&Source, &str) -> String| -> String {
        sources
            .iter()
            .zip(&variants)
            .map(|(s, v)| format!("            ModuleId::{v} => {},\n", f(s, v)))
            .collect()
    };
    let _ = write!(
        rs,
        "    /// The module's name: its file stem.\n    pub const fn name(self) -> &'static str {{\n        match self {{\n{}        }}\n    }}\n\n",
        arms(&|s, _| format!("{:?}", s.stem))
    );
    let _ = write!(
        rs,
        "    /// The image loaded on the GPU: the sm_90 cubin.\n    pub const fn image(self) -> &'static [u8] {{\n        match self {{\n{}        }}\n    }}\n\n",
        arms(&|s, _| format!("{}_CUBIN", s.stem.to_ascii_uppercase()))
    );
    let _ = write!(
        rs,
        "    /// The PTX, JIT-compiled by the driver where the cubin cannot run (a GPU newer than sm_90).\n    pub const fn ptx(self) -> &'static [u8] {{\n        match self {{\n{}        }}\n    }}\n}}\n",
        arms(&|s, _| format!("{}_PTX", s.stem.to_ascii_uppercase()))
    );
    rs
}
