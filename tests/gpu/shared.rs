//! GPU tests of buffers that several steps share (`#[shared]`, `Shared<T>`): an act step
//! reads the parameters that an update step writes, each its own graph on its own
//! streams. The update is long (many kernels in a row), so an act launched right after
//! it without the order `Shared` keeps would read half-updated parameters; the act must
//! see exactly the update's result. Misuse is refused with errors that name both steps.

use stepgraph::{CaptureStream, DeviceBuffer, Error, Result, Shared};
use stepgraph_kernels::Kernels;
use stepgraph_kernels::reference::axpby_reference;
use stepgraph_testkit::Rng;

use super::{device, kernels};

const N: usize = 1 << 16;
/// Kernels in one update: long enough that an unordered act would overtake it.
const UPDATE_KERNELS: usize = 64;

#[stepgraph::step(streams(main), kernels = Kernels)]
mod act {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[shared]
        pub params: Shared<DeviceBuffer<f32>>,
        pub actions: DeviceBuffer<f32>,
    }

    /// A policy's stand-in: `actions = params`.
    fn act(
        s: &CaptureStream<'_>,
        params: &DeviceBuffer<f32>,
        actions: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(params, actions)
    }
}

#[stepgraph::step(streams(main, side), kernels = Kernels)]
mod update {
    use super::*;

    #[buffers]
    pub struct Buffers {
        #[shared]
        pub params: Shared<DeviceBuffer<f32>>,
        pub grad: DeviceBuffer<f32>,
        pub other: DeviceBuffer<f32>,
    }

    /// An optimiser's stand-in: `params = 0.5 params + grad`, many times over.
    fn sgd(
        s: &CaptureStream<'_>,
        k: &Kernels,
        grad: &DeviceBuffer<f32>,
        params: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        for _ in 0..UPDATE_KERNELS {
            k.axpby(s, grad, params, 1.0, 0.5)?;
        }
        Ok(())
    }

    /// Unrelated work on a side stream, so that the step forks and joins.
    #[stream(side)]
    fn other(
        s: &CaptureStream<'_>,
        k: &Kernels,
        grad: &DeviceBuffer<f32>,
        other: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.axpby(s, grad, other, 1.0, 1.0)
    }
}

/// Fails naming how many elements differ and the first, not printing 65,536 of them.
fn same(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let wrong: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&i) = wrong.first() {
        panic!(
            "{what}: {} of {} elements differ; the first, [{i}], is {} where {} was expected",
            wrong.len(),
            got.len(),
            got[i],
            want[i]
        );
    }
}

fn updated(params: &[f32], grad: &[f32]) -> Vec<f32> {
    let mut p = params.to_vec();
    for _ in 0..UPDATE_KERNELS {
        axpby_reference(grad, &mut p, 1.0, 0.5);
    }
    p
}

struct Pair {
    params: Shared<DeviceBuffer<f32>>,
    act: act::Step,
    update: update::Step,
    p0: Vec<f32>,
    grad: Vec<f32>,
}

fn pair(seed: u64) -> Result<Pair> {
    let device = device();
    let k = kernels(&device);
    let mut rng = Rng::new(seed);
    let (p0, grad) = (rng.vec(N, -1.0, 1.0), rng.vec(N, -1.0, 1.0));
    let params = Shared::new("params", device.upload_new("params", &p0)?);
    let act = act::Step::new(
        &device,
        k.clone(),
        act::Buffers {
            params: params.clone(),
            actions: device.upload_new("actions", &rng.vec(N, -1.0, 1.0))?,
        },
        act::Config {},
    )?;
    let update = update::Step::new(
        &device,
        k,
        update::Buffers {
            params: params.clone(),
            grad: device.upload_new("grad", &grad)?,
            other: device.upload_new("other", &rng.vec(N, -1.0, 1.0))?,
        },
        update::Config {},
    )?;
    Ok(Pair {
        params,
        act,
        update,
        p0,
        grad,
    })
}

#[test]
fn an_update_is_seen_by_the_next_act_and_not_by_the_one_before() -> Result<()> {
    let Pair {
        params,
        mut act,
        mut update,
        p0,
        grad,
    } = pair(11)?;
    let p1 = updated(&p0, &grad);
    let p2 = updated(&p1, &grad);
    // No host wait between the launches: only the shared buffer orders them.
    act.replay()?;
    update.replay()?;
    act.replay()?;
    update.replay()?;
    act.wait()?;
    same(
        "the second act sees the first update whole",
        &act.download(|b| &b.actions)?,
        &p1,
    );
    // The second update ran after the second act (its waits), and the host's hold waits
    // for it.
    let device = act.executor().device().clone();
    same(
        "the host sees both updates",
        &device.download(&*params.host()?)?,
        &p2,
    );
    // Many rounds, each act after its update, in a device loop on each side.
    let mut want = p2;
    for round in 0..4u32 {
        update.replay_loop(round + 1)?;
        for _ in 0..=round {
            want = updated(&want, &grad);
        }
        act.replay_loop(2)?;
    }
    act.wait()?;
    same(
        "each act loop sees the update loop before it",
        &act.download(|b| &b.actions)?,
        &want,
    );
    Ok(())
}

#[test]
fn a_step_refuses_memory_another_steps_rebind_replaced_naming_both() -> Result<()> {
    let Pair {
        params,
        mut act,
        mut update,
        grad,
        ..
    } = pair(12)?;
    let device = act.executor().device().clone();
    let mut rng = Rng::new(13);
    let fresh = rng.vec(N, -1.0, 1.0);
    let new_memory = device.upload_new("params 2", &fresh)?;
    update.rebind(|b| -> Result<()> {
        *b.params.host()? = new_memory;
        Ok(())
    })??;
    let e = act.replay().expect_err("act captured the old memory");
    match &e {
        Error::SharedRebound {
            step, buffer, by, ..
        } => assert_eq!(
            (*step, buffer.as_str(), *by),
            ("act", "params", Some("update"))
        ),
        other => panic!("expected SharedRebound, found {other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.contains("`act`") && text.contains("`update`"),
        "{text}"
    );
    // Captured again, it runs on the new memory, after the update.
    act.recapture()?;
    update.replay()?;
    act.replay()?;
    act.wait()?;
    same(
        "act on the new memory, after the update",
        &act.download(|b| &b.actions)?,
        &updated(&fresh, &grad),
    );
    drop(params);
    Ok(())
}

#[test]
fn a_step_is_refused_while_the_host_holds_its_shared_buffer() -> Result<()> {
    let Pair {
        params, mut act, ..
    } = pair(14)?;
    let held = params.host()?;
    let e = act.replay().expect_err("the host holds the parameters");
    assert!(
        matches!(
            e,
            Error::SharedBusy {
                step: "act",
                holder: "the host",
                ..
            }
        ),
        "{e:?}"
    );
    drop(held);
    act.replay()?;
    act.wait()?;
    Ok(())
}
