//! The kernels of `cuda/attention.cu` and `cuda/attention_fused.cu`: window
//! self-attention, the pooled reward head, and the whole head in one kernel.

use super::*;

/// Most samples a block of the attention kernels' block path stages in shared memory.
const ATTENTION_MAX_SAMPLES_PER_BLOCK: usize = 4;

/// The head width the attention kernels' warp path handles (`ATT_DH` in
/// `cuda/attention.cu`): a lane keeps one row's head slice in registers.
pub(super) const ATTENTION_WARP_HEAD_WIDTH: usize = 16;

/// The longest window the warp path handles (`ATT_WMAX`): a lane keeps a row of scores in
/// registers.
pub(super) const ATTENTION_WARP_MAX_WINDOW: usize = 8;

/// Most warps (one sample each) in a block of the warp path (`ATT_MAX_WARPS`).
pub(super) const ATTENTION_WARP_MAX_WARPS: usize = 4;

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
pub(super) enum AttentionPath {
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
pub(super) struct AttentionPlan {
    pub(super) path: AttentionPath,
    /// Samples per block (on the warp path, warps per block).
    pub(super) spb: u32,
    /// Shared-memory row strides of qkv and datt rows.
    pub(super) ld: u32,
    pub(super) lda: u32,
    pub(super) config: LaunchConfig,
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

pub(super) fn attention_plan(dims: AttentionDims, backward: bool) -> Result<AttentionPlan> {
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
    pub(super) fn cols(self) -> Result<u32> {
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
        // Checked before the first launch, so that nothing is half done.
        dims.cols()?;
        let rows = dims.blocks() as usize;
        self.raw.attn_pool_loss_checked(
            stream,
            inputs.o,
            inputs.wp,
            inputs.bp,
            inputs.r,
            &mut *out.pred,
            &mut *out.d_o,
            &mut *scratch,
            dims.batch,
            dims.window,
            dims.width,
            coef,
        )?;
        self.raw.attn_pool_finish_checked(
            stream, &*scratch, rows, dims.width, out.dwp, out.dbp, out.losses, dims.batch, coef,
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
pub(super) const ATTENTION_FUSED_FOLD_BLOCKS: u32 = 48;

/// Blocks of `attention_fused_grads` (`AF_GRADS_BLOCKS`): 48 of `dwqkv`'s rows, 16 of
/// `dwemb`'s, and one for the rest.
pub(super) const ATTENTION_FUSED_GRADS_BLOCKS: u32 = 65;

/// Samples in a tile of `attention_fused` (`AF_SAMPLES`): 64 rows of the window.
pub(super) const ATTENTION_FUSED_TILE: usize = 8;

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
pub(super) struct AttnFusedPlan {
    /// `attention_fused_fold`: the weights folded, before the tiles.
    pub(super) fold: LaunchConfig,
    /// `attention_fused`: the tiles.
    pub(super) config: LaunchConfig,
    /// Partial rows written (one per block of `config`).
    pub(super) rows: u32,
    pub(super) scratch_len: usize,
    /// `attention_fused_sums`: the rows added, column by column, into one more row.
    pub(super) sums: LaunchConfig,
    /// `attention_fused_grads`: the gradients from that row.
    pub(super) grads: LaunchConfig,
}

/// `min(ceil(B / 8), sms)` persistent blocks of 256 threads: one a SM (each
/// takes 185 KB of shared memory), each with at least one tile.
pub(super) fn attention_fused_plan(dims: AttnFusedDims) -> Result<AttnFusedPlan> {
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
