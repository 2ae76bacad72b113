//! GPU tests of a step's device loop (`Step::replay_loop`): one launch runs the step n
//! times inside a CUDA WHILE node. Integer-valued random data makes every sum exact, so
//! the counts are read off the buffers: a loop of n runs the step exactly n times, an
//! `#[every(4)]` op inside it every 4th iteration (keeping its cadence across launches and
//! with plain replays), a new n needs no new capture, n = 0 runs nothing, and the host
//! reads the last iteration's values through a read-back ring.

use stepgraph::{CaptureStream, DeviceBuffer, HostOutput, Result};
use stepgraph_kernels::Kernels;
use stepgraph_testkit::Rng;

use super::{device, kernels};

const N: usize = 2048;

#[stepgraph::step(streams(main, side), kernels = Kernels)]
mod looped {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub every_step: DeviceBuffer<f32>,
        pub side_step: DeviceBuffer<f32>,
        pub every_fourth: DeviceBuffer<f32>,
        pub last: HostOutput<f32>,
    }

    /// An environment step's stand-in: `every_step += x`.
    fn env_step(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        every_step: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.axpby(s, x, every_step, 1.0, 1.0)
    }

    /// Beside it on another stream: `side_step += 2 x`.
    #[stream(side)]
    fn side(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        side_step: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.axpby(s, x, side_step, 2.0, 1.0)
    }

    /// An update's stand-in, at every 4th iteration: `every_fourth += x`.
    #[every(4)]
    fn update(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        every_fourth: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.axpby(s, x, every_fourth, 1.0, 1.0)
    }

    /// The statistics the host reads without stalling the loop.
    fn stats(
        s: &CaptureStream<'_>,
        every_step: &DeviceBuffer<f32>,
        side_step: &DeviceBuffer<f32>,
        last: &mut HostOutput<f32>,
    ) -> Result<()> {
        let _ = side_step;
        s.read_back(every_step, last)
    }
}

/// Integers 1..=8 as f32: sums of a few thousand stay exact.
fn ints(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| (1 + rng.below(8)) as f32).collect()
}

fn buffers(
    device: &stepgraph::Device,
    x: &[f32],
    y: &[f32],
    s: &[f32],
    z: &[f32],
) -> Result<looped::Buffers> {
    Ok(looped::Buffers {
        x: device.upload_new("x", x)?,
        every_step: device.upload_new("every_step", y)?,
        side_step: device.upload_new("side_step", s)?,
        every_fourth: device.upload_new("every_fourth", z)?,
        last: HostOutput::new(device, "last", N)?,
    })
}

fn plus(base: &[f32], x: &[f32], times: u32) -> Vec<f32> {
    base.iter()
        .zip(x)
        .map(|(b, x)| b + times as f32 * x)
        .collect()
}

#[test]
fn a_loop_runs_the_step_exactly_n_times_with_every_k_ops_inside() -> Result<()> {
    let device = device();
    let mut rng = Rng::new(0x100);
    let (x, y0, s0, z0) = (
        ints(&mut rng, N),
        ints(&mut rng, N),
        ints(&mut rng, N),
        ints(&mut rng, N),
    );
    let buffers = buffers(&device, &x, &y0, &s0, &z0)?;
    let mut step = looped::Step::new(&device, kernels(&device), buffers, looped::Config {})?;
    let check = |step: &looped::Step, iterations: u32, fourths: u32| -> Result<()> {
        let y = step.download(|b| &b.every_step)?;
        let s = step.download(|b| &b.side_step)?;
        let z = step.download(|b| &b.every_fourth)?;
        assert_eq!(
            y,
            plus(&y0, &x, iterations),
            "every_step after {iterations} iterations"
        );
        let twice: Vec<f32> = x.iter().map(|v| 2.0 * v).collect();
        assert_eq!(
            s,
            plus(&s0, &twice, iterations),
            "side_step after {iterations} iterations"
        );
        assert_eq!(
            z,
            plus(&z0, &x, fourths),
            "every_fourth after {iterations} iterations"
        );
        Ok(())
    };

    // 10 iterations: the update runs at the 4th and 8th.
    step.replay_loop(10)?;
    step.wait()?;
    check(&step, 10, 2)?;
    let last = step.read_back_latest(|b| &b.last)?;
    assert_eq!(
        last.to_vec(),
        plus(&y0, &x, 10),
        "the read-back holds the last iteration's values"
    );
    let counters = step.every_counters()?;
    assert_eq!(
        counters[0].counted, 2,
        "10 iterations leave the cadence at 10 mod 4"
    );

    // Another n, no new capture: 7 more (iterations 11..=17), the update at 12 and 16.
    step.replay_loop(7)?;
    step.wait()?;
    check(&step, 17, 4)?;

    // A plain replay is the 18th, a loop of 0 runs nothing, a loop of 2 ends at 20 (an
    // update).
    step.replay()?;
    step.replay_loop(0)?;
    step.replay_loop(2)?;
    step.wait()?;
    check(&step, 20, 5)?;
    assert_eq!(
        step.replays_launched(),
        5,
        "each loop launch is one replay for host I/O"
    );
    Ok(())
}

#[test]
fn a_rebind_captures_the_loop_again_on_the_new_buffers() -> Result<()> {
    let device = device();
    let mut rng = Rng::new(0x2e);
    let (x, y0) = (ints(&mut rng, N), ints(&mut rng, N));
    let buffers = buffers(&device, &x, &y0, &y0, &y0)?;
    let mut step = looped::Step::new(&device, kernels(&device), buffers, looped::Config {})?;
    step.replay_loop(3)?;
    let y1 = ints(&mut rng, N);
    let fresh = device.upload_new("every_step 2", &y1)?;
    let old = step.rebind(|b| std::mem::replace(&mut b.every_step, fresh))?;
    step.replay_loop(3)?;
    step.wait()?;
    assert_eq!(
        device.download(&old)?,
        plus(&y0, &x, 3),
        "the old buffer saw the first loop only"
    );
    assert_eq!(
        step.download(|b| &b.every_step)?,
        plus(&y1, &x, 3),
        "the new buffer saw the second"
    );
    Ok(())
}

#[test]
fn a_loop_is_verified_against_the_plan() -> Result<()> {
    let device = device();
    let mut rng = Rng::new(7);
    let x = ints(&mut rng, N);
    let buffers = buffers(&device, &x, &x, &x, &x)?;
    let dir = std::env::temp_dir().join(format!("stepgraph-loop-dot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let dot = dir.join("{step}.dot");
    let options = stepgraph::Options::from_env()?
        .with_verify(true)
        .with_graph_dot(dot.to_string_lossy().into_owned());
    let mut step = looped::Step::with_options(
        &device,
        kernels(&device),
        buffers,
        looped::Config {},
        options,
    )?;
    let graph = step
        .executor()
        .last_verify()
        .expect("a verified capture leaves a report");
    step.replay_loop(4)?;
    let body = step
        .executor()
        .last_verify()
        .expect("a verified capture of the loop leaves a report");
    assert_eq!(body.ops, 4, "the loop's body holds every op: {body:?}");
    assert_eq!(
        body.nodes,
        graph.nodes + 1,
        "the body is the step's graph and the kernel that counts the iterations: {graph:?} {body:?}"
    );
    // The loop's own graph, drawn by the driver: the WHILE node and its body.
    let drawn = std::fs::read_to_string(dir.join("looped.loop.dot"))
        .expect("the loop's graph is written beside the step's");
    let step_graph = dir.join("looped.dot").is_file();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        drawn.contains("WHILE") || drawn.contains("While"),
        "{drawn}"
    );
    assert!(step_graph, "the step's own graph is written too");
    step.wait()?;
    Ok(())
}
