//! `cargo xtask`: the project's chores, written in Rust so that they run wherever cargo
//! does (the alias lives in `.cargo/config.toml`).
//!
//! One module per command, a struct per command with `fn run(self, ws)`. Commands are
//! built as argument lists with [`std::process::Command`], never through a shell string,
//! and every command that writes outside cargo's own folders takes `--dry-run`.
//!
//! A library as well as the binary so that the integration tests (`tests/deploy.rs`)
//! write their test bundle with the same code as `cargo xtask bundle`.

pub mod demo;
pub mod plan;
pub mod test;
#[cfg(test)]
mod tidy;

pub use stepgraph_deploy::{bundle, cmd, deploy, install_nvcc, interrupt, lock, programs};
