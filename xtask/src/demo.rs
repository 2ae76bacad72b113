//! `cargo xtask demo`: builds and runs the main job, DQN agents learning CartPole-v1 with
//! the whole loop on the GPU (it needs a GPU to train; without one it prints its steps'
//! plans and says what it would do).

use anyhow::Result;
use clap::Args;

use crate::cmd::{self, Workspace};
use crate::install_nvcc::InstallNvcc;
use crate::programs::{DEMO, Program};

/// Installs nvcc if needed and runs the main job (the CartPole agents) in release mode.
#[derive(Debug, Args)]
pub struct Demo {
    /// Print the commands without running them.
    #[arg(long)]
    pub dry_run: bool,
    /// Passed to the program (`cargo xtask demo -- --agents 8`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

impl Demo {
    pub fn run(self, ws: &Workspace) -> Result<()> {
        let nvcc = InstallNvcc::with_dry_run(self.dry_run).ensure(ws)?;
        let mut run = ws.cargo();
        run.args(["run", "--release"])
            .args(Program::find(DEMO)?.cargo_args())
            .arg("--")
            .args(&self.args)
            .env("NVCC", &nvcc.path);
        cmd::run(&mut run, self.dry_run)
    }
}
