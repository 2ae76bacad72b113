//! The "after" of the migration: the trainer's step as a stepgraph step, its existing
//! functions wrapped as ops, unchanged, with the IQN head on a stream of its own and the
//! attention head on another.
//!
//! What the migration took, besides this file (`MIGRATION.diff` is all of it):
//! - `stepgraph` as a dependency;
//! - `#[derive(stepgraph::StepBuffer)]` on the trainer's structs of `CudaSlice`s in
//!   [`model`](crate::model), so that they are the step's buffers as they are (a
//!   `CudaSlice` is a step buffer, and so is a struct of step buffers);
//! - nothing else: no function of [`model`](crate::model), [`lt`](crate::lt) or
//!   [`kernels`](crate::kernels) changed. Each op hands its stream and that stream's
//!   cuBLASLt workspace to the existing function through the overrides it already has
//!   ([`CaptureStream::cuda_stream`], [`Blas::workspace`](stepgraph::Blas::workspace)).
//!
//! The planner reads the ops' signatures: both heads read the trunk's activations, each
//! writes only its own, so each head waits once for the trunk and the origin stream joins
//! both at the end. Each stream has its own cuBLASLt workspace, so the heads never share
//! one; the graph is the before's, with the heads side by side.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use stepgraph::{CaptureStream, Device, Options, Schedule};

use crate::before::{LEARNING_RATE, State};
use crate::kernels::Kernels;
use crate::lt::Lt;
use crate::model::Dims;

/// What the ops use besides buffers: the trainer's cuBLASLt wrapper and kernels, loaded
/// once, as the before's trainer holds them.
#[derive(Debug)]
pub struct Existing {
    /// The cuBLASLt wrapper; only its plans are used (every call passes a stream and a
    /// workspace).
    pub lt: Lt,
    /// The trainer's kernels.
    pub kernels: Kernels,
}

/// Runs an existing function inside an op, with the op's stream and that stream's
/// cuBLASLt workspace as its overrides; in the dry pass (no stream) it is not called.
fn existing(
    s: &CaptureStream<'_>,
    f: impl FnOnce(&Arc<CudaStream>, (u64, usize)) -> crate::Result<()>,
) -> stepgraph::Result<()> {
    // SAFETY: the trainer's functions issue only kernels and cuBLASLt matmuls, on the
    // stream they are given, into the buffers they are given (model's docs): no
    // synchronisation, allocation or host copy. Each op gives them exactly the buffers its
    // signature names, with the access it states.
    match unsafe { s.cuda_stream() } {
        Some(stream) => f(stream, s.blas().workspace()).map_err(stepgraph::Error::external),
        None => Ok(()),
    }
}

/// The step: the trunk on `main`, each head with its update on a stream of its own.
#[stepgraph::step(streams(main, iqn, attn), kernels = Existing)]
pub mod step {
    use cudarc::driver::CudaSlice;
    use stepgraph::{CaptureStream, Result};

    use super::{Existing, existing};
    use crate::model::{
        self, AttnActs, AttnData, AttnParams, Dims, IqnActs, IqnData, IqnParams, Linear, TrunkActs,
        TrunkParams,
    };

    /// The before's [`State`](crate::before::State), field by field: the planner orders
    /// the ops by which of them each reads and writes.
    #[buffers]
    #[derive(Debug)]
    pub struct Buffers {
        pub x: CudaSlice<f32>,
        pub trunk: TrunkParams,
        pub trunk_acts: TrunkActs,
        pub iqn: IqnParams,
        pub iqn_data: IqnData,
        pub iqn_acts: IqnActs,
        pub iqn_grad: Linear,
        pub attn: AttnParams,
        pub attn_data: AttnData,
        pub attn_acts: AttnActs,
        pub attn_grad: Linear,
    }

    #[config]
    #[derive(Clone, Copy, Debug)]
    pub struct Config {
        pub dims: Dims,
        pub lr: f32,
    }

    fn trunk_fwd(
        s: &CaptureStream<'_>,
        e: &Existing,
        x: &CudaSlice<f32>,
        trunk: &TrunkParams,
        trunk_acts: &mut TrunkActs,
        dims: Dims,
    ) -> Result<()> {
        existing(s, |stream, ws| {
            model::trunk_forward(
                &e.lt,
                &e.kernels,
                Some(stream),
                Some(ws),
                &dims,
                x,
                trunk,
                trunk_acts,
            )
        })
    }

    #[stream(iqn)]
    fn iqn_fwd(
        s: &CaptureStream<'_>,
        e: &Existing,
        trunk_acts: &TrunkActs,
        iqn: &IqnParams,
        iqn_data: &IqnData,
        iqn_acts: &mut IqnActs,
        dims: Dims,
    ) -> Result<()> {
        existing(s, |stream, ws| {
            let h = &trunk_acts.h;
            model::iqn_head(
                &e.lt,
                &e.kernels,
                Some(stream),
                Some(ws),
                &dims,
                h,
                iqn,
                iqn_data,
                iqn_acts,
            )
        })
    }

    #[stream(iqn)]
    fn iqn_sgd(
        s: &CaptureStream<'_>,
        e: &Existing,
        iqn_acts: &IqnActs,
        iqn: &mut IqnParams,
        iqn_grad: &mut Linear,
        dims: Dims,
        lr: f32,
    ) -> Result<()> {
        existing(s, |stream, ws| {
            let out = &mut iqn.out;
            model::iqn_update(
                &e.lt,
                &e.kernels,
                Some(stream),
                Some(ws),
                &dims,
                lr,
                iqn_acts,
                out,
                iqn_grad,
            )
        })
    }

    #[stream(attn)]
    fn attn_fwd(
        s: &CaptureStream<'_>,
        e: &Existing,
        trunk_acts: &TrunkActs,
        attn: &AttnParams,
        attn_data: &AttnData,
        attn_acts: &mut AttnActs,
        dims: Dims,
    ) -> Result<()> {
        existing(s, |stream, ws| {
            let h = &trunk_acts.h;
            model::attention_head(
                &e.lt,
                &e.kernels,
                Some(stream),
                Some(ws),
                &dims,
                h,
                attn,
                attn_data,
                attn_acts,
            )
        })
    }

    #[stream(attn)]
    fn attn_sgd(
        s: &CaptureStream<'_>,
        e: &Existing,
        attn_acts: &AttnActs,
        attn: &mut AttnParams,
        attn_grad: &mut Linear,
        dims: Dims,
        lr: f32,
    ) -> Result<()> {
        existing(s, |stream, ws| {
            let out = &mut attn.out;
            model::attention_update(
                &e.lt,
                &e.kernels,
                Some(stream),
                Some(ws),
                &dims,
                lr,
                attn_acts,
                out,
                attn_grad,
            )
        })
    }
}

/// The trainer after the migration: the same state, seeded the same way, stepped by the
/// stepgraph step.
///
/// ```no_run
/// use stepgraph_migrate::{After, Dims};
///
/// let ctx = cudarc::driver::CudaContext::new(0)?;
/// let mut after = After::new(ctx, Dims::default(), 42)?;
/// for _ in 0..10 {
///     after.step.replay()?;
/// }
/// after.step.wait()?;
/// println!("IQN {}", after.step.download(|b| &b.iqn_acts.loss)?[0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct After {
    /// The step, captured.
    pub step: step::Step,
    /// The device over the trainer's context.
    pub device: Device,
}

impl After {
    /// The trainer's state, seeded as the before's is for the same `seed`, in a step
    /// captured with the planned schedule.
    pub fn new(ctx: Arc<CudaContext>, dims: Dims, seed: u64) -> stepgraph::Result<After> {
        Self::with_options(ctx, dims, seed, Options::from_env()?)
    }

    /// [`After::new`] with the step's options ([`Schedule::OneStream`] is the step on one
    /// stream).
    pub fn with_options(
        ctx: Arc<CudaContext>,
        dims: Dims,
        seed: u64,
        options: Options,
    ) -> stepgraph::Result<After> {
        let ext = stepgraph::Error::external;
        dims.check().map_err(ext)?;
        // SAFETY: as in the before's `Trainer::new`: turned off before anything is
        // allocated, and the program orders its streams itself: its setup runs on one
        // stream, synchronised below, and the step's streams are ordered by its plan.
        unsafe { ctx.disable_event_tracking() };
        let device = Device::from_context(ctx.clone())?;
        let stream = ctx
            .new_stream()
            .map_err(stepgraph::Error::driver("cuStreamCreate"))?;
        let lt = Lt::new(stream.clone()).map_err(ext)?;
        let kernels = Kernels::load(&ctx).map_err(ext)?;
        // Planned here, as the before does, so that no heuristic runs inside the capture.
        for gemm in dims.gemms().all() {
            lt.prepare(&gemm).map_err(ext)?;
        }
        let State {
            x,
            trunk,
            trunk_acts,
            iqn,
            iqn_data,
            iqn_acts,
            iqn_grad,
            attn,
            attn_data,
            attn_acts,
            attn_grad,
        } = State::upload(&stream, &dims, seed).map_err(ext)?;
        stream
            .synchronize()
            .map_err(stepgraph::Error::driver("cuStreamSynchronize"))?;
        let buffers = step::Buffers {
            x,
            trunk,
            trunk_acts,
            iqn,
            iqn_data,
            iqn_acts,
            iqn_grad,
            attn,
            attn_data,
            attn_acts,
            attn_grad,
        };
        let config = step::Config {
            dims,
            lr: LEARNING_RATE,
        };
        let step =
            step::Step::with_options(&device, Existing { lt, kernels }, buffers, config, options)?;
        Ok(After { step, device })
    }

    /// The step on one stream: the before's schedule, built by stepgraph.
    pub fn one_stream(ctx: Arc<CudaContext>, dims: Dims, seed: u64) -> stepgraph::Result<After> {
        let options = Options::from_env()?.with_schedule(Schedule::OneStream);
        Self::with_options(ctx, dims, seed, options)
    }
}
