//! GPU tests of the DQN step's kernels, each against its CPU reference: they need a CUDA
//! GPU of compute capability 9.0 and run only with the `gpu-tests` feature (`cargo xtask
//! bundle --gpu-tests` builds them for the GPU host). Every test uses random data.
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
#[path = "gpu/trunk.rs"]
mod trunk;

use stepgraph::{CaptureStream, Device, Result};
use stepgraph_testkit::{Rng, bits, check_within, nan_buffer, rms};

/// Runs `body` once, eagerly, on a fresh stream, and waits for it.
fn run_one_op(device: &Device, body: impl FnOnce(&CaptureStream<'_>) -> Result<()>) -> Result<()> {
    stepgraph::exec::run_once(device, body)
}
