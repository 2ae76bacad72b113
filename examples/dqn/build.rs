//! The DQN step's kernels, `cuda/*.cu`, compiled by stepgraph-build (the per-branch
//! structs of dqn.cuh are pointer tables, which it passes itself); `__maxnreg__` needs
//! nvcc 12.4.
fn main() {
    stepgraph_build::Builder::new()
        .min_nvcc_version(12, 4)
        // sm_90a: `iqn_wgmma` (cuda/iqn.cu) uses Hopper's wgmma, which the plain sm_90 cubin
        // and the PTX lack; every other GPU, and Hopper in portable mode, takes `iqn_fused`.
        .target("sm_90a")
        .run();
}
