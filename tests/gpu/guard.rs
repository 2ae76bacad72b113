//! GPU tests of the host-call guard: whatever reaches an op (here a kernels type that
//! smuggles in a `Device`, a buffer and another step), a host-side call made while the op
//! is issued fails with an error naming the op and the call, the capture is discarded,
//! and the device stays usable.

use std::sync::Mutex;

use stepgraph::exec::{BlasSession, Executor};
use stepgraph::{CaptureStream, Device, DeviceBuffer, DeviceScalars, Error, Result, Schedule};

use super::{N, Rng, device, fork_join, fork_join_buffers, kernels, run_one_op};

/// What the op can reach besides its buffers: the escape routes no type check closes.
pub struct Escape {
    device: Device,
    buf: DeviceBuffer<f32>,
    other: Mutex<fork_join::Step>,
    /// A buffer the op can take and drop.
    spare: Mutex<Option<DeviceBuffer<f32>>>,
}

/// The host-side calls, by case number.
const CALLS: [&str; 12] = [
    "Device::synchronize",
    "Device::alloc_zeros",
    "Device::upload_new",
    "Device::download",
    "DeviceScalars::new",
    "Step::replay",
    "Step::wait",
    "Executor::new",
    "BlasHandle::new",
    "Module::load",
    "exec::run_once",
    "DeviceBuffer::drop",
];

#[stepgraph::step(streams(main), kernels = Escape)]
mod escaping {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub case: usize,
    }

    fn sneaky(
        s: &CaptureStream<'_>,
        e: &Escape,
        x: &mut DeviceBuffer<f32>,
        case: usize,
    ) -> Result<()> {
        s.memset_zeros(x)?;
        host_call(e, case)
    }
}

fn host_call(e: &Escape, case: usize) -> Result<()> {
    let d = &e.device;
    let step = || {
        e.other
            .lock()
            .map_err(|_| Error::Invalid("poisoned".into()))
    };
    match case {
        0 => d.synchronize(),
        1 => d.alloc_zeros::<f32>("tmp", 4).map(drop),
        2 => d.upload_new("tmp", &[1.0f32]).map(drop),
        3 => d.download(&e.buf).map(drop),
        4 => DeviceScalars::new(d, "lr", &[1.0f32]).map(drop),
        5 => step()?.replay(),
        6 => step()?.wait(),
        7 => Executor::new(d, fork_join::Step::plan(), Schedule::Planned).map(drop),
        8 => BlasSession::new(d).map(drop),
        9 => stepgraph_kernels::Kernels::load(d).map(drop),
        10 => run_one_op(d, |_| Ok(())),
        // A free has no error to return: the op fails all the same.
        _ => {
            let taken = e.spare.lock().map(|mut s| s.take()).ok().flatten();
            assert!(taken.is_some(), "the spare buffer is dropped once");
            drop(taken);
            Ok(())
        }
    }
}

/// The `HostCallInOp` under `err`, if any.
fn host_call_in(err: &Error) -> Option<(&'static str, &'static str, &'static str)> {
    err.errors().find_map(|e| match e {
        Error::HostCallInOp { step, op, call } => Some((*step, *op, *call)),
        _ => None,
    })
}

#[test]
fn gpu_every_host_call_inside_an_op_is_refused_naming_the_op_and_the_call() {
    let device = device();
    let k = kernels(&device);
    let seed = Rng::new(31).vec(N, -1.0, 1.0);
    let config = fork_join::Config { iters: 4 };
    let other = fork_join::Step::new(
        &device,
        k.clone(),
        fork_join_buffers(&device, &seed),
        config,
    )
    .unwrap();
    // One `Escape` shared by the steps of every case, on this thread only: a step holds
    // its kernels in an `Arc`, and a step (inside `Escape`) is not `Sync`.
    #[allow(clippy::arc_with_non_send_sync)]
    let escape = std::sync::Arc::new(Escape {
        device: device.clone(),
        buf: device.upload_new("buf", &seed).unwrap(),
        other: Mutex::new(other),
        spare: Mutex::new(Some(device.upload_new("spare", &seed).unwrap())),
    });
    for (case, want) in CALLS.iter().enumerate() {
        let buffers = escaping::Buffers {
            x: device.upload_new("x", &seed).unwrap(),
        };
        let err = escaping::Step::new(&device, escape.clone(), buffers, escaping::Config { case })
            .unwrap_err();
        assert_eq!(
            host_call_in(&err),
            Some(("escaping", "sneaky", *want)),
            "case {case}: {}",
            err.chain()
        );
        assert!(
            err.chain()
                .contains("op `sneaky` of step `escaping` called"),
            "{}",
            err.chain()
        );
    }
    // Nothing was left capturing: the smuggled step still replays, and right.
    let mut other = escape.other.lock().unwrap();
    other.replay().unwrap();
    other.wait().unwrap();
    assert!(
        other
            .download(|b| &b.total)
            .unwrap()
            .iter()
            .all(|v| v.is_finite())
    );
}

#[test]
fn gpu_the_same_calls_outside_an_op_succeed() {
    let device = device();
    let k = kernels(&device);
    let seed = Rng::new(32).vec(N, -1.0, 1.0);
    let other = fork_join::Step::new(
        &device,
        k,
        fork_join_buffers(&device, &seed),
        fork_join::Config { iters: 4 },
    )
    .unwrap();
    let escape = Escape {
        device: device.clone(),
        buf: device.upload_new("buf", &seed).unwrap(),
        other: Mutex::new(other),
        spare: Mutex::new(Some(device.upload_new("spare", &seed).unwrap())),
    };
    for (case, call) in CALLS.iter().enumerate() {
        host_call(&escape, case).unwrap_or_else(|e| panic!("{call}: {}", e.chain()));
    }
}
