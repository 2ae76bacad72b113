//! GPU tests of what an op may do while it is captured, beyond its types: the capture
//! guard (CUPTI) refuses every CUDA call an op's code makes off its capture stream (work
//! on the program's own streams or the legacy default stream, through cudarc, raw driver
//! calls or cuBLASLt; synchronisations; allocations; copies to the host), also beside
//! captured work and in a release build; a write to memory none of the op's `&mut`
//! parameters holds, and a `&mut` buffer swapped inside the op, are refused too. Each
//! refusal names the op and the call; the device stays usable after it, and the same code
//! on the capture stream is captured and replayed, right.

use std::sync::{Arc, Mutex};

use stepgraph::cudarc::cublaslt::{CudaBlasLT, Matmul as LtMatmul, MatmulConfig};
use stepgraph::cudarc::driver::{CudaSlice, CudaStream};
use stepgraph::{
    CaptureStream, Device, DeviceBuffer, DeviceScalars, Error, Options, Result, Schedule,
};
use stepgraph_kernels::Kernels;
use stepgraph_testkit::Rng;

use super::{device, kernels};

const N: usize = 1024;
/// The side of the square matrices of the cuBLASLt case.
const M: usize = 32;

/// What an op can reach besides its buffers: the program's own cudarc objects, the ways
/// out of a capture that no type closes.
pub struct Foreign {
    k: Arc<Kernels>,
    /// A stream of the program's own, not capturing.
    stream: Arc<CudaStream>,
    /// cudarc's default stream: the legacy stream.
    legacy: Arc<CudaStream>,
    slice: Mutex<CudaSlice<f32>>,
    blas: CudaBlasLT,
    a: CudaSlice<f32>,
    c: Mutex<CudaSlice<f32>>,
    /// A buffer that is none of the step's.
    outside: Mutex<DeviceBuffer<f32>>,
    device: Device,
}

/// The escapes, by case number, with the call the guard names first.
const CASES: &[(&str, &str)] = &[
    ("a memset on the program's own stream", "cuMemsetD8Async"),
    ("a memset on the legacy default stream", "cuMemsetD8Async"),
    ("a copy to the host", "cuMemcpyDtoHAsync_v2"),
    ("a clone of a slice", "cuMemAllocAsync"),
    (
        "a synchronisation of the program's stream",
        "cuStreamSynchronize",
    ),
    (
        "a raw driver memset on the program's stream",
        "cuMemsetD32Async",
    ),
    ("a cuBLASLt matmul on the program's stream", ""),
    (
        "the capture stream's own work, then a memset beside it",
        "cuMemsetD8Async",
    ),
    (
        "a fork to a stream of the program's own, joined back",
        "cuStreamWaitEvent",
    ),
    ("a context synchronisation", "cuCtxSynchronize"),
];

#[stepgraph::step(streams(main), kernels = Foreign)]
mod escaping {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub case: usize,
    }

    /// Captured work first (a kernel on the capture stream), then the escape.
    fn sneaky(
        s: &CaptureStream<'_>,
        f: &Foreign,
        x: &mut DeviceBuffer<f32>,
        case: usize,
    ) -> Result<()> {
        f.k.fill_affine(s, x, 0.5, 1e-3)?;
        escape(s, f, x, case)
    }

    /// Reads what `sneaky` wrote.
    fn after(
        s: &CaptureStream<'_>,
        x: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(x, y)
    }
}

/// One escape, outside the op's body, where the macro's scan of op bodies cannot see it.
fn escape(
    s: &CaptureStream<'_>,
    f: &Foreign,
    x: &mut DeviceBuffer<f32>,
    case: usize,
) -> Result<()> {
    let drv = |e| Error::driver("cudarc")(e);
    let mut slice = f
        .slice
        .lock()
        .map_err(|_| Error::Invalid("poisoned".into()))?;
    match case {
        0 => f.stream.memset_zeros(&mut *slice).map_err(drv),
        1 => f.legacy.memset_zeros(&mut *slice).map_err(drv),
        2 => f.stream.clone_dtoh(&*slice).map(drop).map_err(drv),
        3 => {
            let copy = slice.clone();
            drop(copy);
            Ok(())
        }
        4 => f.stream.synchronize().map_err(drv),
        5 => {
            use stepgraph::cudarc::driver::DevicePtr;
            let (ptr, _sync) = slice.device_ptr(&f.stream);
            // SAFETY: a memset of the slice's own memory on its own stream.
            unsafe {
                stepgraph::cudarc::driver::sys::cuMemsetD32Async(ptr, 0, N, f.stream.cu_stream())
            }
            .result()
            .map_err(drv)
        }
        6 => {
            let mut c = f.c.lock().map_err(|_| Error::Invalid("poisoned".into()))?;
            let cfg = square(M);
            // SAFETY: [M, M] operands, all M * M long.
            unsafe { f.blas.matmul(cfg, &f.a, &f.a, &mut *c, None, None) }
                .map_err(|e| Error::Invalid(format!("cuBLASLt: {e:?}")))
        }
        7 => {
            // The op's own raw work is fine; the memset beside it on another stream is not.
            // SAFETY: one memset of `x`, the op's `&mut` parameter, on its stream.
            unsafe {
                if let Some(own) = s.cuda_stream() {
                    own.memset_zeros(x.cuda_slice_mut()).map_err(drv)?;
                }
            }
            f.stream.memset_zeros(&mut *slice).map_err(drv)
        }
        8 => {
            // SAFETY: the capture stream, only to record and wait on an event.
            let Some(own) = (unsafe { s.cuda_stream() }) else {
                return Ok(());
            };
            let forked = own.record_event(None).map_err(drv)?;
            f.stream.wait(&forked).map_err(drv)?;
            f.stream.memset_zeros(&mut *slice).map_err(drv)?;
            let joined = f.stream.record_event(None).map_err(drv)?;
            own.wait(&joined).map_err(drv)
        }
        9 => f.stream.context().synchronize().map_err(drv),
        _ => Ok(()),
    }
}

fn square(m: usize) -> MatmulConfig {
    let m = m as u64;
    MatmulConfig {
        transa: false,
        transb: false,
        transc: false,
        m,
        n: m,
        k: m,
        alpha: 1.0,
        lda: m as i64,
        ldb: m as i64,
        beta: 0.0,
        ldc: m as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    }
}

fn foreign(device: &Device, seed: u64) -> Arc<Foreign> {
    let ctx = device.context();
    let stream = ctx.new_stream().unwrap();
    let mut rng = Rng::new(seed);
    let slice = stream.clone_htod(&rng.vec(N, -1.0, 1.0)).unwrap();
    let a = stream.clone_htod(&rng.vec(M * M, -1.0, 1.0)).unwrap();
    let c = stream.alloc_zeros::<f32>(M * M).unwrap();
    let blas = CudaBlasLT::new(stream.clone()).unwrap();
    // Warm the matmul outside any capture, so that cuBLASLt's first-use loading is done.
    let mut c0 = stream.alloc_zeros::<f32>(M * M).unwrap();
    // SAFETY: [M, M] operands.
    unsafe { blas.matmul(square(M), &a, &a, &mut c0, None, None) }.unwrap();
    stream.synchronize().unwrap();
    Arc::new(Foreign {
        k: kernels(device),
        legacy: ctx.default_stream(),
        stream,
        slice: Mutex::new(slice),
        blas,
        a,
        c: Mutex::new(c),
        outside: Mutex::new(
            device
                .upload_new("outside", &rng.vec(N, -1.0, 1.0))
                .unwrap(),
        ),
        device: device.clone(),
    })
}

fn buffers(device: &Device, rng: &mut Rng) -> escaping::Buffers {
    escaping::Buffers {
        x: device.upload_new("x", &rng.vec(N, -1.0, 1.0)).unwrap(),
        y: device.upload_new("y", &rng.vec(N, -1.0, 1.0)).unwrap(),
    }
}

/// The escape under a failed build, if there is one: (step, op, call, the message).
fn escape_in(err: &Error) -> Option<(&'static str, &'static str, String, String)> {
    err.errors().find_map(|e| match e {
        Error::Escape { step, op, call, .. } => Some((*step, *op, call.clone(), e.to_string())),
        _ => None,
    })
}

/// Release builds (where verification is off by default) and debug builds alike: every
/// escape fails the build of the step, naming the op and the call, whatever captured work
/// sits beside it in the op.
#[test]
fn gpu_every_escape_from_an_op_is_refused_naming_the_op_and_the_call() {
    let device = device();
    let f = foreign(&device, 41);
    let mut rng = Rng::new(42);
    for verify in [false, true] {
        let options = Options::default().with_verify(verify);
        for (case, (what, call)) in CASES.iter().enumerate() {
            let err = escaping::Step::with_options(
                &device,
                f.clone(),
                buffers(&device, &mut rng),
                escaping::Config { case },
                options.clone(),
            )
            .map(drop)
            .unwrap_err();
            let (step, op, named, message) =
                escape_in(&err).unwrap_or_else(|| panic!("case {case} ({what}): {}", err.chain()));
            assert_eq!((step, op), ("escaping", "sneaky"), "case {case}: {message}");
            if !call.is_empty() {
                assert_eq!(named, *call, "case {case} ({what}): {message}");
            }
            assert!(
                message.contains("op `sneaky` of step `escaping` called"),
                "case {case}: {message}"
            );
            assert!(
                message.contains("never in a replay") || message.contains("capture"),
                "{message}"
            );
        }
    }
    // The legacy stream is named as such.
    let err = escaping::Step::new(
        &device,
        f.clone(),
        buffers(&device, &mut rng),
        escaping::Config { case: 1 },
    )
    .map(drop)
    .unwrap_err();
    let (_, _, _, message) = escape_in(&err).unwrap();
    assert!(message.contains("the legacy default stream"), "{message}");
    // Nothing was left capturing: the device and the program's stream still work.
    f.stream.synchronize().unwrap();
    let back = f.stream.clone_dtoh(&*f.slice.lock().unwrap()).unwrap();
    assert_eq!(back.len(), N);
}

/// The same calls outside any op run, and an op that issues only on its capture stream
/// (its own kernel, cudarc code through `cuda_stream`) is captured and replays right.
#[test]
fn gpu_work_on_the_capture_stream_passes_the_guard_and_replays() {
    let device = device();
    let f = foreign(&device, 43);
    let mut rng = Rng::new(44);
    // Outside an op: each call is the program's business.
    for case in [0, 1, 2, 4, 9] {
        escape_outside(&f, case);
    }
    // `case` past the list: the op's kernel and nothing else.
    let mut step = escaping::Step::with_options(
        &device,
        f.clone(),
        buffers(&device, &mut rng),
        escaping::Config { case: CASES.len() },
        Options::default().with_verify(true),
    )
    .unwrap();
    for _ in 0..3 {
        step.replay().unwrap();
    }
    let y = step.download(|b| &b.y).unwrap();
    let mut want = vec![0.0f32; N];
    stepgraph_kernels::reference::fill_affine_reference(&mut want, 0.5, 1e-3);
    assert_eq!(y, want);
}

fn escape_outside(f: &Foreign, case: usize) {
    let mut slice = f.slice.lock().unwrap();
    match case {
        0 => f.stream.memset_zeros(&mut *slice).unwrap(),
        1 => f.legacy.memset_zeros(&mut *slice).unwrap(),
        2 => drop(f.stream.clone_dtoh(&*slice).unwrap()),
        4 => f.stream.synchronize().unwrap(),
        9 => f.stream.context().synchronize().unwrap(),
        _ => {}
    }
}

/// With the guard off, an escape is captured as before the guard: the work ran once, at
/// capture, and no replay runs it. The switch exists for runs under a profiler.
#[test]
fn gpu_with_the_guard_off_an_escape_runs_only_at_capture() {
    let device = device();
    let f = foreign(&device, 45);
    let mut rng = Rng::new(46);
    let before = device.download(&*f.slice.lock().unwrap()).unwrap();
    assert!(before.iter().any(|&v| v != 0.0));
    let mut step = escaping::Step::with_options(
        &device,
        f.clone(),
        buffers(&device, &mut rng),
        escaping::Config { case: 0 },
        Options::default().with_capture_guard(false),
    )
    .unwrap();
    // The dry pass and the capture zeroed the slice; refill it and replay.
    f.stream.synchronize().unwrap();
    let fresh = rng.vec_nonzero(N, -1.0, 1.0);
    f.stream
        .memcpy_htod(&fresh, &mut *f.slice.lock().unwrap())
        .unwrap();
    f.stream.synchronize().unwrap();
    for _ in 0..5 {
        step.replay().unwrap();
    }
    step.wait().unwrap();
    assert_eq!(device.download(&*f.slice.lock().unwrap()).unwrap(), fresh);
}

#[stepgraph::step(streams(main), kernels = Foreign)]
mod reaching {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
        pub lr: DeviceScalars<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        pub case: usize,
    }

    fn op(
        s: &CaptureStream<'_>,
        f: &Foreign,
        x: &mut DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
        lr: &DeviceScalars<f32>,
        case: usize,
    ) -> Result<()> {
        reach(s, f, x, y, lr, case)
    }
}

/// Memory and host state an op reaches besides its parameters, and buffers replaced
/// through them.
fn reach(
    s: &CaptureStream<'_>,
    f: &Foreign,
    x: &mut DeviceBuffer<f32>,
    y: &mut DeviceBuffer<f32>,
    lr: &DeviceScalars<f32>,
    case: usize,
) -> Result<()> {
    match case {
        // A buffer none of the step's, written.
        0 => s.memset_zeros(&mut *f.outside.lock().unwrap()),
        1 => {
            f.k.fill_affine(s, &mut *f.outside.lock().unwrap(), 0.0, 1.0)
        }
        // Two `&mut` buffers swapped.
        2 => {
            std::mem::swap(x, y);
            Ok(())
        }
        // A buffer assigned a new allocation through its `&mut`: the allocation itself is
        // refused (a host call), before the replacement.
        3 => {
            *x = f.device.alloc_zeros("new", N)?;
            Ok(())
        }
        // cudarc's slice through the safe accessor.
        4 => x.as_cuda_slice().map(drop),
        // A host value read: it would be frozen at capture time.
        5 => lr.get(0).map(drop),
        // The op's only work, on the program's own stream.
        6 => f
            .stream
            .memset_zeros(&mut *f.slice.lock().unwrap())
            .map_err(Error::driver("cudarc")),
        // A buffer none of the step's, in a pointer table the kernel writes through.
        8 => {
            let mut outside = f.outside.lock().unwrap();
            stepgraph::PtrTable::<4>::writes("table", &mut [&mut *outside]).map(drop)
        }
        // Writing the op's own parameters is fine; reading the outside buffer too.
        _ => {
            let outside = f.outside.lock().unwrap();
            s.copy(&*outside, x)?;
            s.memset_zeros(y)
        }
    }
}

#[test]
fn gpu_writes_outside_an_ops_buffers_and_swapped_buffers_are_refused_naming_the_op() {
    let device = device();
    let f = foreign(&device, 47);
    let mut rng = Rng::new(48);
    let build = |case: usize, rng: &mut Rng| {
        let buffers = reaching::Buffers {
            x: device.upload_new("x", &rng.vec(N, -1.0, 1.0)).unwrap(),
            y: device.upload_new("y", &rng.vec(N, -1.0, 1.0)).unwrap(),
            lr: DeviceScalars::new(&device, "lr", &[1e-3]).unwrap(),
        };
        reaching::Step::with_options(
            &device,
            f.clone(),
            buffers,
            reaching::Config { case },
            Options::default().with_verify(false),
        )
    };
    for case in [0, 1, 8] {
        let err = build(case, &mut rng).map(drop).unwrap_err();
        let found = err.errors().find_map(|e| match e {
            Error::UngrantedWrite { step, op, what, .. } => Some((*step, *op, what.clone())),
            _ => None,
        });
        let (step, op, what) = found.unwrap_or_else(|| panic!("case {case}: {}", err.chain()));
        assert_eq!((step, op), ("reaching", "op"), "case {case}");
        assert!(
            what == "memset" || what.contains("kernel `fill_affine`") || what == "table[0]",
            "case {case}: {what}"
        );
    }
    let err = build(2, &mut rng).map(drop).unwrap_err();
    assert!(
        err.errors().any(|e| matches!(
            e,
            Error::BufferReplaced {
                step: "reaching",
                op: "op",
                buffer: "x" | "y"
            }
        )),
        "{}",
        err.chain()
    );
    for (case, call) in [
        (3, "Device::alloc_zeros"),
        (4, "DeviceBuffer::as_cuda_slice"),
        (5, "DeviceScalars::get"),
    ] {
        let err = build(case, &mut rng).map(drop).unwrap_err();
        assert!(
            err.errors().any(|e| matches!(
                e,
                Error::HostCallInOp { step: "reaching", op: "op", call: c } if *c == call
            )),
            "case {case}: {}",
            err.chain()
        );
    }
    let err = build(6, &mut rng).map(drop).unwrap_err();
    let (step, op, call, _) = escape_in(&err).unwrap_or_else(|| panic!("{}", err.chain()));
    assert_eq!(
        (step, op, call.as_str()),
        ("reaching", "op", "cuMemsetD8Async")
    );
    // Reading memory outside the step and writing the op's own buffers is allowed.
    let mut step = build(7, &mut rng).unwrap();
    step.replay().unwrap();
    let want = device.download(&*f.outside.lock().unwrap()).unwrap();
    assert_eq!(step.download(|b| &b.x).unwrap(), want);
    assert!(step.download(|b| &b.y).unwrap().iter().all(|&v| v == 0.0));
}

/// The ranks of a data-parallel step capture on threads of their own at once: the guard's
/// one CUPTI subscription serves them all, each thread's calls are its own op's, and the
/// subscription is given back after and taken again by the next capture.
///
/// On one GPU, loading modules or freeing memory on one thread while another captures
/// invalidates the capture (the driver synchronises the device): the threads build their
/// steps one at a time, and only the captures run side by side (the ranks of a real
/// data-parallel step are on GPUs of their own).
#[test]
fn gpu_steps_captured_on_several_threads_at_once_share_the_guard() {
    const THREADS: usize = 4;
    let device = device();
    let f = foreign(&device, 50);
    let building = Mutex::new(());
    let captured = std::sync::Barrier::new(THREADS);
    let mut want = vec![0.0f32; N];
    stepgraph_kernels::reference::fill_affine_reference(&mut want, 0.5, 1e-3);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (device, f, want) = (&device, &f, &want);
            let (building, captured) = (&building, &captured);
            scope.spawn(move || {
                let mut step = {
                    let _one_at_a_time = building.lock().unwrap();
                    let mut rng = Rng::new(60 + t as u64);
                    escaping::Step::new(
                        device,
                        f.clone(),
                        buffers(device, &mut rng),
                        escaping::Config { case: CASES.len() },
                    )
                    .unwrap()
                };
                captured.wait();
                for _ in 0..5 {
                    // Captured again, then verified (a capture too), then replayed.
                    step.rebind(|_| ()).unwrap();
                    step.verify().unwrap();
                    step.replay().unwrap();
                }
                assert_eq!(&step.download(|b| &b.y).unwrap(), want);
                // Freed one at a time, after every thread's captures.
                captured.wait();
                let _one_at_a_time = building.lock().unwrap();
                drop(step);
            });
        }
    });
    let mut rng = Rng::new(70);
    // After them, a capture takes the subscription again: an escape is still refused, and
    // a one-stream baseline captures as usual.
    let err = escaping::Step::new(
        &device,
        f.clone(),
        buffers(&device, &mut rng),
        escaping::Config { case: 0 },
    )
    .map(drop)
    .unwrap_err();
    assert!(escape_in(&err).is_some(), "{}", err.chain());
    let mut step = escaping::Step::with_schedule(
        &device,
        f,
        buffers(&device, &mut rng),
        escaping::Config { case: CASES.len() },
        Schedule::OneStream,
    )
    .unwrap();
    step.replay().unwrap();
    step.wait().unwrap();
}
