//! GPU tests of host inputs and outputs: a fresh host batch every replay through the
//! double-buffered staging slots, values read back a replay or more late, and the slot a
//! replay is still reading never handed to the host.

use stepgraph::{CaptureStream, DeviceBuffer, HostInput, HostOutput, MAX_IN_FLIGHT, Result};
use stepgraph_kernels::Kernels;
use stepgraph_kernels::reference::chain_step_reference;
use stepgraph_testkit::Rng;

use super::{device, kernels};

const N: usize = 4096;
/// chain_step iterations of the transform: a little work between the copies.
const ITERS: u32 = 8;

#[stepgraph::step(streams(main, side), kernels = Kernels)]
mod feed {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub batch_in: HostInput<f32>,
        pub x: DeviceBuffer<f32>,
        pub y: DeviceBuffer<f32>,
        pub y_out: HostOutput<f32>,
        pub sum: DeviceBuffer<f32>,
        pub sum_out: HostOutput<f32>,
    }

    /// The batch, from the slot the host filled last.
    fn load(
        s: &CaptureStream<'_>,
        batch_in: &HostInput<f32>,
        x: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.stage(batch_in, x)
    }

    /// y = chain_step(x), on another stream.
    #[stream(side)]
    fn transform(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(x, y)?;
        k.chain_step(s, y, ITERS, 0.999, 0.001)
    }

    /// sum += x: every replay's batch adds in.
    fn accumulate(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        sum: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.axpby(s, x, sum, 1.0, 1.0)
    }

    #[join(side)]
    fn report(
        s: &CaptureStream<'_>,
        y: &DeviceBuffer<f32>,
        y_out: &mut HostOutput<f32>,
        sum: &DeviceBuffer<f32>,
        sum_out: &mut HostOutput<f32>,
    ) -> Result<()> {
        s.read_back(y, y_out)?;
        s.read_back(sum, sum_out)
    }
}

fn build() -> Result<feed::Step> {
    let device = device();
    let buffers = feed::Buffers {
        batch_in: HostInput::new(&device, "batch_in", N)?,
        x: device.alloc_zeros("x", N)?,
        y: device.alloc_zeros("y", N)?,
        y_out: HostOutput::new(&device, "y_out", N)?,
        sum: device.alloc_zeros("sum", N)?,
        sum_out: HostOutput::new(&device, "sum_out", N)?,
    };
    feed::Step::new(&device, kernels(&device), buffers, feed::Config {})
}

fn transformed(batch: &[f32]) -> Vec<f32> {
    let mut y = batch.to_vec();
    chain_step_reference(&mut y, ITERS, 0.999, 0.001);
    y
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn gpu_every_replay_copies_its_own_host_batch_and_reads_back_late() -> Result<()> {
    let mut step = build()?;
    let report = step.verify()?;
    assert_eq!(report.ops, 4);
    let mut rng = Rng::new(91);
    // batches[r] is replay r's (1-based; the verify above captured, it did not replay).
    let mut batches: Vec<Vec<f32>> = vec![Vec::new()];
    let mut checked = Vec::new();
    let replays = 64u64;
    for t in 1..=replays {
        let batch = rng.vec_nonzero(N, -1.0, 1.0);
        step.fill(|b| &b.batch_in, |slot| slot.copy_from_slice(&batch))?;
        batches.push(batch);
        step.replay()?;
        assert_eq!(step.executor().replays_launched(), t);
        // No wait: whatever replay finished last, its values are its own batch's.
        if let Some(y) = step.read_back(|b| &b.y_out)? {
            let r = y.replay();
            assert!(
                r <= t && r + MAX_IN_FLIGHT >= t,
                "read back replay {r} at {t}"
            );
            assert_eq!(
                bits(&y),
                bits(&transformed(&batches[r as usize])),
                "replay {r}"
            );
            checked.push(r);
        }
    }
    let y = step.read_back_latest(|b| &b.y_out)?;
    assert_eq!(y.replay(), replays);
    assert_eq!(bits(&y), bits(&transformed(&batches[replays as usize])));
    // The sum saw every batch once, in order (f32 additions in replay order).
    let mut sum = vec![0.0f32; N];
    for batch in &batches[1..] {
        for (s, x) in sum.iter_mut().zip(batch) {
            *s += *x;
        }
    }
    let got = step.read_back_latest(|b| &b.sum_out)?;
    assert_eq!(bits(&got), bits(&sum), "the sum of all {replays} batches");
    // Batches differ, so a stale slot would have shown above; and the host did read
    // back while replays ran, at least for most of them.
    assert!(
        checked.len() as u64 >= replays / 2,
        "read back only {checked:?}"
    );
    Ok(())
}

#[stepgraph::step(streams(main), kernels = Kernels)]
mod slow_feed {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub spin: DeviceBuffer<f32>,
        pub batch_in: HostInput<f32>,
        pub x: DeviceBuffer<f32>,
        pub sum: DeviceBuffer<f32>,
        pub sum_out: HostOutput<f32>,
    }

    /// Long work before the copy, so that the copy of the slot happens well after the
    /// replay is launched: a host write to that slot before then would be seen.
    fn spin(s: &CaptureStream<'_>, k: &Kernels, spin: &mut DeviceBuffer<f32>) -> Result<()> {
        k.chain_step(s, spin, 400_000, 0.999, 0.001)
    }

    fn load(
        s: &CaptureStream<'_>,
        batch_in: &HostInput<f32>,
        x: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.stage(batch_in, x)
    }

    fn accumulate(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        sum: &mut DeviceBuffer<f32>,
        sum_out: &mut HostOutput<f32>,
    ) -> Result<()> {
        k.axpby(s, x, sum, 1.0, 1.0)?;
        s.read_back(sum, sum_out)
    }
}

#[test]
fn gpu_a_slot_that_a_replay_still_reads_is_never_handed_to_the_host() -> Result<()> {
    let device = device();
    let buffers = slow_feed::Buffers {
        spin: device.upload_new("spin", &vec![0.5f32; 64 * 1024])?,
        batch_in: HostInput::new(&device, "batch_in", N)?,
        x: device.alloc_zeros("x", N)?,
        sum: device.alloc_zeros("sum", N)?,
        sum_out: HostOutput::new(&device, "sum_out", N)?,
    };
    let mut step = slow_feed::Step::new(&device, kernels(&device), buffers, slow_feed::Config {})?;
    let mut rng = Rng::new(92);
    let batches: Vec<Vec<f32>> = (0..6).map(|_| rng.vec_nonzero(N, -1.0, 1.0)).collect();
    // Fill and replay back to back: each replay spins for milliseconds before it copies
    // its slot, so the third fill (slot 0 again) comes long before replay 1 reads slot 0
    // unless it waits for it.
    let mut waited = Vec::new();
    for batch in &batches {
        let t0 = std::time::Instant::now();
        step.stage(|b| &b.batch_in, batch)?;
        waited.push(t0.elapsed().as_secs_f64() * 1e3);
        step.replay()?;
    }
    let mut sum = vec![0.0f32; N];
    for batch in &batches {
        for (s, x) in sum.iter_mut().zip(batch) {
            *s += *x;
        }
    }
    let got = step.read_back_latest(|b| &b.sum_out)?;
    assert_eq!(got.replay(), batches.len() as u64);
    assert_eq!(bits(&got), bits(&sum), "every replay copied its own batch");
    println!("milliseconds each fill waited: {waited:.2?}");
    Ok(())
}

#[test]
fn gpu_host_rings_refuse_what_they_cannot_do() -> Result<()> {
    let device = device();
    let mut step = build()?;
    let msg = step
        .stage(|b| &b.batch_in, &[1.0; 3])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("the data staged into `batch_in`")
            && msg.contains("4096")
            && msg.contains('3'),
        "{msg}"
    );
    // Nothing replayed yet: no read-back, and the latest one is refused with the reason.
    assert!(step.read_back(|b| &b.y_out)?.is_none());
    let e = step.read_back_latest(|b| &b.y_out).unwrap_err();
    assert!(
        matches!(&e, stepgraph::Error::HostIo { buffer, .. } if buffer == "y_out"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("has not been written yet"), "{msg}");
    // A host input belongs to the step whose graph copies it: moved into another step,
    // its capture is refused by name.
    let fresh = HostInput::new(&device, "fresh", N)?;
    let taken = step.rebind(|b| std::mem::replace(&mut b.batch_in, fresh))?;
    let mut other = build()?;
    let e = other.rebind(|b| b.batch_in = taken).unwrap_err();
    let msg = e.chain();
    assert!(
        msg.contains("`batch_in` is copied by the graph of another step"),
        "{msg}"
    );
    assert!(
        e.errors()
            .any(|e| matches!(e, stepgraph::Error::HostIo { buffer, .. } if buffer == "batch_in")),
        "{e:?}"
    );
    Ok(())
}
