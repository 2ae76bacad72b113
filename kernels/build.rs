//! Compiles `cuda/*.cu` with stepgraph-build (stepgraph-build's default targets, `-O3
//! -lineinfo`) into the registry that `src/lib.rs` includes; `cuda/stepgraph/` holds the
//! headers this crate exports to the kernel crates that depend on it.
fn main() {
    stepgraph_build::Builder::new().run();
}
