//! The model and the trainer's existing functions: the trunk, the IQN head and the
//! attention head, each head with the SGD update of its last layer.
//!
//! ```text
//! trunk      h1 = relu(x w1ᵀ + b1)                        [B, H]
//!            h  = relu(h1 w2ᵀ + b2)                       [B, H]
//! IQN        cosf[b,j,i] = cos(π (i + 1) tau[b,j])        [B N, C]
//!            phi = relu(cosf wφᵀ + bφ)                    [B N, H]
//!            g[b,j] = h[b] ⊙ phi[b,j]                     [B N, H]
//!            z = g wzᵀ + bz                               [B N, A]
//!            u = y[b,a] − z[b,j,a]
//!            L_iqn = mean_{b,j,a} |tau[b,j] − 1(u < 0)| huber_κ(u)
//! attention  tok = relu(h wtᵀ + bt)                       [B, T E] = [B T, E]
//!            q | k | v = tok wqkvᵀ + bqkv                 [B T, 3E]
//!            p[b,i,j] = softmax_j(q[b,i]·k[b,j] / √E)     [B T, T]
//!            ctx[b,i] = Σ_j p[b,i,j] v[b,j]               [B T, E]
//!            pred = ctx[:, 0] woᵀ + bo                    [B, R]   (token 0 reads out)
//!            L_attn = mean_{b,r} (pred − target)²
//! updates    (wz, bz) −= lr ∂L_iqn/∂(wz, bz);  (wo, bo) −= lr ∂L_attn/∂(wo, bo)
//! ```
//!
//! Every function takes the cuBLASLt wrapper, the kernels and the optional stream and
//! workspace overrides ([`Lt::matmul`] says what an override must be; `None` means the
//! trainer's default stream and workspace), then its sizes, inputs (`&`) and outputs
//! (`&mut`). It only issues work on the stream: no allocation, synchronisation or host
//! copy, so a training step can be captured.
//!
//! The two heads are independent: both only read the trunk's `h`, and each writes only
//! its own buffers ([`IqnActs`] and the IQN parameters, [`AttnActs`] and the attention
//! parameters). Each is a chain of small GEMMs and kernels; at the default [`Dims`] one
//! head alone keeps few of an H200's 132 SMs busy.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::error::{Error, Result};
use crate::kernels::{Kernels, count};
use crate::lt::{Gemm, Lt};

/// The Huber loss's threshold κ in the IQN loss.
pub const HUBER_KAPPA: f32 = 1.0;

/// The model's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, stepgraph::ConfigValue)]
pub struct Dims {
    /// `B`: samples per step.
    pub batch: usize,
    /// `S`: features of an input sample.
    pub input: usize,
    /// `H`: the trunk's width, and the IQN embedding's.
    pub hidden: usize,
    /// `N`: IQN quantile fractions per sample.
    pub quantiles: usize,
    /// `C`: cosine features per quantile fraction.
    pub cos_dim: usize,
    /// `A`: IQN outputs per quantile (one per action).
    pub actions: usize,
    /// `T`: attention tokens per sample.
    pub tokens: usize,
    /// `E`: a token's width.
    pub width: usize,
    /// `R`: attention head outputs per sample.
    pub outputs: usize,
}

impl Default for Dims {
    /// The trainer's sizes: B 256, S 64, H 256, N 32, C 64, A 8, T 8, E 64, R 4.
    fn default() -> Dims {
        Dims {
            batch: 256,
            input: 64,
            hidden: 256,
            quantiles: 32,
            cos_dim: 64,
            actions: 8,
            tokens: 8,
            width: 64,
            outputs: 4,
        }
    }
}

/// The GEMM shapes of one training step, named by where they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemms {
    /// `h1 = x·w1ᵀ`.
    pub trunk1: Gemm,
    /// `h = h1·w2ᵀ`.
    pub trunk2: Gemm,
    /// `phi = cosf·wφᵀ`.
    pub iqn_embed: Gemm,
    /// `z = g·wzᵀ`.
    pub iqn_out: Gemm,
    /// `∂wz = dzᵀ·g`.
    pub iqn_grad: Gemm,
    /// `tok = h·wtᵀ`.
    pub attn_tokens: Gemm,
    /// `qkv = tok·wqkvᵀ`.
    pub attn_qkv: Gemm,
    /// `pred = ctx[:, 0]·woᵀ`, reading token 0 of each sample in place (row stride `T·E`).
    pub attn_out: Gemm,
    /// `∂wo = dpredᵀ·ctx[:, 0]`.
    pub attn_grad: Gemm,
}

impl Gemms {
    /// Every shape, for planning them all before a capture.
    pub fn all(&self) -> [Gemm; 9] {
        [
            self.trunk1,
            self.trunk2,
            self.iqn_embed,
            self.iqn_out,
            self.iqn_grad,
            self.attn_tokens,
            self.attn_qkv,
            self.attn_out,
            self.attn_grad,
        ]
    }
}

impl Dims {
    /// Small sizes, for checking the step against the CPU reference quickly.
    pub fn small() -> Dims {
        Dims {
            batch: 16,
            input: 12,
            hidden: 32,
            quantiles: 8,
            cos_dim: 16,
            actions: 4,
            tokens: 4,
            width: 16,
            outputs: 4,
        }
    }

    /// Checks that no size is zero and that every tensor fits one kernel launch.
    pub fn check(&self) -> Result<()> {
        let d = self;
        let named = [
            ("batch", d.batch),
            ("input", d.input),
            ("hidden", d.hidden),
            ("quantiles", d.quantiles),
            ("cos_dim", d.cos_dim),
            ("actions", d.actions),
            ("tokens", d.tokens),
            ("width", d.width),
            ("outputs", d.outputs),
        ];
        if let Some((name, _)) = named.iter().find(|(_, v)| *v == 0) {
            return Err(Error::Invalid(format!("Dims: {name} is zero")));
        }
        for (what, factors) in [
            ("phi [B N, H]", &[d.batch, d.quantiles, d.hidden][..]),
            ("cosf [B N, C]", &[d.batch, d.quantiles, d.cos_dim]),
            ("z [B N, A]", &[d.batch, d.quantiles, d.actions]),
            ("qkv [B T, 3E]", &[d.batch, d.tokens, 3, d.width]),
            ("scores [B T, T]", &[d.batch, d.tokens, d.tokens]),
            ("softmax threads [B T, 32]", &[d.batch, d.tokens, 32]),
            ("w_tokens [T E, H]", &[d.tokens, d.width, d.hidden]),
            ("h [B, H]", &[d.batch, d.hidden]),
            ("x [B, S]", &[d.batch, d.input]),
        ] {
            count("Dims", what, factors)?;
        }
        Ok(())
    }

    /// The step's GEMM shapes.
    pub fn gemms(&self) -> Gemms {
        let Dims {
            batch: b,
            input: s,
            hidden: h,
            quantiles: n,
            cos_dim: c,
            actions: a,
            tokens: t,
            width: e,
            outputs: r,
        } = *self;
        Gemms {
            trunk1: Gemm::new(b, h, s).trans_b(),
            trunk2: Gemm::new(b, h, h).trans_b(),
            iqn_embed: Gemm::new(b * n, h, c).trans_b(),
            iqn_out: Gemm::new(b * n, a, h).trans_b(),
            iqn_grad: Gemm::new(a, h, b * n).trans_a(),
            attn_tokens: Gemm::new(b, t * e, h).trans_b(),
            attn_qkv: Gemm::new(b * t, 3 * e, e).trans_b(),
            attn_out: Gemm::new(b, r, e).trans_b().with_lda(t * e),
            attn_grad: Gemm::new(r, e, b).trans_a().with_ldb(t * e),
        }
    }
}

/// A linear layer `y = x·wᵀ + b` (`w` `[out, in]`, `b` `[out]`), or its gradient.
#[derive(Debug, stepgraph::StepBuffer)]
pub struct Linear {
    /// `[out, in]`.
    pub w: CudaSlice<f32>,
    /// `[out]`.
    pub b: CudaSlice<f32>,
}

/// The trunk's parameters.
#[derive(Debug, stepgraph::StepBuffer)]
pub struct TrunkParams {
    /// `w1 [H, S]`, `b1 [H]`.
    pub l1: Linear,
    /// `w2 [H, H]`, `b2 [H]`.
    pub l2: Linear,
}

/// The trunk's activations.
#[derive(Debug, stepgraph::StepBuffer)]
pub struct TrunkActs {
    /// `[B, H]`.
    pub h1: CudaSlice<f32>,
    /// `[B, H]`: the features both heads read.
    pub h: CudaSlice<f32>,
}

/// The IQN head's parameters.
#[derive(Debug, stepgraph::StepBuffer)]
pub struct IqnParams {
    /// `wφ [H, C]`, `bφ [H]`: the quantile embedding.
    pub embed: Linear,
    /// `wz [A, H]`, `bz [A]`: the output layer, the one trained.
    pub out: Linear,
}

/// The IQN head's data: quantile fractions and targets.
#[derive(Debug, stepgraph::StepBuffer)]
pub struct IqnData {
    /// `[B, N]`, in (0, 1).
    pub tau: CudaSlice<f32>,
    /// `y [B, A]`.
    pub target: CudaSlice<f32>,
}

/// The IQN head's activations, loss and loss gradient.
#[derive(Debug, stepgraph::StepBuffer)]
pub struct IqnActs {
    /// `[B N, C]`.
    pub cosf: CudaSlice<f32>,
    /// `[B N, H]`.
    pub phi: CudaSlice<f32>,
    /// `[B N, H]`: `h ⊙ phi`.
    pub g: CudaSlice<f32>,
    /// `[B N, A]`: the per-quantile outputs.
    pub z: CudaSlice<f32>,
    /// `[B N, A]`: `∂L_iqn/∂z`.
    pub dz: CudaSlice<f32>,
    /// `[B]`: each sample's summed loss.
    pub row_loss: CudaSlice<f32>,
    /// `[1]`: `L_iqn`.
    pub loss: CudaSlice<f32>,
}

/// The attention head's parameters.
#[derive(Debug, stepgraph::StepBuffer)]
pub struct AttnParams {
    /// `wt [T E, H]`, `bt [T E]`: the tokens from the features.
    pub tokens: Linear,
    /// `wqkv [3E, E]`, `bqkv [3E]`: query, key and value of each token.
    pub qkv: Linear,
    /// `wo [R, E]`, `bo [R]`: the output layer, the one trained.
    pub out: Linear,
}

/// The attention head's data.
#[derive(Debug, stepgraph::StepBuffer)]
pub struct AttnData {
    /// `[B, R]`.
    pub target: CudaSlice<f32>,
}

/// The attention head's activations, loss and loss gradient.
#[derive(Debug, stepgraph::StepBuffer)]
pub struct AttnActs {
    /// `[B T, E]`.
    pub tok: CudaSlice<f32>,
    /// `[B T, 3E]`.
    pub qkv: CudaSlice<f32>,
    /// `[B T, T]`: the scores, then their softmax.
    pub scores: CudaSlice<f32>,
    /// `[B T, E]`.
    pub ctx: CudaSlice<f32>,
    /// `[B, R]`: the outputs.
    pub pred: CudaSlice<f32>,
    /// `[B, R]`: `∂L_attn/∂pred`.
    pub dpred: CudaSlice<f32>,
    /// `[B]`: each sample's summed squared error.
    pub row_loss: CudaSlice<f32>,
    /// `[1]`: `L_attn`.
    pub loss: CudaSlice<f32>,
}

/// The stream a function issues on.
fn stream<'a>(lt: &'a Lt, override_stream: Option<&'a Arc<CudaStream>>) -> &'a Arc<CudaStream> {
    override_stream.unwrap_or(lt.stream())
}

/// The trunk: `h = relu(relu(x·w1ᵀ + b1)·w2ᵀ + b2)`. Reads `x [B, S]` and `p`, writes `out`.
#[allow(clippy::too_many_arguments)]
pub fn trunk_forward(
    lt: &Lt,
    k: &Kernels,
    override_stream: Option<&Arc<CudaStream>>,
    override_workspace: Option<(u64, usize)>,
    dims: &Dims,
    x: &CudaSlice<f32>,
    p: &TrunkParams,
    out: &mut TrunkActs,
) -> Result<()> {
    let s = stream(lt, override_stream);
    let g = dims.gemms();
    let (b, h) = (dims.batch, dims.hidden);
    let (os, ow) = (override_stream, override_workspace);
    lt.matmul(os, ow, &g.trunk1, x, &p.l1.w, &mut out.h1)?;
    k.add_bias(s, &mut out.h1, &p.l1.b, b, h, true)?;
    lt.matmul(os, ow, &g.trunk2, &out.h1, &p.l2.w, &mut out.h)?;
    k.add_bias(s, &mut out.h, &p.l2.b, b, h, true)
}

/// The IQN head's forward pass and loss: reads the trunk's `h [B, H]`, `p` and `data`;
/// writes `out`, including `L_iqn` and `∂L_iqn/∂z` for [`iqn_update`].
#[allow(clippy::too_many_arguments)]
pub fn iqn_head(
    lt: &Lt,
    k: &Kernels,
    override_stream: Option<&Arc<CudaStream>>,
    override_workspace: Option<(u64, usize)>,
    dims: &Dims,
    h: &CudaSlice<f32>,
    p: &IqnParams,
    data: &IqnData,
    out: &mut IqnActs,
) -> Result<()> {
    let s = stream(lt, override_stream);
    let g = dims.gemms();
    let (os, ow) = (override_stream, override_workspace);
    let (b, n, a) = (dims.batch, dims.quantiles, dims.actions);
    let rows = b * n;
    k.cos_embed(s, &data.tau, &mut out.cosf, dims.cos_dim)?;
    lt.matmul(os, ow, &g.iqn_embed, &out.cosf, &p.embed.w, &mut out.phi)?;
    k.add_bias(s, &mut out.phi, &p.embed.b, rows, dims.hidden, true)?;
    k.broadcast_mul(s, &out.phi, h, &mut out.g, rows, dims.hidden, n)?;
    lt.matmul(os, ow, &g.iqn_out, &out.g, &p.out.w, &mut out.z)?;
    k.add_bias(s, &mut out.z, &p.out.b, rows, a, false)?;
    let mean = 1.0 / (rows * a) as f32;
    k.quantile_huber(
        s,
        &out.z,
        &data.target,
        &data.tau,
        &mut out.dz,
        &mut out.row_loss,
        b,
        n,
        a,
        HUBER_KAPPA,
        mean,
    )?;
    k.sum_scaled(s, &out.row_loss, &mut out.loss, mean)
}

/// The IQN head's backward pass through its output layer and one SGD step on it:
/// `grad = (dzᵀ·g, Σ_rows dz)`, `out_layer −= lr·grad`. Reads `acts` (from
/// [`iqn_head`]); writes `grad` and `out_layer` (the head's `p.out`).
#[allow(clippy::too_many_arguments)]
pub fn iqn_update(
    lt: &Lt,
    k: &Kernels,
    override_stream: Option<&Arc<CudaStream>>,
    override_workspace: Option<(u64, usize)>,
    dims: &Dims,
    lr: f32,
    acts: &IqnActs,
    out_layer: &mut Linear,
    grad: &mut Linear,
) -> Result<()> {
    let s = stream(lt, override_stream);
    let g = dims.gemms();
    let rows = dims.batch * dims.quantiles;
    lt.matmul(
        override_stream,
        override_workspace,
        &g.iqn_grad,
        &acts.dz,
        &acts.g,
        &mut grad.w,
    )?;
    k.col_sum(s, &acts.dz, &mut grad.b, rows, dims.actions)?;
    k.sgd(s, &mut out_layer.w, &grad.w, lr)?;
    k.sgd(s, &mut out_layer.b, &grad.b, lr)
}

/// The attention head's forward pass and loss: reads the trunk's `h [B, H]`, `p` and
/// `data`; writes `out`, including `L_attn` and `∂L_attn/∂pred` for [`attention_update`].
#[allow(clippy::too_many_arguments)]
pub fn attention_head(
    lt: &Lt,
    k: &Kernels,
    override_stream: Option<&Arc<CudaStream>>,
    override_workspace: Option<(u64, usize)>,
    dims: &Dims,
    h: &CudaSlice<f32>,
    p: &AttnParams,
    data: &AttnData,
    out: &mut AttnActs,
) -> Result<()> {
    let s = stream(lt, override_stream);
    let g = dims.gemms();
    let (os, ow) = (override_stream, override_workspace);
    let (b, t, e, r) = (dims.batch, dims.tokens, dims.width, dims.outputs);
    lt.matmul(os, ow, &g.attn_tokens, h, &p.tokens.w, &mut out.tok)?;
    k.add_bias(s, &mut out.tok, &p.tokens.b, b, t * e, true)?;
    lt.matmul(os, ow, &g.attn_qkv, &out.tok, &p.qkv.w, &mut out.qkv)?;
    k.add_bias(s, &mut out.qkv, &p.qkv.b, b * t, 3 * e, false)?;
    let scale = 1.0 / (e as f32).sqrt();
    k.attn_scores(s, &out.qkv, &mut out.scores, b, t, e, scale)?;
    k.softmax_rows(s, &mut out.scores, b * t, t)?;
    k.attn_context(s, &out.scores, &out.qkv, &mut out.ctx, b, t, e)?;
    lt.matmul(os, ow, &g.attn_out, &out.ctx, &p.out.w, &mut out.pred)?;
    k.add_bias(s, &mut out.pred, &p.out.b, b, r, false)?;
    let mean = 1.0 / (b * r) as f32;
    k.mse_rows(
        s,
        &out.pred,
        &data.target,
        &mut out.dpred,
        &mut out.row_loss,
        b,
        r,
        2.0 * mean,
    )?;
    k.sum_scaled(s, &out.row_loss, &mut out.loss, mean)
}

/// The attention head's backward pass through its output layer and one SGD step on it:
/// `grad = (dpredᵀ·ctx[:, 0], Σ_b dpred)`, `out_layer −= lr·grad`. Reads `acts` (from
/// [`attention_head`]); writes `grad` and `out_layer` (the head's `p.out`).
#[allow(clippy::too_many_arguments)]
pub fn attention_update(
    lt: &Lt,
    k: &Kernels,
    override_stream: Option<&Arc<CudaStream>>,
    override_workspace: Option<(u64, usize)>,
    dims: &Dims,
    lr: f32,
    acts: &AttnActs,
    out_layer: &mut Linear,
    grad: &mut Linear,
) -> Result<()> {
    let s = stream(lt, override_stream);
    let g = dims.gemms();
    lt.matmul(
        override_stream,
        override_workspace,
        &g.attn_grad,
        &acts.dpred,
        &acts.ctx,
        &mut grad.w,
    )?;
    k.col_sum(s, &acts.dpred, &mut grad.b, dims.batch, dims.outputs)?;
    k.sgd(s, &mut out_layer.w, &grad.w, lr)?;
    k.sgd(s, &mut out_layer.b, &grad.b, lr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_and_small_sizes_pass_their_check() {
        Dims::default().check().unwrap();
        Dims::small().check().unwrap();
        let e = Dims {
            tokens: 0,
            ..Dims::default()
        }
        .check()
        .unwrap_err()
        .to_string();
        assert_eq!(e, "Dims: tokens is zero");
        let e = Dims {
            batch: 1 << 20,
            ..Dims::default()
        }
        .check()
        .unwrap_err()
        .to_string();
        assert!(e.contains("phi [B N, H]"), "{e}");
    }

    #[test]
    fn every_gemm_of_the_step_is_a_valid_shape_over_the_step_buffers() {
        for d in [Dims::default(), Dims::small()] {
            let g = d.gemms();
            for gemm in g.all() {
                gemm.check().unwrap();
            }
            let (b, t, e, r) = (d.batch, d.tokens, d.width, d.outputs);
            let (bn, h) = (d.batch * d.quantiles, d.hidden);
            let ok = |gemm: Gemm, a: usize, bb: usize, dd: usize| {
                gemm.check_operands(a, bb, dd)
                    .unwrap_or_else(|err| panic!("{err}"))
            };
            ok(g.trunk1, b * d.input, h * d.input, b * h);
            ok(g.trunk2, b * h, h * h, b * h);
            ok(g.iqn_embed, bn * d.cos_dim, h * d.cos_dim, bn * h);
            ok(g.iqn_out, bn * h, d.actions * h, bn * d.actions);
            ok(g.iqn_grad, bn * d.actions, bn * h, d.actions * h);
            ok(g.attn_tokens, b * h, t * e * h, b * t * e);
            ok(g.attn_qkv, b * t * e, 3 * e * e, b * t * 3 * e);
            // ctx is read in place, one row of each sample.
            ok(g.attn_out, b * t * e, r * e, b * r);
            ok(g.attn_grad, b * r, b * t * e, r * e);
        }
    }

    #[test]
    fn the_readout_reads_token_zero_of_each_sample() {
        let d = Dims::default();
        let a = d.gemms().attn_out.a();
        assert_eq!(
            (a.rows, a.cols, a.ld),
            (d.batch, d.width, d.tokens * d.width)
        );
        let b = d.gemms().attn_grad.b();
        assert_eq!(
            (b.rows, b.cols, b.ld),
            (d.batch, d.width, d.tokens * d.width)
        );
    }
}
