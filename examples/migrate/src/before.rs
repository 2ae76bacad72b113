//! The trainer as it drives the step today: everything on one stream, captured once as
//! a CUDA graph and replayed.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaGraph, CudaSlice, CudaStream};

use crate::error::{Error, Result};
use crate::host::{self, HostData, HostLinear, HostParams};
use crate::kernels::Kernels;
use crate::lt::Lt;
use crate::model::{
    self, AttnActs, AttnData, AttnParams, Dims, IqnActs, IqnData, IqnParams, Linear, TrunkActs,
    TrunkParams,
};

/// The SGD learning rate of both heads' output layers.
pub const LEARNING_RATE: f32 = 0.05;

/// The trainer: its stream, cuBLASLt handle, kernels, every buffer of the step, and the
/// captured step.
///
/// ```no_run
/// use stepgraph_migrate::{Dims, Trainer};
///
/// let ctx = cudarc::driver::CudaContext::new(0)?;
/// let mut trainer = Trainer::new(ctx, Dims::default(), 42)?;
/// trainer.capture()?;
/// for _ in 0..10 {
///     trainer.replay()?;
/// }
/// trainer.sync()?;
/// println!("IQN {} attention {}", trainer.iqn_loss()?, trainer.attention_loss()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Trainer {
    /// Declared first so it goes first: nothing may replay into freed buffers.
    graph: Option<CudaGraph>,
    dims: Dims,
    lr: f32,
    state: State,
    kernels: Kernels,
    lt: Lt,
    stream: Arc<CudaStream>,
}

/// Every buffer of the step: the data, each part's parameters and activations, and the
/// heads' gradients.
#[derive(Debug)]
pub struct State {
    /// `[B, S]`: the inputs.
    pub x: CudaSlice<f32>,
    /// The trunk's parameters.
    pub trunk: TrunkParams,
    /// The trunk's activations.
    pub trunk_acts: TrunkActs,
    /// The IQN head's parameters.
    pub iqn: IqnParams,
    /// The IQN head's data.
    pub iqn_data: IqnData,
    /// The IQN head's activations.
    pub iqn_acts: IqnActs,
    /// The IQN output layer's gradient.
    pub iqn_grad: Linear,
    /// The attention head's parameters.
    pub attn: AttnParams,
    /// The attention head's data.
    pub attn_data: AttnData,
    /// The attention head's activations.
    pub attn_acts: AttnActs,
    /// The attention output layer's gradient.
    pub attn_grad: Linear,
}

impl State {
    /// Allocates every buffer on `stream` and uploads the random weights and data that
    /// `seed` fixes ([`host::init`]); activations start as NaN, so that an element no
    /// kernel writes shows in a check.
    pub fn upload(stream: &Arc<CudaStream>, dims: &Dims, seed: u64) -> Result<State> {
        let (params, data) = host::init(dims, seed);
        let d = dims;
        let up = |v: &[f32]| {
            stream
                .clone_htod(v)
                .map_err(Error::driver("cuMemcpyHtoDAsync"))
        };
        let linear = |l: &HostLinear| -> Result<Linear> {
            Ok(Linear {
                w: up(&l.w)?,
                b: up(&l.b)?,
            })
        };
        let act = |n: usize| up(&vec![f32::NAN; n]);
        let (bn, bt) = (d.batch * d.quantiles, d.batch * d.tokens);
        Ok(State {
            x: up(&data.x)?,
            trunk: TrunkParams {
                l1: linear(&params.trunk1)?,
                l2: linear(&params.trunk2)?,
            },
            trunk_acts: TrunkActs {
                h1: act(d.batch * d.hidden)?,
                h: act(d.batch * d.hidden)?,
            },
            iqn: IqnParams {
                embed: linear(&params.iqn_embed)?,
                out: linear(&params.iqn_out)?,
            },
            iqn_data: IqnData {
                tau: up(&data.tau)?,
                target: up(&data.iqn_target)?,
            },
            iqn_acts: IqnActs {
                cosf: act(bn * d.cos_dim)?,
                phi: act(bn * d.hidden)?,
                g: act(bn * d.hidden)?,
                z: act(bn * d.actions)?,
                dz: act(bn * d.actions)?,
                row_loss: act(d.batch)?,
                loss: act(1)?,
            },
            iqn_grad: Linear {
                w: act(d.actions * d.hidden)?,
                b: act(d.actions)?,
            },
            attn: AttnParams {
                tokens: linear(&params.attn_tokens)?,
                qkv: linear(&params.attn_qkv)?,
                out: linear(&params.attn_out)?,
            },
            attn_data: AttnData {
                target: up(&data.attn_target)?,
            },
            attn_acts: AttnActs {
                tok: act(bt * d.width)?,
                qkv: act(bt * 3 * d.width)?,
                scores: act(bt * d.tokens)?,
                ctx: act(bt * d.width)?,
                pred: act(d.batch * d.outputs)?,
                dpred: act(d.batch * d.outputs)?,
                row_loss: act(d.batch)?,
                loss: act(1)?,
            },
            attn_grad: Linear {
                w: act(d.outputs * d.width)?,
                b: act(d.outputs)?,
            },
        })
    }
}

impl fmt::Debug for Trainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trainer")
            .field("dims", &self.dims)
            .field("lr", &self.lr)
            .field("captured", &self.graph.is_some())
            .field("lt", &self.lt)
            .finish_non_exhaustive()
    }
}

impl Trainer {
    /// Creates the trainer's stream and cuBLASLt handle, loads the kernels, uploads the
    /// random weights and data that `seed` fixes ([`host::init`]) and plans every GEMM of
    /// the step.
    pub fn new(ctx: Arc<CudaContext>, dims: Dims, seed: u64) -> Result<Trainer> {
        dims.check()?;
        // SAFETY: called before the trainer allocates anything, so none of its slices
        // tracks events. cudarc's tracking acts once the context has a stream of its own
        // (`new_stream`; a capture needs one, since the legacy default stream cannot be
        // captured): every launch, copy and drop of a slice then waits for the events of
        // its last use and records new ones. Recorded inside a capture, those events are
        // graph nodes, not work a stream can wait for: the driver refuses later eager waits
        // on them (CUDA_ERROR_CAPTURED_EVENT), so eager launches after the capture fail
        // and copies and drops, which only record the error, go unordered; and the waits
        // inside the capture add edges between streams that the work does not need. So every cudarc user who captures
        // work on streams turns tracking off and orders the work itself. This trainer
        // does: all of its work is on one stream, its slices are allocated and freed in
        // that stream's order, and the host reads results only after synchronising it.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(Error::driver("cuStreamCreate"))?;
        let lt = Lt::new(stream.clone())?;
        let kernels = Kernels::load(&ctx)?;
        let state = State::upload(&stream, &dims, seed)?;
        let trainer = Trainer {
            graph: None,
            dims,
            lr: LEARNING_RATE,
            state,
            kernels,
            lt,
            stream,
        };
        // Planned here, so that no heuristic runs inside the capture.
        for gemm in dims.gemms().all() {
            trainer.lt.prepare(&gemm)?;
        }
        trainer.sync()?;
        Ok(trainer)
    }

    /// The model's sizes.
    pub fn dims(&self) -> &Dims {
        &self.dims
    }

    /// The trainer's stream, on which all its work runs.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The cuBLASLt wrapper, with the default workspace.
    pub fn lt(&self) -> &Lt {
        &self.lt
    }

    /// The kernels.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// Issues one training step on the trainer's stream: the trunk, then the IQN head and
    /// its update, then the attention head and its update, with the default stream and
    /// workspace.
    fn issue_step(&mut self) -> Result<()> {
        let (lt, k, d, lr) = (&self.lt, &self.kernels, &self.dims, self.lr);
        let s = &mut self.state;
        model::trunk_forward(lt, k, None, None, d, &s.x, &s.trunk, &mut s.trunk_acts)?;
        let h = &s.trunk_acts.h;
        model::iqn_head(
            lt,
            k,
            None,
            None,
            d,
            h,
            &s.iqn,
            &s.iqn_data,
            &mut s.iqn_acts,
        )?;
        model::iqn_update(
            lt,
            k,
            None,
            None,
            d,
            lr,
            &s.iqn_acts,
            &mut s.iqn.out,
            &mut s.iqn_grad,
        )?;
        model::attention_head(
            lt,
            k,
            None,
            None,
            d,
            h,
            &s.attn,
            &s.attn_data,
            &mut s.attn_acts,
        )?;
        model::attention_update(
            lt,
            k,
            None,
            None,
            d,
            lr,
            &s.attn_acts,
            &mut s.attn.out,
            &mut s.attn_grad,
        )
    }

    /// Runs one step without the graph, launch by launch: the same work [`capture`]
    /// records, for debugging and for comparing against the graph.
    ///
    /// [`capture`]: Trainer::capture
    pub fn step_eager(&mut self) -> Result<()> {
        self.issue_step()
    }

    /// Captures one training step as a CUDA graph, replacing any earlier one.
    ///
    /// The capture is RELAXED (`CU_STREAM_CAPTURE_MODE_RELAXED`): cuBLASLt may load its
    /// kernels lazily on a shape's first call, and the default GLOBAL mode refuses such
    /// calls on any thread while a capture is under way. Nothing runs while capturing: the
    /// step's buffers are unchanged until the first [`replay`](Trainer::replay).
    pub fn capture(&mut self) -> Result<()> {
        self.graph = None;
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(Error::driver("cuStreamBeginCapture"))?;
        let issued = self.issue_step();
        // Ended whatever happened, so that the stream leaves capture mode.
        let ended = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(Error::driver("cuStreamEndCapture"));
        issued?;
        let graph = ended?.ok_or_else(|| Error::Invalid("the capture recorded nothing".into()))?;
        graph.upload().map_err(Error::driver("cuGraphUpload"))?;
        self.graph = Some(graph);
        Ok(())
    }

    /// Launches the captured step once on the trainer's stream; it runs asynchronously.
    pub fn replay(&self) -> Result<()> {
        let graph = self
            .graph
            .as_ref()
            .ok_or_else(|| Error::Invalid("replay before capture".into()))?;
        graph.launch().map_err(Error::driver("cuGraphLaunch"))
    }

    /// Waits for everything issued on the trainer's stream.
    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(Error::driver("cuStreamSynchronize"))
    }

    /// Copies `buf` to the host, after the work before it on the stream.
    fn download(&self, buf: &CudaSlice<f32>) -> Result<Vec<f32>> {
        self.stream
            .clone_dtoh(buf)
            .map_err(Error::driver("cuMemcpyDtoHAsync"))
    }

    fn scalar(&self, buf: &CudaSlice<f32>) -> Result<f32> {
        self.download(buf)?
            .first()
            .copied()
            .ok_or_else(|| Error::Invalid("an empty loss buffer".into()))
    }

    /// Every buffer of the step.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// `L_iqn` of the last step.
    pub fn iqn_loss(&self) -> Result<f32> {
        self.scalar(&self.state.iqn_acts.loss)
    }

    /// `L_attn` of the last step.
    pub fn attention_loss(&self) -> Result<f32> {
        self.scalar(&self.state.attn_acts.loss)
    }

    /// The trunk's features `h [B, H]` of the last step.
    pub fn features(&self) -> Result<Vec<f32>> {
        self.download(&self.state.trunk_acts.h)
    }

    /// IQN's per-quantile outputs `z [B N, A]` of the last step.
    pub fn iqn_outputs(&self) -> Result<Vec<f32>> {
        self.download(&self.state.iqn_acts.z)
    }

    /// The attention head's outputs `pred [B, R]` of the last step.
    pub fn attention_outputs(&self) -> Result<Vec<f32>> {
        self.download(&self.state.attn_acts.pred)
    }

    /// The IQN output layer's gradient of the last step.
    pub fn iqn_grad(&self) -> Result<HostLinear> {
        self.download_linear(&self.state.iqn_grad)
    }

    /// The attention output layer's gradient of the last step.
    pub fn attention_grad(&self) -> Result<HostLinear> {
        self.download_linear(&self.state.attn_grad)
    }

    fn download_linear(&self, l: &Linear) -> Result<HostLinear> {
        Ok(HostLinear {
            w: self.download(&l.w)?,
            b: self.download(&l.b)?,
        })
    }

    /// Every parameter, as the steps so far left them.
    pub fn params(&self) -> Result<HostParams> {
        Ok(HostParams {
            trunk1: self.download_linear(&self.state.trunk.l1)?,
            trunk2: self.download_linear(&self.state.trunk.l2)?,
            iqn_embed: self.download_linear(&self.state.iqn.embed)?,
            iqn_out: self.download_linear(&self.state.iqn.out)?,
            attn_tokens: self.download_linear(&self.state.attn.tokens)?,
            attn_qkv: self.download_linear(&self.state.attn.qkv)?,
            attn_out: self.download_linear(&self.state.attn.out)?,
        })
    }

    /// The step's data, as uploaded.
    pub fn data(&self) -> Result<HostData> {
        Ok(HostData {
            x: self.download(&self.state.x)?,
            tau: self.download(&self.state.iqn_data.tau)?,
            iqn_target: self.download(&self.state.iqn_data.target)?,
            attn_target: self.download(&self.state.attn_data.target)?,
        })
    }
}
