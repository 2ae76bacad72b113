//! The pieces of the DQN model as device buffers: parameters (also used for their
//! gradients and Adam moments, which have the same shapes), activations, and the linear
//! layers' forward and backward as cuBLASLt matmuls.

use crate::kernels::{
    BranchHeadDims, ExpectileHeadDims, Kernels, TrunkL1Dims, branch_head_backward_scratch_len,
};
use stepgraph::{
    AllocLike, Blas, CaptureStream, Device, DeviceBuffer, Epilogue, Matmul, MatmulArgs, Precision,
    Result, StepBuffer,
};

/// f32 device buffer.
pub type Buf = DeviceBuffer<f32>;

/// Every GEMM of the step runs in TF32 (MODEL.md, "Precision and the stated bound").
pub const PRECISION: Precision = Precision::Tf32;

/// The model's sizes (MODEL.md's table); `D`, the number of branches, is fixed at 4 by
/// the step's `branch[4]` stream group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, stepgraph::ConfigValue)]
pub struct Sizes {
    pub batch: usize,
    pub state: usize,
    pub hidden: usize,
    pub glu: usize,
    pub actions: usize,
    pub quantiles: usize,
    pub cosines: usize,
    pub window: usize,
    pub width: usize,
    pub heads: usize,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            batch: 16384,
            state: 64,
            hidden: 256,
            glu: 32,
            actions: 5,
            quantiles: 32,
            cosines: 64,
            window: 8,
            width: 64,
            heads: 4,
        }
    }
}

impl Sizes {
    /// One branch's head: its GLU and advantage layer over the batch.
    pub fn branch_head(&self) -> BranchHeadDims {
        BranchHeadDims {
            batch: self.batch,
            glu: self.glu,
            actions: self.actions,
        }
    }

    /// An IQL head: its layer over the trunk's output.
    pub fn expectile_head(&self) -> ExpectileHeadDims {
        ExpectileHeadDims {
            batch: self.batch,
            hidden: self.hidden,
        }
    }

    /// The trunk's first layer, backward: over the batch, from the state.
    pub fn trunk_l1(&self) -> TrunkL1Dims {
        TrunkL1Dims {
            batch: self.batch,
            hidden: self.hidden,
            state: self.state,
        }
    }
}

/// The number of action branches.
pub const D: usize = 4;

/// A linear layer `y = x wᵀ + b`, `w[out, in]`.
#[derive(Debug, StepBuffer)]
pub struct Linear {
    pub w: Buf,
    pub b: Buf,
}

impl Linear {
    pub fn zeros(device: &Device, name: &str, out: usize, inp: usize) -> Result<Self> {
        Ok(Linear {
            w: device.alloc_zeros(&format!("{name}.w"), out * inp)?,
            b: device.alloc_zeros(&format!("{name}.b"), out)?,
        })
    }
}

/// `y[rows, out] = epilogue(x[rows, in] wᵀ + b)`.
pub fn linear_spec(rows: usize, inp: usize, out: usize, epilogue: Epilogue) -> Matmul {
    Matmul::new(rows, out, inp)
        .with_trans_b(true)
        .with_precision(PRECISION)
        .with_epilogue(epilogue)
}

/// `dw[out, in] = dyᵀ x` over `rows` rows of `dy[rows, out]` and `x[rows, in]`.
pub fn weight_only_grad_spec(rows: usize, inp: usize, out: usize) -> Matmul {
    Matmul::new(out, inp, rows)
        .with_trans_a(true)
        .with_precision(PRECISION)
}

/// `dw[out, in] = dyᵀ x` with `db[out] = Σ_rows dy` from the same matmul.
pub fn weight_grad_spec(rows: usize, inp: usize, out: usize) -> Matmul {
    weight_only_grad_spec(rows, inp, out).with_epilogue(Epilogue::BgradA)
}

/// `dx[rows, in] = dy[rows, out] w[out, in]`, with an optional backward epilogue.
pub fn input_grad_spec(rows: usize, inp: usize, out: usize, epilogue: Epilogue) -> Matmul {
    Matmul::new(rows, inp, out)
        .with_precision(PRECISION)
        .with_epilogue(epilogue)
}

/// `y = x wᵀ + b` (with `epilogue`'s activation).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    blas: &Blas<'_>,
    x: &Buf,
    layer: &Linear,
    y: &mut Buf,
    rows: usize,
    inp: usize,
    out: usize,
    epilogue: Epilogue,
) -> Result<()> {
    let spec = linear_spec(rows, inp, out, epilogue);
    blas.matmul(&spec, x, &layer.w, y, MatmulArgs::new().bias(&layer.b))
}

/// The weight and bias gradients of a layer from its input `x` and output gradient `dy`.
pub fn param_grads(
    blas: &Blas<'_>,
    dy: &Buf,
    x: &Buf,
    grad: &mut Linear,
    rows: usize,
    inp: usize,
    out: usize,
) -> Result<()> {
    let spec = weight_grad_spec(rows, inp, out);
    blas.matmul(
        &spec,
        dy,
        x,
        &mut grad.w,
        MatmulArgs::new().bias_grad(&mut grad.b),
    )
}

/// The weight and bias gradients of a layer whose rows are many and outputs few, with the
/// bias gradient from a wide column-sum kernel: cuBLASLt's bias-gradient epilogue sums
/// such a `dy` in 1 to 8 blocks (74 µs for the attention embedding's 131072 × 64 on an
/// H100, 7 µs for a one-output head), a long thin kernel on the critical path that other
/// streams starve further. `scratch` holds at least
/// [`stepgraph_kernels::column_sums_scratch_len`]`(rows, out)` floats.
#[allow(clippy::too_many_arguments)]
pub fn param_grads_wide(
    blas: &Blas<'_>,
    stream: &CaptureStream<'_>,
    k: &Kernels,
    dy: &Buf,
    x: &Buf,
    grad: &mut Linear,
    rows: usize,
    inp: usize,
    out: usize,
    scratch: &mut Buf,
) -> Result<()> {
    let spec = weight_only_grad_spec(rows, inp, out);
    blas.matmul(&spec, dy, x, &mut grad.w, MatmulArgs::new())?;
    k.generic
        .column_sums(stream, dy, rows, out, scratch, &mut grad.b)
}

/// Allocates a zeroed copy shaped like each field: per-branch scratch.
macro_rules! alloc_like_fields {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl AllocLike for $ty {
            fn alloc_like(&self, device: &Device, what: &str) -> Result<Self> {
                Ok($ty { $($field: self.$field.alloc_like(device, &format!("{what}.{}", stringify!($field)))?,)* })
            }
        }
    };
}

/// A branch's parameters: the GLU layer (`wg[2G, H]`) and the advantage head (`wa[A, G]`).
#[derive(Debug, StepBuffer)]
pub struct Branch {
    pub gate: Linear,
    pub adv: Linear,
}

/// A branch's forward activations for one batch of states.
#[derive(Debug, StepBuffer)]
pub struct BranchAct {
    /// `h wgᵀ + bg`, `[B, 2G]`.
    pub u: Buf,
    /// GLU output, `[B, G]`.
    pub g: Buf,
    /// Advantages, `[B, A]`.
    pub adv: Buf,
}

/// A branch's backward scratch: reused by every step, one copy per branch.
#[derive(Debug, StepBuffer)]
pub struct BranchBack {
    /// `[B, G]`: the GLU's output gradient, on the GEMM path only (sizes that
    /// [`Kernels::branch_head_backward`] does not take); one element otherwise.
    pub dg: Buf,
    /// `[B, 2G]`.
    pub du: Buf,
    /// [`Kernels::branch_head_backward`]'s partial sums; one element on the GEMM path.
    pub partials: Buf,
}
alloc_like_fields!(BranchBack { dg, du, partials });

impl Branch {
    pub fn zeros(device: &Device, s: &Sizes, name: &str) -> Result<Self> {
        Ok(Branch {
            gate: Linear::zeros(device, &format!("{name}.gate"), 2 * s.glu, s.hidden)?,
            adv: Linear::zeros(device, &format!("{name}.adv"), s.actions, s.glu)?,
        })
    }
}

impl BranchAct {
    pub fn zeros(device: &Device, s: &Sizes, name: &str) -> Result<Self> {
        Ok(BranchAct {
            u: device.alloc_zeros(&format!("{name}.u"), s.batch * 2 * s.glu)?,
            g: device.alloc_zeros(&format!("{name}.g"), s.batch * s.glu)?,
            adv: device.alloc_zeros(&format!("{name}.adv"), s.batch * s.actions)?,
        })
    }
}

impl BranchBack {
    pub fn zeros(device: &Device, s: &Sizes) -> Result<Self> {
        // Each path's buffer at its size, a one-element stand-in for the other's.
        let fused = s.branch_head().supported();
        let (dg, partials) = if fused {
            (1, branch_head_backward_scratch_len(s.branch_head()))
        } else {
            (s.batch * s.glu, 1)
        };
        Ok(BranchBack {
            dg: device.alloc_zeros("branch dg", dg)?,
            du: device.alloc_zeros("branch du", s.batch * 2 * s.glu)?,
            partials: device.alloc_zeros("branch head partial sums", partials)?,
        })
    }
}

/// The trunk and the value head: `w1[H, S]`, `w2[H, H]`, `wv[1, H]`.
#[derive(Debug, StepBuffer)]
pub struct Trunk {
    pub l1: Linear,
    pub l2: Linear,
    pub v: Linear,
}

impl Trunk {
    pub fn zeros(device: &Device, s: &Sizes, name: &str) -> Result<Self> {
        Ok(Trunk {
            l1: Linear::zeros(device, &format!("{name}.l1"), s.hidden, s.state)?,
            l2: Linear::zeros(device, &format!("{name}.l2"), s.hidden, s.hidden)?,
            v: Linear::zeros(device, &format!("{name}.v"), 1, s.hidden)?,
        })
    }
}

/// A forward pass of the trunk over one batch of states.
#[derive(Debug, StepBuffer)]
pub struct TrunkAct {
    pub h1: Buf,
    pub h: Buf,
    /// `[B]`.
    pub v: Buf,
}

impl TrunkAct {
    pub fn zeros(device: &Device, s: &Sizes, name: &str) -> Result<Self> {
        Ok(TrunkAct {
            h1: device.alloc_zeros(&format!("{name}.h1"), s.batch * s.hidden)?,
            h: device.alloc_zeros(&format!("{name}.h"), s.batch * s.hidden)?,
            v: device.alloc_zeros(&format!("{name}.v"), s.batch)?,
        })
    }
}

/// The trunk forward: `h1 = relu(x w1ᵀ + b1)`, `h = relu(h1 w2ᵀ + b2)`, `v = h wvᵀ + bv`.
/// With `mask1`, layer 1 also saves its ReLU mask for the backward pass.
pub fn trunk_forward(
    blas: &Blas<'_>,
    s: &Sizes,
    x: &Buf,
    trunk: &Trunk,
    act: &mut TrunkAct,
    mask1: Option<&mut DeviceBuffer<u8>>,
) -> Result<()> {
    let (b, st, h) = (s.batch, s.state, s.hidden);
    match mask1 {
        Some(mask) => {
            let spec = linear_spec(b, st, h, Epilogue::ReluAuxBias);
            blas.matmul(
                &spec,
                x,
                &trunk.l1.w,
                &mut act.h1,
                MatmulArgs::new().bias(&trunk.l1.b).save_relu_mask(mask),
            )?;
        }
        None => forward(
            blas,
            x,
            &trunk.l1,
            &mut act.h1,
            b,
            st,
            h,
            Epilogue::ReluBias,
        )?,
    }
    forward(
        blas,
        &act.h1,
        &trunk.l2,
        &mut act.h,
        b,
        h,
        h,
        Epilogue::ReluBias,
    )?;
    forward(blas, &act.h, &trunk.v, &mut act.v, b, h, 1, Epilogue::Bias)
}

/// The length of layer 1's saved ReLU mask, in bytes.
pub fn mask1_len(s: &Sizes) -> usize {
    linear_spec(s.batch, s.state, s.hidden, Epilogue::ReluAuxBias)
        .aux_len()
        .unwrap_or(0)
}
