//! GPU tests of the runtime and the generic kernels: they need a CUDA GPU of compute
//! capability 9.0 and run only with the `gpu-tests` feature (`cargo xtask bundle
//! --gpu-tests` builds them for the GPU host). Every test uses random data and compares
//! against a reference computed another way. The DQN trainer's kernels have their own,
//! in `examples/dqn/tests/gpu_dqn.rs`.
#![cfg(feature = "gpu-tests")]

#[path = "gpu/blas.rs"]
mod blas;
#[path = "gpu/capture_guard.rs"]
mod capture_guard;
#[path = "gpu/comm.rs"]
mod comm;
#[path = "gpu/every.rs"]
mod every;
#[path = "gpu/floor.rs"]
mod floor;
#[path = "gpu/gather_table.rs"]
mod gather_table;
#[path = "gpu/guard.rs"]
mod guard;
#[path = "gpu/host_io.rs"]
mod host_io;
#[path = "gpu/interop.rs"]
mod interop;
#[path = "gpu/launch.rs"]
mod launch;
#[path = "gpu/multi_tensor.rs"]
mod multi_tensor;
#[path = "gpu/optim.rs"]
mod optim;
#[path = "gpu/random.rs"]
mod random;
#[path = "gpu/repeat.rs"]
mod repeat;
#[path = "gpu/shared.rs"]
mod shared;
#[path = "gpu/views.rs"]
mod views;
#[path = "gpu/when.rs"]
mod when;

use std::sync::Arc;

use stepgraph::exec::{Mode, Refresh};
use stepgraph::{CaptureStream, Device, DeviceBuffer, DeviceScalars, Error, Result, Schedule};
use stepgraph_kernels::Kernels;
use stepgraph_testkit::{Rng, bits, check_within, max_err, nan_buffer, rms};

/// Runs `body` once, eagerly, on a fresh stream, and waits for it.
fn run_one_op(device: &Device, body: impl FnOnce(&CaptureStream<'_>) -> Result<()>) -> Result<()> {
    stepgraph::exec::run_once(device, body)
}

fn device() -> Device {
    Device::new(0).expect("these tests need a CUDA GPU of compute capability 9.0")
}

fn kernels(device: &Device) -> Arc<Kernels> {
    Arc::new(Kernels::load(device).expect("kernels load"))
}

const N: usize = 4096;
const ITERS: u32 = 96;

/// Four chains from a random seed, joined by a sum: the fork-join shape.
#[stepgraph::step(streams(main, chain[4]), kernels = Kernels, compare(auto))]
mod fork_join {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub seed: DeviceBuffer<f32>,
        #[per_branch]
        pub lanes: [DeviceBuffer<f32>; 4],
        pub total: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub iters: u32,
    }

    #[stream(chain[d])]
    fn chain(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        d: usize,
        seed: &DeviceBuffer<f32>,
        lanes: &mut DeviceBuffer<f32>,
        iters: u32,
    ) -> Result<()> {
        stream.copy(seed, lanes)?;
        k.axpby(stream, seed, lanes, 0.5 + d as f32, 0.25)?;
        for _ in 0..4 {
            k.chain_step(stream, lanes, iters, 0.999, 0.001)?;
        }
        Ok(())
    }

    #[join(chain)]
    fn total(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        lanes: &[DeviceBuffer<f32>; 4],
        total: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        stream.copy(&lanes[0], total)?;
        for lane in &lanes[1..] {
            k.axpby(stream, lane, total, 1.0, 1.0)?;
        }
        Ok(())
    }
}

fn fork_join_reference(seed: &[f32], iters: u32) -> Vec<f32> {
    let mut total = vec![0.0f32; seed.len()];
    for d in 0..4 {
        let mut lane: Vec<f32> = seed.to_vec();
        stepgraph_kernels::reference::axpby_reference(seed, &mut lane, 0.5 + d as f32, 0.25);
        for _ in 0..4 {
            stepgraph_kernels::reference::chain_step_reference(&mut lane, iters, 0.999, 0.001);
        }
        if d == 0 {
            total.copy_from_slice(&lane);
        } else {
            stepgraph_kernels::reference::axpby_reference(&lane, &mut total, 1.0, 1.0);
        }
    }
    total
}

fn fork_join_buffers(device: &Device, seed: &[f32]) -> fork_join::Buffers {
    let nan = vec![f32::NAN; seed.len()];
    let up = |what, data: &[f32]| device.upload_new(what, data).unwrap();
    fork_join::Buffers {
        seed: up("seed", seed),
        lanes: [
            up("l0", &nan),
            up("l1", &nan),
            up("l2", &nan),
            up("l3", &nan),
        ],
        total: up("total", &nan),
    }
}
/// A `fork_join` step over fresh buffers from `seed`, captured with `schedule`.
fn fork_join_with(
    device: &Device,
    k: &Arc<Kernels>,
    seed: &[f32],
    config: fork_join::Config,
    schedule: Schedule,
) -> fork_join::Step {
    fork_join::Step::with_schedule(
        device,
        k.clone(),
        fork_join_buffers(device, seed),
        config,
        schedule,
    )
    .unwrap()
}

#[test]
fn gpu_fork_join_replay_equals_sequential_execution() {
    let device = device();
    let k = kernels(&device);
    let mut rng = Rng::new(1);
    let config = fork_join::Config { iters: ITERS };
    let seed = rng.vec(N, -1.0, 1.0);
    let mut parallel = fork_join::Step::new(
        &device,
        k.clone(),
        fork_join_buffers(&device, &seed),
        config,
    )
    .unwrap();
    let mut serial = fork_join_with(&device, &k, &seed, config, Schedule::OneStream);
    // The planner's placement of every op (`compare(auto)`).
    let mut automatic = fork_join_with(&device, &k, &seed, config, Schedule::Automatic);
    // Three rounds, fresh random seeds uploaded in place between replays.
    for round in 0..3 {
        let seed = rng.vec(N, -1.0, 1.0);
        let [p, s, a] = [&mut parallel, &mut serial, &mut automatic].map(|step| {
            step.upload(|b| &b.seed, &seed).unwrap();
            step.replay().unwrap();
            step.download(|b| &b.total).unwrap()
        });
        // Same kernels in the same per-element order: bit for bit.
        assert_eq!(
            p, s,
            "round {round}: multi-stream result differs from one-stream"
        );
        assert_eq!(
            a, s,
            "round {round}: the planner's placement differs from one-stream"
        );
        let err = max_err(&p, &fork_join_reference(&seed, ITERS), 1e-3);
        assert!(
            err < 1e-5,
            "round {round}: relative error {err} against the CPU"
        );
    }
    // The plan: each chain forks from capture begin, the join waits once per chain.
    assert_eq!(fork_join::PLAN.wait_count(), 8);
    let counts = parallel.executor().node_counts().unwrap();
    assert_eq!(counts.kernels, 4 * 5 + 3, "{counts:?}");
    assert_eq!(counts.memcpys, 4 + 1, "{counts:?}");
}

#[test]
fn gpu_download_many_equals_one_download_per_buffer_in_order() {
    let device = device();
    let k = kernels(&device);
    let seed = Rng::new(13).vec_nonzero(N, -1.0, 1.0);
    let config = fork_join::Config { iters: ITERS };
    let mut step =
        fork_join::Step::new(&device, k, fork_join_buffers(&device, &seed), config).unwrap();
    step.replay().unwrap();
    // Queued right behind the replay: the one wait must cover it.
    let many = step
        .download_many(|b| b.lanes.iter().rev().chain([&b.total, &b.seed]).collect())
        .unwrap();
    let mut one_by_one: Vec<Vec<f32>> = (0..4)
        .rev()
        .map(|d| step.download(|b| &b.lanes[d]).unwrap())
        .collect();
    one_by_one.push(step.download(|b| &b.total).unwrap());
    one_by_one.push(step.download(|b| &b.seed).unwrap());
    assert_eq!(many.len(), 6);
    for (i, (m, o)) in many.iter().zip(&one_by_one).enumerate() {
        assert_eq!(bits(&[m]), bits(&[o]), "buffer {i}");
    }
    assert!(max_err(&many[4], &fork_join_reference(&seed, ITERS), 1e-3) < 1e-5);
    // Nothing selected: nothing copied, still no error.
    let none = step
        .download_many::<f32, DeviceBuffer<f32>>(|_| Vec::new())
        .unwrap();
    assert!(none.is_empty());
}

#[test]
fn gpu_eager_run_matches_graph_replay() {
    let device = device();
    let k = kernels(&device);
    let seed = Rng::new(2).vec(N, -1.0, 1.0);
    let config = fork_join::Config { iters: ITERS };
    let mut step =
        fork_join::Step::new(&device, k, fork_join_buffers(&device, &seed), config).unwrap();
    step.run_eager().unwrap();
    let eager = step.download(|b| &b.total).unwrap();
    step.upload(|b| &b.total, &vec![f32::NAN; N]).unwrap();
    step.replay().unwrap();
    let replay = step.download(|b| &b.total).unwrap();
    assert_eq!(eager, replay);
}

/// A device scalar read by a kernel: refreshed from pinned host memory at every replay.
#[stepgraph::step(streams(main, side), kernels = Kernels)]
mod scalars {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub scale: DeviceScalars<f32>,
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
        pub z: DeviceBuffer<f32>,
    }

    fn refresh(stream: &CaptureStream<'_>, scale: &mut DeviceScalars<f32>) -> Result<()> {
        stream.refresh(scale)
    }

    #[stream(side)]
    fn scaled(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        scale: &DeviceScalars<f32>,
        x: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        stream.copy(x, y)?;
        k.scale_by_scalar(stream, scale, 1, y)
    }

    fn also_scaled(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        scale: &DeviceScalars<f32>,
        x: &DeviceBuffer<f32>,
        z: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        stream.copy(x, z)?;
        k.scale_by_scalar(stream, scale, 0, z)
    }
}

#[test]
fn gpu_device_scalars_take_new_values_between_replays() {
    let device = device();
    let k = kernels(&device);
    let mut rng = Rng::new(3);
    let x = rng.vec(N, -2.0, 2.0);
    let buffers = scalars::Buffers {
        scale: DeviceScalars::new(&device, "scale", &[1.0, 1.0]).unwrap(),
        x: device.upload_new("x", &x).unwrap(),
        y: device.upload_new("y", &vec![f32::NAN; N]).unwrap(),
        z: device.upload_new("z", &vec![f32::NAN; N]).unwrap(),
    };
    let mut step = scalars::Step::new(&device, k, buffers, scalars::Config {}).unwrap();
    for _ in 0..5 {
        let (s0, s1) = (rng.next_f32() * 4.0 - 2.0, rng.next_f32() * 4.0 - 2.0);
        {
            let access = step.host_access().unwrap();
            step.buffers().scale.set(&access, 0, s0).unwrap();
            step.buffers().scale.set(&access, 1, s1).unwrap();
        }
        step.replay().unwrap();
        let y = step.download(|b| &b.y).unwrap();
        let z = step.download(|b| &b.z).unwrap();
        for i in 0..N {
            assert_eq!(y[i], x[i] * s1, "y[{i}] with scale {s1}");
            assert_eq!(z[i], x[i] * s0, "z[{i}] with scale {s0}");
        }
    }
    // Out of range is an error, not a panic.
    let access = step.host_access().unwrap();
    assert!(step.buffers().scale.set(&access, 2, 1.0).is_err());
}

#[test]
fn gpu_rebinding_a_buffer_updates_the_graph_in_place() {
    let device = device();
    let k = kernels(&device);
    let mut rng = Rng::new(4);
    let seed_a = rng.vec(N, -1.0, 1.0);
    let seed_b = rng.vec(N, -1.0, 1.0);
    let config = fork_join::Config { iters: ITERS };
    let mut step =
        fork_join::Step::new(&device, k, fork_join_buffers(&device, &seed_a), config).unwrap();
    step.replay().unwrap();
    let a = step.download(|b| &b.total).unwrap();
    assert!(max_err(&a, &fork_join_reference(&seed_a, ITERS), 1e-3) < 1e-5);

    // A new seed buffer (a new address) and a new total buffer.
    let new_seed = device.upload_new("seed b", &seed_b).unwrap();
    let new_total = device.upload_new("total b", &vec![f32::NAN; N]).unwrap();
    let old_addr = step.buffers().seed.device_address();
    let (old_seed, old_total) = step
        .rebind(|b| {
            (
                std::mem::replace(&mut b.seed, new_seed),
                std::mem::replace(&mut b.total, new_total),
            )
        })
        .unwrap();
    assert_ne!(old_addr, step.buffers().seed.device_address());
    assert_eq!(step.executor().last_refresh(), Some(Refresh::Updated));
    drop((old_seed, old_total));
    step.replay().unwrap();
    let b = step.download(|b| &b.total).unwrap();
    let err = max_err(&b, &fork_join_reference(&seed_b, ITERS), 1e-3);
    assert!(err < 1e-5, "after rebind: relative error {err}");
}

#[test]
fn gpu_ten_thousand_replays_without_error_or_memory_growth() {
    let device = device();
    let k = kernels(&device);
    let seed = Rng::new(5).vec(N, -1.0, 1.0);
    let config = fork_join::Config { iters: 8 };
    let mut step =
        fork_join::Step::new(&device, k, fork_join_buffers(&device, &seed), config).unwrap();
    for _ in 0..100 {
        step.replay().unwrap();
    }
    step.wait().unwrap();
    device.synchronize().unwrap();
    let (free_before, _) = device.memory().unwrap();
    for i in 0..10_000 {
        step.replay().unwrap();
        if i % 1000 == 999 {
            step.wait().unwrap();
        }
    }
    step.wait().unwrap();
    device.synchronize().unwrap();
    let (free_after, _) = device.memory().unwrap();
    assert_eq!(
        free_before, free_after,
        "device memory changed over 10,000 replays"
    );
    let total = step.download(|b| &b.total).unwrap();
    assert!(max_err(&total, &fork_join_reference(&seed, 8), 1e-3) < 1e-5);
}

/// Two side streams with per-stream scratch: building allocates one copy per extra stream.
#[stepgraph::step(streams(main, a, b))]
mod big_scratch {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[scratch(per_stream)]
        pub tmp: DeviceBuffer<u8>,
    }

    fn zero_main(stream: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<u8>) -> Result<()> {
        stream.memset_zeros(tmp)
    }
    #[stream(a)]
    fn zero_a(stream: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<u8>) -> Result<()> {
        stream.memset_zeros(tmp)
    }
    #[stream(b)]
    fn zero_b(stream: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<u8>) -> Result<()> {
        stream.memset_zeros(tmp)
    }
}

#[test]
fn gpu_out_of_memory_when_building_a_step_names_the_allocation() {
    let device = device();
    let (free, _) = device.memory().unwrap();
    // The user's copy takes 40% of free memory; two more copies cannot fit.
    let first = device.alloc_zeros::<u8>("tmp", free / 10 * 4).unwrap();
    let err = big_scratch::Step::new(
        &device,
        (),
        big_scratch::Buffers { tmp: first },
        big_scratch::Config {},
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{msg}");
    assert!(msg.contains("scratch copy 2 of `tmp`"), "{msg}");
    // Nothing leaked: the failed build freed what it had allocated. Freed memory goes back
    // to the stream-ordered allocator's pool and to the device at the next synchronise.
    device.synchronize().unwrap();
    let (free_after, _) = device.memory().unwrap();
    assert!(
        free_after + (1 << 24) >= free,
        "free {free} before, {free_after} after"
    );
    // And an absurd request is a clear error too.
    let err = device.alloc_zeros::<f32>("huge", 1 << 40).unwrap_err();
    assert!(err.to_string().contains("huge"), "{err}");
}

#[test]
fn gpu_missing_library_is_a_clear_error_and_present_ones_pass() {
    stepgraph::preflight::check_libraries()
        .expect("the CUDA driver and cuBLASLt are installed here");
    let err = stepgraph::preflight::require_library("cublasLt_stepgraph_absent").unwrap_err();
    assert!(matches!(err, Error::LibraryMissing { .. }), "{err}");
    assert!(
        err.to_string().contains("libcublasLt_stepgraph_absent.so"),
        "{err}"
    );
}

/// An op that fails only during capture, after another stream has forked.
#[stepgraph::step(streams(main, side))]
mod fails_in_capture {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    #[stream(side)]
    fn side_work(stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        stream.memset_zeros(x)
    }

    fn main_work(stream: &CaptureStream<'_>, y: &mut DeviceBuffer<f32>) -> Result<()> {
        if stream.mode() == Mode::Capture {
            return Err(Error::Invalid("planted failure".into()));
        }
        stream.memset_zeros(y)
    }
}

#[test]
fn gpu_a_failing_op_aborts_the_capture_cleanly() {
    let device = device();
    let bufs = || fails_in_capture::Buffers {
        x: device.upload_new("x", &[1.0f32; 64]).unwrap(),
        y: device.upload_new("y", &[1.0f32; 64]).unwrap(),
    };
    let err =
        fails_in_capture::Step::new(&device, (), bufs(), fails_in_capture::Config {}).unwrap_err();
    let msg = err.chain();
    assert!(msg.contains("main_work"), "{msg}");
    assert!(
        msg.contains("planted failure") || format!("{err:?}").contains("planted failure"),
        "{err:?}"
    );
    // The device is still usable: no stream was left capturing.
    let k = kernels(&device);
    let seed = Rng::new(6).vec(N, -1.0, 1.0);
    let mut step = fork_join::Step::new(
        &device,
        k,
        fork_join_buffers(&device, &seed),
        fork_join::Config { iters: 4 },
    )
    .unwrap();
    step.replay().unwrap();
    step.wait().unwrap();
}

#[test]
fn gpu_verifier_passes_on_a_planned_step_and_on_its_one_stream_baseline() {
    let device = device();
    let k = kernels(&device);
    let seed = Rng::new(7).vec(N, -1.0, 1.0);
    let config = fork_join::Config { iters: 8 };
    let mut step = fork_join::Step::new(
        &device,
        k.clone(),
        fork_join_buffers(&device, &seed),
        config,
    )
    .unwrap();
    let report = step.verify().unwrap();
    // 4 chains reading the seed (no dependency on each other), joined by `total`.
    assert_eq!(report.ops, 5, "{report}");
    assert_eq!(report.independent_pairs, 6, "{report}");
    assert_eq!(
        report.ordered_dependencies,
        fork_join::PLAN.edges.len(),
        "{report}"
    );
    // The baseline orders everything, as a one-stream capture must.
    let mut serial = fork_join_with(&device, &k, &seed, config, Schedule::OneStream);
    let report = serial.verify().unwrap();
    assert_eq!(report.independent_pairs, 0, "{report}");
    // The graph still replays correctly after the verifying capture.
    step.replay().unwrap();
    let total = step.download(|b| &b.total).unwrap();
    assert!(max_err(&total, &fork_join_reference(&seed, 8), 1e-3) < 1e-5);
}

/// Hand-built plans through the runtime's low-level API: ops `write` (main) and `read`
/// (side) on buffer `x`, with `read` depending on `write` (read after write).
mod broken {
    use stepgraph::plan::*;

    const STREAMS: &[StreamDesc] = &[StreamDesc::named("main"), StreamDesc::named("side")];
    const X: BufId = BufId(0);

    /// `read` forks from capture begin instead of waiting for `write`: a race.
    pub const RACY: PlanDesc = PlanDesc::new("racy")
        .with_streams(STREAMS)
        .with_buffers(&[BufferDesc::new("x", BufKind::Shared)])
        .with_ops(&[
            OpDesc::new("write", StreamId(0)).with_accesses(&[AccessDesc::write(X, 0)]),
            OpDesc::new("read", StreamId(1))
                .with_accesses(&[AccessDesc::read(X, 0)])
                .with_waits(&[EventId(0)])
                .with_record(EventId(1)),
        ])
        .with_edges(&[EdgeDesc::new(
            OpId(0),
            OpId(1),
            EdgeKind::ReadAfterWrite,
            Some(X),
        )])
        .with_events(&[
            EventDesc::at_capture_begin(),
            EventDesc::after(StreamId(1), OpId(1)),
        ])
        .with_final_waits(&[EventId(1)]);

    /// Two independent writers of two buffers, but `second` waits for `first`.
    pub const SERIALISED: PlanDesc = PlanDesc::new("serialised")
        .with_streams(STREAMS)
        .with_buffers(&[
            BufferDesc::new("x", BufKind::Shared),
            BufferDesc::new("y", BufKind::Shared),
        ])
        .with_ops(&[
            OpDesc::new("first", StreamId(0))
                .with_accesses(&[AccessDesc::write(X, 0)])
                .with_record(EventId(0)),
            OpDesc::new("second", StreamId(1))
                .with_accesses(&[AccessDesc::write(BufId(1), 0)])
                .with_waits(&[EventId(0)])
                .with_record(EventId(1)),
        ])
        .with_events(&[
            EventDesc::after(StreamId(0), OpId(0)),
            EventDesc::after(StreamId(1), OpId(1)),
        ])
        .with_final_waits(&[EventId(1)]);
}

fn capture_two_op_plan(
    device: &Device,
    plan: &'static stepgraph::PlanDesc,
) -> Result<stepgraph::VerifyReport> {
    use stepgraph::plan::OpId;
    let k = kernels(device);
    let mut x = device.upload_new("x", &Rng::new(8).vec(N, -1.0, 1.0))?;
    let mut y = device.upload_new("y", &Rng::new(9).vec(N, -1.0, 1.0))?;
    let mut exec = stepgraph::exec::Executor::new(device, plan, Schedule::Planned)?;
    exec.verify(&mut |issue| {
        issue.op(OpId(0), |s| k.chain_step(s, &mut x, 4, 0.999, 0.001))?;
        issue.op(OpId(1), |s| {
            // Reads x (racy plan) or writes y (serialised plan).
            if plan.buffers.len() == 1 {
                k.axpby(s, &x, &mut y, 1.0, 0.0)
            } else {
                k.chain_step(s, &mut y, 4, 0.999, 0.001)
            }
        })
    })
}

#[test]
fn gpu_verifier_catches_a_racy_schedule_naming_the_ops() {
    let device = device();
    let err = capture_two_op_plan(&device, &broken::RACY).unwrap_err();
    let msg = err.chain();
    assert!(msg.contains("race"), "{msg}");
    assert!(
        msg.contains("`write` (stream `main`)") && msg.contains("`read` (stream `side`)"),
        "{msg}"
    );
}

#[test]
fn gpu_verifier_catches_a_falsely_serialised_schedule_naming_the_ops() {
    let device = device();
    let err = capture_two_op_plan(&device, &broken::SERIALISED).unwrap_err();
    let msg = err.chain();
    assert!(msg.contains("false serialisation"), "{msg}");
    assert!(
        msg.contains("`first` (stream `main`)") && msg.contains("`second` (stream `side`)"),
        "{msg}"
    );
}

#[test]
fn gpu_profile_shows_the_chains_overlapping() {
    let device = device();
    let k = kernels(&device);
    let seed = Rng::new(10).vec(N, -1.0, 1.0);
    // Chains of about 0.25 ms, so launch gaps of a few microseconds are small beside them.
    let config = fork_join::Config { iters: 16384 };
    let mut step =
        fork_join::Step::new(&device, k, fork_join_buffers(&device, &seed), config).unwrap();
    let profile = step.profile(20).unwrap();
    println!("{profile}");
    assert_eq!(profile.ops.len(), 5);
    // Four chains side by side: the streams are busy about four times the wall time.
    assert!(profile.overlap() > 3.0, "overlap {:.2}", profile.overlap());
    // The critical path (one chain, then the join) accounts for the measured step time of
    // the normal graph, within 10%.
    let mut times = step.executor().time_replays(5, 50).unwrap();
    times.sort_by(f64::total_cmp);
    let step_ms = times[times.len() / 2];
    let ratio = profile.critical_path_ms() / step_ms;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "critical path {:.4} ms, step {step_ms:.4} ms",
        profile.critical_path_ms()
    );
    // The normal graph carries no timing events: profiling left it as it was.
    let counts = step.executor().node_counts().unwrap();
    assert_eq!(counts.other, 0, "{counts:?}");
    step.replay().unwrap();
    let total = step.download(|b| &b.total).unwrap();
    assert!(max_err(&total, &fork_join_reference(&seed, 16384), 1e-3) < 1e-5);
}

#[test]
fn gpu_work_bound_times_every_kernel_and_weights_it_by_its_grid() {
    let device = device();
    let k = kernels(&device);
    let seed = Rng::new(12).vec(N, -1.0, 1.0);
    let config = fork_join::Config { iters: 4096 };
    let mut step = fork_join_with(&device, &k, &seed, config, Schedule::OneStream);
    let mut times = step.executor().time_replays(5, 50).unwrap();
    times.sort_by(f64::total_cmp);
    let one_stream_ms = times[times.len() / 2];
    let work = step.work_bound().unwrap();
    println!("{work}");
    // Every kernel node of the step, attributed to its op.
    let counts = step.executor().node_counts().unwrap();
    assert_eq!(work.kernels(), counts.kernels);
    assert_eq!(work.ops.len(), fork_join::PLAN.ops.len());
    assert_eq!(
        work.ops[0].kernels.len(),
        5,
        "a chain: axpby and four chain steps"
    );
    for op in &work.ops {
        for kw in &op.kernels {
            assert!(
                kw.alone_ms > 0.0 && kw.share > 0.0 && kw.share <= 1.0,
                "{op:?}"
            );
            // A grid of N / 256 = 16 blocks of 256 threads fills a small part of a GPU
            // that holds several such blocks on each of its SMs.
            assert_eq!((kw.blocks, kw.threads), (16, 256), "{op:?}");
            assert!(kw.share < 0.2, "{op:?}");
        }
    }
    assert!(work.bound_ms() < 0.2 * work.alone_ms());
    // The kernels alone add up to about the one-stream step (which also has copies and
    // launch gaps).
    let ratio = work.alone_ms() / one_stream_ms;
    assert!(
        (0.5..=1.1).contains(&ratio),
        "kernels alone {:.4} ms, one-stream step {one_stream_ms:.4} ms",
        work.alone_ms()
    );
}

/// Two chains, the side one marked low priority.
#[stepgraph::step(streams(main, side(low)), kernels = Kernels)]
mod prioritised {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub seed: DeviceBuffer<f32>,
        pub urgent: DeviceBuffer<f32>,
        pub background: DeviceBuffer<f32>,
    }

    #[stream(side)]
    fn background(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        seed: &DeviceBuffer<f32>,
        background: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        stream.copy(seed, background)?;
        for _ in 0..3 {
            k.chain_step(stream, background, 64, 0.999, 0.001)?;
        }
        Ok(())
    }

    fn urgent(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        seed: &DeviceBuffer<f32>,
        urgent: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        stream.copy(seed, urgent)?;
        k.axpby(stream, seed, urgent, 2.0, 1.0)
    }
}

#[test]
fn gpu_a_low_priority_stream_keeps_its_priority_in_the_graph() {
    let device = device();
    let k = kernels(&device);
    let seed = Rng::new(31).vec(N, -1.0, 1.0);
    let nan = vec![f32::NAN; N];
    let up = |what, data: &[f32]| device.upload_new(what, data).unwrap();
    let buffers = prioritised::Buffers {
        seed: up("seed", &seed),
        urgent: up("urgent", &nan),
        background: up("background", &nan),
    };
    let mut step = prioritised::Step::new(&device, k, buffers, prioritised::Config {}).unwrap();
    println!("{}", prioritised::PLAN);
    // Capture copied each stream's priority into its kernels: the main stream's one
    // kernel ranks above (a lower number than) the side stream's three.
    let ranks = step
        .executor()
        .graph()
        .unwrap()
        .kernel_priorities()
        .unwrap();
    println!("kernel priorities (value, nodes): {ranks:?}");
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    assert_eq!((ranks[0].1, ranks[1].1), (1, 3), "{ranks:?}");
    step.replay().unwrap();
    let mut want = seed.clone();
    stepgraph_kernels::reference::chain_step_reference(&mut want, 3 * 64, 0.999, 0.001);
    let got = step.download(|b| &b.background).unwrap();
    assert!(max_err(&got, &want, 1e-3) < 1e-5);
    let mut want = seed.clone();
    stepgraph_kernels::reference::axpby_reference(&seed, &mut want, 2.0, 1.0);
    assert_eq!(step.download(|b| &b.urgent).unwrap(), want);
}
