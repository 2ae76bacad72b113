//! `cargo xtask test`: the whole test suite, with nvcc 13.0 so the kernels build.

use anyhow::Result;
use clap::Args;

use crate::bundle;
use crate::cmd::{self, Workspace};
use crate::install_nvcc::InstallNvcc;

/// Installs nvcc if needed, runs `cargo test --workspace`, compiles (does not run) the
/// GPU tests, and runs the DQN results merger's tests (Python standard library only).
#[derive(Debug, Args)]
pub struct Test {
    /// Print the commands without running them.
    #[arg(long)]
    pub dry_run: bool,
    /// Passed to `cargo test --workspace` after its own arguments
    /// (`cargo xtask test -- -p stepgraph -- --nocapture`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

impl Test {
    pub fn run(self, ws: &Workspace) -> Result<()> {
        let nvcc = InstallNvcc::with_dry_run(self.dry_run).ensure(ws)?;

        let mut all = ws.cargo();
        all.args(["test", "--workspace"])
            .args(&self.args)
            .env("NVCC", &nvcc.path);
        cmd::run(&mut all, self.dry_run)?;

        // GPU tests cannot run without a GPU; this proves they compile. Only the GPU test
        // binaries read the feature: the suite's other targets were built above.
        let mut gpu = ws.cargo();
        gpu.args([
            "test",
            "-p",
            bundle::SUITE,
            "--features",
            "gpu-tests",
            "--no-run",
            "--test",
            bundle::GPU_TESTS,
        ])
        .env("NVCC", &nvcc.path);
        cmd::run(&mut gpu, self.dry_run)?;

        // The PyTorch oracle's own tests need torch and run on the GPU host; the results
        // merger needs only python3, which every machine here has.
        let mut combine = std::process::Command::new("python3");
        combine
            .args([
                "-m",
                "unittest",
                "-v",
                "examples/dqn/test_combine.py",
                "examples/dqn/test_dram_bound.py",
            ])
            .current_dir(&ws.root);
        cmd::run(&mut combine, self.dry_run)
    }
}
