//! The "before" of a migration to stepgraph: a small trainer written directly on cudarc,
//! as an experienced cudarc user writes one today, with no dependency on stepgraph.
//!
//! A training step is a trunk and two independent heads, IQN-like and attention-like,
//! each with an SGD update of its own output layer ([`model`] states the math). The
//! [`Trainer`] issues the whole step on one stream, captures it as one CUDA graph and
//! replays it. The heads could run side by side, on two streams; doing that by hand means
//! a second stream, a second cuBLASLt workspace, fork and join events and the overrides
//! threaded through every call. That is why every function of [`model`] already takes
//! `override_stream` and `override_workspace`: the "after" of the migration wraps these
//! same functions, unchanged, as stepgraph ops.
//!
//! - [`model`]: the sizes, the step's buffers and the existing functions
//!   ([`trunk_forward`], [`iqn_head`], [`iqn_update`], [`attention_head`],
//!   [`attention_update`]);
//! - [`lt`]: the cuBLASLt wrapper, with one algorithm per shape chosen for a fixed
//!   workspace, whatever workspace a call passes;
//! - [`kernels`]: the trainer's CUDA kernels (`cuda/*.cu`, compiled by `build.rs` with
//!   stepgraph-build), each behind a launch function that checks lengths;
//! - [`before`]: the [`Trainer`] that captures and replays the step on one stream;
//! - [`host`] and [`reference`](mod@reference): the seeded initial state, and the step
//!   computed on the CPU in `f64` to check the GPU against;
//! - [`error`]: the error type.
//!
//! The seeded draws come from `stepgraph_testkit::Rng`, the workspace's one generator.
//!
//! Every kernel is deterministic (fixed-order sums, no float atomics), and each GEMM shape
//! keeps the algorithm chosen for it, so the same step on the same GPU gives the same
//! bits.

pub mod after;
pub mod before;
pub mod bench;
pub mod error;
pub mod host;
pub mod kernels;
pub mod lt;
pub mod model;
pub mod reference;

pub use after::After;
pub use before::{State, Trainer};
pub use error::{Error, Result};
pub use kernels::Kernels;
pub use lt::{Gemm, Lt};
pub use model::{Dims, attention_head, attention_update, iqn_head, iqn_update, trunk_forward};
