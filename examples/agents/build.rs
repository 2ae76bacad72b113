//! Compiles `cuda/*.cu` (acting, the replay ring, the fused update, Polyak targets) with
//! stepgraph-build into the registry that `src/kernels.rs` includes.
fn main() {
    stepgraph_build::Builder::new().run();
}
