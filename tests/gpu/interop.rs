//! GPU tests of the way down to cudarc: a device over an existing context, buffers from
//! and into `CudaSlice`s, an op's stream as cudarc's, and what the checks say when cudarc
//! code inside an op issues work off the graph or breaks the capture.

use std::sync::Arc;

use stepgraph::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use stepgraph::exec::WORKSPACE_BYTES;
use stepgraph::{CaptureStream, Device, DeviceBuffer, Error, Options, Result};
use stepgraph_testkit::Rng;

use super::run_one_op;

/// A context of the program's own, with event tracking off as a step requires.
fn own_context() -> Arc<CudaContext> {
    let ctx = CudaContext::new(0).expect("these tests need a CUDA GPU");
    // SAFETY: these tests order their streams themselves: every transfer is synchronised
    // before its result is read, and a step orders its own work.
    unsafe { ctx.disable_event_tracking() };
    ctx
}

#[test]
fn gpu_a_device_over_a_programs_context_takes_its_slices_both_ways() -> Result<()> {
    // With tracking on, refused, saying why.
    let tracking = CudaContext::new(0).map_err(Error::driver("cuCtxCreate"))?;
    let e = Device::from_context(tracking.clone()).unwrap_err();
    assert!(matches!(e, Error::Interop { .. }), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("tracks events") && e.contains("disable_event_tracking"),
        "{e}"
    );
    let theirs: CudaSlice<f32> = tracking
        .default_stream()
        .clone_htod(&[1.0f32; 8])
        .map_err(Error::driver("cuMemcpyHtoD"))?;

    let ctx = own_context();
    let device = Device::from_context(ctx.clone())?;
    assert!(Arc::ptr_eq(device.context(), &ctx));
    // A slice of a context value that tracks events would break a capture: refused.
    let e = DeviceBuffer::from_cuda_slice(&device, theirs).unwrap_err();
    assert!(matches!(e, Error::Interop { .. }), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("tracks events"), "{e}");

    let mut rng = Rng::new(71);
    let data = rng.vec_nonzero(777, -1.0, 1.0);
    let stream = ctx.new_stream().map_err(Error::driver("cuStreamCreate"))?;
    let mine = stream
        .clone_htod(&data)
        .map_err(Error::driver("cuMemcpyHtoD"))?;
    stream
        .synchronize()
        .map_err(Error::driver("cuStreamSynchronize"))?;
    let src = DeviceBuffer::from_cuda_slice(&device, mine)?;
    let mut dst = device.alloc_zeros::<f32>("dst", 777)?;
    run_one_op(&device, |s| s.copy(&src, &mut dst))?;
    // Back to cudarc: the same memory, read with cudarc's own copy.
    let back: CudaSlice<f32> = dst.into_cuda_slice();
    let read = stream
        .clone_dtoh(&back)
        .map_err(Error::driver("cuMemcpyDtoH"))?;
    assert_eq!(read, data);
    // And a CudaSlice goes wherever a buffer does: a download, a copy source.
    assert_eq!(device.download(src.as_cuda_slice()?)?, data);
    Ok(())
}

/// What an op can reach besides its buffers: a stream of the program's own.
#[derive(Debug)]
pub struct Own {
    stream: Arc<CudaStream>,
}

#[stepgraph::step(streams(main, side), kernels = Own)]
mod through_cudarc {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub y: CudaSlice<f32>,
    }

    #[config]
    #[derive(Clone, Copy)]
    pub struct Config {
        /// 0: on the op's stream; 1: on the program's own stream; 2: a synchronisation of
        /// the op's stream, its error ignored.
        pub how: u32,
    }

    fn zero_x(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        s.memset_zeros(x)
    }

    #[stream(side)]
    fn zero_y(s: &CaptureStream<'_>, own: &Own, y: &mut CudaSlice<f32>, how: u32) -> Result<()> {
        // SAFETY: case 0 issues one memset of `y` on the op's stream; cases 1 and 2 break
        // the contract on purpose, for the checks to find.
        let Some(stream) = (unsafe { s.cuda_stream() }) else {
            return Ok(());
        };
        match how {
            0 => stream.memset_zeros(y).map_err(Error::driver("memset")),
            1 => own.stream.memset_zeros(y).map_err(Error::driver("memset")),
            _ => {
                let _ignored = stream.synchronize();
                Ok(())
            }
        }
    }
}

fn build(how: u32, verify: bool) -> Result<(Device, Result<through_cudarc::Step>)> {
    build_guarded(how, verify, true)
}

fn build_guarded(
    how: u32,
    verify: bool,
    guard: bool,
) -> Result<(Device, Result<through_cudarc::Step>)> {
    let ctx = own_context();
    let device = Device::from_context(ctx.clone())?;
    let own = Own {
        stream: ctx.new_stream().map_err(Error::driver("cuStreamCreate"))?,
    };
    let mut rng = Rng::new(72 + u64::from(how));
    let y = own
        .stream
        .clone_htod(&rng.vec_nonzero(512, 1.0, 2.0))
        .map_err(Error::driver("cuMemcpyHtoD"))?;
    own.stream
        .synchronize()
        .map_err(Error::driver("cuStreamSynchronize"))?;
    let buffers = through_cudarc::Buffers {
        x: device.upload_new("x", &rng.vec_nonzero(512, 1.0, 2.0))?,
        y,
    };
    let options = Options::from_env()?
        .with_verify(verify)
        .with_capture_guard(guard);
    let step = through_cudarc::Step::with_options(
        &device,
        own,
        buffers,
        through_cudarc::Config { how },
        options,
    );
    Ok((device, step))
}

#[test]
fn gpu_cudarc_work_on_the_ops_stream_is_captured_and_verified() -> Result<()> {
    let (device, step) = build(0, true)?;
    let mut step = step?;
    let report = step.verify()?;
    assert_eq!(report.ops, 2);
    step.replay()?;
    assert!(step.download(|b| &b.y)?.iter().all(|&v| v == 0.0));
    // An op's stream's cuBLASLt workspace and handle, for existing cuBLASLt calls.
    let seen = std::cell::Cell::new((0, 0, false));
    run_one_op(&device, |s| {
        let blas = s.blas();
        let (ptr, bytes) = blas.workspace();
        seen.set((ptr, bytes, !blas.cublaslt_handle().is_null()));
        Ok(())
    })?;
    let (ptr, bytes, handle) = seen.get();
    assert!(
        ptr != 0 && ptr % 256 == 0 && bytes == WORKSPACE_BYTES && handle,
        "{ptr:#x} {bytes}"
    );
    Ok(())
}

#[test]
fn gpu_work_on_a_programs_own_stream_inside_an_op_is_refused_naming_the_op() -> Result<()> {
    // The capture guard sees the memset on the program's stream, in every build.
    let (_device, step) = build(1, false)?;
    let msg = step.map(drop).unwrap_err().chain();
    assert!(
        msg.contains("op `zero_y` of step `through_cudarc` called `cuMemsetD8Async` on stream"),
        "{msg}"
    );
    assert!(msg.contains("never in a replay"), "{msg}");
    // Without the guard (as under a profiler), the work goes unnoticed at capture: it ran
    // once, eagerly. Verification still finds the op that put nothing into the graph.
    let (_device, step) = build_guarded(1, false, false)?;
    let mut step = step?;
    let e = step.verify().unwrap_err();
    let msg = e.chain();
    assert!(
        msg.contains("op `zero_y` (stream `side`) put no work into the captured graph"),
        "{msg}"
    );
    assert!(msg.contains("never in a replay"), "{msg}");
    Ok(())
}

#[test]
fn gpu_a_capture_broken_by_cudarc_code_inside_an_op_names_the_op() -> Result<()> {
    let (device, step) = build(2, false)?;
    let msg = step.map(drop).unwrap_err().chain();
    assert!(msg.contains("op `zero_y` on stream `side` failed"), "{msg}");
    assert!(msg.contains("called `cuStreamSynchronize`"), "{msg}");
    // Without the guard, the broken capture is found after the op.
    let (device2, step) = build_guarded(2, false, false)?;
    let msg = step.map(drop).unwrap_err().chain();
    assert!(msg.contains("capture invalidated"), "{msg}");
    // Either way the device is still usable.
    for device in [device, device2] {
        let mut x = device.upload_new("x", &[1.0f32; 16])?;
        run_one_op(&device, |s| s.memset_zeros(&mut x))?;
        assert_eq!(device.download(&x)?, [0.0; 16]);
    }
    Ok(())
}
