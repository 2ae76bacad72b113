//! What this workspace ships to a GPU host, for `cargo xtask bundle` and `cargo xtask
//! deploy` (both from `stepgraph-deploy`): every program of [`PROGRAMS`], `cartpole`
//! by default; the GPU tests of [`GPU_TEST_PACKAGES`]; nvcc 13.0 for the kernels; and a
//! host that runs what nvcc 13.0 writes for [`KERNEL_TARGETS`].

use stepgraph_deploy::{GpuTests, Needs, Program, Project, Workspace};

use crate::install_nvcc::{InstallNvcc, NVCC_RELEASE};
use crate::programs::{self, DEMO, GPU_TEST_PACKAGES, GPU_TESTS, PROGRAMS, Target};

/// Where bundles go, relative to the workspace root (git-ignored): `.device/bundle-<example>`
/// for a job, `.device/bundle` for the GPU tests.
pub const BUNDLE_DIR: &str = ".device";

/// The deploy folder on the host, relative to the remote home.
pub const REMOTE_DIR: &str = "stepgraph";

/// What the kernels are compiled for: stepgraph-build's default targets, cubins for
/// Ampere, Ada and Hopper and PTX for any newer GPU (the DQN example adds `sm_90a`).
pub const KERNEL_TARGETS: &[&str] = &["sm_80", "sm_86", "sm_89", "sm_90", "compute_80"];

/// The lowest compute capability that runs the kernels: the oldest of the
/// [`KERNEL_TARGETS`], whose PTX no older GPU loads.
pub const MIN_COMPUTE_CAPABILITY: &str = "8.0";

/// The oldest driver that loads what nvcc [`NVCC_RELEASE`] writes: NVIDIA's table of
/// toolkit and driver versions gives 580.65.06 for CUDA 13.0 GA on Linux. An older
/// driver refuses the cubins and the PTX alike.
pub const MIN_DRIVER: &str = "580.65.06";

/// The libraries the runtime loads (at run time): the driver, cuBLASLt, and CUPTI for
/// the capture guard, under the names the CUDA 13 builds give them.
pub const CUDA_LIBRARIES: &[&str] = &["libcuda.so.1", "libcublasLt.so.13", "libcupti.so.13"];

/// The example a GPU-test bundle's `run.sh sanitize` runs under compute-sanitizer: the
/// fork-join step, small enough for racecheck to finish in seconds. (It is not the demo
/// example, which trains at full size.)
pub const SANITIZE_EXAMPLE: &str = "fork_join";

/// What a host needs to run this workspace's programs.
pub fn needs() -> Needs {
    Needs::new()
        .libraries(CUDA_LIBRARIES.iter().copied())
        .compute_capability(MIN_COMPUTE_CAPABILITY)
        .driver(MIN_DRIVER, format!("CUDA {NVCC_RELEASE}"))
}

/// This workspace as `stepgraph-deploy` sees it. Its builds get nvcc 13.0 (installed
/// first if missing) as `NVCC`, and its bundles record nvcc's version and the kernel
/// targets.
pub fn project(ws: &Workspace) -> Project {
    let mut project = Project::new(DEMO)
        .root(ws.root.clone())
        .bundle_dir(BUNDLE_DIR)
        .remote_dir(REMOTE_DIR)
        .needs(needs())
        .before_build(|setup| {
            let nvcc = InstallNvcc::with_dry_run(setup.dry_run()).ensure(setup.workspace())?;
            setup
                .env("NVCC", nvcc.path.clone())
                .info("nvcc", nvcc.version)
                .info("kernel_targets", KERNEL_TARGETS);
            Ok(())
        });
    for p in PROGRAMS {
        project = project.program(program(p));
    }
    let mut tests = GpuTests::new()
        .feature("gpu-tests")
        .tests(GPU_TESTS)
        .sanitize(SANITIZE_EXAMPLE, ["--quick"]);
    for package in GPU_TEST_PACKAGES {
        tests = tests.package(*package);
    }
    project.gpu_tests(tests)
}

/// A program of the table as `stepgraph-deploy` names it.
fn program(p: &programs::Program) -> Program {
    let program = match p.target {
        Target::Bin => Program::bin(p.name),
        Target::Example => Program::example(p.name),
    };
    program.package(p.package)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimum_compute_capability_is_the_kernels_oldest_target() {
        let oldest = KERNEL_TARGETS
            .iter()
            .filter_map(|t| t.rsplit('_').next()?.parse::<u32>().ok())
            .min();
        assert_eq!(
            Some(
                MIN_COMPUTE_CAPABILITY
                    .replace('.', "")
                    .parse::<u32>()
                    .unwrap()
            ),
            oldest
        );
    }

    #[test]
    fn the_project_names_the_demo_and_every_program() {
        let ws = Workspace::new("/ws".into());
        let project = project(&ws);
        assert_eq!(project.job(), DEMO);
        assert_eq!(project.default_remote_dir(), REMOTE_DIR);
        let text = format!("{project:?}");
        for p in PROGRAMS {
            assert!(text.contains(&format!("name: {:?}", p.name)), "{text}");
        }
    }
}
