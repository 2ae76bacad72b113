//! Soft actor-critic with twin critics: one whole update step as a stepgraph step,
//! written against stepgraph's public API alone (`MODEL.md` states the math exactly).
//!
//! - [`model`]: the step (`model::sac`) on four streams, `main`, `q1`, `q2` and `actor`,
//!   its buffers and [`model::allocate`];
//! - [`layers`]: the sizes, and the three-layer MLPs' forward and backward as cuBLASLt
//!   matmuls;
//! - [`kernels`]: the step's own CUDA kernels (`cuda/sac.cu`, built by `stepgraph-build`),
//!   each behind a wrapper that checks sizes, beside the generic ones of
//!   `stepgraph-kernels` (global norm, clipped Adam, `axpby` for the Polyak update);
//! - [`reference`](mod@reference): a CPU reference of every kernel;
//! - [`host`]: the seeded initial state and batch, and [`host::Trainer`], which stages
//!   Adam's step-dependent scalars before each replay;
//! - [`check`]: the tensors `sac --check DIR` writes for `reference.py check`.
//!
//! The `sac` binary builds and captures the step; without a GPU it prints the plan.

pub mod check;
pub mod host;
pub mod kernels;
pub mod layers;
pub mod model;
pub mod reference;
