//! Examples and cross-crate tests of stepgraph, and the small pieces the examples share.

pub mod npy;
