//! Compiles `cuda/*.cu` (both agents' acting, replay rings, fused updates, targets) with
//! stepgraph-build into the registry that `src/kernels.rs` includes.
fn main() {
    stepgraph_build::Builder::new().run();
}
