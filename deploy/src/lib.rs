//! Bundling a workspace's programs and deploying them to a GPU host over ssh and rsync,
//! with nothing to install on the host but bash, coreutils, rsync and an sshd.
//!
//! A workspace describes what it ships as a [`Project`]: its programs (any binary or
//! example target, found with `cargo metadata`), the one a deploy runs, data files that
//! go with it, the job's default arguments, and what the host must have ([`Needs`]).
//! [`Cli`] turns that into two commands, usually the workspace's own `cargo xtask`:
//!
//! - `bundle [PROGRAM]` builds the program with `cargo build --release` and writes a
//!   bundle folder: the stripped executable in `bin/`, the data files in `data/`, a
//!   `run.sh` that runs it in a fresh results folder, a `preflight.sh` that checks a host
//!   can run it (GPU, compute capability, driver, libraries, free disk), a
//!   `build-info.json` and a `SHA256SUMS` over all of it;
//! - `deploy --host USER@HOST[:PORT] [-- ARGS]` bundles, copies the bundle to a release
//!   folder on the host (sending only what changed, resuming an interrupted upload),
//!   checks its hashes and the preflight there, switches `current` to it and starts it
//!   as a detached job (its own process group and log, its end recorded on the host),
//!   follows its log and, once it has ended, fetches its results into
//!   `target/deploy/<host>/<release>/<run>/`. Its subcommands look after the releases a
//!   host holds (`status`, `list`, `rollback`, `clean`, `run`, `stage`) and its jobs
//!   (`logs`, `attach` after a lost connection or `--detach`, `cancel`), and break a
//!   stale lock of the deploy folder (`unlock`).
//!
//! Every failure says what was expected and what was found. A lost connection stops
//! nothing on the host and names the `attach` that picks the job up again; Ctrl-C stops
//! the job too (unless `--keep-running-on-interrupt`) and exits 130 (SIGTERM 143).
//!
//! # A workspace's xtask
//!
//! A binary crate `xtask` in the workspace, with this crate as a dependency and the
//! alias `xtask = "run --quiet --package xtask --"` in `.cargo/config.toml`:
//!
//! ```no_run
//! use stepgraph_deploy::{Cli, Needs, Project};
//!
//! fn main() -> std::process::ExitCode {
//!     Cli::new(
//!         Project::new("trainer") // the program a deploy runs
//!             .bin("eval") // another binary target `bundle eval` may pick
//!             .data("configs/") // shipped as the bundle's data/configs/
//!             .args(["--steps", "1000"]) // run.sh's arguments when given none
//!             .needs(Needs::new().library("libcublasLt.so.13")),
//!     )
//!     .run()
//! }
//! ```
//!
//! Then `cargo xtask deploy --host me@gpu-box -- --steps 50` runs `trainer --steps 50`
//! on the host (arguments after `--` replace the defaults), in its results folder, where
//! it writes what it wants fetched; it reads its data from `$DEPLOY_DATA/configs/`.
//!
//! An xtask with commands of its own embeds [`Command`] (or [`Bundle`] and [`Deploy`])
//! in its own `clap` parser and calls [`Project::set_defaults`] on it before parsing.
//!
//! # Layers
//!
//! [`bundle`] writes bundle folders ([`bundle::Plan`], [`bundle::Contents`]); [`Deploy`]
//! ships them, over one shared ssh connection ([`cmd`] runs the local commands,
//! [`lock`] guards the bundle folder, [`interrupt`] turns Ctrl-C into an orderly stop).

#![warn(missing_docs)]

pub mod bundle;
mod cli;
pub mod cmd;
mod deploy;
pub mod interrupt;
pub mod lock;
mod project;

pub use bundle::Bundle;
pub use cli::{Cli, Command, exit_code};
pub use cmd::Workspace;
pub use deploy::Deploy;
pub use project::{BuildSetup, DEFAULT_BUNDLE_DIR, GpuTests, Needs, Program, Project, TargetKind};
