//! The workspace's small examples (`examples/fork_join.rs`, `examples/capture_cost.rs`)
//! and cross-crate tests (`tests/`); this package has no library code of its own.
