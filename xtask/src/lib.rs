//! `cargo xtask`: the project's chores, written in Rust so that they run wherever cargo
//! does (the alias lives in `.cargo/config.toml`).
//!
//! One module per command, a struct per command with `fn run(self, ws)`. Commands are
//! built as argument lists with [`std::process::Command`], never through a shell string,
//! and every command that writes outside cargo's own folders takes `--dry-run`.
//!
//! `bundle` and `deploy` come from `stepgraph-deploy`, given this workspace's
//! [`project`]; the other commands are modules here.
//!
//! A library as well as the binary so that the integration tests (`tests/deploy.rs`)
//! write their test bundle with the same code as `cargo xtask bundle`.

pub mod demo;
pub mod install_nvcc;
pub mod plan;
pub mod programs;
pub mod project;
pub mod test;
#[cfg(test)]
mod tidy;
#[cfg(test)]
mod tidy_size;

pub use stepgraph_deploy::{bundle, cmd, interrupt, lock};

use std::path::Path;

use stepgraph_deploy::Workspace;

/// This workspace: the folder above xtask's own.
pub fn workspace() -> Workspace {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits one folder below the workspace root");
    Workspace::new(root.to_path_buf())
}
