//! A crate outside the workspace, made in a temporary folder the way a user would make
//! one: path dependencies on `stepgraph` and `stepgraph-build`, one `.cu` file, a
//! `build.rs` of a few lines, and a `#[step]` whose op launches the kernel through its
//! generated, typed launcher. `cargo check` runs the build script (nvcc included) and
//! type-checks the step.
//!
//! nvcc is found the way the builder finds it (`NVCC`, `CUDA_HOME`, ..., `PATH`);
//! `cargo xtask test` installs the workspace's own and names it in `NVCC`, which the
//! user crate's cargo inherits. The workspace's Cargo.lock is copied in and cargo runs
//! offline, so no dependency is resolved anew; the target folder under the workspace's
//! `target/` keeps the compiled dependencies between runs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the build crate sits in the workspace")
        .to_path_buf()
}

/// The whole build script of the user crate.
const BUILD_RS: &str = "fn main() {\n    stepgraph_build::Builder::new().run();\n}\n";

/// A crate named `name` with `cuda/<file>` and `src/main.rs`, in a temporary folder.
fn user_crate(name: &str, cu_file: &str, cu: &str, main_rs: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("stepgraph-user-crate-")
        .tempdir()
        .unwrap();
    let ws = workspace();
    let manifest = format!(
        "[package]\n\
         name = \"{name}\"\n\
         version = \"0.1.0\"\n\
         edition = \"2024\"\n\
         publish = false\n\n\
         # Its own workspace: nothing above the temporary folder is consulted.\n\
         [workspace]\n\n\
         [dependencies]\n\
         stepgraph = {{ path = {:?} }}\n\n\
         [build-dependencies]\n\
         stepgraph-build = {{ path = {:?} }}\n",
        ws.join("runtime"),
        ws.join("build")
    );
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    };
    write("Cargo.toml", &manifest);
    write("build.rs", BUILD_RS);
    write(&format!("cuda/{cu_file}"), cu);
    write("src/main.rs", main_rs);
    fs::copy(ws.join("Cargo.lock"), dir.path().join("Cargo.lock")).unwrap();
    dir
}

fn cargo_check(dir: &Path) -> Output {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    Command::new(cargo)
        .args(["check", "--offline", "--quiet", "--target-dir"])
        .arg(workspace().join("target/user-crate-tests"))
        .current_dir(dir)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("cargo runs")
}

const SCALE_CU: &str = r#"// x[i] <- s x[i], one thread per element.
extern "C" __global__ void scale(float* __restrict__ x, unsigned n, float s) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] *= s;
    }
}
"#;

const SCALE_MAIN: &str = r#"//! A user's trainer: its own kernel, launched from a step's op.
use stepgraph::{CaptureStream, DeviceBuffer, Error, LaunchConfig, Result};

mod kernels {
    stepgraph::include_kernels!();
}
use kernels::Kernels;

#[stepgraph::step(streams(main), kernels = Kernels)]
mod doubling {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    fn double(stream: &CaptureStream<'_>, k: &Kernels, x: &mut DeviceBuffer<f32>) -> Result<()> {
        let n = u32::try_from(x.len()).map_err(|_| Error::Invalid("x: too long".into()))?;
        // SAFETY: one thread per element, and the kernel returns for i >= n = x.len().
        unsafe { k.scale(stream, LaunchConfig::for_num_elems(n), x, n, 2.0) }
    }
}

fn main() {
    println!("{}", doubling::PLAN);
    println!("kernels built by nvcc {}: {:?}", kernels::NVCC_RELEASE, kernels::KernelId::ALL);
}
"#;

#[test]
fn a_crate_outside_the_workspace_builds_its_kernel_and_a_step_that_launches_it() {
    assert!(BUILD_RS.lines().count() <= 10);
    let krate = user_crate("user_scale", "scale.cu", SCALE_CU, SCALE_MAIN);
    let out = cargo_check(krate.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "cargo check of the user crate in {} failed:\n{stderr}",
        krate.path().display()
    );
}

const SCALE_CONTRACT_CU: &str = r#"// x[i] <- s x[i], one thread per element.
// stepgraph(unsafe): x[n], grid = elementwise(n)
extern "C" __global__ void scale(float* __restrict__ x, unsigned n, float s) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] *= s;
    }
}
"#;

const SCALE_CONTRACT_MAIN: &str = r#"//! The same trainer, with no `unsafe` of its own: the kernel's contract gives it a safe
//! launcher.
#![deny(unsafe_code)]
use stepgraph::{CaptureStream, DeviceBuffer, Result};

#[allow(unsafe_code)]
mod kernels {
    stepgraph::include_kernels!();
}
use kernels::Kernels;

#[stepgraph::step(streams(main), kernels = Kernels)]
mod doubling {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    fn double(stream: &CaptureStream<'_>, k: &Kernels, x: &mut DeviceBuffer<f32>) -> Result<()> {
        let n = x.len();
        k.scale_checked(stream, x, n, 2.0)
    }
}

fn main() {
    println!("{}", doubling::PLAN);
    let grid = kernels::contract::elementwise(1000);
    println!("{:?}", grid.grid_dim);
}
"#;

#[test]
fn a_kernel_with_a_contract_gets_a_safe_launcher_that_a_crate_without_unsafe_calls() {
    let krate = user_crate(
        "user_scale_checked",
        "scale.cu",
        SCALE_CONTRACT_CU,
        SCALE_CONTRACT_MAIN,
    );
    let out = cargo_check(krate.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "cargo check of the user crate in {} failed:\n{stderr}",
        krate.path().display()
    );
}

const PAIR_CU: &str = r#"struct Pair {
    float a;
    float b;
};

extern "C" __global__ void pair_affine(float* x, unsigned n,
                                       Pair p) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = p.a * x[i] + p.b;
    }
}
"#;

const PAIR_MAIN: &str = r#"mod kernels {
    stepgraph::include_kernels!();
}

fn main() {
    let _ = kernels::KernelId::ALL;
}
"#;

#[test]
fn a_struct_parameter_without_a_mapping_fails_the_build_naming_it_and_the_fix() {
    let krate = user_crate("user_pair", "pairs.cu", PAIR_CU, PAIR_MAIN);
    let out = cargo_check(krate.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the build should fail:\n{stderr}");
    let want = "cuda/pairs.cu:7: kernel `pair_affine`, parameter 2 `p` (`Pair p`): `Pair` is a \
                struct (cuda/pairs.cu:1) passed by value";
    assert!(stderr.contains(want), "no `{want}` in:\n{stderr}");
    assert!(
        stderr.contains("`Builder::new().rust_type(\"Pair\", \"crate::Pair\")`"),
        "no fix in:\n{stderr}"
    );
    // A `cargo::error`, not a panic in the build script.
    assert!(!stderr.contains("panicked"), "{stderr}");
}
