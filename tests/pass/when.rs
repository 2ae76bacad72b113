//! An op that runs only when a device flag is set: the flag set on one stream, the op on
//! another, a conditional node of the one graph; the op reads the flag without naming it.
use stepgraph::{CaptureStream, DeviceBuffer, DeviceFlag, Result};

#[stepgraph::step(streams(main, side))]
mod step {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub loss: DeviceBuffer<f32>,
        pub diverged: DeviceFlag,
        pub params: DeviceBuffer<f32>,
        pub backup: DeviceBuffer<f32>,
        pub seen: DeviceBuffer<u32>,
    }

    fn train(s: &CaptureStream<'_>, backup: &DeviceBuffer<f32>, params: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(backup, params)
    }

    #[stream(side)]
    fn check(s: &CaptureStream<'_>, loss: &DeviceBuffer<f32>, diverged: &mut DeviceFlag) -> Result<()> {
        s.set_flag(diverged, loss.is_empty())
    }

    #[when(diverged)]
    fn restore(s: &CaptureStream<'_>, backup: &DeviceBuffer<f32>, params: &mut DeviceBuffer<f32>) -> Result<()> {
        s.copy(backup, params)
    }

    // May read the flag it runs on, by name, too (a flag is a `DeviceMem<u32>`).
    #[stream(side)]
    #[when(diverged)]
    fn report(s: &CaptureStream<'_>, diverged: &DeviceFlag, seen: &mut DeviceBuffer<u32>) -> Result<()> {
        s.copy(diverged, seen)
    }

    // Writes the flag after the ops that run on it: it waits for both.
    fn clear(s: &CaptureStream<'_>, diverged: &mut DeviceFlag) -> Result<()> {
        s.set_flag(diverged, false)
    }
}

fn main() {
    use stepgraph::plan::{Access, BufId};

    let plan = step::Step::plan();
    plan.check().unwrap();
    plan.audit().unwrap();
    let flag = BufId(1);
    assert_eq!(plan.buffer_name(flag), "diverged");
    assert_eq!(plan.ops[0].when, None);
    assert_eq!(plan.ops[2].when, Some(flag));
    assert_eq!(plan.ops[3].when, Some(flag));
    // The implicit read, once even where the op names the flag as well.
    for op in [&plan.ops[2], &plan.ops[3]] {
        let reads = op
            .accesses
            .iter()
            .filter(|a| a.buf == flag && a.access == Access::Read)
            .count();
        assert_eq!(reads, 1, "{}", op.name);
    }
    // `restore` (main) waits for `check` (side), which set the flag.
    assert_eq!(plan.ops[2].waits.len(), 1);
    // `clear` (main) waits for `report` (side), which reads the flag.
    assert_eq!(plan.ops[4].waits.len(), 1);
    let text = plan.to_string();
    assert!(text.contains("restore  reads backup, diverged  writes params"), "{text}");
    assert!(text.contains("when diverged"), "{text}");
    println!("{plan}");
}
