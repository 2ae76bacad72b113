//! The DQN step's kernels, `cuda/*.cu`, compiled by stepgraph-build. The per-branch structs
//! of dqn.cuh are passed by value as `BranchPtrs`; `__maxnreg__` needs nvcc 12.4.
fn main() {
    stepgraph_build::Builder::new()
        .min_nvcc_version(12, 4)
        .rust_type("BranchIn", "crate::kernels::BranchPtrs")
        .rust_type("BranchOut", "crate::kernels::BranchPtrs")
        .run();
}
