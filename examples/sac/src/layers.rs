//! The networks of the SAC step as device buffers (parameters, and with the same shapes
//! their gradients and Adam moments), their activations, and the forward and backward
//! passes of a three-layer MLP as cuBLASLt matmuls and the ReLU backward kernel.

use stepgraph::{
    Blas, CaptureStream, Device, Epilogue, Matmul, MatmulArgs, Precision, Result, SmTarget,
    StepBuffer,
};

use stepgraph_kernels::column_sums_scratch_len;

use crate::kernels::{
    Buf, Kernels, NARROW_OUTPUTS, critic_head_scratch_len, critic_head_takes,
    relu_narrow_product_takes,
};

/// Every GEMM of the step runs in TF32 (MODEL.md, "Forward passes").
pub const PRECISION: Precision = Precision::Tf32;

/// The step's sizes (MODEL.md's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, stepgraph::ConfigValue)]
pub struct Sizes {
    /// `B`: transitions per step.
    pub batch: usize,
    /// `S`: observation features.
    pub obs: usize,
    /// `A`: action dimensions.
    pub action: usize,
    /// `H`: the hidden width of every network.
    pub hidden: usize,
}

impl Default for Sizes {
    /// B 16384, S 64, A 8, H 256.
    fn default() -> Sizes {
        Sizes {
            batch: 16384,
            obs: 64,
            action: 8,
            hidden: 256,
        }
    }
}

impl Sizes {
    /// Small sizes, for quick checks.
    pub fn small() -> Sizes {
        Sizes {
            batch: 256,
            obs: 12,
            action: 3,
            hidden: 32,
        }
    }

    /// `C = S + A`: a critic's input.
    pub fn critic_in(&self) -> usize {
        self.obs + self.action
    }

    /// The critics' shape.
    pub fn critic(&self) -> MlpDims {
        MlpDims {
            rows: self.batch,
            inp: self.critic_in(),
            hidden: self.hidden,
            out: 1,
            sms: SmTarget::Whole,
        }
    }

    /// The actor's shape: its head is the mean and the raw log_std, `2A` outputs.
    pub fn actor(&self) -> MlpDims {
        MlpDims {
            rows: self.batch,
            inp: self.obs,
            hidden: self.hidden,
            out: 2 * self.action,
            sms: SmTarget::Whole,
        }
    }

    /// Checks that no size is zero and that every tensor fits a kernel launch.
    pub fn check(&self) -> Result<()> {
        for (name, v) in [
            ("batch", self.batch),
            ("obs", self.obs),
            ("action", self.action),
            ("hidden", self.hidden),
        ] {
            if v == 0 {
                return Err(stepgraph::Error::Invalid(format!(
                    "Sizes: {name} must be at least 1"
                )));
            }
        }
        let widest = self.hidden.max(self.critic_in()).max(2 * self.action);
        stepgraph_kernels::launch::product("Sizes: [batch, widest]", &[self.batch, widest])
            .and_then(|n| stepgraph_kernels::launch::len_u32("Sizes: [batch, widest]", n))
            .map(|_| ())
    }
}

/// A three-layer MLP's sizes: `rows` inputs of `inp` features, two hidden layers of
/// `hidden`, `out` outputs; and the SMs its matmuls are planned for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlpDims {
    pub rows: usize,
    pub inp: usize,
    pub hidden: usize,
    pub out: usize,
    pub sms: SmTarget,
}

impl MlpDims {
    /// The same network with its matmuls planned for `sms` (cuBLASLt's SM count target).
    pub fn planned_for(self, sms: SmTarget) -> MlpDims {
        MlpDims { sms, ..self }
    }

    /// Whether its output layer, a loss on it and their backward are one pass of
    /// [`Kernels::critic_head`]: one output (a critic's) and a last hidden layer that
    /// kernel takes.
    pub fn fused_head(&self) -> bool {
        self.out == 1 && critic_head_takes(self.hidden)
    }
}

/// A linear layer `y = x wᵀ + b`, `w[out, in]`.
#[derive(Debug, StepBuffer)]
pub struct Linear {
    pub w: Buf,
    pub b: Buf,
}

impl Linear {
    pub fn zeros(device: &Device, name: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear {
            w: device.alloc_zeros(&format!("{name}.w"), out * inp)?,
            b: device.alloc_zeros(&format!("{name}.b"), out)?,
        })
    }
}

/// A network's three layers (`l1 [H, in]`, `l2 [H, H]`, `l3 [out, H]`); also the shape
/// of its gradients and Adam moments.
#[derive(Debug, StepBuffer)]
pub struct Mlp {
    pub l1: Linear,
    pub l2: Linear,
    pub l3: Linear,
}

impl Mlp {
    pub fn zeros(device: &Device, d: MlpDims, name: &str) -> Result<Mlp> {
        Ok(Mlp {
            l1: Linear::zeros(device, &format!("{name}.l1"), d.hidden, d.inp)?,
            l2: Linear::zeros(device, &format!("{name}.l2"), d.hidden, d.hidden)?,
            l3: Linear::zeros(device, &format!("{name}.l3"), d.out, d.hidden)?,
        })
    }

    /// Its tensors in one fixed order (`w1, b1, w2, b2, w3, b3`), the optimizer's.
    pub fn tensors(&self) -> [&Buf; 6] {
        [
            &self.l1.w, &self.l1.b, &self.l2.w, &self.l2.b, &self.l3.w, &self.l3.b,
        ]
    }

    /// The same, writable.
    pub fn tensors_mut(&mut self) -> [&mut Buf; 6] {
        let Mlp { l1, l2, l3 } = self;
        [
            &mut l1.w, &mut l1.b, &mut l2.w, &mut l2.b, &mut l3.w, &mut l3.b,
        ]
    }

    /// The MODEL.md names of [`Mlp::tensors`].
    pub const NAMES: [&'static str; 6] = ["w1", "b1", "w2", "b2", "w3", "b3"];
}

/// A forward pass of an MLP over one batch: both hidden layers' ReLU outputs and the
/// output.
#[derive(Debug, StepBuffer)]
pub struct MlpAct {
    /// `[rows, H]`.
    pub h1: Buf,
    /// `[rows, H]`.
    pub h2: Buf,
    /// `[rows, out]`.
    pub out: Buf,
}

impl MlpAct {
    pub fn zeros(device: &Device, d: MlpDims, name: &str) -> Result<MlpAct> {
        Ok(MlpAct {
            h1: device.alloc_zeros(&format!("{name}.h1"), d.rows * d.hidden)?,
            h2: device.alloc_zeros(&format!("{name}.h2"), d.rows * d.hidden)?,
            out: device.alloc_zeros(&format!("{name}.out"), d.rows * d.out)?,
        })
    }
}

/// An MLP's backward scratch: the hidden layers' pre-activation gradients and the bias
/// gradients' partial column sums.
#[derive(Debug, StepBuffer)]
pub struct MlpBack {
    /// `[rows, H]`: `dz2`.
    pub dz2: Buf,
    /// `[rows, H]`: `dz1`; in a pass for the input's gradient alone, the gradient at
    /// `h1` before ReLU's mask (`relu_narrow_product` applies it as it reads).
    pub dz1: Buf,
    /// The partial sums of [`Kernels::column_sums`](stepgraph_kernels::Kernels::column_sums),
    /// for every layer's bias gradient in turn.
    pub sums: Buf,
}

impl MlpBack {
    pub fn zeros(device: &Device, d: MlpDims, name: &str) -> Result<MlpBack> {
        // Also the partial sums of a critic's fused output layer (`critic_head`), which
        // are read before the hidden layers' column sums are written.
        let head = if d.fused_head() {
            critic_head_scratch_len(d.rows, d.hidden)
        } else {
            0
        };
        let sums = column_sums_scratch_len(d.rows, d.hidden)
            .max(column_sums_scratch_len(d.rows, d.out))
            .max(head);
        Ok(MlpBack {
            dz2: device.alloc_zeros(&format!("{name}.dz2"), d.rows * d.hidden)?,
            dz1: device.alloc_zeros(&format!("{name}.dz1"), d.rows * d.hidden)?,
            sums: device.alloc_zeros(&format!("{name}.bias sums"), sums)?,
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

/// `dw[out, in] = dyᵀ x`. (The bias gradient `Σ_rows dy` is a column sum of its own: at
/// these shapes cuBLASLt's `BgradA` epilogue is a separate kernel of one to 32 blocks
/// after the matmul's split-K reduction, PERF.md.)
pub fn weight_grad_spec(rows: usize, inp: usize, out: usize) -> Matmul {
    Matmul::new(out, inp, rows)
        .with_trans_a(true)
        .with_precision(PRECISION)
}

/// `dx[rows, in] = dy[rows, out] w[out, in]`.
pub fn input_grad_spec(rows: usize, inp: usize, out: usize) -> Matmul {
    Matmul::new(rows, inp, out).with_precision(PRECISION)
}

/// The forward pass `out = l3(relu(l2(relu(l1(x)))))`, each bias (and ReLU) a matmul
/// epilogue.
pub fn mlp_forward(
    blas: &Blas<'_>,
    d: MlpDims,
    x: &Buf,
    net: &Mlp,
    act: &mut MlpAct,
) -> Result<()> {
    hidden_forward(blas, d, x, net, act)?;
    let last = linear_spec(d.rows, d.hidden, d.out, Epilogue::Bias).with_sm_target(d.sms);
    blas.matmul(
        &last,
        &act.h2,
        &net.l3.w,
        &mut act.out,
        MatmulArgs::new().bias(&net.l3.b),
    )
}

/// The hidden layers of [`mlp_forward`]: `h1 = relu(l1(x))`, `h2 = relu(l2(h1))`.
pub fn hidden_forward(
    blas: &Blas<'_>,
    d: MlpDims,
    x: &Buf,
    net: &Mlp,
    act: &mut MlpAct,
) -> Result<()> {
    let MlpDims {
        rows,
        inp,
        hidden: h,
        sms,
        ..
    } = d;
    let relu = |i, o| linear_spec(rows, i, o, Epilogue::ReluBias).with_sm_target(sms);
    blas.matmul(
        &relu(inp, h),
        x,
        &net.l1.w,
        &mut act.h1,
        MatmulArgs::new().bias(&net.l1.b),
    )?;
    blas.matmul(
        &relu(h, h),
        &act.h1,
        &net.l2.w,
        &mut act.h2,
        MatmulArgs::new().bias(&net.l2.b),
    )
}

/// A linear layer's parameter gradients from its output's gradient `dy [rows, out]` and
/// its input `x [rows, in]` (the widths read off `grad`): `dw = dyᵀ x` and `db = Σ_rows dy`
/// by column sums, `sums` their scratch; the matmul planned for `d.sms`.
#[allow(clippy::too_many_arguments)]
pub fn linear_grads(
    blas: &Blas<'_>,
    stream: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    dy: &Buf,
    x: &Buf,
    grad: &mut Linear,
    sums: &mut Buf,
) -> Result<()> {
    weight_grad(blas, d, dy, x, &mut grad.w)?;
    let (rows, out) = (d.rows, grad.b.len());
    k.generic
        .column_sums(stream, dy, rows, out, sums, &mut grad.b)
}

/// [`linear_grads`] for a `dy` whose column sums' first pass was done as it was written
/// (`partials`, [`relu_hidden_grad`] given them): `dw = dyᵀ x`, and `db` the sums' second pass.
#[allow(clippy::too_many_arguments)]
pub fn linear_grads_summed(
    blas: &Blas<'_>,
    stream: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    dy: &Buf,
    x: &Buf,
    grad: &mut Linear,
    partials: &Buf,
) -> Result<()> {
    weight_grad(blas, d, dy, x, &mut grad.w)?;
    let (rows, out) = (d.rows, grad.b.len());
    k.generic
        .column_sums_finish(stream, partials, rows, out, &mut grad.b)
}

/// `dw = dyᵀ x` for `dy [rows, out]`, `x [rows, in]` (the widths read off `dw [out, in]`
/// and `dy`); the matmul planned for `d.sms`.
pub fn weight_grad(blas: &Blas<'_>, d: MlpDims, dy: &Buf, x: &Buf, dw: &mut Buf) -> Result<()> {
    let rows = d.rows;
    let out = dy.len() / rows.max(1);
    let inp = dw.len() / out.max(1);
    let spec = weight_grad_spec(rows, inp, out).with_sm_target(d.sms);
    blas.matmul(&spec, dy, x, dw, MatmulArgs::new())
}

/// The gradient through the ReLU of output `h [rows, units]` that feeds a layer of
/// weights `w [out, units]`, from that layer's output gradient `dy [rows, out]`:
/// `dz = (dy w) ⊙ (h > 0)`. A narrow layer (a critic's one unit, the actor's `2A`) takes
/// one pass (`narrow_relu_grad`); a wider one a GEMM and `relu_backward`.
#[allow(clippy::too_many_arguments)]
pub fn relu_input_grad(
    blas: &Blas<'_>,
    stream: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    dy: &Buf,
    w: &Buf,
    h: &Buf,
    dz: &mut Buf,
) -> Result<()> {
    let out = dy.len() / d.rows.max(1);
    if out <= NARROW_OUTPUTS {
        return k.narrow_relu_grad(stream, dy, w, h, dz, out);
    }
    let units = w.len() / out;
    let spec = input_grad_spec(d.rows, units, out).with_sm_target(d.sms);
    blas.matmul(&spec, dy, w, dz, MatmulArgs::new())?;
    k.relu_backward(stream, h, dz)
}

/// The gradient through the ReLU of a hidden layer's output `h [rows, units]` that feeds
/// a hidden layer of weights `w [out, units]`, given `wt = wᵀ [units, out]`, from that
/// layer's output gradient `dy [rows, out]`: `dz = (dy w) ⊙ (h > 0)`, the matmul as
/// `dy wtᵀ`, the layout of the forward one, where TF32 tensor cores read both operands
/// along the inner dimension: cuBLASLt's Hopper kernels take it (`dy w` with `w` as it is
/// runs Ampere's, about 1.45 times as long at these sizes; PERF.md).
///
/// Given `sums`, ReLU's backward also forms the first pass of the column sums of `dz` (the
/// bias gradient of the layer below) as it writes `dz` (`relu_backward_sums`), and
/// [`linear_grads_summed`] finishes them: one pass over `dz` fewer than `relu_backward`
/// and then [`linear_grads`]' column sums.
#[allow(clippy::too_many_arguments)]
pub fn relu_hidden_grad(
    blas: &Blas<'_>,
    stream: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    dy: &Buf,
    wt: &Buf,
    h: &Buf,
    dz: &mut Buf,
    sums: Option<&mut Buf>,
) -> Result<()> {
    input_grad_t(blas, d, dy, wt, dz)?;
    match sums {
        Some(partials) => k.relu_backward_sums(stream, h, dz, d.hidden, partials),
        None => k.relu_backward(stream, h, dz),
    }
}

/// `dx = dy w` as `dy wtᵀ`, `wt = wᵀ [units, out]` (see [`relu_hidden_grad`]); `dx [rows,
/// units]`.
fn input_grad_t(blas: &Blas<'_>, d: MlpDims, dy: &Buf, wt: &Buf, dx: &mut Buf) -> Result<()> {
    let out = dy.len() / d.rows.max(1);
    let units = wt.len() / out.max(1);
    let spec = linear_spec(d.rows, out, units, Epilogue::Default).with_sm_target(d.sms);
    blas.matmul(&spec, dy, wt, dx, MatmulArgs::new())
}

/// The backward pass of an MLP from the gradient `dout [rows, out]` of its output, given
/// its input `x`, the forward pass `act` and `w2t`, its second layer's weights transposed
/// ([`relu_hidden_grad`]): into `grads` (the parameters' gradients,
/// biases as column sums) when given, and, given `(dx, first)`, the input's gradient at
/// its columns `first..in` into `dx [rows, in − first]` (only the columns a caller needs
/// are computed: a critic's action columns for the actor); `back` holds the hidden
/// layers' gradients on the way.
#[allow(clippy::too_many_arguments)]
pub fn mlp_backward(
    blas: &Blas<'_>,
    stream: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    net: &Mlp,
    w2t: &Buf,
    x: &Buf,
    act: &MlpAct,
    dout: &Buf,
    back: &mut MlpBack,
    mut grads: Option<&mut Mlp>,
    dx: Option<(&mut Buf, usize)>,
) -> Result<()> {
    if let Some(g) = grads.as_deref_mut() {
        linear_grads(blas, stream, k, d, dout, &act.h2, &mut g.l3, &mut back.sums)?;
    }
    relu_input_grad(blas, stream, k, d, dout, &net.l3.w, &act.h2, &mut back.dz2)?;
    // The second layer's bias gradient where `dz2` is formed, as `critic_head` sums it
    // where it forms `dz2`; `hidden_backward` takes the weights' from there.
    if let Some(g) = grads.as_deref_mut() {
        let (rows, units) = (d.rows, g.l2.b.len());
        k.generic
            .column_sums(stream, &back.dz2, rows, units, &mut back.sums, &mut g.l2.b)?;
    }
    hidden_backward(blas, stream, k, d, net, w2t, x, act, back, grads, dx)
}

/// [`mlp_backward`] from `back.dz2`, the gradient at the last hidden layer's
/// pre-activation, on (`w2t` the second layer's weights transposed): the hidden layers'
/// gradients into `grads` but the second layer's bias gradient, which the op that forms
/// `dz2` sums (`critic_head` as it writes it, [`mlp_backward`] after it), and, given
/// `(dx, first)`,
/// the input's gradient at its columns `first..in`. Without `grads`, a narrow `dx` takes
/// ReLU's backward and its matmul in one pass (`relu_narrow_product`); with them, ReLU's
/// backward forms the first pass of the first layer's bias gradient as it goes
/// ([`relu_hidden_grad`]).
#[allow(clippy::too_many_arguments)]
pub fn hidden_backward(
    blas: &Blas<'_>,
    stream: &CaptureStream<'_>,
    k: &Kernels,
    d: MlpDims,
    net: &Mlp,
    w2t: &Buf,
    x: &Buf,
    act: &MlpAct,
    back: &mut MlpBack,
    mut grads: Option<&mut Mlp>,
    dx: Option<(&mut Buf, usize)>,
) -> Result<()> {
    let MlpDims {
        rows,
        inp,
        hidden: h,
        ..
    } = d;
    let MlpBack { dz2, dz1, sums } = back;
    if let Some(g) = grads.as_deref_mut() {
        weight_grad(blas, d, dz2, &act.h1, &mut g.l2.w)?;
    }
    // The input gradient's columns: from `first` to the end of the input.
    let mut dx = match dx {
        Some((dx, first)) => {
            let cols = inp.checked_sub(first).filter(|&c| c > 0).ok_or_else(|| {
                stepgraph::Error::Invalid(format!(
                    "hidden_backward: the input gradient's first column must be below the \
                     input's {inp}, found {first}"
                ))
            })?;
            Some((dx, first, cols))
        }
        None => None,
    };
    if let Some((dx, first, cols)) = &mut dx
        && grads.is_none()
        && relu_narrow_product_takes(h, *cols)
    {
        // dz1 before the ReLU's mask: relu_narrow_product applies it as it reads.
        input_grad_t(blas, d, dz2, w2t, dz1)?;
        return k.relu_narrow_product(stream, dz1, &act.h1, &net.l1.w, inp, *first, dx);
    }
    if let Some(g) = grads {
        relu_hidden_grad(blas, stream, k, d, dz2, w2t, &act.h1, dz1, Some(sums))?;
        linear_grads_summed(blas, stream, k, d, dz1, x, &mut g.l1, sums)?;
    } else {
        relu_hidden_grad(blas, stream, k, d, dz2, w2t, &act.h1, dz1, None)?;
    }
    let Some((dx, first, cols)) = dx else {
        return Ok(());
    };
    // dx = dz1 · w1[:, first..]: w1 [H, in] read as a block of its columns.
    let spec = input_grad_spec(rows, cols, h)
        .with_ld_b(inp)
        .with_sm_target(d.sms);
    let span = stepgraph::Span::columns(h, inp, first, cols);
    let w1 = net.l1.w.view(span.start()..span.end())?;
    blas.matmul(&spec, &*dz1, &w1, dx, MatmulArgs::new())
}
