//! The kernels of `cuda/heads.cu`: the GLU, the double-DQN target, the dueling losses,
//! the expectile heads, the branch heads and the trunk's gradients.

use super::*;

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
        let adv2: Vec<&DeviceBuffer<f32>> = inputs.adv2.iter().collect();
        let advt: Vec<&DeviceBuffer<f32>> = inputs.advt.iter().collect();
        self.raw.ddqn_target_checked(
            stream,
            inputs.v2,
            &adv2,
            inputs.vt,
            &advt,
            inputs.r,
            inputs.done,
            y,
            ybar,
            dims.batch,
            dims.branches,
            dims.actions,
            gamma,
        )
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
        let mut dadv: Vec<&mut DeviceBuffer<f32>> = out.dadv.iter_mut().collect();
        self.raw.dueling_losses_checked(
            stream,
            inputs.v,
            inputs.adv,
            inputs.act,
            inputs.y,
            out.dv,
            &mut dadv,
            out.qbar,
            out.losses,
            dims.batch,
            dims.branches,
            dims.actions,
            coef.td,
            coef.cql,
            coef.conf,
        )
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
        let (_, chunks, rows_per_chunk) = trunk_grad_join_plan(dims.batch, dims.hidden);
        let dh_branch: Vec<&DeviceBuffer<f32>> = inputs.dh_branch.iter().collect();
        self.raw.trunk_grad_join_partial_checked(
            stream,
            inputs.h_out,
            inputs.dv,
            inputs.wv,
            &dh_branch,
            inputs.de_hi,
            inputs.we_hi,
            inputs.de_lo,
            inputs.we_lo,
            inputs.dh_iqn,
            dz2,
            &mut *scratch,
            dims.batch,
            dims.hidden,
            dims.branches,
            rows_per_chunk,
        )?;
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
pub(super) const TRUNK_L1_ROWS: usize = 32;

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
        let (chunks, rows_per_chunk) = trunk_l1_grad_plan(dims.batch);
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
pub(super) fn warp_row_plan(rows: usize) -> (usize, usize) {
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
pub(super) const BRANCH_HEAD_FORWARD_ROWS: usize = 64;

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
