//! GPU tests of `#[every(k)]` ops: work that runs at every k-th replay of one graph, as
//! a conditional node. A target network synced from the online one every K steps is read
//! at steps K-1, K and K+1 (and later) against a CPU model of the schedule; a cuBLASLt
//! matmul runs inside a conditional body; the graph is verified against its plan; eager
//! runs keep the same cadence.

use stepgraph::{Blas, CaptureStream, DeviceBuffer, Matmul, MatmulArgs, Result};
use stepgraph_kernels::Kernels;
use stepgraph_kernels::reference::chain_step_reference;
use stepgraph_testkit::{Rng, check_within};

use super::{device, kernels};

const ROWS: usize = 16;
const COLS: usize = 256;
const OUT: usize = 16;

#[stepgraph::step(streams(main, side), kernels = Kernels)]
mod target_sync {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub online: DeviceBuffer<f32>,
        pub target: DeviceBuffer<f32>,
        pub seen: DeviceBuffer<f32>,
        pub w: DeviceBuffer<f32>,
        pub proj: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub sync_every: u32,
    }

    /// A training step of the online parameters: x <- 0.999 x + 0.001, twice.
    fn train(s: &CaptureStream<'_>, k: &Kernels, online: &mut DeviceBuffer<f32>) -> Result<()> {
        k.chain_step(s, online, 2, 0.999, 0.001)
    }

    /// The target sync, on a side stream: a copy, every `sync_every` replays.
    #[stream(side)]
    #[every(sync_every)]
    fn sync(
        s: &CaptureStream<'_>,
        online: &DeviceBuffer<f32>,
        target: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(online, target)
    }

    /// What reads the target after the sync: a copy of it, every replay.
    fn read_target(
        s: &CaptureStream<'_>,
        target: &DeviceBuffer<f32>,
        seen: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(target, seen)
    }

    /// A matmul inside a conditional body, every third replay.
    #[every(3)]
    fn project(
        b: &Blas<'_>,
        online: &DeviceBuffer<f32>,
        w: &DeviceBuffer<f32>,
        proj: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        b.matmul(
            &Matmul::new(ROWS, OUT, COLS),
            online,
            w,
            proj,
            MatmulArgs::new(),
        )
    }
}

struct Model {
    online: Vec<f32>,
    target: Vec<f32>,
    proj: Vec<f32>,
    w: Vec<f32>,
    step: u32,
}

impl Model {
    /// One step of the step's schedule on the CPU.
    fn step(&mut self, sync_every: u32) {
        self.step += 1;
        chain_step_reference(&mut self.online, 2, 0.999, 0.001);
        if self.step.is_multiple_of(sync_every) {
            self.target.clone_from(&self.online);
        }
        if self.step.is_multiple_of(3) {
            for i in 0..ROWS {
                for j in 0..OUT {
                    self.proj[i * OUT + j] = (0..COLS)
                        .map(|p| {
                            f64::from(self.online[i * COLS + p]) * f64::from(self.w[p * OUT + j])
                        })
                        .sum::<f64>() as f32;
                }
            }
        }
    }
}

fn build(seed: u64, sync_every: u32) -> Result<(target_sync::Step, Model)> {
    let device = device();
    let mut rng = Rng::new(seed);
    let n = ROWS * COLS;
    let online = rng.vec_nonzero(n, -1.0, 1.0);
    let target = rng.vec_nonzero(n, -1.0, 1.0);
    let w = rng.vec_nonzero(COLS * OUT, -0.1, 0.1);
    let proj = rng.vec_nonzero(ROWS * OUT, -1.0, 1.0);
    let buffers = target_sync::Buffers {
        online: device.upload_new("online", &online)?,
        target: device.upload_new("target", &target)?,
        seen: device.alloc_zeros("seen", n)?,
        w: device.upload_new("w", &w)?,
        proj: device.upload_new("proj", &proj)?,
    };
    let step = target_sync::Step::new(
        &device,
        kernels(&device),
        buffers,
        target_sync::Config { sync_every },
    )?;
    let model = Model {
        online,
        target,
        proj,
        w,
        step: 0,
    };
    Ok((step, model))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn gpu_the_target_is_synced_exactly_every_k_replays() -> Result<()> {
    let k = 4;
    let (mut step, mut model) = build(81, k)?;
    let initial_target = model.target.clone();
    for s in 1..=2 * k + 1 {
        step.replay()?;
        model.step(k);
        let target = step.download(|b| &b.target)?;
        let seen = step.download(|b| &b.seen)?;
        // The copies are exact: the same bits as the model's, at every step.
        assert_eq!(bits(&target), bits(&model.target), "target after step {s}");
        assert_eq!(
            bits(&seen),
            bits(&model.target),
            "the read of the target after step {s}"
        );
        check_within(
            &format!("step {s}"),
            "proj",
            &step.download(|b| &b.proj)?,
            &model.proj,
            0.05,
            1e-4,
        );
        // Steps K-1, K and K+1: unsynced, synced, kept.
        if s == k - 1 {
            assert_eq!(
                bits(&target),
                bits(&initial_target),
                "no sync before step {k}"
            );
        }
        if s == k || s == k + 1 {
            let online = step.download(|b| &b.online)?;
            if s == k {
                assert_eq!(bits(&target), bits(&online), "synced at step {k}");
            } else {
                assert_ne!(
                    bits(&target),
                    bits(&online),
                    "not synced again at step {}",
                    k + 1
                );
            }
        }
    }
    Ok(())
}

#[test]
fn gpu_a_graph_with_conditional_ops_is_verified_and_profiled() -> Result<()> {
    let (mut step, mut model) = build(82, 2)?;
    let report = step.verify()?;
    assert_eq!(report.ops, 4);
    println!("{report}");
    // Verifying captured it again; the counters kept counting from zero, and the
    // replays after it follow the same schedule.
    for _ in 0..5 {
        step.replay()?;
        model.step(2);
    }
    assert_eq!(bits(&step.download(|b| &b.target)?), bits(&model.target));
    let profile = step.profile(3)?;
    assert_eq!(profile.ops.len(), 4);
    assert!(profile.total_ms > 0.0);
    Ok(())
}

#[test]
fn gpu_eager_runs_keep_the_cadence_of_replays() -> Result<()> {
    let (mut step, mut model) = build(83, 3)?;
    for s in 1..=7 {
        step.run_eager()?;
        model.step(3);
        assert_eq!(
            bits(&step.download(|b| &b.target)?),
            bits(&model.target),
            "eager run {s}"
        );
    }
    Ok(())
}

/// The work bound lists an `#[every]` op's counting kernel without launching it alone (its
/// condition handle belongs to the step's graph), and times every other kernel; the step
/// replays as before afterwards.
#[test]
fn gpu_the_work_bound_lists_a_conditional_ops_kernel_untimed() -> Result<()> {
    let (mut step, _) = build(84, 2)?;
    let work = step.work_bound()?;
    assert_eq!(work.ops.len(), 4);
    for op in &work.ops {
        match op.name.as_str() {
            "sync" | "project" => {
                assert!(!op.kernels.is_empty(), "{}: its counting kernel", op.name);
                assert!(
                    op.kernels.iter().all(|k| k.alone_ms == 0.0),
                    "{}: launched alone",
                    op.name
                );
                assert!(op.other_nodes >= 1, "{}: its conditional node", op.name);
            }
            "train" => assert!(
                !op.kernels.is_empty() && op.kernels.iter().all(|k| k.alone_ms > 0.0),
                "train: {:?}",
                op.kernels
            ),
            _ => {}
        }
    }
    step.replay()?;
    step.wait()
}

/// Replays and eager runs count in one counter per op: mixed, they keep one cadence.
#[test]
fn gpu_replays_and_eager_runs_share_one_cadence() -> Result<()> {
    let (mut step, mut model) = build(85, 3)?;
    for s in 1..=9 {
        if s % 2 == 0 {
            step.run_eager()?;
        } else {
            step.replay()?;
        }
        model.step(3);
        assert_eq!(
            bits(&step.download(|b| &b.target)?),
            bits(&model.target),
            "run {s}"
        );
    }
    Ok(())
}

/// What measures a step (timed replays, a profile, a verification, a work bound) runs
/// the counting kernels of its own graphs, and puts the counts back: the cadence the
/// counters read before is the one the next replays follow.
#[test]
fn gpu_measuring_a_step_leaves_its_cadence_as_it_was() -> Result<()> {
    let (mut step, mut model) = build(86, 3)?;
    step.replay()?;
    model.step(3);
    let counted = |step: &target_sync::Step| -> Result<Vec<(&'static str, u32)>> {
        Ok(step
            .every_counters()?
            .iter()
            .map(|c| (c.op, c.counted))
            .collect())
    };
    assert_eq!(counted(&step)?, [("sync", 1), ("project", 1)]);
    let launched = step.replays_launched();
    let _ = step.time_replays(2, 5)?;
    assert_eq!(step.replays_launched(), launched + 7);
    let _ = step.profile(3)?;
    let _ = step.verify()?;
    let _ = step.work_bound()?;
    assert_eq!(counted(&step)?, [("sync", 1), ("project", 1)]);
    // The work bound reran the kernels on the buffers: start the model again from them.
    model.online = step.download(|b| &b.online)?;
    model.target = step.download(|b| &b.target)?;
    for s in 2..=7 {
        step.replay()?;
        model.step(3);
        assert_eq!(
            bits(&step.download(|b| &b.target)?),
            bits(&model.target),
            "replay {s}"
        );
    }
    Ok(())
}

/// A reset puts every count back to zero: the k-th replay after it runs the op.
#[test]
fn gpu_a_reset_restarts_the_cadence_and_every_replay_is_counted() -> Result<()> {
    let (mut step, mut model) = build(87, 3)?;
    for _ in 0..2 {
        step.replay()?;
        model.step(3);
    }
    step.reset_every_counters()?;
    assert!(step.every_counters()?.iter().all(|c| c.counted == 0));
    // The model's own count restarts too.
    model.step = 0;
    for s in 1..=4 {
        step.replay()?;
        model.step(3);
        assert_eq!(
            bits(&step.download(|b| &b.target)?),
            bits(&model.target),
            "replay {s}"
        );
    }
    step.run_eager()?;
    assert_eq!(step.replays_launched(), 2 + 4 + 1);
    Ok(())
}
