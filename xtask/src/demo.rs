//! `cargo xtask demo`: builds and runs the demo example (needs a GPU).

use anyhow::Result;
use clap::Args;

use crate::cmd::{self, Workspace};
use crate::install_nvcc::InstallNvcc;

/// The example `demo` runs.
pub const DEMO_EXAMPLE: &str = "dqn";

/// Installs nvcc if needed and runs the demo example in release mode.
#[derive(Debug, Args)]
pub struct Demo {
    /// Print the commands without running them.
    #[arg(long)]
    pub dry_run: bool,
    /// Passed to the example (`cargo xtask demo -- --quick`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

impl Demo {
    pub fn run(self, ws: &Workspace) -> Result<()> {
        let nvcc = InstallNvcc::with_dry_run(self.dry_run).ensure(ws)?;
        let mut run = ws.cargo();
        run.args(["run", "--release", "--example", DEMO_EXAMPLE, "--"])
            .args(&self.args)
            .env("NVCC", &nvcc.path);
        cmd::run(&mut run, self.dry_run)
    }
}
