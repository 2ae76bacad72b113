// A derived config value is checked at its fields: the reference to an atomic is reported
// here, not where the struct is used.
use std::sync::atomic::AtomicU32;
use stepgraph::ConfigValue;

#[derive(Clone, Copy, ConfigValue)]
pub struct Sizes {
    pub batch: usize,
    pub calls: &'static AtomicU32,
}

fn main() {}
