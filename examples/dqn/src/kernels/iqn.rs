//! The kernels of `cuda/iqn.cu`: the cosine features and the quantile Huber head, fused
//! or in parts, with its Hopper (`wgmma`) variant.

use super::*;

/// Most blocks of an [`Kernels::iqn_forward_backward`] launch; each writes one partial row
/// of the scratch buffer, so the grid (and the result's bits) depend on the sizes only.
pub const IQN_BLOCKS: u32 = 1024;

/// Warps per block of the vector IQN kernels (`IQN_WARPS` in `cuda/iqn.cu`).
pub(super) const IQN_WARPS: u32 = 8;

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
pub(super) struct IqnPlan {
    pub(super) kernel: KernelId,
    pub(super) config: LaunchConfig,
    /// Partial rows written (one per block).
    pub(super) rows: u32,
    pub(super) scratch_len: usize,
}

pub(super) fn iqn_plan(dims: IqnDims) -> Result<IqnPlan> {
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
pub(super) fn at_least_one_sm(kernel: &str, sms: u32) -> Result<()> {
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
pub(super) const IQN_FUSED_MAX_WARPS: u32 = 16;

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
pub(super) const IQN_FUSED_WAVES: u32 = 1;

/// Blocks of [`Kernels::iqn_fused`] that share an SM when `H` is small enough for their
/// registers to allow more than one: each takes 37 KB of static shared memory, and an SM has
/// 228 KB.
pub(super) const IQN_FUSED_SMEM_BLOCKS_PER_SM: u32 = 5;

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
pub(super) struct IqnFusedPlan {
    pub(super) config: LaunchConfig,
    /// Partial rows written (one per block of `config`).
    pub(super) rows: u32,
    pub(super) scratch_len: usize,
}

pub(super) fn iqn_fused_plan(dims: IqnFusedDims) -> Result<IqnFusedPlan> {
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
pub(super) fn iqn_wgmma_plan(dims: IqnFusedDims) -> Result<IqnFusedPlan> {
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
