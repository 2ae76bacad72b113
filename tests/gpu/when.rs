//! GPU tests of `#[when(flag)]` ops: work that runs only at the replays where a device
//! flag is set, as a conditional node of one graph. A kernel sets the flag from random
//! data uploaded before each replay (set when the first value is positive); two
//! conditional ops (an accumulation with a counter, and a copy on another stream) must
//! have run exactly at the replays where it was set, against a host model; an op that
//! copies the flag sees each replay's value, and one that clears it afterwards leaves it
//! clear. The graph is verified against its plan, the one-stream baseline and eager runs
//! follow the flag too, and the host reads and sets a flag directly.

use stepgraph::{CaptureStream, Device, DeviceBuffer, DeviceFlag, Result, Schedule};
use stepgraph_kernels::Kernels;
use stepgraph_kernels::reference::axpby_reference;
use stepgraph_testkit::{Rng, bits};

use super::{device, kernels};

const N: usize = 4096;
const REPLAYS: usize = 48;

#[stepgraph::step(streams(main, side), kernels = Kernels)]
mod guarded {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub go: DeviceFlag,
        pub ones: DeviceBuffer<f32>,
        pub acc: DeviceBuffer<f32>,
        pub count: DeviceBuffer<f32>,
        pub last: DeviceBuffer<f32>,
        pub seen: DeviceBuffer<u32>,
    }

    /// The condition, decided on the device from the data: x[0] > 0.
    #[stream(side)]
    fn decide(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        go: &mut DeviceFlag,
    ) -> Result<()> {
        k.flag_above(s, x, 0, 0.0, go)
    }

    /// When set: acc += x, count += 1 (two kernels in the body), on the other stream
    /// than the one that set the flag.
    #[when(go)]
    fn accumulate(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        ones: &DeviceBuffer<f32>,
        acc: &mut DeviceBuffer<f32>,
        count: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.axpby(s, x, acc, 1.0, 1.0)?;
        k.axpby(s, ones, count, 1.0, 1.0)
    }

    /// When set: last <- x (a copy in the body), beside `accumulate`.
    #[stream(side)]
    #[when(go)]
    fn snapshot(
        s: &CaptureStream<'_>,
        x: &DeviceBuffer<f32>,
        last: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(x, last)
    }

    /// Every replay: seen <- the flag, as the conditional nodes saw it.
    fn record(s: &CaptureStream<'_>, go: &DeviceFlag, seen: &mut DeviceBuffer<u32>) -> Result<()> {
        s.copy(go, seen)
    }

    /// Every replay, after everything that reads the flag: clears it.
    #[stream(side)]
    fn clear(s: &CaptureStream<'_>, go: &mut DeviceFlag) -> Result<()> {
        s.set_flag(go, false)
    }
}

/// What the step leaves in its buffers, computed on the host.
struct Model {
    acc: Vec<f32>,
    count: f32,
    last: Vec<f32>,
}

impl Model {
    /// One step on data `x`; whether the conditional ops ran.
    fn step(&mut self, x: &[f32]) -> bool {
        let set = x[0] > 0.0;
        if set {
            axpby_reference(x, &mut self.acc, 1.0, 1.0);
            self.count += 1.0;
            self.last.copy_from_slice(x);
        }
        set
    }
}

/// Random data whose first value is positive or negative at random (never zero).
fn data(rng: &mut Rng) -> Vec<f32> {
    let mut x = rng.vec_nonzero(N, -1.0, 1.0);
    let magnitude = x[0].abs().max(1e-3);
    x[0] = if rng.next_f32() < 0.5 {
        magnitude
    } else {
        -magnitude
    };
    x
}

fn build(device: &Device, rng: &mut Rng, schedule: Schedule) -> Result<(guarded::Step, Model)> {
    let acc = rng.vec_nonzero(N, -1.0, 1.0);
    let last = rng.vec_nonzero(N, -1.0, 1.0);
    let buffers = guarded::Buffers {
        x: device.upload_new("x", &data(rng))?,
        // Set at first: the first replay's `decide` overwrites it before it is read.
        go: DeviceFlag::new(device, "go", true)?,
        ones: device.upload_new("ones", &[1.0f32])?,
        acc: device.upload_new("acc", &acc)?,
        count: device.upload_new("count", &[0.0f32])?,
        last: device.upload_new("last", &last)?,
        seen: device.upload_new("seen", &[u32::MAX])?,
    };
    let step = guarded::Step::with_schedule(
        device,
        kernels(device),
        buffers,
        guarded::Config {},
        schedule,
    )?;
    Ok((
        step,
        Model {
            acc,
            count: 0.0,
            last,
        },
    ))
}

/// Runs `REPLAYS` steps (replays, or eager runs) on fresh random data each, checking the
/// buffers after each against the model. Returns how many times the flag was set.
fn run_and_check(
    step: &mut guarded::Step,
    model: &mut Model,
    rng: &mut Rng,
    eager: bool,
    case: &str,
) -> Result<usize> {
    let mut ran = 0;
    for r in 0..REPLAYS {
        let x = data(rng);
        step.upload(|b| &b.x, &x)?;
        if eager {
            step.run_eager()?;
        } else {
            step.replay()?;
        }
        let set = model.step(&x);
        ran += usize::from(set);
        let seen: Vec<u32> = step.download(|b| &b.seen)?;
        assert_eq!(seen, [u32::from(set)], "{case}, step {r}: the flag as read");
        let go: Vec<u32> = step.download(|b| &b.go)?;
        assert_eq!(
            go,
            [0],
            "{case}, step {r}: `clear` ran after the flag's readers"
        );
        let count = step.download(|b| &b.count)?;
        assert_eq!(count, [model.count], "{case}, step {r}: the count of runs");
        let acc = step.download(|b| &b.acc)?;
        assert_eq!(
            bits(&[&acc]),
            bits(&[&model.acc]),
            "{case}, step {r} (flag {set}): the accumulation"
        );
        let last = step.download(|b| &b.last)?;
        assert_eq!(
            bits(&[&last]),
            bits(&[&model.last]),
            "{case}, step {r} (flag {set}): the snapshot"
        );
    }
    // Random signs over 48 steps: both branches were taken (all one way has odds 2^-47).
    assert!(
        0 < ran && ran < REPLAYS,
        "{case}: the flag was set at {ran} of {REPLAYS} steps"
    );
    Ok(ran)
}

#[test]
fn gpu_a_when_op_runs_exactly_at_the_replays_where_its_flag_is_set() -> Result<()> {
    let device = device();
    for (seed, schedule) in [(91, Schedule::Planned), (92, Schedule::OneStream)] {
        let mut rng = Rng::new(seed);
        let (mut step, mut model) = build(&device, &mut rng, schedule)?;
        let ran = run_and_check(
            &mut step,
            &mut model,
            &mut rng,
            false,
            &format!("{schedule:?}"),
        )?;
        println!("{schedule:?}: the conditional ops ran at {ran} of {REPLAYS} replays");
    }
    Ok(())
}

#[test]
fn gpu_a_graph_with_when_ops_is_verified_against_its_plan() -> Result<()> {
    let device = device();
    let mut rng = Rng::new(93);
    let (mut step, mut model) = build(&device, &mut rng, Schedule::Planned)?;
    let report = step.verify()?;
    println!("{report}");
    assert_eq!(report.ops, guarded::PLAN.ops.len());
    // The conditional op on `main` waits for the flag's writer on `side`, and `clear`
    // for the readers on `main`.
    assert_eq!(guarded::PLAN.ops[1].when, guarded::PLAN.ops[2].when);
    assert!(guarded::PLAN.ops[1].when.is_some());
    assert_eq!(guarded::PLAN.ops[1].waits.len(), 1);
    assert_eq!(guarded::PLAN.ops[4].waits.len(), 1);
    // Verifying captured the step again: the replays after it follow the flag as well.
    run_and_check(&mut step, &mut model, &mut rng, false, "after verify")?;
    Ok(())
}

#[test]
fn gpu_eager_runs_follow_the_flag() -> Result<()> {
    let device = device();
    let mut rng = Rng::new(94);
    let (mut step, mut model) = build(&device, &mut rng, Schedule::Planned)?;
    run_and_check(&mut step, &mut model, &mut rng, true, "eager")?;
    Ok(())
}

#[test]
fn gpu_the_host_reads_and_sets_a_device_flag() -> Result<()> {
    let device = device();
    let mut rng = Rng::new(95);
    for _ in 0..8 {
        let initially = rng.next_f32() < 0.5;
        let mut flag = DeviceFlag::new(&device, "flag", initially)?;
        assert_eq!(device.download(&flag)?, [u32::from(initially)]);
        let value = (rng.next_f32() * 1000.0) as u32;
        device.upload(&mut flag, &[value])?;
        assert_eq!(device.download(&flag)?, [value]);
        assert_eq!(flag.as_buffer().len(), 1);
        assert_eq!(flag.device_address(), flag.as_buffer().device_address());
    }
    Ok(())
}
