//! Compiles `cuda/*.cu` with stepgraph-build (an sm_90 cubin and compute_90 PTX each, `-O3
//! -lineinfo`) into the registry that `src/lib.rs` includes. The per-branch structs of
//! dqn_common.cuh are passed by value as `BranchPtrs`; `__maxnreg__` needs nvcc 12.4.
fn main() {
    stepgraph_build::Builder::new()
        .min_nvcc_version(12, 4)
        .rust_type("BranchIn", "crate::BranchPtrs")
        .rust_type("BranchOut", "crate::BranchPtrs")
        .run();
}
