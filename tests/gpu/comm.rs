//! GPU tests of collectives inside a captured step: a one-rank NCCL communicator (the
//! only world one GPU allows: NCCL refuses two ranks on one device), its all-reduces on a
//! communication stream captured into the graph, replayed and checked against the CPU
//! and against the same step with no NCCL at all.

use stepgraph::{CaptureStream, CommId, Communicator, Device, DeviceBuffer, Result, Schedule};
use stepgraph_kernels::Kernels;

use super::{Rng, device, kernels, max_err};

const LEN: usize = 1 << 16;

/// Two heads write gradient buckets on two streams; each bucket is all-reduced on the
/// `comm` stream right after its head, and an update reads both.
#[stepgraph::step(streams(main, aux, comm), kernels = Kernels)]
mod data_parallel {
    use super::*;
    use stepgraph::ReduceOp;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
        pub grad_a: DeviceBuffer<f32>,
        pub grad_b: DeviceBuffer<f32>,
        pub comm: Communicator,
        pub update: DeviceBuffer<f32>,
    }

    #[stream(aux)]
    fn head_a(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        grad_a: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(x, grad_a)?;
        k.chain_step(s, grad_a, 64, 0.999, 0.001)
    }

    fn head_b(
        s: &CaptureStream<'_>,
        k: &Kernels,
        x: &DeviceBuffer<f32>,
        grad_b: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(x, grad_b)?;
        k.axpby(s, x, grad_b, 2.0, -0.5)
    }

    #[stream(comm)]
    #[join(aux)]
    fn reduce_a(
        s: &CaptureStream<'_>,
        comm: &mut Communicator,
        grad_a: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.all_reduce(comm, &mut [grad_a], ReduceOp::Avg)
    }

    #[stream(comm)]
    #[join(main)]
    fn reduce_b(
        s: &CaptureStream<'_>,
        comm: &mut Communicator,
        grad_b: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.all_reduce(comm, &mut [grad_b], ReduceOp::Sum)
    }

    fn apply(
        s: &CaptureStream<'_>,
        k: &Kernels,
        grad_a: &DeviceBuffer<f32>,
        grad_b: &DeviceBuffer<f32>,
        update: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        s.copy(grad_a, update)?;
        k.axpby(s, grad_b, update, 1.0, 1.0)
    }
}

fn buffers(device: &Device, x: &[f32], comm: Communicator) -> data_parallel::Buffers {
    // Poisoned: an element the step does not write fails the comparison.
    let nan = vec![f32::NAN; LEN];
    let up = |what, data: &[f32]| device.upload_new(what, data).unwrap();
    data_parallel::Buffers {
        x: up("x", x),
        grad_a: up("grad_a", &nan),
        grad_b: up("grad_b", &nan),
        comm,
        update: up("update", &nan),
    }
}

/// What one rank computes: an all-reduce over one rank is the identity.
fn reference(x: &[f32]) -> Vec<f32> {
    let mut a = x.to_vec();
    stepgraph_kernels::reference::chain_step_reference(&mut a, 64, 0.999, 0.001);
    let mut b = x.to_vec();
    stepgraph_kernels::reference::axpby_reference(x, &mut b, 2.0, -0.5);
    a.iter().zip(&b).map(|(a, b)| a + b).collect()
}

#[test]
fn gpu_one_rank_all_reduce_is_captured_replayed_and_verified() {
    let device = device();
    let k = kernels(&device);
    println!("NCCL version {}", Communicator::nccl_version().unwrap());
    let mut rng = Rng::new(21);
    let x = rng.vec(LEN, -1.0, 1.0);
    let comm = Communicator::join(&device, CommId::new().unwrap(), 0, 1).unwrap();
    assert!(comm.uses_nccl() && comm.world() == 1);
    let mut nccl = data_parallel::Step::new(
        &device,
        k.clone(),
        buffers(&device, &x, comm),
        data_parallel::Config {},
    )
    .unwrap();
    let mut plain = data_parallel::Step::with_schedule(
        &device,
        k,
        buffers(&device, &x, Communicator::single()),
        data_parallel::Config {},
        Schedule::OneStream,
    )
    .unwrap();
    // The capture with NCCL inside is read back and checked against the plan.
    println!("{}", nccl.verify().unwrap());
    println!(
        "graph with NCCL: {:?}",
        nccl.executor().node_counts().unwrap()
    );
    println!(
        "graph without: {:?}",
        plain.executor().node_counts().unwrap()
    );
    for round in 0..3 {
        let x = rng.vec(LEN, -1.0, 1.0);
        nccl.upload(|b| &b.x, &x).unwrap();
        plain.upload(|b| &b.x, &x).unwrap();
        nccl.replay().unwrap();
        plain.replay().unwrap();
        let got = nccl.download(|b| &b.update).unwrap();
        let want = plain.download(|b| &b.update).unwrap();
        assert_eq!(
            got, want,
            "round {round}: NCCL step differs from the step without it"
        );
        let err = max_err(&got, &reference(&x), 1e-3);
        assert!(
            err < 1e-5,
            "round {round}: relative error {err} against the CPU"
        );
    }
}

#[test]
fn gpu_a_rank_outside_its_world_is_refused() {
    let device = device();
    let err = Communicator::join(&device, CommId::new().unwrap(), 1, 1).unwrap_err();
    assert!(err.to_string().contains("found rank 1 of world 1"), "{err}");
}

/// A communicator the macro cannot see as one (inside a component of the op's own): an
/// all-reduce in an `#[every]` op is refused when the step is built, naming the op.
#[derive(stepgraph::StepBuffer)]
pub struct Reduced {
    pub comm: Communicator,
    pub bucket: DeviceBuffer<f32>,
}

#[stepgraph::step(streams(main))]
mod reduce_every {
    use super::*;
    use stepgraph::ReduceOp;

    #[buffers]
    pub struct Buffers {
        pub grads: Reduced,
    }

    #[every(4)]
    fn reduce(s: &CaptureStream<'_>, grads: &mut Reduced) -> Result<()> {
        let Reduced { comm, bucket } = grads;
        s.all_reduce(comm, &mut [bucket], ReduceOp::Sum)
    }
}

#[test]
fn gpu_an_all_reduce_in_a_conditional_op_is_refused_naming_the_op() {
    let device = device();
    let buffers = reduce_every::Buffers {
        grads: Reduced {
            comm: Communicator::single(),
            bucket: device.upload_new("bucket", &[1.0f32; 64]).unwrap(),
        },
    };
    let err = reduce_every::Step::new(&device, (), buffers, reduce_every::Config {})
        .map(drop)
        .unwrap_err();
    let msg = err.chain();
    assert!(msg.contains("op `reduce` on stream `main` failed"), "{msg}");
    assert!(msg.contains("inside an #[every] or #[when] op"), "{msg}");
    assert!(
        err.errors()
            .any(|e| matches!(e, stepgraph::Error::InConditional { .. })),
        "{err:?}"
    );
}
