//! The DQN trainer of the mission, as a crate of its own built the way a user's would
//! be: a trunk, four dueling GLU branches on four streams, the double-DQN target, IQL,
//! IQN and Attention heads, CQL and an agreement term, global-norm clipping and Adam
//! (`MODEL.md` states the math exactly; `reference.py` checks the step against PyTorch).
//!
//! - [`model`]: the step (`model::dqn`), its parameters and activations;
//! - [`layers`]: the sizes and the linear layers the step is built from;
//! - [`floor`]: the step's and its heavy heads' floors, counted from MODEL.md;
//! - [`kernels`]: the step's own CUDA kernels (`cuda/*.cu`, built by `stepgraph-build`),
//!   each behind a wrapper that checks sizes, beside the generic ones of
//!   `stepgraph-kernels`;
//! - [`reference`](mod@reference): a CPU reference of every kernel, whose gradients the unit tests check
//!   against finite differences;
//! - [`replay`]: where the batch comes from, a replay buffer on the device sampled inside
//!   the graph or a batch the host uploads.
//!
//! The `.npy` files it exchanges with `reference.py` are `stepgraph_testkit::npy`'s.
//!
//! The `dqn` binary trains, benchmarks and writes the check's tensors.

pub mod floor;
pub mod kernels;
pub mod layers;
pub mod model;
pub mod reference;
pub mod replay;
