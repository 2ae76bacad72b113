//! Compiles `cuda/*.cu` (the environments' reset and step kernels) with stepgraph-build
//! into the registry that `src/lib.rs` includes.
fn main() {
    stepgraph_build::Builder::new().run();
}
