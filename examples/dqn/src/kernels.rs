//! The DQN step's kernels (`cuda/*.cu`, MODEL.md), built by stepgraph-build like any
//! user crate's, with a safe wrapper each that checks sizes before it launches; the
//! optimizer's and the elementwise kernels come from `stepgraph-kernels`.

use std::sync::Arc;

use stepgraph::{CaptureStream, Device, DeviceBuffer, Error, LaunchConfig, Result};
use stepgraph_kernels::launch::{
    BLOCK_THREADS, check_len, check_scratch, elementwise_config, len_u32, positive, product,
    row_chunk_plan, same_len, tile_config,
};

/// The registry stepgraph-build generated from `cuda/*.cu`.
mod raw {
    stepgraph::include_kernels!();
}
pub use raw::{KernelId, ModuleId};

/// The DQN step's kernels and the generic ones it uses, loaded once per device.
#[derive(Debug)]
pub struct Kernels {
    raw: raw::Kernels,
    /// The optimizer's and the elementwise kernels (`stepgraph-kernels`).
    pub generic: Arc<stepgraph_kernels::Kernels>,
    /// Whether the driver loaded `cuda/iqn.cu`'s sm_90a cubin, whose `iqn_wgmma` runs on
    /// Hopper's warpgroup MMA (elsewhere, the PTX fallback has only its trap).
    wgmma: bool,
    /// Whether the driver granted `attention_fused` its shared memory.
    attention_fused: bool,
}

impl Kernels {
    /// Loads this crate's modules and the generic kernels into `device`'s context; each
    /// kernel's parameter list is checked against its CUDA signature. Where the driver took
    /// the sm_90a cubin of `cuda/iqn.cu`, `iqn_wgmma` is also opted in to the shared memory
    /// it needs ([`IQN_WGMMA_SHARED_BYTES`]); if the driver refuses that, the load fails
    /// with [`Error::DynamicShared`] rather than quietly run the slower kernel.
    /// `attention_fused` is opted in to [`ATTENTION_FUSED_SHARED_BYTES`] on any GPU; where
    /// the driver refuses, [`Kernels::has_attention_fused`] says so and the step takes the
    /// unfused attention path.
    pub fn load(device: &Device) -> Result<Kernels> {
        let raw = raw::Kernels::load(device)?;
        let wgmma = raw
            .module(ModuleId::Iqn)
            .image()
            .is_some_and(|image| image.target == WGMMA_TARGET);
        if wgmma {
            raw.kernel(KernelId::IqnWgmma)
                .set_max_dynamic_shared(IQN_WGMMA_SHARED_BYTES)?;
        }
        // A GPU with less shared memory a block than Hopper refuses the opt-in: the step
        // then takes the unfused attention path, so the refusal is an answer, not an error.
        let attention_fused = match raw
            .kernel(KernelId::AttentionFused)
            .set_max_dynamic_shared(ATTENTION_FUSED_SHARED_BYTES)
        {
            Ok(()) => true,
            Err(Error::DynamicShared { .. }) => false,
            Err(other) => return Err(other),
        };
        Ok(Kernels {
            raw,
            generic: Arc::new(stepgraph_kernels::Kernels::load(device)?),
            wgmma,
            attention_fused,
        })
    }

    /// Whether `iqn_wgmma` can run here: the driver loaded the sm_90a cubin (a Hopper GPU
    /// and a build whose targets include `sm_90a`, as this crate's build.rs asks).
    pub fn has_wgmma(&self) -> bool {
        self.wgmma
    }

    /// A kernel of this crate, for launches without a wrapper (checked against its
    /// parameter list when launched).
    pub fn kernel(&self, id: KernelId) -> &stepgraph::Kernel {
        self.raw.kernel(id)
    }
}

// ---------------------------------------------------------------------------------------
// The DQN step's kernels (MODEL.md), one section per `cuda/*.cu` file.
// Shapes are row-major (`[B, X]` puts row b at offset b X); the branches' tensors are packed
// as `[D, B, X]`. Every wrapper checks each buffer's length against the sizes it is given
// and fails with [`Error::LengthMismatch`] (or [`Error::Invalid`] for a size the kernel
// cannot take) before anything is launched. Buffers must be whole allocations, as every
// `DeviceBuffer` is: the kernels' 16-byte accesses rely on their alignment.
// A kernel whose bounds are its buffers' lengths and its grid declares them above its
// signature (`// stepgraph(unsafe): ...`), and its wrapper calls the `_checked` method
// stepgraph-build generates from that; the others (per-branch pointers, chunk plans,
// register and shared-memory limits) launch by hand with a `SAFETY:` comment.
// ---------------------------------------------------------------------------------------

/// A slot of the DQN step's loss buffer: [`LOSS_SLOTS`] floats, zeroed by a memset op at
/// the start of the step. Each loss kernel adds its term's value into the term's slot and
/// coefficient × value into [`LossSlot::Total`].
///
/// The same numbers are `#define`d in `cuda/dqn.cuh`; a unit test checks that the
/// two agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossSlot {
    /// `L`, the weighted total of the terms.
    Total = 0,
    /// `L_td` ([`Kernels::dueling_losses`]).
    Td = 1,
    /// `L_iql`, high and low heads together ([`Kernels::expectile_loss`], called twice).
    Iql = 2,
    /// `L_iqn` ([`Kernels::iqn_fused`], or [`Kernels::iqn_forward_backward`]).
    Iqn = 3,
    /// `L_attn` ([`Kernels::attn_pool_loss`]).
    Attn = 4,
    /// `L_cql` ([`Kernels::dueling_losses`]).
    Cql = 5,
    /// `L_conf` ([`Kernels::dueling_losses`]).
    Conf = 6,
}

impl LossSlot {
    /// Every slot that a kernel writes (slot 7 is spare).
    pub const ALL: [LossSlot; 7] = [
        LossSlot::Total,
        LossSlot::Td,
        LossSlot::Iql,
        LossSlot::Iqn,
        LossSlot::Attn,
        LossSlot::Cql,
        LossSlot::Conf,
    ];

    /// Its index in the loss buffer.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its term's name in `examples/dqn/MODEL.md` (`L`, `L_td`, ...).
    pub const fn model_name(self) -> &'static str {
        match self {
            LossSlot::Total => "L",
            LossSlot::Td => "L_td",
            LossSlot::Iql => "L_iql",
            LossSlot::Iqn => "L_iqn",
            LossSlot::Attn => "L_attn",
            LossSlot::Cql => "L_cql",
            LossSlot::Conf => "L_conf",
        }
    }

    /// Its `#define` in `cuda/dqn.cuh`.
    pub const fn macro_name(self) -> &'static str {
        match self {
            LossSlot::Total => "LOSS_TOTAL",
            LossSlot::Td => "LOSS_TD",
            LossSlot::Iql => "LOSS_IQL",
            LossSlot::Iqn => "LOSS_IQN",
            LossSlot::Attn => "LOSS_ATTN",
            LossSlot::Cql => "LOSS_CQL",
            LossSlot::Conf => "LOSS_CONF",
        }
    }
}

/// Length of the loss buffer that the loss kernels add into (see [`LossSlot`]).
pub const LOSS_SLOTS: usize = 8;

fn check_losses(what: &str, losses: &DeviceBuffer<f32>) -> Result<()> {
    same_len(what, LOSS_SLOTS, losses.len())
}

/// Dynamic shared memory a block may use without opting in to more.
const MAX_DYNAMIC_SMEM: usize = 48 * 1024;

/// The most branches the per-branch kernels take (`MAX_BRANCHES` in dqn.cuh).
pub const MAX_BRANCHES: usize = 8;

/// One device address per branch, passed to a kernel by value (`BranchIn` / `BranchOut`
/// in dqn.cuh). Per-branch arrays stay separate allocations, each written by its
/// branch's op on its branch's stream, which is what lets the schedule tell them apart.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct BranchPtrs {
    p: [u64; MAX_BRANCHES],
}

// SAFETY: a plain array of device addresses, laid out as the CUDA struct of pointers
// (8-byte pointers on x86-64 and on the device).
unsafe impl stepgraph::DeviceRepr for BranchPtrs {}

impl BranchPtrs {
    /// The addresses of `bufs`, after checking there is one per branch and each holds
    /// `len` elements.
    fn of<'b>(
        what: &str,
        bufs: impl ExactSizeIterator<Item = &'b DeviceBuffer<f32>>,
        branches: usize,
        len: usize,
    ) -> Result<Self> {
        if bufs.len() != branches || branches > MAX_BRANCHES {
            return Err(Error::Invalid(format!(
                "{what}: expected one buffer per branch ({branches}, at most {MAX_BRANCHES}), found {}",
                bufs.len()
            )));
        }
        let mut p = [0u64; MAX_BRANCHES];
        for (d, buf) in bufs.enumerate() {
            check_len(&format!("{what}[{d}]"), buf.len(), len)?;
            p[d] = buf.device_address();
        }
        Ok(BranchPtrs { p })
    }
}

// ---- cuda/heads.cu: GLU, double-DQN target, dueling losses, expectile, trunk join ----

/// Sizes of the dueling heads: `B` samples, `D` branches, `A` actions per branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DuelingDims {
    /// `B`.
    pub batch: usize,
    /// `D`.
    pub branches: usize,
    /// `A`.
    pub actions: usize,
}

impl DuelingDims {
    /// `(B, D, A)` as the kernels take them, after checking that each is at least 1 and
    /// that `D B A` fits.
    fn checked(self, what: &str) -> Result<(u32, u32, u32)> {
        let b = positive(&format!("{what}: batch"), self.batch)?;
        let d = positive(&format!("{what}: branches"), self.branches)?;
        let a = positive(&format!("{what}: actions"), self.actions)?;
        len_u32(
            what,
            product(what, &[self.branches, self.batch, self.actions])?,
        )?;
        Ok((b, d, a))
    }
}

/// Inputs of [`Kernels::ddqn_target`]: the online net's value and advantages on `s2`, the
/// target net's, the reward and the done flag.
#[derive(Clone, Copy, Debug)]
pub struct DdqnTargetInputs<'a> {
    /// `v2[B]`: online value on `s2`.
    pub v2: &'a DeviceBuffer<f32>,
    /// Online advantages on `s2`: one `[B, A]` buffer per branch.
    pub adv2: &'a [DeviceBuffer<f32>],
    /// `vt[B]`: target value on `s2`.
    pub vt: &'a DeviceBuffer<f32>,
    /// Target advantages on `s2`: one `[B, A]` buffer per branch.
    pub advt: &'a [DeviceBuffer<f32>],
    /// `r[B]`.
    pub r: &'a DeviceBuffer<f32>,
    /// `done[B]`, 0 or 1.
    pub done: &'a DeviceBuffer<f32>,
}

/// Inputs of [`Kernels::dueling_losses`].
#[derive(Clone, Copy, Debug)]
pub struct DuelingInputs<'a> {
    /// `v[B]`: the value head on `s`.
    pub v: &'a DeviceBuffer<f32>,
    /// The branches' advantages on `s`: one `[B, A]` buffer per branch.
    pub adv: &'a [&'a DeviceBuffer<f32>],
    /// `act[B, D]`: the actions taken, in `0..A`.
    pub act: &'a DeviceBuffer<i32>,
    /// `y[B, D]`: the targets ([`Kernels::ddqn_target`]).
    pub y: &'a DeviceBuffer<f32>,
}

/// The weights of the dueling losses in the total loss.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DuelingCoefficients {
    /// Weight of `L_td`.
    pub td: f32,
    /// Weight of `L_cql`.
    pub cql: f32,
    /// Weight of `L_conf`.
    pub conf: f32,
}

impl Default for DuelingCoefficients {
    /// MODEL.md's: 1, 0.1, 0.05.
    fn default() -> Self {
        DuelingCoefficients {
            td: 1.0,
            cql: 0.1,
            conf: 0.05,
        }
    }
}

/// Outputs of [`Kernels::dueling_losses`].
#[derive(Debug)]
pub struct DuelingOutputs<'a> {
    /// `dv[B]`: dL/dv (written).
    pub dv: &'a mut DeviceBuffer<f32>,
    /// dL/dadv (written): one `[B, A]` buffer per branch.
    pub dadv: &'a mut [DeviceBuffer<f32>],
    /// `qbar[B]`: `mean_d qa[d]`, the IQL heads' target (written).
    pub qbar: &'a mut DeviceBuffer<f32>,
    /// The loss buffer ([`LossSlot`]): `Td`, `Cql`, `Conf` and `Total` are added to.
    pub losses: &'a mut DeviceBuffer<f32>,
}

/// One expectile head of IQL: its expectile and its weight in the total loss.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expectile {
    /// `τ`.
    pub tau: f32,
    /// The loss's weight (MODEL.md: 0.5).
    pub coef: f32,
}

impl Expectile {
    /// The high head: `τ = 0.7`, weight 0.5.
    pub const HIGH: Expectile = Expectile {
        tau: 0.7,
        coef: 0.5,
    };
    /// The low head: `τ = 0.3`, weight 0.5.
    pub const LOW: Expectile = Expectile {
        tau: 0.3,
        coef: 0.5,
    };
}

/// Sizes of the trunk's gradient join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrunkDims {
    /// `B`.
    pub batch: usize,
    /// `H`.
    pub hidden: usize,
    /// `D`.
    pub branches: usize,
}

/// What flows back into the trunk's output `h` ([`Kernels::trunk_grad_join`]). The value
/// and expectile heads are rank one, so they come as their factors.
#[derive(Clone, Copy, Debug)]
pub struct TrunkGrads<'a> {
    /// `h[B, H]`: the trunk's output (after its ReLU), for the mask.
    pub h_out: &'a DeviceBuffer<f32>,
    /// `dv[B]`, times `wv[H]`: the value head's part.
    pub dv: &'a DeviceBuffer<f32>,
    /// `wv[H]`.
    pub wv: &'a DeviceBuffer<f32>,
    /// The branches' parts: one `[B, H]` buffer per branch.
    pub dh_branch: &'a [DeviceBuffer<f32>],
    /// `de_hi[B]`, times `we_hi[H]`.
    pub de_hi: &'a DeviceBuffer<f32>,
    /// `we_hi[H]`.
    pub we_hi: &'a DeviceBuffer<f32>,
    /// `de_lo[B]`, times `we_lo[H]`.
    pub de_lo: &'a DeviceBuffer<f32>,
    /// `we_lo[H]`.
    pub we_lo: &'a DeviceBuffer<f32>,
    /// `dh_iqn[B, H]` ([`Kernels::iqn_fused`], or [`Kernels::iqn_forward_backward`]).
    pub dh_iqn: &'a DeviceBuffer<f32>,
}

impl Kernels {
    /// GLU, forward: `g[r, k] = u[r, k] σ(u[r, G + k])` for `u[rows, 2G]`, `g[rows, G]`,
    /// `G = width`. Pass the `D` branches packed as `[D, B, 2G]` with `rows = D B`.
    ///
    /// One thread per element of `g`, blocks of [`BLOCK_THREADS`].
    /// [`glu_forward_reference`](crate::reference::glu_forward_reference) computes the same on the CPU.
    pub fn glu_forward(
        &self,
        stream: &CaptureStream<'_>,
        u: &DeviceBuffer<f32>,
        g: &mut DeviceBuffer<f32>,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        let n = product("glu_forward: g", &[rows, width])?;
        self.raw.glu_forward_checked(stream, u, g, n, width)
    }

    /// GLU, backward: `du[rows, 2G]` from `u[rows, 2G]` and `dg[rows, G]` (see
    /// `cuda/heads.cu` for the formula). Same grid as [`Kernels::glu_forward`];
    /// [`glu_backward_reference`](crate::reference::glu_backward_reference) is the CPU version.
    pub fn glu_backward(
        &self,
        stream: &CaptureStream<'_>,
        u: &DeviceBuffer<f32>,
        dg: &DeviceBuffer<f32>,
        du: &mut DeviceBuffer<f32>,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        let n = product("glu_backward: dg", &[rows, width])?;
        self.raw.glu_backward_checked(stream, u, dg, du, n, width)
    }

    /// The double-DQN target: `y[B, D]` and `ybar[B] = mean_d y` (formula in
    /// `cuda/heads.cu` and MODEL.md; the first maximum wins ties).
    ///
    /// One thread per sample, blocks of [`BLOCK_THREADS`]. [`ddqn_target_reference`](crate::reference::ddqn_target_reference) is the
    /// CPU version.
    pub fn ddqn_target(
        &self,
        stream: &CaptureStream<'_>,
        dims: DuelingDims,
        inputs: &DdqnTargetInputs<'_>,
        gamma: f32,
        y: &mut DeviceBuffer<f32>,
        ybar: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let (b, d, a) = dims.checked("ddqn_target")?;
        let by = product("ddqn_target", &[dims.batch, dims.branches])?;
        check_len("ddqn_target: v2 ([B])", inputs.v2.len(), dims.batch)?;
        let ba = product("ddqn_target", &[dims.batch, dims.actions])?;
        let adv2 = BranchPtrs::of(
            "ddqn_target: adv2 ([B, A] per branch)",
            inputs.adv2.iter(),
            dims.branches,
            ba,
        )?;
        check_len("ddqn_target: vt ([B])", inputs.vt.len(), dims.batch)?;
        let advt = BranchPtrs::of(
            "ddqn_target: advt ([B, A] per branch)",
            inputs.advt.iter(),
            dims.branches,
            ba,
        )?;
        check_len("ddqn_target: r ([B])", inputs.r.len(), dims.batch)?;
        check_len("ddqn_target: done ([B])", inputs.done.len(), dims.batch)?;
        check_len("ddqn_target: y ([B, D])", y.len(), by)?;
        check_len("ddqn_target: ybar ([B])", ybar.len(), dims.batch)?;
        // SAFETY: threads with b >= B return, and every buffer holds what its shape in B,
        // D, A says (checked above).
        unsafe {
            self.raw.ddqn_target(
                stream,
                elementwise_config(b),
                inputs.v2,
                adv2,
                inputs.vt,
                advt,
                inputs.r,
                inputs.done,
                y,
                ybar,
                b,
                d,
                a,
                gamma,
            )
        }
    }

    /// The dueling losses `L_td`, `L_cql`, `L_conf`, forward and backward in one pass:
    /// writes `dv`, `dadv` (the gradients of `td L_td + cql L_cql + conf L_conf`, means'
    /// factors included) and `qbar`, and adds the three terms and their weighted sum into
    /// the loss buffer. Formulas and the hand derivation are in `cuda/heads.cu`. An
    /// action outside `0..A` makes its sample's outputs NaN.
    ///
    /// One thread per sample, blocks of [`BLOCK_THREADS`]. The gradients are deterministic;
    /// the loss slots get one `atomicAdd` per block, so their last bits can vary between
    /// runs. [`dueling_losses_reference`](crate::reference::dueling_losses_reference) is the CPU version.
    pub fn dueling_losses(
        &self,
        stream: &CaptureStream<'_>,
        dims: DuelingDims,
        inputs: &DuelingInputs<'_>,
        coef: DuelingCoefficients,
        out: DuelingOutputs<'_>,
    ) -> Result<()> {
        let (b, d, a) = dims.checked("dueling_losses")?;
        let by = product("dueling_losses", &[dims.batch, dims.branches])?;
        check_len("dueling_losses: v ([B])", inputs.v.len(), dims.batch)?;
        let ba = product("dueling_losses", &[dims.batch, dims.actions])?;
        let adv_ptrs = BranchPtrs::of(
            "dueling_losses: adv ([B, A] per branch)",
            inputs.adv.iter().copied(),
            dims.branches,
            ba,
        )?;
        check_len("dueling_losses: act ([B, D])", inputs.act.len(), by)?;
        check_len("dueling_losses: y ([B, D])", inputs.y.len(), by)?;
        check_len("dueling_losses: dv ([B])", out.dv.len(), dims.batch)?;
        let dadv_ptrs = BranchPtrs::of(
            "dueling_losses: dadv ([B, A] per branch)",
            out.dadv.iter(),
            dims.branches,
            ba,
        )?;
        check_len("dueling_losses: qbar ([B])", out.qbar.len(), dims.batch)?;
        check_losses("dueling_losses: losses", out.losses)?;
        // SAFETY: only threads with b < B touch the per-sample buffers (sized by B, D, A,
        // checked above), an action outside 0..A is never used as an index, and thread 0 of
        // each block adds into slots below LOSS_SLOTS = losses.len().
        unsafe {
            self.raw.dueling_losses(
                stream,
                elementwise_config(b),
                inputs.v,
                adv_ptrs,
                inputs.act,
                inputs.y,
                out.dv,
                dadv_ptrs,
                out.qbar,
                out.losses,
                b,
                d,
                a,
                coef.td,
                coef.cql,
                coef.conf,
            )
        }
    }

    /// One IQL expectile head: `de[B]`, the gradient of `coef · mean_b |τ − 1(u < 0)| u²`
    /// with `u = qbar − e`, and the loss added into [`LossSlot::Iql`] (and `coef ·` it into
    /// [`LossSlot::Total`]). Call it for [`Expectile::HIGH`] and [`Expectile::LOW`].
    ///
    /// One thread per sample, blocks of [`BLOCK_THREADS`]; one `atomicAdd` per block and
    /// slot. [`expectile_loss_reference`](crate::reference::expectile_loss_reference) is the CPU version.
    pub fn expectile_loss(
        &self,
        stream: &CaptureStream<'_>,
        e: &DeviceBuffer<f32>,
        qbar: &DeviceBuffer<f32>,
        expectile: Expectile,
        de: &mut DeviceBuffer<f32>,
        losses: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        self.raw.expectile_loss_checked(
            stream,
            e,
            qbar,
            de,
            losses,
            e.len(),
            expectile.tau,
            expectile.coef,
        )
    }

    /// The trunk's gradient join: `dz2[B, H]`, the sum of everything that flows into the
    /// trunk's output `h`, masked by `h > 0` (see [`TrunkGrads`] and `cuda/heads.cu`),
    /// and the three reductions that read the same rows: layer 2's bias gradient
    /// `out.db2[H] = Σ_b dz2[b, ·]`, the value head's weight gradient
    /// `out.dwv[H] = Σ_b dv[b] h[b, ·]` and its bias gradient `out.dbv[1] = Σ_b dv[b]`.
    ///
    /// Two-pass and deterministic: `trunk_grad_join_partial` (`(ceil(H / 32), chunks)`
    /// blocks of 32 × 8, [`trunk_grad_join_plan`]) writes `dz2` and `[chunks, 2H + 1]`
    /// partial sums into `scratch` (at least [`trunk_grad_join_scratch_len`] floats), then
    /// `trunk_grad_join_finish` adds them in order. [`trunk_grad_join_reference`](crate::reference::trunk_grad_join_reference) is the
    /// CPU version.
    pub fn trunk_grad_join(
        &self,
        stream: &CaptureStream<'_>,
        dims: TrunkDims,
        inputs: &TrunkGrads<'_>,
        dz2: &mut DeviceBuffer<f32>,
        scratch: &mut DeviceBuffer<f32>,
        out: TrunkJoinOutputs<'_>,
    ) -> Result<()> {
        let b = positive("trunk_grad_join: batch", dims.batch)?;
        let h = positive("trunk_grad_join: hidden", dims.hidden)?;
        let d = len_u32("trunk_grad_join: branches", dims.branches)?;
        let bh = product("trunk_grad_join", &[dims.batch, dims.hidden])?;
        let rows = |what: &str, buf: &DeviceBuffer<f32>| check_len(what, buf.len(), dims.batch);
        let cols = |what: &str, buf: &DeviceBuffer<f32>| check_len(what, buf.len(), dims.hidden);
        check_len("trunk_grad_join: h_out ([B, H])", inputs.h_out.len(), bh)?;
        rows("trunk_grad_join: dv ([B])", inputs.dv)?;
        cols("trunk_grad_join: wv ([H])", inputs.wv)?;
        let dh_branch = BranchPtrs::of(
            "trunk_grad_join: dh_branch ([B, H] per branch)",
            inputs.dh_branch.iter(),
            dims.branches,
            bh,
        )?;
        rows("trunk_grad_join: de_hi ([B])", inputs.de_hi)?;
        cols("trunk_grad_join: we_hi ([H])", inputs.we_hi)?;
        rows("trunk_grad_join: de_lo ([B])", inputs.de_lo)?;
        cols("trunk_grad_join: we_lo ([H])", inputs.we_lo)?;
        check_len("trunk_grad_join: dh_iqn ([B, H])", inputs.dh_iqn.len(), bh)?;
        check_len("trunk_grad_join: dz2 ([B, H])", dz2.len(), bh)?;
        cols("trunk_grad_join: out.db2 ([H])", out.db2)?;
        cols("trunk_grad_join: out.dwv ([H])", out.dwv)?;
        check_len("trunk_grad_join: out.dbv ([1])", out.dbv.len(), 1)?;
        let (col_blocks, chunks, rows_per_chunk) = trunk_grad_join_plan(dims.batch, dims.hidden);
        let needed = trunk_grad_join_scratch_len(dims.batch, dims.hidden);
        check_scratch(
            "trunk_grad_join: scratch (at least trunk_grad_join_scratch_len)",
            scratch.len(),
            needed,
        )?;
        let col_blocks = len_u32("trunk_grad_join: column blocks", col_blocks)?;
        let chunks32 = len_u32("trunk_grad_join: row chunks", chunks)?;
        let per_chunk = len_u32("trunk_grad_join: rows per chunk", rows_per_chunk)?;
        // The kernels index a partials row of 2H + 1 floats in 32-bit arithmetic.
        len_u32(
            "trunk_grad_join: partials row (2H + 1)",
            2 * dims.hidden + 1,
        )?;
        {
            let config = LaunchConfig {
                grid_dim: (col_blocks, chunks32, 1),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: block (x, y) touches columns < H of rows [y rows_per_chunk, B) of the
            // [B, H] buffers and [B] entries of those rows, and writes partials[y (2H + 1)
            // + j] for y < chunks, j < 2H + 1: inside scratch (checked above). Every buffer
            // holds what its shape says.
            unsafe {
                self.raw.trunk_grad_join_partial(
                    stream,
                    config,
                    inputs.h_out,
                    inputs.dv,
                    inputs.wv,
                    dh_branch,
                    inputs.de_hi,
                    inputs.we_hi,
                    inputs.de_lo,
                    inputs.we_lo,
                    inputs.dh_iqn,
                    dz2,
                    &mut *scratch,
                    b,
                    h,
                    d,
                    per_chunk,
                )?
            };
        }
        self.raw.trunk_grad_join_finish_checked(
            stream,
            &*scratch,
            chunks,
            dims.hidden,
            out.db2,
            out.dwv,
            out.dbv,
        )
    }
}

/// The outputs of [`Kernels::trunk_grad_join`] besides `dz2`: gradients of the step's
/// parameters, written whole (not accumulated).
#[derive(Debug)]
pub struct TrunkJoinOutputs<'a> {
    /// Layer 2's bias gradient, `[H]`.
    pub db2: &'a mut DeviceBuffer<f32>,
    /// The value head's weight gradient, `[H]` (its weight is `[1, H]`).
    pub dwv: &'a mut DeviceBuffer<f32>,
    /// The value head's bias gradient, `[1]`.
    pub dbv: &'a mut DeviceBuffer<f32>,
}

/// How [`Kernels::trunk_grad_join`] splits the rows: `(column blocks, row chunks, rows
/// per chunk)`. About a thousand blocks of 256 threads, each thread 16 rows or more at
/// the default sizes; depends on the sizes only, so the sums' bits do too.
pub fn trunk_grad_join_plan(batch: usize, hidden: usize) -> (usize, usize, usize) {
    row_chunk_plan(batch, hidden, 128)
}

/// Length of the scratch buffer [`Kernels::trunk_grad_join`] needs.
pub fn trunk_grad_join_scratch_len(batch: usize, hidden: usize) -> usize {
    let (_, chunks, _) = trunk_grad_join_plan(batch, hidden);
    chunks.saturating_mul(hidden.saturating_mul(2).saturating_add(1))
}

/// Most hidden units [`Kernels::trunk_l1_grad`] takes (`TL1_MAX_H` in `cuda/heads.cu`):
/// two blocks of 128 units (`TL1_UNITS`) a chunk of rows.
pub const TRUNK_L1_MAX_HIDDEN: usize = 256;

/// Most state features [`Kernels::trunk_l1_grad`] takes (`TL1_MAX_S`: 8 mma tiles of 8
/// columns a warp, in registers).
pub const TRUNK_L1_MAX_STATE: usize = 64;

/// Rows a block of [`Kernels::trunk_l1_grad`] stages at a time (`TL1_ROWS`); a chunk of
/// rows is a multiple of it.
const TRUNK_L1_ROWS: usize = 32;

/// Sizes of the trunk's first layer, backward: `B` rows of `dh1[B, H]` and `s[B, S]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrunkL1Dims {
    /// `B`.
    pub batch: usize,
    /// `H`.
    pub hidden: usize,
    /// `S`.
    pub state: usize,
}

impl TrunkL1Dims {
    /// Whether [`Kernels::trunk_l1_grad`] takes these sizes: `H` and `S` multiples of 4
    /// (16-byte loads) up to [`TRUNK_L1_MAX_HIDDEN`] and [`TRUNK_L1_MAX_STATE`] (the
    /// accumulators and the staged tiles are sized for them), and `B >= 1`. Other sizes
    /// take the GEMM path.
    pub fn supported(&self) -> bool {
        let fits = |n: usize, most: usize| (1..=most).contains(&n) && n.is_multiple_of(4);
        fits(self.hidden, TRUNK_L1_MAX_HIDDEN)
            && fits(self.state, TRUNK_L1_MAX_STATE)
            && self.batch >= 1
    }
}

/// What [`Kernels::trunk_l1_grad`] reads.
#[derive(Clone, Copy, Debug)]
pub struct TrunkL1Inputs<'a> {
    /// `dh1[B, H] = dz2 w2`: the gradient at layer 1's output, before its ReLU.
    pub dh1: &'a DeviceBuffer<f32>,
    /// `h1[B, H]`: layer 1's output (its ReLU passes where `h1 > 0`).
    pub h1: &'a DeviceBuffer<f32>,
    /// `s[B, S]`: the layer's input.
    pub s: &'a DeviceBuffer<f32>,
}

/// What [`Kernels::trunk_l1_grad`] writes, each whole.
#[derive(Debug)]
pub struct TrunkL1Outputs<'a> {
    /// `dw1[H, S]`.
    pub dw1: &'a mut DeviceBuffer<f32>,
    /// `db1[H]`.
    pub db1: &'a mut DeviceBuffer<f32>,
}

/// How [`Kernels::trunk_l1_grad`] splits the rows: `(chunks, rows per chunk)`, about 128
/// rows a block, at most 256 blocks (each writes a partial row of `H S + H` floats), rows
/// a multiple of 32; depends on the batch only.
pub fn trunk_l1_grad_plan(batch: usize) -> (usize, usize) {
    let chunks = batch.div_ceil(128).clamp(1, 256);
    let rows_per_chunk = batch
        .div_ceil(chunks)
        .div_ceil(TRUNK_L1_ROWS)
        .max(1)
        .saturating_mul(TRUNK_L1_ROWS);
    (batch.div_ceil(rows_per_chunk).max(1), rows_per_chunk)
}

/// Length of the scratch buffer [`Kernels::trunk_l1_grad`] needs.
pub fn trunk_l1_grad_scratch_len(dims: TrunkL1Dims) -> usize {
    let (chunks, _) = trunk_l1_grad_plan(dims.batch);
    chunks.saturating_mul(
        dims.hidden
            .saturating_mul(dims.state)
            .saturating_add(dims.hidden),
    )
}

impl Kernels {
    /// The trunk's first layer, backward, from `dh1 = dz2 w2` (a plain GEMM's output):
    /// the ReLU (`dz1 = dh1` where `h1 > 0`, else 0; never written), `dw1 = dz1ᵀ s` on
    /// the tensor cores in TF32 and `db1 = Σ_b dz1[b, ·]` in f32.
    ///
    /// Two-pass and deterministic: `trunk_l1_grad_partial` (blocks of 256, one per chunk of
    /// rows, [`trunk_l1_grad_plan`], and 128 hidden units) writes one partial row of
    /// `H S + H` floats per chunk
    /// into `scratch` (at least [`trunk_l1_grad_scratch_len`] floats), then
    /// `trunk_l1_grad_finish` adds them in order. Sizes must be
    /// [`TrunkL1Dims::supported`]. [`trunk_l1_grad_reference`](crate::reference::trunk_l1_grad_reference) is the CPU version.
    pub fn trunk_l1_grad(
        &self,
        stream: &CaptureStream<'_>,
        dims: TrunkL1Dims,
        inputs: &TrunkL1Inputs<'_>,
        scratch: &mut DeviceBuffer<f32>,
        out: TrunkL1Outputs<'_>,
    ) -> Result<()> {
        let (_, rows_per_chunk) = trunk_l1_grad_plan(dims.batch);
        self.raw.trunk_l1_grad_partial_checked(
            stream,
            inputs.dh1,
            inputs.h1,
            inputs.s,
            &mut *scratch,
            dims.batch,
            dims.hidden,
            dims.state,
            rows_per_chunk,
        )?;
        let (chunks, _) = trunk_l1_grad_plan(dims.batch);
        self.raw.trunk_l1_grad_finish_checked(
            stream,
            &*scratch,
            chunks,
            dims.hidden,
            dims.state,
            out.dw1,
            out.db1,
        )
    }
}

/// Widest trunk output [`Kernels::expectile_head`] takes: 32 `EXPECTILE_HEAD_MAX_UNITS`
/// (`cuda/heads.cu`), eight units a lane.
pub const EXPECTILE_HEAD_MAX_HIDDEN: usize = 256;

/// Sizes of an IQL expectile head: `B` rows of the trunk's output `h[B, H]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpectileHeadDims {
    /// `B`.
    pub batch: usize,
    /// `H`.
    pub hidden: usize,
}

impl ExpectileHeadDims {
    /// Whether [`Kernels::expectile_head`] takes these sizes: `1 <= H <=`
    /// [`EXPECTILE_HEAD_MAX_HIDDEN`] (a lane holds its units' weights and sums in
    /// registers) and `B >= 1`. Other sizes take the GEMM path.
    pub fn supported(&self) -> bool {
        (1..=EXPECTILE_HEAD_MAX_HIDDEN).contains(&self.hidden) && self.batch >= 1
    }
}

/// What [`Kernels::expectile_head`] reads: the trunk's output, the head's layer and the
/// target `q̄`.
#[derive(Clone, Copy, Debug)]
pub struct ExpectileHeadInputs<'a> {
    /// `h[B, H]`.
    pub h: &'a DeviceBuffer<f32>,
    /// `we[H]` (the layer's weight, `[1, H]`).
    pub we: &'a DeviceBuffer<f32>,
    /// `be[1]`.
    pub be: &'a DeviceBuffer<f32>,
    /// `qbar[B]`.
    pub qbar: &'a DeviceBuffer<f32>,
}

/// What [`Kernels::expectile_head`] writes (each whole) and adds into.
#[derive(Debug)]
pub struct ExpectileHeadOutputs<'a> {
    /// `e[B]`: the head's output.
    pub e: &'a mut DeviceBuffer<f32>,
    /// `de[B]`: the gradient of `coef · L` at `e` (the trunk join takes it as a factor).
    pub de: &'a mut DeviceBuffer<f32>,
    /// `dwe[H]`.
    pub dwe: &'a mut DeviceBuffer<f32>,
    /// `dbe[1]`.
    pub dbe: &'a mut DeviceBuffer<f32>,
    /// The loss buffer ([`LOSS_SLOTS`]): `L` is added into [`LossSlot::Iql`], `coef L`
    /// into [`LossSlot::Total`].
    pub losses: &'a mut DeviceBuffer<f32>,
}

/// How [`Kernels::expectile_head`] splits the rows: `(chunks, rows per chunk)`, about 64
/// rows a block of 8 warps, at most 1024 chunks; depends on the sizes only.
pub fn expectile_head_plan(dims: ExpectileHeadDims) -> (usize, usize) {
    warp_row_plan(dims.batch)
}

/// Length of the scratch buffer [`Kernels::expectile_head`] needs.
pub fn expectile_head_scratch_len(dims: ExpectileHeadDims) -> usize {
    let (chunks, _) = expectile_head_plan(dims);
    chunks.saturating_mul(dims.hidden + 2)
}

impl Kernels {
    /// One IQL expectile head, forward and backward, in one pass over `h`: `e = h weᵀ + be`,
    /// the loss `coef · mean_b |τ − 1(u < 0)| u²` with `u = qbar − e` (added into the loss
    /// buffer as [`Kernels::expectile_loss`] does), `de`, and the layer's gradients
    /// `dwe = Σ_b de[b] h[b, ·]`, `dbe = Σ_b de[b]`.
    ///
    /// Two-pass and deterministic: `expectile_head_partial` (one block of 256 per chunk of
    /// rows, [`expectile_head_plan`]) writes `e`, `de` and one partial row per chunk into
    /// `scratch` (at least [`expectile_head_scratch_len`] floats), then
    /// `expectile_head_finish` adds them in order and adds the loss once. Sizes must be
    /// [`ExpectileHeadDims::supported`]. [`expectile_head_reference`](crate::reference::expectile_head_reference) is the CPU version.
    pub fn expectile_head(
        &self,
        stream: &CaptureStream<'_>,
        dims: ExpectileHeadDims,
        inputs: &ExpectileHeadInputs<'_>,
        expectile: Expectile,
        out: ExpectileHeadOutputs<'_>,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let (chunks, rows_per_chunk) = expectile_head_plan(dims);
        self.raw.expectile_head_partial_checked(
            stream,
            inputs.h,
            inputs.we,
            inputs.be,
            inputs.qbar,
            out.e,
            out.de,
            &mut *scratch,
            dims.batch,
            dims.hidden,
            expectile.tau,
            expectile.coef,
            rows_per_chunk,
        )?;
        self.raw.expectile_head_finish_checked(
            stream,
            &*scratch,
            chunks,
            dims.hidden,
            out.dwe,
            out.dbe,
            out.losses,
            dims.batch,
            expectile.coef,
        )
    }
}

/// Most actions of a branch [`Kernels::branch_head_forward`] and
/// [`Kernels::branch_head_backward`] take (`BRANCH_HEAD_MAX_A` in `cuda/heads.cu`).
pub const BRANCH_HEAD_MAX_ACTIONS: usize = 8;

/// Widest GLU [`Kernels::branch_head_forward`] and [`Kernels::branch_head_backward`] take:
/// 32 `BRANCH_HEAD_MAX_UNITS` (`cuda/heads.cu`), two units a lane.
pub const BRANCH_HEAD_MAX_GLU: usize = 64;

/// Sizes of one branch's head: `B` rows, a GLU of width `G` (its input layer has `2G`
/// outputs) and an advantage layer of `A` actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BranchHeadDims {
    /// `B`.
    pub batch: usize,
    /// `G`.
    pub glu: usize,
    /// `A`.
    pub actions: usize,
}

impl BranchHeadDims {
    /// Whether [`Kernels::branch_head_forward`] and [`Kernels::branch_head_backward`] take
    /// these sizes: `1 <= A <=`
    /// [`BRANCH_HEAD_MAX_ACTIONS`] and `1 <= G <=` [`BRANCH_HEAD_MAX_GLU`] (the lanes hold
    /// the advantage weights and sums in registers). Other sizes take the GEMM path.
    pub fn supported(&self) -> bool {
        (1..=BRANCH_HEAD_MAX_ACTIONS).contains(&self.actions)
            && (1..=BRANCH_HEAD_MAX_GLU).contains(&self.glu)
            && self.batch >= 1
    }

    /// Floats of one partial row: `dwa[A, G] | dba[A] | dbg[2G]`.
    fn partial_cols(&self) -> usize {
        self.actions * self.glu + self.actions + 2 * self.glu
    }
}

/// What [`Kernels::branch_head_backward`] reads: the advantage layer's output gradient, the
/// GLU's saved input and output, and the advantage layer's weight.
#[derive(Clone, Copy, Debug)]
pub struct BranchHeadInputs<'a> {
    /// `dadv[B, A]`.
    pub dadv: &'a DeviceBuffer<f32>,
    /// `u[B, 2G]`: the GLU's input (the gate layer's output).
    pub u: &'a DeviceBuffer<f32>,
    /// `g[B, G]`: the GLU's output, the advantage layer's input.
    pub g: &'a DeviceBuffer<f32>,
    /// `wa[A, G]`.
    pub wa: &'a DeviceBuffer<f32>,
}

/// What [`Kernels::branch_head_backward`] writes, each whole (not accumulated).
#[derive(Debug)]
pub struct BranchHeadOutputs<'a> {
    /// `du[B, 2G]`: the gradient at the GLU's input, for the gate layer's GEMMs.
    pub du: &'a mut DeviceBuffer<f32>,
    /// `dwa[A, G]`: the advantage layer's weight gradient.
    pub dwa: &'a mut DeviceBuffer<f32>,
    /// `dba[A]`: its bias gradient.
    pub dba: &'a mut DeviceBuffer<f32>,
    /// `dbg[2G]`: the gate layer's bias gradient, `Σ_b du[b, ·]`.
    pub dbg: &'a mut DeviceBuffer<f32>,
}

/// How [`Kernels::branch_head_backward`] splits the rows: `(chunks, rows per chunk)`, about
/// 64 rows a block of 8 warps (two blocks an SM at the default sizes), at most 1024 chunks;
/// depends on the sizes only, so the sums' bits do too.
pub fn branch_head_backward_plan(dims: BranchHeadDims) -> (usize, usize) {
    warp_row_plan(dims.batch)
}

/// `(chunks, rows per chunk)` for the kernels that give each row to a warp of a block of 8
/// and each block a chunk of about 64 rows: one block covers every column of its rows.
fn warp_row_plan(rows: usize) -> (usize, usize) {
    let (_, chunks, rows_per_chunk) = row_chunk_plan(rows, 32, 64);
    (chunks, rows_per_chunk)
}

/// Length of the scratch buffer [`Kernels::branch_head_backward`] needs.
pub fn branch_head_backward_scratch_len(dims: BranchHeadDims) -> usize {
    let (chunks, _) = branch_head_backward_plan(dims);
    chunks.saturating_mul(dims.partial_cols())
}

impl BranchHeadDims {
    /// [`Kernels::branch_head_forward`] and [`Kernels::branch_head_backward`] refuse sizes
    /// that are not [`BranchHeadDims::supported`], naming them.
    fn check_supported(&self, what: &str) -> Result<()> {
        if self.supported() {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "{what}: expected 1 to {BRANCH_HEAD_MAX_ACTIONS} actions, a GLU of width 1 to \
             {BRANCH_HEAD_MAX_GLU} and a batch of at least 1, found {} actions, width {}, \
             batch {}",
            self.actions, self.glu, self.batch
        )))
    }
}

/// Rows a block of [`Kernels::branch_head_forward`] takes (`BRANCH_HEAD_FORWARD_ROWS`).
const BRANCH_HEAD_FORWARD_ROWS: usize = 64;

impl Kernels {
    /// A branch's head forward in one pass over the rows: the GLU `g = glu(u)`
    /// ([`Kernels::glu_forward`]'s formula) and the advantage layer `adv = g waᵀ + ba`.
    /// `g` is written when given (the backward reads it); the passes over the next state
    /// need only `adv`.
    ///
    /// One warp a row, blocks of 256 threads over 64 rows. Sizes must be
    /// [`BranchHeadDims::supported`]. [`branch_head_forward_reference`](crate::reference::branch_head_forward_reference) is the CPU version.
    #[allow(clippy::too_many_arguments)] // the kernel's operands, one each
    pub fn branch_head_forward(
        &self,
        stream: &CaptureStream<'_>,
        dims: BranchHeadDims,
        u: &DeviceBuffer<f32>,
        wa: &DeviceBuffer<f32>,
        ba: &DeviceBuffer<f32>,
        g: Option<&mut DeviceBuffer<f32>>,
        adv: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        dims.check_supported("branch_head_forward")?;
        let b = positive("branch_head_forward: batch", dims.batch)?;
        let gw = positive("branch_head_forward: glu", dims.glu)?;
        let a = positive("branch_head_forward: actions", dims.actions)?;
        let what = "branch_head_forward";
        let bg = product(what, &[dims.batch, dims.glu])?;
        check_len(
            "branch_head_forward: u ([B, 2G])",
            u.len(),
            product(what, &[bg, 2])?,
        )?;
        check_len(
            "branch_head_forward: wa ([A, G])",
            wa.len(),
            dims.actions * dims.glu,
        )?;
        check_len("branch_head_forward: ba ([A])", ba.len(), dims.actions)?;
        check_len(
            "branch_head_forward: adv ([B, A])",
            adv.len(),
            product(what, &[dims.batch, dims.actions])?,
        )?;
        if let Some(g) = &g {
            check_len("branch_head_forward: g ([B, G])", g.len(), bg)?;
        }
        let blocks = len_u32(
            "branch_head_forward: blocks",
            dims.batch.div_ceil(BRANCH_HEAD_FORWARD_ROWS),
        )?;
        let null: u64 = 0;
        let write_g: u32 = g.is_some().into();
        // A null `g` has no `DeviceBuffer`, so this launch is assembled by hand (and checked
        // against the kernel's parameter list when launched).
        let mut launch = stream.launch(self.kernel(KernelId::BranchHeadForward));
        launch.buf(u).buf(wa).buf(ba);
        match g {
            Some(g) => launch.buf_mut(g),
            None => launch.arg(&null),
        };
        launch.buf_mut(adv).arg(&b).arg(&gw).arg(&a).arg(&write_g);
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `branch_head_forward(const float* u, const float* wa,
        // const float* ba, float* g, float* adv, unsigned B, unsigned G, unsigned A,
        // unsigned write_g)`; block y touches rows [64 y, min(B, 64 y + 64)), units below
        // G and actions below A (within the kernel's register arrays: `supported`, checked
        // above); g is null only with write_g = 0, and the kernel writes it only when
        // write_g != 0. Every buffer holds what its shape says (checked above).
        unsafe { launch.launch(config) }
    }

    /// A branch's head backward in one pass over the rows: the advantage layer
    /// (`dg = dadv wa`, `dwa = dadvᵀ g`, `dba = Σ_b dadv`), the GLU (`du` from `u` and `dg`,
    /// [`Kernels::glu_backward`]'s formula) and the gate layer's bias gradient
    /// `dbg = Σ_b du`. The gate layer's weight and input gradients stay GEMMs over `du`.
    ///
    /// Two-pass and deterministic: `branch_head_backward_partial` (one block of 256 per
    /// chunk of rows, [`branch_head_backward_plan`]) writes `du` and one partial row per
    /// chunk into `scratch` (at least [`branch_head_backward_scratch_len`] floats), then
    /// `branch_head_backward_finish` adds them in order. Sizes must be
    /// [`BranchHeadDims::supported`]. [`branch_head_backward_reference`](crate::reference::branch_head_backward_reference) is the CPU version.
    pub fn branch_head_backward(
        &self,
        stream: &CaptureStream<'_>,
        dims: BranchHeadDims,
        inputs: &BranchHeadInputs<'_>,
        out: BranchHeadOutputs<'_>,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        dims.check_supported("branch_head_backward")?;
        let (chunks, rows_per_chunk) = branch_head_backward_plan(dims);
        self.raw.branch_head_backward_partial_checked(
            stream,
            inputs.dadv,
            inputs.u,
            inputs.g,
            inputs.wa,
            out.du,
            &mut *scratch,
            dims.batch,
            dims.glu,
            dims.actions,
            rows_per_chunk,
        )?;
        self.raw.branch_head_backward_finish_checked(
            stream,
            &*scratch,
            chunks,
            dims.glu,
            dims.actions,
            out.dwa,
            out.dba,
            out.dbg,
        )
    }
}

// ---- cuda/iqn.cu: cosine features, the fused quantile Huber head ----

/// Most blocks of an [`Kernels::iqn_forward_backward`] launch; each writes one partial row
/// of the scratch buffer, so the grid (and the result's bits) depend on the sizes only.
pub const IQN_BLOCKS: u32 = 1024;

/// Warps per block of the vector IQN kernels (`IQN_WARPS` in `cuda/iqn.cu`).
const IQN_WARPS: u32 = 8;

/// Sizes of the IQN head: `B` samples, `N` quantiles, `H` hidden units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IqnDims {
    /// `B`.
    pub batch: usize,
    /// `N`.
    pub quantiles: usize,
    /// `H`.
    pub hidden: usize,
}

impl IqnDims {
    /// Length of the scratch buffer that [`Kernels::iqn_forward_backward`] needs (its
    /// per-block partial sums), or 0 if the sizes are invalid.
    pub fn scratch_len(self) -> usize {
        iqn_plan(self).map_or(0, |plan| plan.scratch_len)
    }
}

/// Which IQN kernel runs, and how.
#[derive(Clone, Copy, Debug)]
struct IqnPlan {
    kernel: KernelId,
    config: LaunchConfig,
    /// Partial rows written (one per block).
    rows: u32,
    scratch_len: usize,
}

fn iqn_plan(dims: IqnDims) -> Result<IqnPlan> {
    let b = positive("iqn_forward_backward: batch", dims.batch)?;
    positive("iqn_forward_backward: quantiles", dims.quantiles)?;
    let h = positive("iqn_forward_backward: hidden", dims.hidden)?;
    len_u32(
        "iqn_forward_backward: phi",
        product(
            "iqn_forward_backward",
            &[dims.batch, dims.quantiles, dims.hidden],
        )?,
    )?;
    let (kernel, blocks, threads, smem) = if h % 4 == 0 && h <= 512 {
        let kernel = if h <= 256 {
            KernelId::IqnForwardBackwardV2
        } else {
            KernelId::IqnForwardBackwardV4
        };
        (
            kernel,
            b.div_ceil(IQN_WARPS).min(IQN_BLOCKS),
            32 * IQN_WARPS,
            0,
        )
    } else {
        let smem = dims.quantiles * 4;
        if smem > MAX_DYNAMIC_SMEM {
            return Err(Error::Invalid(format!(
                "iqn_forward_backward: {} quantiles do not fit the generic kernel's shared \
                 memory (at most {} with H = {h}, which is not a multiple of 4 up to 512)",
                dims.quantiles,
                MAX_DYNAMIC_SMEM / 4
            )));
        }
        (
            KernelId::IqnForwardBackwardGeneric,
            b.min(IQN_BLOCKS),
            32,
            smem as u32,
        )
    };
    // H fits 32 bits (checked above), so 2 H + 2 fits a usize; it may not fit the
    // kernels' 32-bit column count.
    let cols = len_u32(
        "iqn_forward_backward: a partial row (2 H + 2 columns)",
        2 * dims.hidden + 2,
    )?;
    let scratch_len = product(
        "iqn_forward_backward: scratch",
        &[blocks as usize, cols as usize],
    )?;
    Ok(IqnPlan {
        kernel,
        config: LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        },
        rows: blocks,
        scratch_len,
    })
}

/// Inputs of [`Kernels::iqn_forward_backward`].
#[derive(Clone, Copy, Debug)]
pub struct IqnInputs<'a> {
    /// `h[B, H]`: the trunk's output.
    pub h: &'a DeviceBuffer<f32>,
    /// `phi[B N, H]`: `relu(cosf wphiᵀ + bphi)`, from a GEMM.
    pub phi: &'a DeviceBuffer<f32>,
    /// `wq[H]`.
    pub wq: &'a DeviceBuffer<f32>,
    /// `bq[1]`.
    pub bq: &'a DeviceBuffer<f32>,
    /// `ybar[B]`: the mean target ([`Kernels::ddqn_target`]).
    pub ybar: &'a DeviceBuffer<f32>,
    /// `tau[B, N]`: the quantile fractions.
    pub tau: &'a DeviceBuffer<f32>,
}

/// Outputs of [`Kernels::iqn_forward_backward`]; every gradient is of `coef · L_iqn`.
#[derive(Debug)]
pub struct IqnOutputs<'a> {
    /// `dphi_pre[B N, H]`: the gradient of phi's pre-activation (ReLU folded in), for the
    /// GEMM `dwphi = dphi_preᵀ cosf` (written).
    pub dphi_pre: &'a mut DeviceBuffer<f32>,
    /// `dh[B, H]`: the IQN head's part of the trunk's gradient (written, not added).
    pub dh: &'a mut DeviceBuffer<f32>,
    /// `dwq[H]` (written).
    pub dwq: &'a mut DeviceBuffer<f32>,
    /// `dbphi[H]`: column sums of `dphi_pre`, so no bias-gradient pass is needed (written).
    pub dbphi: &'a mut DeviceBuffer<f32>,
    /// `dbq[1]` (written).
    pub dbq: &'a mut DeviceBuffer<f32>,
    /// The loss buffer: [`LossSlot::Iqn`] and [`LossSlot::Total`] are added to.
    pub losses: &'a mut DeviceBuffer<f32>,
}

impl Kernels {
    /// IQN cosine features: `cosf[r, i] = cos(π (i + 1) tau[r])` for the `rows = B N`
    /// entries of `tau` and `i < C = features`; `cosf` is `[B N, C]`.
    ///
    /// One thread per 4 elements (one 16-byte store when `C % 4 == 0`), blocks of
    /// [`BLOCK_THREADS`]. [`iqn_cos_features_reference`](crate::reference::iqn_cos_features_reference) is the CPU version.
    pub fn iqn_cos_features(
        &self,
        stream: &CaptureStream<'_>,
        tau: &DeviceBuffer<f32>,
        cosf: &mut DeviceBuffer<f32>,
        features: usize,
    ) -> Result<()> {
        self.raw
            .iqn_cos_features_checked(stream, tau, cosf, tau.len(), features)
    }

    /// The IQN head, forward and backward, fused: the quantile Huber loss against `ybar`
    /// and every non-GEMM gradient of `coef · L_iqn` ([`IqnOutputs`]; formulas in
    /// `cuda/iqn.cu`). `phi` is read once and `dphi_pre` written once, with 16-byte
    /// accesses when `H % 4 == 0`.
    ///
    /// Two launches: the fused kernel (`H % 4 == 0` and `H <= 512`: `min(ceil(B / 8),
    /// IQN_BLOCKS)` blocks of 256, a warp per sample; otherwise a slower generic kernel,
    /// `min(B, IQN_BLOCKS)` blocks of 32), which writes one partial row per block into
    /// `scratch` (at least [`IqnDims::scratch_len`] floats, not shared with an op that may
    /// run at the same time); then `iqn_finish`, `ceil((2H + 2) / 32)` blocks of 32 × 32,
    /// which adds the rows in order. Deterministic, the loss slot included (one add).
    /// [`iqn_forward_backward_reference`](crate::reference::iqn_forward_backward_reference) is the CPU version.
    pub fn iqn_forward_backward(
        &self,
        stream: &CaptureStream<'_>,
        dims: IqnDims,
        inputs: &IqnInputs<'_>,
        coef: f32,
        out: IqnOutputs<'_>,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let plan = iqn_plan(dims)?;
        let (b, n, h) = (dims.batch as u32, dims.quantiles as u32, dims.hidden as u32);
        let bh = product("iqn_forward_backward", &[dims.batch, dims.hidden])?;
        let bn = product("iqn_forward_backward", &[dims.batch, dims.quantiles])?;
        let bnh = product("iqn_forward_backward", &[bn, dims.hidden])?;
        check_len("iqn_forward_backward: h ([B, H])", inputs.h.len(), bh)?;
        check_len(
            "iqn_forward_backward: phi ([B N, H])",
            inputs.phi.len(),
            bnh,
        )?;
        check_len(
            "iqn_forward_backward: wq ([H])",
            inputs.wq.len(),
            dims.hidden,
        )?;
        check_len("iqn_forward_backward: bq ([1])", inputs.bq.len(), 1)?;
        check_len(
            "iqn_forward_backward: ybar ([B])",
            inputs.ybar.len(),
            dims.batch,
        )?;
        check_len("iqn_forward_backward: tau ([B, N])", inputs.tau.len(), bn)?;
        check_len(
            "iqn_forward_backward: dphi_pre ([B N, H])",
            out.dphi_pre.len(),
            bnh,
        )?;
        check_len("iqn_forward_backward: dh ([B, H])", out.dh.len(), bh)?;
        check_len(
            "iqn_forward_backward: dwq ([H])",
            out.dwq.len(),
            dims.hidden,
        )?;
        check_len(
            "iqn_forward_backward: dbphi ([H])",
            out.dbphi.len(),
            dims.hidden,
        )?;
        check_len("iqn_forward_backward: dbq ([1])", out.dbq.len(), 1)?;
        check_losses("iqn_forward_backward: losses", out.losses)?;
        check_scratch(
            "iqn_forward_backward: scratch (at least IqnDims::scratch_len)",
            scratch.len(),
            plan.scratch_len,
        )?;
        // The three kernels take the same parameters; the plan picks one by H.
        let launcher = match plan.kernel {
            KernelId::IqnForwardBackwardV2 => raw::Kernels::iqn_forward_backward_v2,
            KernelId::IqnForwardBackwardV4 => raw::Kernels::iqn_forward_backward_v4,
            KernelId::IqnForwardBackwardGeneric => raw::Kernels::iqn_forward_backward_generic,
            other => {
                return Err(Error::Invalid(format!(
                    "iqn_forward_backward: the plan picked {other:?}, which is not one of its \
                     kernels"
                )));
            }
        };
        // SAFETY: the plan picks v2/v4 only for H % 4 == 0 and H <= 128 VPL (the columns the
        // lanes own), warps stop at b >= B, every buffer holds what its shape says, scratch
        // holds gridDim.x rows of 2H + 2 (checked above), and the generic kernel gets N
        // floats of dynamic shared memory.
        unsafe {
            launcher(
                &self.raw,
                stream,
                plan.config,
                inputs.h,
                inputs.phi,
                inputs.wq,
                inputs.bq,
                inputs.ybar,
                inputs.tau,
                &mut *out.dphi_pre,
                &mut *out.dh,
                &mut *scratch,
                b,
                n,
                h,
                coef,
            )?
        };
        self.raw.iqn_finish_checked(
            stream,
            &*scratch,
            plan.rows as usize,
            dims.hidden,
            out.dwq,
            out.dbphi,
            out.dbq,
            out.losses,
            b,
            n,
            coef,
        )
    }
}

// ---- cuda/iqn.cu: the whole IQN head in one kernel ----

/// The SMs of an H100 SXM and of an H200: the whole GPU, as a persistent head's `sms`
/// ([`IqnFusedDims::sms`], [`AttnFusedDims::sms`]) counts it. A constant rather than the
/// device's SM count, so that the grid, the order of the sums and the result's bits depend
/// on the sizes only (and are the same on both GPUs).
pub const PERSISTENT_SMS: u32 = 132;

/// The check every persistent head's plan makes of its `sms`.
fn at_least_one_sm(kernel: &str, sms: u32) -> Result<()> {
    if sms == 0 {
        return Err(Error::Invalid(format!(
            "{kernel}: expected sms of at least 1 (the SMs its grid may hold; \
             {PERSISTENT_SMS} is the whole GPU), found 0"
        )));
    }
    Ok(())
}

/// Most warps in a block of [`Kernels::iqn_fused`] (`IQN_FUSED_MAX_WARPS` in
/// `cuda/iqn.cu`); each owns 16 hidden units.
const IQN_FUSED_MAX_WARPS: u32 = 16;

/// Most hidden units `H` that [`Kernels::iqn_fused`] takes.
pub const IQN_FUSED_MAX_HIDDEN: usize = 16 * IQN_FUSED_MAX_WARPS as usize;

/// Most cosine features `C` that [`Kernels::iqn_fused`] takes (`IQN_FUSED_C` in
/// `cuda/iqn.cu`: the kernel computes with 64, zero-padded).
pub const IQN_FUSED_MAX_COSINES: usize = 64;

/// Waves of [`IqnFusedDims::sms`] SMs' blocks in a [`Kernels::iqn_fused`] launch. One: each
/// block loads its slice of `wphi` once and writes one partial row (66 KB at `H = 256`) that
/// `iqn_fused_finish` reads back. More waves of shorter blocks cost a partial row each but
/// let the hardware balance the work when other kernels hold some SMs (a persistent block
/// that starts late finishes late). Measured in the step, the cost won for both IQN
/// kernels: 2 and 4 waves of `iqn_fused` and 2 to 4 of `iqn_wgmma` were slower than one
/// (PERF.md, "Tried and dropped").
const IQN_FUSED_WAVES: u32 = 1;

/// Blocks of [`Kernels::iqn_fused`] that share an SM when `H` is small enough for their
/// registers to allow more than one: each takes 37 KB of static shared memory, and an SM has
/// 228 KB.
const IQN_FUSED_SMEM_BLOCKS_PER_SM: u32 = 5;

/// The target of `cuda/iqn.cu`'s image that has `iqn_wgmma` (build.rs asks for it).
pub const WGMMA_TARGET: &str = "sm_90a";

/// Dynamic shared memory of an `iqn_wgmma` block (`IQN_WG_SMEM` in `cuda/iqn.cu`): 1 KB of
/// alignment slack, `wphi` (64 KB) and two tiles of `cosf` in each of two layouts
/// (4 x 16 KB).
pub const IQN_WGMMA_SHARED_BYTES: u32 = 1024 + 65536 + 4 * 16384;

/// The sizes `iqn_wgmma` is written for (`IQN_WG_N`, `IQN_WG_C`, `IQN_WG_H`): quantiles,
/// cosine features, hidden units. Its tiles are two samples of 32 quantiles, and each of
/// its two warpgroups owns 128 hidden units.
pub const IQN_WGMMA_SIZES: (usize, usize, usize) = (32, 64, 256);

/// Which kernel computes the fused IQN head ([`Kernels::iqn_fused`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, stepgraph::ConfigValue)]
pub enum IqnFusedKernel {
    /// `iqn_wgmma`: both products on Hopper's warpgroup MMA (wgmma), at
    /// [`IQN_WGMMA_SIZES`] only, and only where [`Kernels::has_wgmma`].
    Wgmma,
    /// `iqn_fused`: `mma.sync` tiles, any sizes [`IqnFusedDims::supported`] accepts.
    MmaSync,
}

/// Sizes of the whole IQN head: `B` samples, `N` quantiles, `H` hidden units, `C` cosine
/// features.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IqnFusedDims {
    /// `B`.
    pub batch: usize,
    /// `N`.
    pub quantiles: usize,
    /// `H`.
    pub hidden: usize,
    /// `C`.
    pub cosines: usize,
    /// The SMs the head's grid may hold, at least 1: `iqn_wgmma` launches at most this many
    /// persistent blocks (one an SM), `iqn_fused` this many times the blocks an SM holds.
    /// With the batch it fixes the grid, the order of the sums and so the result's bits.
    /// [`PERSISTENT_SMS`] is the whole GPU; a step that runs the head beside other work can
    /// leave that work SMs of its own (`model::IQN_HEAD_SMS`).
    pub sms: u32,
}

impl IqnFusedDims {
    /// Whether [`Kernels::iqn_fused`] takes these sizes: each at least 1, `H` at most
    /// [`IQN_FUSED_MAX_HIDDEN`], `C` at most [`IQN_FUSED_MAX_COSINES`], and `B N`, `B H`
    /// within the kernels' 32-bit indices. Otherwise use the unfused path
    /// ([`Kernels::iqn_cos_features`], the two GEMMs and [`Kernels::iqn_forward_backward`]).
    pub fn supported(self) -> bool {
        iqn_fused_plan(self).is_ok()
    }

    /// Length of the scratch buffer that [`Kernels::iqn_fused`] needs (a partial row of
    /// `2H + 2 + H C` floats per block), or 0 if the sizes are not supported.
    pub fn scratch_len(self) -> usize {
        iqn_fused_plan(self).map_or(0, |plan| plan.scratch_len)
    }

    /// Whether `iqn_wgmma` takes these sizes: `(N, C, H)` equal to [`IQN_WGMMA_SIZES`],
    /// and the sizes [`IqnFusedDims::supported`]. Where it does not, or where the GPU did
    /// not load its image, [`Kernels::iqn_fused`] runs `iqn_fused`.
    pub fn wgmma_takes(self) -> bool {
        (self.quantiles, self.cosines, self.hidden) == IQN_WGMMA_SIZES && self.supported()
    }

    /// The sizes without `C`, as the unfused path takes them.
    pub fn unfused(self) -> IqnDims {
        IqnDims {
            batch: self.batch,
            quantiles: self.quantiles,
            hidden: self.hidden,
        }
    }
}

/// How [`Kernels::iqn_fused`] launches.
#[derive(Clone, Copy, Debug)]
struct IqnFusedPlan {
    config: LaunchConfig,
    /// Partial rows written (one per block of `config`).
    rows: u32,
    scratch_len: usize,
}

fn iqn_fused_plan(dims: IqnFusedDims) -> Result<IqnFusedPlan> {
    let b = positive("iqn_fused: batch", dims.batch)?;
    positive("iqn_fused: quantiles", dims.quantiles)?;
    let h = positive("iqn_fused: hidden", dims.hidden)?;
    positive("iqn_fused: cosines", dims.cosines)?;
    // Each warp keeps its 16 units' rows of wphi and of dwphi in registers, and a block has
    // at most IQN_FUSED_MAX_WARPS warps: a larger H has no warp to hold its units.
    if dims.hidden > IQN_FUSED_MAX_HIDDEN {
        return Err(Error::Invalid(format!(
            "iqn_fused: expected at most {IQN_FUSED_MAX_HIDDEN} hidden units (16 per warp, \
             {IQN_FUSED_MAX_WARPS} warps), found H = {}; use the unfused IQN path",
            dims.hidden
        )));
    }
    // The register fragments cover 64 features; more would be silently dropped.
    if dims.cosines > IQN_FUSED_MAX_COSINES {
        return Err(Error::Invalid(format!(
            "iqn_fused: expected at most {IQN_FUSED_MAX_COSINES} cosine features, found C = {}; \
             use the unfused IQN path",
            dims.cosines
        )));
    }
    len_u32(
        "iqn_fused: tau ([B, N])",
        product("iqn_fused: tau", &[dims.batch, dims.quantiles])?,
    )?;
    len_u32(
        "iqn_fused: h ([B, H])",
        product("iqn_fused: h", &[dims.batch, dims.hidden])?,
    )?;
    let row_len = iqn_partial_row_len(dims);
    let warps = h.div_ceil(16);
    let per_sm = (IQN_FUSED_MAX_WARPS / warps).min(IQN_FUSED_SMEM_BLOCKS_PER_SM);
    at_least_one_sm("iqn_fused", dims.sms)?;
    let blocks = b.min(dims.sms.saturating_mul(per_sm * IQN_FUSED_WAVES));
    let scratch_len = product("iqn_fused: scratch", &[blocks as usize, row_len])?;
    len_u32("iqn_fused: scratch", scratch_len)?;
    Ok(IqnFusedPlan {
        config: LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (32 * warps, 1, 1),
            shared_mem_bytes: 0,
        },
        rows: blocks,
        scratch_len,
    })
}

/// Floats in one block's partial row of either fused IQN kernel, `[dwq (H) | dbphi (H) | dbq
/// | loss | dwphi (H C)]`. For sizes the plans admit (at most 2 · 256 + 2 + 256 · 64): no
/// overflow.
fn iqn_partial_row_len(dims: IqnFusedDims) -> usize {
    2 * dims.hidden + 2 + dims.hidden * dims.cosines
}

/// How `iqn_wgmma` launches: `min(ceil(B / 2), sms)` persistent blocks of 256
/// threads (two warpgroups), each with at least one tile of two samples, each writing one
/// partial row as `iqn_fused` does.
fn iqn_wgmma_plan(dims: IqnFusedDims) -> Result<IqnFusedPlan> {
    // Sizes neither kernel takes (a batch of 0, B N past 32 bits) get iqn_fused's error,
    // which names them.
    iqn_fused_plan(dims)?;
    if !dims.wgmma_takes() {
        let (n, c, h) = IQN_WGMMA_SIZES;
        return Err(Error::Invalid(format!(
            "iqn_wgmma: expected N = {n} quantiles, C = {c} cosine features and H = {h} \
             hidden units, found N = {}, C = {}, H = {}; use IqnFusedKernel::MmaSync",
            dims.quantiles, dims.cosines, dims.hidden
        )));
    }
    // B N fits 32 bits (supported), so ceil(B / 2) does too.
    let blocks = (dims.batch.div_ceil(2) as u32).min(dims.sms);
    Ok(IqnFusedPlan {
        config: LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: IQN_WGMMA_SHARED_BYTES,
        },
        rows: blocks,
        // Never more rows than iqn_fused's plan (min(B, sms) blocks at H = 256), so the
        // scratch that IqnFusedDims::scratch_len asks for serves both kernels.
        scratch_len: blocks as usize * iqn_partial_row_len(dims),
    })
}

/// Inputs of [`Kernels::iqn_fused`].
#[derive(Clone, Copy, Debug)]
pub struct IqnFusedInputs<'a> {
    /// `h[B, H]`: the trunk's output.
    pub h: &'a DeviceBuffer<f32>,
    /// `tau[B, N]`: the quantile fractions.
    pub tau: &'a DeviceBuffer<f32>,
    /// `ybar[B]`: the mean target ([`Kernels::ddqn_target`]).
    pub ybar: &'a DeviceBuffer<f32>,
    /// `wphi[H, C]`.
    pub wphi: &'a DeviceBuffer<f32>,
    /// `bphi[H]`.
    pub bphi: &'a DeviceBuffer<f32>,
    /// `wq[H]`.
    pub wq: &'a DeviceBuffer<f32>,
    /// `bq[1]`.
    pub bq: &'a DeviceBuffer<f32>,
}

/// Outputs of [`Kernels::iqn_fused`]; every gradient is of `coef · L_iqn`, and each is
/// written, not added.
#[derive(Debug)]
pub struct IqnFusedOutputs<'a> {
    /// `dh[B, H]`: the IQN head's part of the trunk's gradient.
    pub dh: &'a mut DeviceBuffer<f32>,
    /// `dwphi[H, C]`.
    pub dwphi: &'a mut DeviceBuffer<f32>,
    /// `dbphi[H]`.
    pub dbphi: &'a mut DeviceBuffer<f32>,
    /// `dwq[H]`.
    pub dwq: &'a mut DeviceBuffer<f32>,
    /// `dbq[1]`.
    pub dbq: &'a mut DeviceBuffer<f32>,
    /// The loss buffer: [`LossSlot::Iqn`] and [`LossSlot::Total`] are added to.
    pub losses: &'a mut DeviceBuffer<f32>,
}

impl Kernels {
    /// The whole IQN head, forward and backward, in one pass: the cosine features, `phi =
    /// relu(cosf wphiᵀ + bphi)`, the quantile Huber loss against `ybar`, and every gradient
    /// of `coef · L_iqn` ([`IqnFusedOutputs`]). Computes what [`Kernels::iqn_cos_features`],
    /// the `phi` GEMM, [`Kernels::iqn_forward_backward`] and the `dwphi` GEMM compute, without
    /// writing `cosf`, `phi` or `dphi_pre`; both products run on the tensor cores in TF32
    /// (operands rounded to nearest), the precision of the cuBLASLt GEMMs it replaces.
    ///
    /// Takes the sizes [`IqnFusedDims::supported`] accepts (`H <= 256`, `C <= 64`, any `N`
    /// and `B`) and fails with [`Error::Invalid`] on others. Runs the kernel that
    /// [`Kernels::iqn_fused_kernel`] picks, then `iqn_fused_finish`, `ceil((2H + 2 + H C) /
    /// 32)` blocks of 32 × 32, which adds the kernel's partial rows (one per block, in
    /// `scratch`: at least [`IqnFusedDims::scratch_len`] floats, not shared with an op that
    /// may run at the same time) in order. Deterministic for given sizes and kernel, the
    /// loss slot included (one add). [`iqn_fused_reference`](crate::reference::iqn_fused_reference)
    /// is the CPU version.
    pub fn iqn_fused(
        &self,
        stream: &CaptureStream<'_>,
        dims: IqnFusedDims,
        inputs: &IqnFusedInputs<'_>,
        coef: f32,
        out: IqnFusedOutputs<'_>,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let kernel = self.iqn_fused_kernel(dims);
        self.iqn_fused_with(kernel, stream, dims, inputs, coef, out, scratch)
    }

    /// The kernel [`Kernels::iqn_fused`] runs for `dims`: [`IqnFusedKernel::Wgmma`] where
    /// [`IqnFusedDims::wgmma_takes`] the sizes and [`Kernels::has_wgmma`], otherwise
    /// [`IqnFusedKernel::MmaSync`].
    pub fn iqn_fused_kernel(&self, dims: IqnFusedDims) -> IqnFusedKernel {
        if self.wgmma && dims.wgmma_takes() {
            IqnFusedKernel::Wgmma
        } else {
            IqnFusedKernel::MmaSync
        }
    }

    /// [`Kernels::iqn_fused`] with the kernel chosen by the caller (to compare the two):
    /// `iqn_fused`, `min(B, sms × blocks per SM)` blocks of `32 ceil(H / 16)`
    /// threads, or `iqn_wgmma`, `min(ceil(B / 2), sms)` persistent blocks of
    /// two warpgroups. [`IqnFusedKernel::Wgmma`] fails with [`Error::Invalid`] where the
    /// sizes are not [`IQN_WGMMA_SIZES`] or the GPU did not load its image.
    #[allow(clippy::too_many_arguments)]
    pub fn iqn_fused_with(
        &self,
        kernel: IqnFusedKernel,
        stream: &CaptureStream<'_>,
        dims: IqnFusedDims,
        inputs: &IqnFusedInputs<'_>,
        coef: f32,
        out: IqnFusedOutputs<'_>,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        if kernel == IqnFusedKernel::Wgmma && !self.wgmma {
            return Err(Error::Invalid(format!(
                "iqn_wgmma: expected the {WGMMA_TARGET} image of cuda/iqn.cu, but the driver \
                 loaded {}; use IqnFusedKernel::MmaSync",
                self.raw
                    .module(ModuleId::Iqn)
                    .image()
                    .map_or("an image from bytes", |image| image.target)
            )));
        }
        let plan = match kernel {
            IqnFusedKernel::Wgmma => iqn_wgmma_plan(dims)?,
            IqnFusedKernel::MmaSync => iqn_fused_plan(dims)?,
        };
        let (b, n) = (dims.batch as u32, dims.quantiles as u32);
        let (h, c) = (dims.hidden as u32, dims.cosines as u32);
        let bh = product("iqn_fused", &[dims.batch, dims.hidden])?;
        let bn = product("iqn_fused", &[dims.batch, dims.quantiles])?;
        let hc = product("iqn_fused", &[dims.hidden, dims.cosines])?;
        check_len("iqn_fused: h ([B, H])", inputs.h.len(), bh)?;
        check_len("iqn_fused: tau ([B, N])", inputs.tau.len(), bn)?;
        check_len("iqn_fused: ybar ([B])", inputs.ybar.len(), dims.batch)?;
        check_len("iqn_fused: wphi ([H, C])", inputs.wphi.len(), hc)?;
        check_len("iqn_fused: bphi ([H])", inputs.bphi.len(), dims.hidden)?;
        check_len("iqn_fused: wq ([H])", inputs.wq.len(), dims.hidden)?;
        check_len("iqn_fused: bq ([1])", inputs.bq.len(), 1)?;
        check_len("iqn_fused: dh ([B, H])", out.dh.len(), bh)?;
        check_len("iqn_fused: dwphi ([H, C])", out.dwphi.len(), hc)?;
        check_len("iqn_fused: dbphi ([H])", out.dbphi.len(), dims.hidden)?;
        check_len("iqn_fused: dwq ([H])", out.dwq.len(), dims.hidden)?;
        check_len("iqn_fused: dbq ([1])", out.dbq.len(), 1)?;
        check_losses("iqn_fused: losses", out.losses)?;
        check_scratch(
            "iqn_fused: scratch (at least IqnFusedDims::scratch_len)",
            scratch.len(),
            plan.scratch_len,
        )?;
        match kernel {
            IqnFusedKernel::Wgmma => {
                // SAFETY: the plan admits only N = 32, C = 64, H = 256 (the kernel's
                // constants) with at most ceil(B / 2) blocks of 256 threads and the shared
                // memory that Kernels::load opted it in to (has_wgmma, checked above); the
                // kernel reads tau and h rows of samples < B only, writes dh[b < B] and
                // gridDim.x rows of 2H + 2 + H C of scratch (checked above).
                unsafe {
                    self.raw.iqn_wgmma(
                        stream,
                        plan.config,
                        inputs.h,
                        inputs.tau,
                        inputs.ybar,
                        inputs.wphi,
                        inputs.bphi,
                        inputs.wq,
                        inputs.bq,
                        &mut *out.dh,
                        &mut *scratch,
                        b,
                        coef,
                    )?
                };
            }
            IqnFusedKernel::MmaSync => {
                // SAFETY: the plan admits only H <= 16 x IQN_FUSED_MAX_WARPS with ceil(H / 16)
                // warps per block (each warp's units below 16 warps) and C <= IQN_FUSED_C, the
                // kernel reads and writes units < H, features < C, quantiles < N and samples <
                // B only, every buffer holds what its shape says, and scratch holds gridDim.x
                // rows of 2H + 2 + H C (checked above).
                unsafe {
                    self.raw.iqn_fused(
                        stream,
                        plan.config,
                        inputs.h,
                        inputs.tau,
                        inputs.ybar,
                        inputs.wphi,
                        inputs.bphi,
                        inputs.wq,
                        inputs.bq,
                        &mut *out.dh,
                        &mut *scratch,
                        b,
                        n,
                        h,
                        c,
                        coef,
                    )?
                };
            }
        }
        self.raw.iqn_fused_finish_checked(
            stream,
            &*scratch,
            plan.rows as usize,
            dims.hidden,
            dims.cosines,
            out.dwphi,
            out.dwq,
            out.dbphi,
            out.dbq,
            out.losses,
            b,
            n,
            coef,
        )
    }
}

// ---- cuda/attention.cu: window self-attention and the pooled reward head ----

/// Most samples a block of the attention kernels' block path stages in shared memory.
const ATTENTION_MAX_SAMPLES_PER_BLOCK: usize = 4;

/// The head width the attention kernels' warp path handles (`ATT_DH` in
/// `cuda/attention.cu`): a lane keeps one row's head slice in registers.
const ATTENTION_WARP_HEAD_WIDTH: usize = 16;

/// The longest window the warp path handles (`ATT_WMAX`): a lane keeps a row of scores in
/// registers.
const ATTENTION_WARP_MAX_WINDOW: usize = 8;

/// Most warps (one sample each) in a block of the warp path (`ATT_MAX_WARPS`).
const ATTENTION_WARP_MAX_WARPS: usize = 4;

/// Sizes of the window attention: `B` samples, `W` window rows, width `E`, `heads` heads
/// of `E / heads`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// `B`.
    pub batch: usize,
    /// `W`.
    pub window: usize,
    /// `E`.
    pub width: usize,
    /// `Hh`.
    pub heads: usize,
}

impl AttentionDims {
    /// `E / Hh`, each head's width.
    pub fn head_width(self) -> usize {
        self.width / self.heads.max(1)
    }

    /// The scores' scale, `1 / sqrt(E / Hh)`.
    pub fn scale(self) -> f32 {
        (1.0 / (self.head_width() as f64).sqrt()) as f32
    }
}

/// How an attention kernel splits the batch (see `cuda/attention.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AttentionPath {
    /// A warp per sample, its rows in the warp's own slice of shared memory and each lane's
    /// row slice in registers; blocks of up to [`ATTENTION_WARP_MAX_WARPS`] warps. For
    /// `E / Hh == 16` and `W <= 8`.
    WarpPerSample,
    /// Up to [`ATTENTION_MAX_SAMPLES_PER_BLOCK`] samples per block of 256 threads, staged in
    /// shared memory, with block barriers between the phases. Any other size.
    BlockOfSamples,
}

/// How the attention kernels lay out shared memory and their grid.
#[derive(Clone, Copy, Debug)]
struct AttentionPlan {
    path: AttentionPath,
    /// Samples per block (on the warp path, warps per block).
    spb: u32,
    /// Shared-memory row strides of qkv and datt rows.
    ld: u32,
    lda: u32,
    config: LaunchConfig,
}

/// A shared-memory row stride for rows of `cols` floats: 16-byte aligned and 4 banks apart
/// when `cols % 4 == 0` (see `cuda/attention.cu`), else one bank apart.
fn padded_stride(cols: usize) -> usize {
    if cols.is_multiple_of(4) {
        cols + 4
    } else {
        cols + 1
    }
}

fn attention_plan(dims: AttentionDims, backward: bool) -> Result<AttentionPlan> {
    let what = if backward {
        "attention_backward"
    } else {
        "attention_forward"
    };
    positive(&format!("{what}: batch"), dims.batch)?;
    positive(&format!("{what}: window"), dims.window)?;
    positive(&format!("{what}: width"), dims.width)?;
    positive(&format!("{what}: heads"), dims.heads)?;
    if !dims.width.is_multiple_of(dims.heads) {
        return Err(Error::Invalid(format!(
            "{what}: width {} is not a multiple of heads {}",
            dims.width, dims.heads
        )));
    }
    len_u32(
        what,
        product(what, &[dims.batch, dims.window, 3 * dims.width])?,
    )?;
    let ld = padded_stride(3 * dims.width);
    let lda = padded_stride(dims.width);
    if dims.head_width() == ATTENTION_WARP_HEAD_WIDTH && dims.window <= ATTENTION_WARP_MAX_WINDOW {
        // Per warp: the qkv tile, and for the backward the datt tile and the (P, dS)
        // exchange of W Hh (W + 1) float2, rounded up to whole 16-byte chunks.
        let tiles = product(what, &[dims.window, if backward { ld + lda } else { ld }])?;
        let exchange = if backward {
            4 * product(what, &[dims.window, dims.heads, dims.window + 1])?.div_ceil(2)
        } else {
            0
        };
        let per_warp = (tiles + exchange) * 4;
        let warps = (MAX_DYNAMIC_SMEM / per_warp).min(ATTENTION_WARP_MAX_WARPS);
        // A width too large for one warp's tile in shared memory takes the block path,
        // which then reports that a sample does not fit.
        if warps > 0 {
            return Ok(AttentionPlan {
                path: AttentionPath::WarpPerSample,
                spb: warps as u32,
                ld: ld as u32,
                lda: lda as u32,
                config: LaunchConfig {
                    grid_dim: (len_u32(what, dims.batch.div_ceil(warps))?, 1, 1),
                    block_dim: (32 * warps as u32, 1, 1),
                    shared_mem_bytes: (warps * per_warp) as u32,
                },
            });
        }
    }
    let scores = product(what, &[dims.heads, dims.window, dims.window])?;
    let per_sample = if backward {
        dims.window * (ld + lda) + 2 * scores
    } else {
        dims.window * ld + scores
    } * 4;
    let spb = (MAX_DYNAMIC_SMEM / per_sample).min(ATTENTION_MAX_SAMPLES_PER_BLOCK);
    if spb == 0 {
        return Err(Error::Invalid(format!(
            "{what}: one sample needs {per_sample} bytes of shared memory (W = {}, E = {}, \
             heads = {}); at most {MAX_DYNAMIC_SMEM} fit",
            dims.window, dims.width, dims.heads
        )));
    }
    let blocks = dims.batch.div_ceil(spb);
    Ok(AttentionPlan {
        path: AttentionPath::BlockOfSamples,
        spb: spb as u32,
        ld: ld as u32,
        lda: lda as u32,
        config: LaunchConfig {
            grid_dim: (len_u32(what, blocks)?, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: (spb * per_sample) as u32,
        },
    })
}

/// Most blocks (one warp each) of an [`Kernels::attn_pool_loss`] launch; each writes one
/// partial row of the scratch buffer.
pub const ATTN_POOL_BLOCKS: u32 = 2048;

/// Sizes of the pooled reward head: `B` samples, `W` window rows, width `E`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnPoolDims {
    /// `B`.
    pub batch: usize,
    /// `W`.
    pub window: usize,
    /// `E`.
    pub width: usize,
}

impl AttnPoolDims {
    /// Length of the scratch buffer that [`Kernels::attn_pool_loss`] needs; `usize::MAX`
    /// for sizes whose scratch does not fit (which `attn_pool_loss` refuses).
    pub fn scratch_len(self) -> usize {
        (self.blocks() as usize).saturating_mul(self.width.saturating_add(2))
    }

    /// Columns of a partial row, `E + 2`: what the finish kernel adds up.
    fn cols(self) -> Result<u32> {
        let e = positive("attn_pool_loss: width", self.width)?;
        // The width fits 32 bits, and E + 2 need not.
        len_u32(
            "attn_pool_loss: a partial row (E + 2 columns)",
            e as usize + 2,
        )
    }

    fn blocks(self) -> u32 {
        u32::try_from(self.batch)
            .unwrap_or(u32::MAX)
            .clamp(1, ATTN_POOL_BLOCKS)
    }
}

/// Inputs of [`Kernels::attn_pool_loss`].
#[derive(Clone, Copy, Debug)]
pub struct AttnPoolInputs<'a> {
    /// `o[B W, E]`: the attention block's output.
    pub o: &'a DeviceBuffer<f32>,
    /// `wp[E]`.
    pub wp: &'a DeviceBuffer<f32>,
    /// `bp[1]`.
    pub bp: &'a DeviceBuffer<f32>,
    /// `r[B]`: the reward to predict.
    pub r: &'a DeviceBuffer<f32>,
}

/// Outputs of [`Kernels::attn_pool_loss`]; every gradient is of `coef · L_attn`.
#[derive(Debug)]
pub struct AttnPoolOutputs<'a> {
    /// `pred[B]` (written).
    pub pred: &'a mut DeviceBuffer<f32>,
    /// `d_o[B W, E]` (written).
    pub d_o: &'a mut DeviceBuffer<f32>,
    /// `dwp[E]` (written).
    pub dwp: &'a mut DeviceBuffer<f32>,
    /// `dbp[1]` (written).
    pub dbp: &'a mut DeviceBuffer<f32>,
    /// The loss buffer: [`LossSlot::Attn`] and [`LossSlot::Total`] are added to.
    pub losses: &'a mut DeviceBuffer<f32>,
}

impl Kernels {
    /// Window self-attention, forward: `att[B W, E]` and the softmax weights
    /// `probs[B, Hh, W, W]` (saved for the backward) from `qkv[B W, 3E]` (formulas in
    /// `cuda/attention.cu`).
    ///
    /// Two paths, picked from the sizes, that give the same bits:
    /// - `E / Hh == 16` and `W <= 8` (the step's sizes): a warp per sample, blocks of up to
    ///   4 warps (as many as fit 48 KB of shared memory, `W (3E + 4)` floats a warp),
    ///   `ceil(B / warps)` blocks; no block barrier.
    /// - Otherwise a block of 256 threads takes up to 4 whole samples (as many as fit 48 KB
    ///   of shared memory); `ceil(B / samples per block)` blocks.
    ///
    /// [`attention_forward_reference`](crate::reference::attention_forward_reference) is the CPU version.
    pub fn attention_forward(
        &self,
        stream: &CaptureStream<'_>,
        dims: AttentionDims,
        qkv: &DeviceBuffer<f32>,
        att: &mut DeviceBuffer<f32>,
        probs: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let plan = attention_plan(dims, false)?;
        let rows = product("attention_forward", &[dims.batch, dims.window])?;
        check_len(
            "attention_forward: qkv ([B W, 3E])",
            qkv.len(),
            product("attention_forward", &[rows, 3 * dims.width])?,
        )?;
        check_len(
            "attention_forward: att ([B W, E])",
            att.len(),
            product("attention_forward", &[rows, dims.width])?,
        )?;
        check_len(
            "attention_forward: probs ([B, Hh, W, W])",
            probs.len(),
            product(
                "attention_forward",
                &[dims.batch, dims.heads, dims.window, dims.window],
            )?,
        )?;
        let (b, w, e, hh) = (
            dims.batch as u32,
            dims.window as u32,
            dims.width as u32,
            dims.heads as u32,
        );
        let scale = dims.scale();
        let warp_path = u32::from(plan.path == AttentionPath::WarpPerSample);
        // SAFETY: block x touches samples [x spb, min(B, x spb + spb)) of buffers sized by
        // B, W, E, heads (checked above). Its dynamic shared memory is what the path lays
        // out: on the warp path (E / heads == 16, W <= 8, ld = 3E + 4, 32 spb threads) spb
        // W ld floats, else (spb W ld + spb heads W W) floats.
        unsafe {
            self.raw.attention_forward(
                stream,
                plan.config,
                qkv,
                att,
                probs,
                b,
                w,
                e,
                hh,
                plan.spb,
                plan.ld,
                warp_path,
                scale,
            )
        }
    }

    /// Window self-attention, backward: `dqkv[B W, 3E]` from `qkv`, the saved `probs` and
    /// `datt[B W, E]`. The same two paths as [`Kernels::attention_forward`], with more
    /// shared memory a sample: on the warp path `W (3E + 4) + W (E + 4) + 2 W Hh (W + 1)`
    /// floats a warp, rounded up to 16 bytes (4 warps a block at the step's sizes).
    /// [`attention_backward_reference`](crate::reference::attention_backward_reference) is the CPU version.
    pub fn attention_backward(
        &self,
        stream: &CaptureStream<'_>,
        dims: AttentionDims,
        qkv: &DeviceBuffer<f32>,
        probs: &DeviceBuffer<f32>,
        datt: &DeviceBuffer<f32>,
        dqkv: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let plan = attention_plan(dims, true)?;
        let rows = product("attention_backward", &[dims.batch, dims.window])?;
        let qkv_len = product("attention_backward", &[rows, 3 * dims.width])?;
        check_len("attention_backward: qkv ([B W, 3E])", qkv.len(), qkv_len)?;
        check_len(
            "attention_backward: probs ([B, Hh, W, W])",
            probs.len(),
            product(
                "attention_backward",
                &[dims.batch, dims.heads, dims.window, dims.window],
            )?,
        )?;
        check_len(
            "attention_backward: datt ([B W, E])",
            datt.len(),
            product("attention_backward", &[rows, dims.width])?,
        )?;
        check_len("attention_backward: dqkv ([B W, 3E])", dqkv.len(), qkv_len)?;
        let (b, w, e, hh) = (
            dims.batch as u32,
            dims.window as u32,
            dims.width as u32,
            dims.heads as u32,
        );
        let scale = dims.scale();
        let warp_path = u32::from(plan.path == AttentionPath::WarpPerSample);
        // SAFETY: block x touches samples [x spb, min(B, x spb + spb)) of buffers sized by
        // B, W, E, heads (checked above). Its dynamic shared memory is what the path lays
        // out: on the warp path (E / heads == 16, W <= 8, ld = 3E + 4, lda = E + 4, 32 spb
        // threads) spb (W (ld + lda) + 4 ceil(W heads (W + 1) / 2)) floats, else (spb W (ld
        // + lda) + 2 spb heads W W) floats.
        unsafe {
            self.raw.attention_backward(
                stream,
                plan.config,
                qkv,
                probs,
                datt,
                dqkv,
                b,
                w,
                e,
                hh,
                plan.spb,
                plan.ld,
                plan.lda,
                warp_path,
                scale,
            )
        }
    }

    /// The pooled reward prediction and its loss: `pred[B]`, `L_attn = mean_b (pred −
    /// r)²` added into [`LossSlot::Attn`] (`coef ·` it into [`LossSlot::Total`]), and the
    /// gradients of `coef · L_attn`: `d_o`, `dwp`, `dbp` (formulas in
    /// `cuda/attention.cu`).
    ///
    /// Two launches: `attn_pool_loss`, `min(B, ATTN_POOL_BLOCKS)` blocks of one warp, a
    /// warp per sample, one partial row per block into `scratch` (at least
    /// [`AttnPoolDims::scratch_len`] floats, not shared with an op that may run at the same
    /// time); then `attn_pool_finish`, `ceil((E + 2) / 32)` blocks of 32 × 32, which adds
    /// the rows in order. Deterministic. [`attn_pool_loss_reference`](crate::reference::attn_pool_loss_reference) is the CPU version.
    pub fn attn_pool_loss(
        &self,
        stream: &CaptureStream<'_>,
        dims: AttnPoolDims,
        inputs: &AttnPoolInputs<'_>,
        coef: f32,
        out: AttnPoolOutputs<'_>,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let b = positive("attn_pool_loss: batch", dims.batch)?;
        let w = positive("attn_pool_loss: window", dims.window)?;
        let e = positive("attn_pool_loss: width", dims.width)?;
        // Checked before the first launch, so that nothing is half done.
        let cols = dims.cols()?;
        let o_len = product("attn_pool_loss", &[dims.batch, dims.window, dims.width])?;
        check_len("attn_pool_loss: o ([B W, E])", inputs.o.len(), o_len)?;
        check_len("attn_pool_loss: wp ([E])", inputs.wp.len(), dims.width)?;
        check_len("attn_pool_loss: bp ([1])", inputs.bp.len(), 1)?;
        check_len("attn_pool_loss: r ([B])", inputs.r.len(), dims.batch)?;
        check_len("attn_pool_loss: pred ([B])", out.pred.len(), dims.batch)?;
        check_len("attn_pool_loss: d_o ([B W, E])", out.d_o.len(), o_len)?;
        check_len("attn_pool_loss: dwp ([E])", out.dwp.len(), dims.width)?;
        check_len("attn_pool_loss: dbp ([1])", out.dbp.len(), 1)?;
        check_losses("attn_pool_loss: losses", out.losses)?;
        let rows = dims.blocks();
        let needed = product("attn_pool_loss: scratch", &[rows as usize, cols as usize])?;
        check_scratch(
            "attn_pool_loss: scratch (at least AttnPoolDims::scratch_len)",
            scratch.len(),
            needed,
        )?;
        {
            let config = LaunchConfig {
                grid_dim: (rows, 1, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: block x takes samples b < B only, every buffer holds what its shape
            // says, and scratch holds gridDim.x rows of E + 2 floats (checked above).
            unsafe {
                self.raw.attn_pool_loss(
                    stream,
                    config,
                    inputs.o,
                    inputs.wp,
                    inputs.bp,
                    inputs.r,
                    &mut *out.pred,
                    &mut *out.d_o,
                    &mut *scratch,
                    b,
                    w,
                    e,
                    coef,
                )?
            };
        }
        self.raw.attn_pool_finish_checked(
            stream,
            &*scratch,
            rows as usize,
            dims.width,
            out.dwp,
            out.dbp,
            out.losses,
            b,
            coef,
        )
    }
}

// ---- cuda/attention_fused.cu: the whole attention head in one kernel ----

/// The sizes `attention_fused` is written for (`AF_S`, `AF_W`, `AF_E`, `AF_HEADS` in
/// `cuda/attention_fused.cu`): state features `S`, window `W`, width `E` and heads `Hh`.
pub const ATTENTION_FUSED_SIZES: (usize, usize, usize, usize) = (64, 8, 64, 4);

/// Dynamic shared memory of an `attention_fused` block (`AF_SMEM_BYTES`): `W' = wqkv wemb`,
/// two tiles of windows, and a tile's `qkv`, `dqkv` and `dS`, in 185 KB. Hopper's opt-in
/// limit is 227 KB; a GPU with less takes the unfused path
/// ([`Kernels::has_attention_fused`]).
pub const ATTENTION_FUSED_SHARED_BYTES: u32 = 189_440;

/// Floats in one block's partial row of `attention_fused` (`AF_ROW_LEN`): `[G = Σ dqkvᵀ win
/// (3E S) | Σ dq (E) | Σ_b g_b mean_w att_b (E) | dbp | loss]`, from which
/// [`Kernels::attention_fused_finish`] makes every gradient.
pub const ATTENTION_FUSED_ROW_LEN: usize = {
    let (s, _, e, _) = ATTENTION_FUSED_SIZES;
    3 * e * s + e + e + 2
};

/// Floats of the weights folded once a step by `attention_fused_fold` (`AF_FOLD_LEN`),
/// kept in the scratch after the partial rows and their sums: `[W' = wqkv wemb (3E S) |
/// b' = wqkv bemb (3E) | v = wpᵀ wo (E)]`.
pub const ATTENTION_FUSED_FOLD_LEN: usize = {
    let (s, _, e, _) = ATTENTION_FUSED_SIZES;
    3 * e * s + 3 * e + e
};

/// Blocks of `attention_fused_fold` (`AF_FOLD_BLOCKS`): 4 rows of `W'` each.
const ATTENTION_FUSED_FOLD_BLOCKS: u32 = 48;

/// Blocks of `attention_fused_grads` (`AF_GRADS_BLOCKS`): 48 of `dwqkv`'s rows, 16 of
/// `dwemb`'s, and one for the rest.
const ATTENTION_FUSED_GRADS_BLOCKS: u32 = 65;

/// Samples in a tile of `attention_fused` (`AF_SAMPLES`): 64 rows of the window.
const ATTENTION_FUSED_TILE: usize = 8;

/// How the attention head runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, stepgraph::ConfigValue)]
pub enum AttentionKernel {
    /// [`Kernels::attention_fused`]: one kernel and its finish, at
    /// [`ATTENTION_FUSED_SIZES`] only, and only where [`Kernels::has_attention_fused`].
    Fused,
    /// cuBLASLt GEMMs around [`Kernels::attention_forward`], [`Kernels::attn_pool_loss`]
    /// and [`Kernels::attention_backward`]: any sizes.
    Unfused,
}

/// Sizes of the whole attention head: `B` samples, `S` state features, `W` window rows,
/// width `E`, `Hh` heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnFusedDims {
    /// `B`.
    pub batch: usize,
    /// `S`.
    pub state: usize,
    /// `W`.
    pub window: usize,
    /// `E`.
    pub width: usize,
    /// `Hh`.
    pub heads: usize,
    /// The SMs the head's grid may hold, at least 1: [`Kernels::attention_fused`] launches
    /// at most this many persistent blocks (one an SM). With the batch it fixes the grid,
    /// the order of the sums and so the result's bits. [`PERSISTENT_SMS`] is the whole GPU;
    /// a step that runs the head beside other work can leave that work SMs of its own
    /// (`model::ATTENTION_HEAD_SMS`).
    pub sms: u32,
}

impl AttnFusedDims {
    /// The sizes the attention kernels of the unfused path take.
    pub fn attention(self) -> AttentionDims {
        AttentionDims {
            batch: self.batch,
            window: self.window,
            width: self.width,
            heads: self.heads,
        }
    }

    /// The sizes [`Kernels::attn_pool_loss`] takes.
    pub fn pool(self) -> AttnPoolDims {
        AttnPoolDims {
            batch: self.batch,
            window: self.window,
            width: self.width,
        }
    }

    /// Whether [`Kernels::attention_fused`] takes these sizes: `(S, W, E, Hh)` equal to
    /// [`ATTENTION_FUSED_SIZES`], at least one sample, and `B W` rows within 32 bits.
    /// It also needs the GPU's shared memory ([`Kernels::has_attention_fused`]).
    pub fn fused_takes(self) -> bool {
        attention_fused_plan(self).is_ok()
    }

    /// Length of the scratch buffer that [`Kernels::attention_fused`] needs (a partial row
    /// of [`ATTENTION_FUSED_ROW_LEN`] floats per block, one more for their sums, and the
    /// folded weights, [`ATTENTION_FUSED_FOLD_LEN`]), or 0 for sizes it does not take.
    pub fn scratch_len(self) -> usize {
        attention_fused_plan(self).map_or(0, |plan| plan.scratch_len)
    }
}

/// How [`Kernels::attention_fused`] launches.
#[derive(Clone, Copy, Debug)]
struct AttnFusedPlan {
    /// `attention_fused_fold`: the weights folded, before the tiles.
    fold: LaunchConfig,
    /// `attention_fused`: the tiles.
    config: LaunchConfig,
    /// Partial rows written (one per block of `config`).
    rows: u32,
    scratch_len: usize,
    /// `attention_fused_sums`: the rows added, column by column, into one more row.
    sums: LaunchConfig,
    /// `attention_fused_grads`: the gradients from that row.
    grads: LaunchConfig,
}

/// `min(ceil(B / 8), sms)` persistent blocks of 256 threads: one a SM (each
/// takes 185 KB of shared memory), each with at least one tile.
fn attention_fused_plan(dims: AttnFusedDims) -> Result<AttnFusedPlan> {
    let (s, w, e, hh) = ATTENTION_FUSED_SIZES;
    if (dims.state, dims.window, dims.width, dims.heads) != (s, w, e, hh) {
        return Err(Error::Invalid(format!(
            "attention_fused: expected S = {s}, W = {w}, E = {e} and Hh = {hh}, found S = {}, \
             W = {}, E = {}, Hh = {}; use the unfused attention path",
            dims.state, dims.window, dims.width, dims.heads
        )));
    }
    positive("attention_fused: batch", dims.batch)?;
    len_u32(
        "attention_fused: win ([B W, S])",
        product("attention_fused: win", &[dims.batch, w, s])?,
    )?;
    let tiles = dims.batch.div_ceil(ATTENTION_FUSED_TILE);
    at_least_one_sm("attention_fused", dims.sms)?;
    let blocks = (tiles as u32).min(dims.sms);
    // One partial row a block, the row their sums go to, and the folded weights, the last
    // two each at a multiple of 4 floats (`af_sums_at`, `af_fold_at`: read as float4s).
    let scratch_len = product(
        "attention_fused: scratch",
        &[blocks as usize, ATTENTION_FUSED_ROW_LEN],
    )?
    .next_multiple_of(4)
        + ATTENTION_FUSED_ROW_LEN.next_multiple_of(4)
        + ATTENTION_FUSED_FOLD_LEN;
    len_u32("attention_fused: scratch", scratch_len)?;
    Ok(AttnFusedPlan {
        fold: LaunchConfig {
            grid_dim: (ATTENTION_FUSED_FOLD_BLOCKS, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        },
        config: LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: ATTENTION_FUSED_SHARED_BYTES,
        },
        rows: blocks,
        scratch_len,
        sums: tile_config(ATTENTION_FUSED_ROW_LEN.div_ceil(32) as u32, 1),
        grads: LaunchConfig {
            grid_dim: (ATTENTION_FUSED_GRADS_BLOCKS, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        },
    })
}

/// Inputs of [`Kernels::attention_fused`].
#[derive(Clone, Copy, Debug)]
pub struct AttnFusedInputs<'a> {
    /// `win[B W, S]`: each sample's window of past states.
    pub win: &'a DeviceBuffer<f32>,
    /// The head's weights but `bp`.
    pub weights: AttnFusedWeights<'a>,
    /// `bp[1]`.
    pub bp: &'a DeviceBuffer<f32>,
    /// `r[B]`: the reward to predict.
    pub r: &'a DeviceBuffer<f32>,
}

/// The attention head's weights but `bp`: what `attention_fused_fold` folds once a step and
/// [`Kernels::attention_fused_finish`] reads to turn the partial rows' sums into the
/// gradients (`dwqkv = G wembᵀ + csum bembᵀ`, `dwemb = wqkvᵀ G`, ...).
#[derive(Clone, Copy, Debug)]
pub struct AttnFusedWeights<'a> {
    /// `wemb[E, S]`.
    pub wemb: &'a DeviceBuffer<f32>,
    /// `bemb[E]`.
    pub bemb: &'a DeviceBuffer<f32>,
    /// `wqkv[3E, E]`.
    pub wqkv: &'a DeviceBuffer<f32>,
    /// `wo[E, E]`.
    pub wo: &'a DeviceBuffer<f32>,
    /// `wp[E]`.
    pub wp: &'a DeviceBuffer<f32>,
}

/// Outputs of [`Kernels::attention_fused`]: each written whole, every gradient of
/// `coef · L_attn`.
#[derive(Debug)]
pub struct AttnFusedOutputs<'a> {
    /// `pred[B]` ([`Kernels::attention_fused_tiles`] writes it).
    pub pred: &'a mut DeviceBuffer<f32>,
    /// The gradients and the loss ([`Kernels::attention_fused_finish`] writes them).
    pub grads: AttnFusedGrads<'a>,
}

/// What [`Kernels::attention_fused_finish`] writes: every weight gradient of the head, of
/// `coef · L_attn`, and the loss.
#[derive(Debug)]
pub struct AttnFusedGrads<'a> {
    /// `dwemb[E, S]`.
    pub dwemb: &'a mut DeviceBuffer<f32>,
    /// `dbemb[E]`.
    pub dbemb: &'a mut DeviceBuffer<f32>,
    /// `dwqkv[3E, E]`.
    pub dwqkv: &'a mut DeviceBuffer<f32>,
    /// `dwo[E, E]`.
    pub dwo: &'a mut DeviceBuffer<f32>,
    /// `dwp[E]`.
    pub dwp: &'a mut DeviceBuffer<f32>,
    /// `dbp[1]`.
    pub dbp: &'a mut DeviceBuffer<f32>,
    /// The loss buffer: [`LossSlot::Attn`] and [`LossSlot::Total`] are added to.
    pub losses: &'a mut DeviceBuffer<f32>,
}

impl Kernels {
    /// Whether `attention_fused` can run here: the driver granted it the shared memory a
    /// block needs ([`ATTENTION_FUSED_SHARED_BYTES`]), as Hopper does.
    pub fn has_attention_fused(&self) -> bool {
        self.attention_fused
    }

    /// How the attention head runs at these sizes on this GPU: [`AttentionKernel::Fused`]
    /// where [`AttnFusedDims::fused_takes`] the sizes and [`Kernels::has_attention_fused`],
    /// otherwise [`AttentionKernel::Unfused`].
    pub fn attention_kernel(&self, dims: AttnFusedDims) -> AttentionKernel {
        if self.attention_fused && dims.fused_takes() {
            AttentionKernel::Fused
        } else {
            AttentionKernel::Unfused
        }
    }

    /// The whole attention head, forward and backward (MODEL.md; the unfused path is the
    /// embedding and QKV GEMMs, [`Kernels::attention_forward`], the output GEMM,
    /// [`Kernels::attn_pool_loss`], [`Kernels::attention_backward`] and five more GEMMs):
    /// `pred` and every weight gradient, and `L_attn` added into the loss buffer.
    /// [`Kernels::attention_fused_tiles`] then [`Kernels::attention_fused_finish`], which
    /// a step may run as two ops. Deterministic.
    /// [`attention_fused_reference`](crate::reference::attention_fused_reference) is the
    /// CPU version.
    ///
    /// Fails with [`Error::Invalid`], launching nothing, for sizes other than
    /// [`ATTENTION_FUSED_SIZES`] or where [`Kernels::has_attention_fused`] is false.
    pub fn attention_fused(
        &self,
        stream: &CaptureStream<'_>,
        dims: AttnFusedDims,
        inputs: &AttnFusedInputs<'_>,
        coef: f32,
        out: AttnFusedOutputs<'_>,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let AttnFusedOutputs { pred, grads } = out;
        // Every length is checked before the first launch, so that nothing is half done.
        attention_fused_finish_checks(dims, &inputs.weights, &grads)?;
        self.attention_fused_tiles(stream, dims, inputs, coef, pred, scratch)?;
        self.attention_fused_finish(stream, dims, &inputs.weights, coef, grads, scratch)
    }

    /// The fused head's first part: `attention_fused_fold` (48 blocks) folds the weights
    /// into `scratch` (`W' = wqkv wemb`, `b' = wqkv bemb`, `v = wpᵀ wo`); then
    /// `attention_fused`, `min(ceil(B / 8), sms)` persistent blocks of 256 threads with
    /// [`ATTENTION_FUSED_SHARED_BYTES`] of shared memory, takes tiles of 8 samples through
    /// the whole head in shared memory, its products on the tensor cores in TF32
    /// (mma.sync), and writes `pred` and one partial row of sums (of `dqkvᵀ win`, `dq`, the
    /// pool's terms and the loss) per block into `scratch` (at least
    /// [`AttnFusedDims::scratch_len`] floats, not shared with an op that may run at the same
    /// time), which [`Kernels::attention_fused_finish`] adds up.
    pub fn attention_fused_tiles(
        &self,
        stream: &CaptureStream<'_>,
        dims: AttnFusedDims,
        inputs: &AttnFusedInputs<'_>,
        coef: f32,
        pred: &mut DeviceBuffer<f32>,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let plan = attention_fused_plan(dims)?;
        if !self.attention_fused {
            return Err(Error::Invalid(format!(
                "attention_fused: expected a GPU that grants a block \
                 {ATTENTION_FUSED_SHARED_BYTES} bytes of shared memory, but this one refused \
                 it; use the unfused attention path"
            )));
        }
        let (_, w, _, _) = ATTENTION_FUSED_SIZES;
        let win_len = product("attention_fused", &[dims.batch, w, dims.state])?;
        check_len("attention_fused: win ([B W, S])", inputs.win.len(), win_len)?;
        check_weights(&inputs.weights)?;
        check_len("attention_fused: bp ([1])", inputs.bp.len(), 1)?;
        check_len("attention_fused: r ([B])", inputs.r.len(), dims.batch)?;
        check_len("attention_fused: pred ([B])", pred.len(), dims.batch)?;
        check_scratch(
            "attention_fused: scratch (at least AttnFusedDims::scratch_len)",
            scratch.len(),
            plan.scratch_len,
        )?;
        // SAFETY: the fold reads the weights at the kernel's sizes (checked above) and writes
        // the fold after `rows` partial rows and their sums' row of scratch (af_fold_at),
        // within plan.scratch_len (checked above).
        unsafe {
            self.raw.attention_fused_fold(
                stream,
                plan.fold,
                inputs.weights.wemb,
                inputs.weights.bemb,
                inputs.weights.wqkv,
                inputs.weights.wo,
                inputs.weights.wp,
                scratch,
                plan.rows,
            )?;
        }
        // SAFETY: the plan admits only the kernel's sizes (S = E = 64, W = 8, Hh = 4) with at
        // most ceil(B / 8) blocks of 256 threads and the shared memory Kernels::load opted
        // it in to (checked above); the kernel reads win rows below B W, r, and the fold
        // that the launch above wrote for gridDim.x = plan.rows blocks, and writes
        // pred[b < B] and gridDim.x partial rows of scratch (checked above).
        unsafe {
            self.raw.attention_fused(
                stream,
                plan.config,
                inputs.win,
                inputs.bp,
                inputs.r,
                pred,
                scratch,
                dims.batch as u32,
                coef,
            )
        }
    }

    /// The fused head's second part: `attention_fused_sums`, `ceil(ROW_LEN / 32)` blocks of
    /// 32 × 32, adds the partial rows that [`Kernels::attention_fused_tiles`] wrote into
    /// `scratch` for the same `dims` in order, into the row after them; then
    /// `attention_fused_grads`, 65 blocks of 256, writes every gradient of `grads` from
    /// those sums and `weights` (`dwqkv = G wembᵀ + csum bembᵀ`, `dwemb = wqkvᵀ G`,
    /// `dbemb = wqkvᵀ csum`, `dwo` and `dwp` from the pool's sums and `wo`, `wp`) and adds
    /// `L_attn` into its loss buffer. `scratch` must hold what
    /// [`Kernels::attention_fused_tiles`] left for the same `dims` (the partial rows and the
    /// fold's `v`).
    pub fn attention_fused_finish(
        &self,
        stream: &CaptureStream<'_>,
        dims: AttnFusedDims,
        weights: &AttnFusedWeights<'_>,
        coef: f32,
        grads: AttnFusedGrads<'_>,
        scratch: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let plan = attention_fused_plan(dims)?;
        attention_fused_finish_checks(dims, weights, &grads)?;
        check_scratch(
            "attention_fused_finish: scratch (at least AttnFusedDims::scratch_len)",
            scratch.len(),
            plan.scratch_len,
        )?;
        // SAFETY: the sums read `rows` partial rows of scratch and write their sums' row after
        // them (af_sums_at), all within plan.scratch_len (checked above).
        unsafe {
            self.raw
                .attention_fused_sums(stream, plan.sums, scratch, plan.rows)?;
        }
        // SAFETY: the grads read the summed row and the fold's v of scratch (within
        // plan.scratch_len) and the weights, and write dwqkv, dwemb, dbemb, dwo, dwp, dbp
        // whole at the kernel's sizes (every length checked above) and loss slots below
        // LOSS_SLOTS.
        unsafe {
            self.raw.attention_fused_grads(
                stream,
                plan.grads,
                scratch,
                plan.rows,
                weights.wemb,
                weights.bemb,
                weights.wqkv,
                weights.wo,
                weights.wp,
                grads.dwqkv,
                grads.dwemb,
                grads.dbemb,
                grads.dwo,
                grads.dwp,
                grads.dbp,
                grads.losses,
                dims.batch as u32,
                coef,
            )
        }
    }
}

/// The five weights of [`AttnFusedWeights`], in its order, with their lengths at the
/// kernel's sizes: their gradients ([`AttnFusedGrads`], `d` before each name) have the same.
fn attention_fused_weight_lens() -> [(&'static str, usize); 5] {
    let (s, _, e, _) = ATTENTION_FUSED_SIZES;
    [
        ("wemb ([E, S])", e * s),
        ("bemb ([E])", e),
        ("wqkv ([3E, E])", 3 * e * e),
        ("wo ([E, E])", e * e),
        ("wp ([E])", e),
    ]
}

/// The weights' lengths at the kernel's sizes.
fn check_weights(weights: &AttnFusedWeights<'_>) -> Result<()> {
    let w = weights;
    let bufs = [w.wemb, w.bemb, w.wqkv, w.wo, w.wp];
    for ((name, len), buf) in attention_fused_weight_lens().into_iter().zip(bufs) {
        check_len(&format!("attention_fused: {name}"), buf.len(), len)?;
    }
    Ok(())
}

/// The lengths [`Kernels::attention_fused_finish`] reads and writes, at the kernel's sizes.
fn attention_fused_finish_checks(
    dims: AttnFusedDims,
    weights: &AttnFusedWeights<'_>,
    grads: &AttnFusedGrads<'_>,
) -> Result<()> {
    attention_fused_plan(dims)?;
    check_weights(weights)?;
    let g = grads;
    let lens = [
        g.dwemb.len(),
        g.dbemb.len(),
        g.dwqkv.len(),
        g.dwo.len(),
        g.dwp.len(),
    ];
    for ((name, len), found) in attention_fused_weight_lens().into_iter().zip(lens) {
        check_len(&format!("attention_fused: d{name}"), found, len)?;
    }
    check_len("attention_fused: dbp ([1])", grads.dbp.len(), 1)?;
    check_losses("attention_fused: losses", grads.losses)
}

// ---- cuda/replay.cu: the replay buffer's fill, the draw of a batch and its gathers ----

/// The rows of transitions the gathers read or write: `s`, `s2` `[rows, S]`, `act`
/// `[rows, D]`, `r`, `done` `[rows]` (the replay buffer's rows, or a batch's).
#[derive(Clone, Copy, Debug)]
pub struct TransitionRows<'a> {
    pub s: &'a DeviceBuffer<f32>,
    pub s2: &'a DeviceBuffer<f32>,
    pub act: &'a DeviceBuffer<i32>,
    pub r: &'a DeviceBuffer<f32>,
    pub done: &'a DeviceBuffer<f32>,
}

/// The same, written.
#[derive(Debug)]
pub struct TransitionRowsMut<'a> {
    pub s: &'a mut DeviceBuffer<f32>,
    pub s2: &'a mut DeviceBuffer<f32>,
    pub act: &'a mut DeviceBuffer<i32>,
    pub r: &'a mut DeviceBuffer<f32>,
    pub done: &'a mut DeviceBuffer<f32>,
}

/// Which tensor of the replay buffer a fill writes: each has a key of its own, so the
/// tensors are independent draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayTensor {
    /// `s [N, S]`.
    S = 0,
    /// `s2 [N, S]`.
    S2 = 1,
    /// `act [N, D]`.
    Act = 2,
    /// `r [N]`.
    R = 3,
    /// `done [N]`.
    Done = 4,
    /// `win [N, W, S]`.
    Win = 5,
}

impl ReplayTensor {
    /// The tensor's number in the generator's key (`tensor` in `cuda/replay.cu`).
    pub const fn id(self) -> u64 {
        self as u64
    }
}

impl Kernels {
    /// The draw of one replay from the generator at `counter[0]`: `idx[b]` uniform in
    /// `[0, capacity)` for every `b < idx.len()`, and `tau` (IQN's fractions) uniform in
    /// `[0.02, 0.98]`. Reads the counter and does not move it: [`Kernels::replay_advance`]
    /// does, after. [`replay_draw_reference`](crate::reference::replay_draw_reference)
    /// computes the same bits on the CPU.
    ///
    /// One thread per index and per fraction, blocks of [`BLOCK_THREADS`].
    pub fn replay_draw(
        &self,
        stream: &CaptureStream<'_>,
        counter: &DeviceBuffer<u64>,
        idx: &mut DeviceBuffer<u32>,
        tau: &mut DeviceBuffer<f32>,
        seed: u64,
        capacity: usize,
    ) -> Result<()> {
        let (batch, taus) = (idx.len(), tau.len());
        self.raw
            .replay_draw_checked(stream, counter, idx, tau, seed, capacity, batch, taus)
    }

    /// `counter[0] += 1`: the next replay draws from the next key.
    pub fn replay_advance(
        &self,
        stream: &CaptureStream<'_>,
        counter: &mut DeviceBuffer<u64>,
    ) -> Result<()> {
        self.raw.replay_advance_checked(stream, counter)
    }

    /// `dst[b] = src[idx[b]]` for the per-row tensors of transitions (`s`, `s2`, `act`,
    /// `r`, `done`), `state` floats per state and `branches` actions per row. `src` holds
    /// the replay buffer's rows, `dst` one row per index. An index out of range (only a
    /// caller's own can be: the draw's are below the capacity) gathers NaN and action 0,
    /// which the step's finite check stops at.
    ///
    /// One thread per element of a row's `2 S + D + 2` values, blocks of [`BLOCK_THREADS`].
    pub fn replay_gather(
        &self,
        stream: &CaptureStream<'_>,
        idx: &DeviceBuffer<u32>,
        src: TransitionRows<'_>,
        dst: TransitionRowsMut<'_>,
        state: usize,
        branches: usize,
    ) -> Result<()> {
        let capacity = src.r.len();
        self.raw.replay_gather_checked(
            stream,
            idx,
            src.s,
            src.s2,
            src.act,
            src.r,
            src.done,
            dst.s,
            dst.s2,
            dst.act,
            dst.r,
            dst.done,
            capacity,
            idx.len(),
            state,
            branches,
        )
    }

    /// `dst[b, :] = src[idx[b], :]` for rows of `width` floats (the window of past
    /// states, `W S`). An index out of range gathers NaN. Rows of a multiple of 4 floats
    /// are copied as `float4`s, one thread each; other widths one thread per float.
    pub fn replay_gather_rows(
        &self,
        stream: &CaptureStream<'_>,
        idx: &DeviceBuffer<u32>,
        src: &DeviceBuffer<f32>,
        dst: &mut DeviceBuffer<f32>,
        width: usize,
    ) -> Result<()> {
        let capacity = src.len() / width.max(1);
        let batch = idx.len();
        if width.is_multiple_of(4) {
            self.raw
                .replay_gather_rows4_checked(stream, idx, src, dst, capacity, batch, width)
        } else {
            self.raw
                .replay_gather_rows_checked(stream, idx, src, dst, capacity, batch, width)
        }
    }

    /// Fills `x` with standard normals (Box-Muller), drawn from the key of `(seed,
    /// tensor)`.
    pub fn replay_fill_normal(
        &self,
        stream: &CaptureStream<'_>,
        x: &mut DeviceBuffer<f32>,
        seed: u64,
        tensor: ReplayTensor,
    ) -> Result<()> {
        let n = x.len();
        self.raw
            .replay_fill_normal_checked(stream, x, n, seed, tensor.id())
    }

    /// Fills `x` with actions uniform in `[0, actions)`.
    pub fn replay_fill_actions(
        &self,
        stream: &CaptureStream<'_>,
        x: &mut DeviceBuffer<i32>,
        actions: usize,
        seed: u64,
        tensor: ReplayTensor,
    ) -> Result<()> {
        let n = x.len();
        self.raw
            .replay_fill_actions_checked(stream, x, n, actions, seed, tensor.id())
    }

    /// Fills `x` with 1 at probability `p` and 0 otherwise.
    pub fn replay_fill_bernoulli(
        &self,
        stream: &CaptureStream<'_>,
        x: &mut DeviceBuffer<f32>,
        p: f32,
        seed: u64,
        tensor: ReplayTensor,
    ) -> Result<()> {
        let n = x.len();
        self.raw
            .replay_fill_bernoulli_checked(stream, x, n, p, seed, tensor.id())
    }
}

// ---------------------------------------------------------------------------------------
// watch.cu: the step's health, latched on the device for the host to read back late.
// ---------------------------------------------------------------------------------------

/// The words of the step's watch buffer (`cuda/watch.cu`, which has the same numbers), and
/// what the host reads back from it: the latest replay's losses and, latched at the first
/// replay that was not finite, that replay's number, losses and the non-finite elements of
/// every gradient. From that replay on no update is applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Watch {
    /// Replays the watch has seen (the step's replays, eager runs included).
    pub replays: u32,
    /// The latest replay's seven losses (L, L_td, L_iql, L_iqn, L_attn, L_cql, L_conf).
    pub losses: [f32; 7],
    /// The latest replay's sum of squares of the gradients.
    pub sq_norm: f32,
    /// The first replay that was not finite, with what it found; `None` while all are.
    pub bad: Option<BadReplay>,
}

/// What the watch latched at the first replay that was not finite.
#[derive(Clone, Debug, PartialEq)]
pub struct BadReplay {
    /// Its number (1 for the first replay the watch saw).
    pub replay: u32,
    pub losses: [f32; 7],
    pub sq_norm: f32,
    /// Per gradient tensor, in the parameter table's order: NaN and Inf elements.
    pub non_finite: Vec<(u32, u32)>,
}

impl Watch {
    /// Words before the per-tensor counts.
    pub const HEADER: usize = 18;
    const REPLAYS: usize = 0;
    const BAD_REPLAY: usize = 1;
    const LOSSES: usize = 2;
    const SQ_NORM: usize = 9;
    const BAD_LOSSES: usize = 10;
    const BAD_SQ_NORM: usize = 17;

    /// Words of the watch buffer for `tensors` gradient tensors.
    pub fn words(tensors: usize) -> usize {
        Self::HEADER + 2 * tensors
    }

    /// The watch as read back (`words(tensors)` words); fails for another length.
    pub fn parse(words: &[u32], tensors: usize) -> Result<Watch> {
        check_len(
            "watch: the words read back",
            words.len(),
            Self::words(tensors),
        )?;
        let f = |i: usize| f32::from_bits(words[i]);
        let seven = |at: usize| std::array::from_fn(|i| f(at + i));
        let bad = match words[Self::BAD_REPLAY] {
            0 => None,
            replay => Some(BadReplay {
                replay,
                losses: seven(Self::BAD_LOSSES),
                sq_norm: f(Self::BAD_SQ_NORM),
                non_finite: words[Self::HEADER..]
                    .chunks_exact(2)
                    .map(|c| (c[0], c[1]))
                    .collect(),
            }),
        };
        Ok(Watch {
            replays: words[Self::REPLAYS],
            losses: seven(Self::LOSSES),
            sq_norm: f(Self::SQ_NORM),
            bad,
        })
    }
}

impl Kernels {
    /// The step's watch (`cuda/watch.cu`), between the gradients' sum of squares and Adam:
    /// counts the replay, keeps its losses (from the three loss buffers, [`LOSS_SLOTS`]
    /// each) and `sq_norm[0]`, latches the first replay that is not finite (with the
    /// non-finite elements of every gradient of `table`), and from that replay on sets
    /// `sq_norm[0]` to NaN so that `adam_clip_update` applies no update. `watch` holds
    /// [`Watch::words`] words, zeroed before the first replay.
    pub fn watch_step(
        &self,
        stream: &CaptureStream<'_>,
        table: &stepgraph_kernels::ParamTable,
        losses: [&DeviceBuffer<f32>; 3],
        sq_norm: &mut DeviceBuffer<f32>,
        watch: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        let tensors = table.entries().len();
        for (what, l) in ["losses", "iqn_losses", "attn_losses"].iter().zip(losses) {
            check_len(
                &format!("watch_step: {what} ([LOSS_SLOTS])"),
                l.len(),
                LOSS_SLOTS,
            )?;
        }
        check_len("watch_step: sq_norm ([1])", sq_norm.len(), 1)?;
        check_len("watch_step: watch", watch.len(), Watch::words(tensors))?;
        let t = len_u32("watch_step: the table's tensors", tensors)?;
        let config = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: one block; thread 0 reads slots below LOSS_SLOTS of each loss buffer and
        // sq_norm[0] (lengths checked above), the counts land at words below
        // Watch::words(T) = watch.len(), and every gradient read is an element of a table
        // entry (its address and length, checked when the table was built).
        unsafe {
            self.raw.watch_step(
                stream,
                config,
                table.on_device(),
                t,
                losses[0],
                losses[1],
                losses[2],
                sq_norm,
                watch,
            )
        }
    }
}

#[cfg(test)]
mod tests;
