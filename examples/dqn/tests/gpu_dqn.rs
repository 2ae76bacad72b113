//! GPU tests of the DQN step's kernels, each against its CPU reference, and of the whole
//! step (`gpu/step.rs`: the replay buffer's draw and gathers, the host-fed batch, the
//! target update every K replays): they need a CUDA GPU of compute capability 9.0 and run
//! only with the `gpu-tests` feature (`cargo xtask bundle --gpu-tests` builds them for the
//! GPU host). Every test uses random data.
#![cfg(feature = "gpu-tests")]

#[path = "gpu/attention.rs"]
mod attention;
#[path = "gpu/branch.rs"]
mod branch;
#[path = "gpu/dueling.rs"]
mod dueling;
#[path = "gpu/iql.rs"]
mod iql;
#[path = "gpu/iqn.rs"]
mod iqn;
#[path = "gpu/step.rs"]
mod step;
#[path = "gpu/trunk.rs"]
mod trunk;

use stepgraph::{CaptureStream, Device, Result};
use stepgraph_testkit::{Rng, bits, check_within, nan_buffer, rms};

/// Runs `body` once, eagerly, on a fresh stream, and waits for it.
fn run_one_op(device: &Device, body: impl FnOnce(&CaptureStream<'_>) -> Result<()>) -> Result<()> {
    stepgraph::exec::run_once(device, body)
}

/// A C struct passed by value (`BranchIn`, eight device addresses) is one parameter of 64
/// bytes for the driver, as the declaration stepgraph-build read from the source says.
#[test]
fn gpu_a_struct_parameter_has_the_size_the_declaration_says() {
    use stepgraph_dqn::kernels::{KernelId, Kernels};
    let device = Device::new(0).expect("these tests need a CUDA GPU of compute capability 9.0");
    let k = Kernels::load(&device).expect("kernels load");
    let adv2 = k.kernel(KernelId::DdqnTarget).params()[1];
    assert_eq!((adv2.name, adv2.size), (Some("adv2"), 64));
    assert_eq!(KernelId::DdqnTarget.decl().params[1].size, 64);
}
