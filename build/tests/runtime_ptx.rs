//! The runtime's kernels (`runtime/cuda/every.cu`, behind `#[every]` and `#[when]` ops)
//! are committed as PTX (`runtime/src/op/every.ptx`), so that the runtime builds without
//! nvcc. This checks that the PTX is what nvcc makes of the source today: a change to one
//! without the other fails here, with the command that regenerates it.
//!
//! The PTX is built for compute_80, so that every GPU from Ampere on JIT-compiles it, and
//! its `.version` lowered to 8.4, the PTX ISA of CUDA 12.4, so that a 12.4 driver reads
//! it: nvcc writes its own release's ISA, and these two kernels use nothing newer.
//!
//! nvcc is the one `cargo xtask test` installs and names in `NVCC` (or the workspace's
//! `target/nvcc`, where it installs it).

use std::path::PathBuf;
use std::process::Command;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the build crate sits in the workspace")
        .to_path_buf()
}

fn nvcc() -> PathBuf {
    if let Some(n) = std::env::var_os("NVCC") {
        return PathBuf::from(n);
    }
    let installed = workspace().join("target/nvcc/nvidia/cu13/bin/nvcc");
    assert!(
        installed.is_file(),
        "this test needs nvcc: run it through `cargo xtask test` (which installs it), or set NVCC"
    );
    installed
}

/// The PTX ISA the committed PTX declares: CUDA 12.4's.
const PTX_ISA: &str = ".version 8.4";

/// The PTX without its comment lines (nvcc's banner names its build) and its ISA version.
fn code(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .map(str::trim_end)
        .filter(|l| !l.trim_start().starts_with("//") && !l.is_empty())
        .filter(|l| !l.starts_with(".version "))
        .collect()
}

#[test]
fn the_committed_ptx_is_what_nvcc_makes_of_every_cu() {
    let root = workspace().join("runtime");
    let out = tempfile::tempdir().expect("a temporary folder");
    let ptx = out.path().join("every.ptx");
    let status = Command::new(nvcc())
        .args(["-arch=compute_80", "-ptx"])
        .arg(root.join("cuda/every.cu"))
        .arg("-o")
        .arg(&ptx)
        .status()
        .expect("nvcc runs");
    assert!(status.success(), "nvcc failed on runtime/cuda/every.cu");
    let fresh = std::fs::read_to_string(&ptx).expect("nvcc wrote the PTX");
    let committed =
        std::fs::read_to_string(root.join("src/op/every.ptx")).expect("runtime/src/op/every.ptx");
    assert_eq!(
        code(&committed),
        code(&fresh),
        "runtime/src/op/every.ptx is stale: regenerate it with `nvcc -arch=compute_80 -ptx \
         cuda/every.cu -o src/op/every.ptx` in runtime/, then set its `.version` to 8.4"
    );
    assert!(
        committed.lines().any(|l| l.trim_end() == PTX_ISA),
        "runtime/src/op/every.ptx: expected `{PTX_ISA}` (CUDA 12.4's PTX ISA, so that 12.4 \
         drivers load it), found {:?}",
        committed.lines().find(|l| l.starts_with(".version"))
    );
    // The kernels the runtime loads by name.
    assert!(committed.contains(".visible .entry stepgraph_every("));
    assert!(committed.contains(".visible .entry stepgraph_when("));
    assert!(committed.contains(".visible .entry stepgraph_loop_start("));
    assert!(committed.contains(".visible .entry stepgraph_loop_next("));
}
