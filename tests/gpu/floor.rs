//! GPU tests of the ceilings a floor is taken at (`stepgraph::stats::Ceilings`): measured on
//! random data, they must be rates a GPU can have. The ranges are wide on purpose (an
//! H200 gives about 400 to 500 TFLOP/s of dense TF32 and 4.3 TB/s of copy): they catch a
//! timing of nothing (an empty or failed launch reads as an absurd rate) or a unit slip
//! (a factor of 1000), not a slow GPU.

use stepgraph::stats::Ceilings;
use stepgraph::{Device, Result};

#[test]
fn gpu_the_ceilings_are_rates_a_gpu_can_have() -> Result<()> {
    let device = Device::new(0)?;
    let c = Ceilings::measure(&device)?;
    eprintln!("{}: {c}", device.name());
    assert!(
        (5e12..5e15).contains(&c.tf32_flop_per_s),
        "TF32 matmul rate {c}"
    );
    assert!((1e11..5e13).contains(&c.copy_bytes_per_s), "copy rate {c}");
    Ok(())
}
