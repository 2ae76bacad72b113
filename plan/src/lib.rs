//! A stepgraph step's schedule as data, shared by the `#[step]` macro, the CUDA runtime
//! and the pictures, none of which this crate depends on:
//!
//! - [`PlanDesc`]: the plan the macro emits as a `const` (ops in program order with their
//!   streams, buffer accesses, waits and records; the dependency edges; the events; the
//!   critical path), its checks and its text form;
//! - [`dag`]: the graph algorithms over a schedule (happens-before edges, closure,
//!   reachability, longest path, levels), written once;
//! - [`views`]: the orderings that views of one buffer need once their spans are known;
//! - [`Profile`]: a measured replay of a plan, op by op, and the figures read off it;
//! - [`costs`]: each op's measured cost, the file automatic placement reads at compile
//!   time.
//!
//! It has no dependencies; the `serde` feature derives `Serialize` and `Deserialize` for
//! the profile types, for record formats.

pub mod costs;
pub mod dag;
mod desc;
mod profile;
pub mod views;

pub use costs::{OpCost, OpCosts};
pub use desc::*;
pub use profile::{OpTiming, Profile, WaitEdge};
