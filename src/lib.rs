//! Examples and cross-crate tests of stepgraph.
