//! Compiles `cuda/*.cu` with stepgraph-build (an sm_90 cubin and compute_90 PTX each, `-O3
//! -lineinfo`) into the registry that `src/lib.rs` includes; `cuda/stepgraph/` holds the
//! headers this crate exports to the kernel crates that depend on it.
fn main() {
    stepgraph_build::Builder::new().run();
}
