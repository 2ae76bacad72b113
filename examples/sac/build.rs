//! The SAC step's kernels, `cuda/*.cu`, compiled by stepgraph-build; the headers of
//! stepgraph-kernels (`stepgraph/reduce.cuh`) come with that dependency.
fn main() {
    stepgraph_build::Builder::new().run();
}
