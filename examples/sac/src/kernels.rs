//! The SAC step's own kernels (`cuda/sac.cu`, MODEL.md), built by stepgraph-build like any
//! user crate's, each behind a wrapper that checks sizes before it launches; the
//! optimizer's kernels and `axpby` (the Polyak update) come from `stepgraph-kernels`.
//!
//! Shapes are row-major (`[B, X]` puts row `b` at offset `b X`). Every wrapper fails with
//! [`Error::LengthMismatch`](stepgraph::Error::LengthMismatch) or [`Error::Invalid`](stepgraph::Error::Invalid) before anything is launched when a
//! buffer's length does not match the sizes it is given. Each kernel has a CPU reference
//! in [`reference`](crate::reference). The elementwise and one-block kernels declare their
//! lengths and grid above their signature (`// stepgraph(unsafe): ...`), and their
//! wrappers call the `_checked` methods stepgraph-build generates from that.

use std::sync::Arc;

use stepgraph::{CaptureStream, Device, DeviceBuffer, LaunchConfig, Result};
use stepgraph_kernels::ColumnSumsPlan;
use stepgraph_kernels::launch::{
    check_len, check_scratch, elementwise_config, float4_rows, len_u32, positive, product,
};

/// The registry stepgraph-build generated from `cuda/*.cu`.
mod raw {
    stepgraph::include_kernels!();
}
pub use raw::{KernelId, ModuleId};

/// f32 device buffer.
pub type Buf = DeviceBuffer<f32>;

/// Threads of the one-block reductions (`SAC_REDUCE_THREADS` in `cuda/sac.cu`).
pub const REDUCE_THREADS: u32 = 1024;

/// The lower clamp of the actor's log standard deviation.
pub const LOG_STD_MIN: f32 = -20.0;
/// The upper clamp of the actor's log standard deviation.
pub const LOG_STD_MAX: f32 = 2.0;
/// The constant in the tanh correction `log(1 − tanh(u)² + 1e-6)`.
pub const TANH_EPS: f32 = 1e-6;

/// The widest layer the narrow kernels take: the outputs of [`Kernels::narrow_relu_grad`]'s
/// layer, the columns [`Kernels::relu_narrow_product`] forms (`SAC_NARROW_MAX`). Past it,
/// the matmul is a GEMM's work.
pub const NARROW_OUTPUTS: usize = 32;

/// Warps of a [`Kernels::critic_head`] or [`Kernels::relu_narrow_product`] block
/// (`SAC_HEAD_WARPS`).
pub const HEAD_WARPS: usize = 8;
/// Rows each of their warps takes in turn (`SAC_HEAD_ROWS`).
pub const HEAD_ROWS: usize = 4;
/// The most blocks of a [`Kernels::relu_narrow_product`] launch: three for each of the
/// H200's 132 SMs, as many as its registers (71 a thread) let an SM hold. A fixed count,
/// not the device's; any count gives the same bits, as each row's sums are one warp's.
pub const NARROW_PRODUCT_BLOCKS: usize = 396;
/// The dynamic shared memory a block may use without opting in to more: 48 KiB.
pub const SHARED_BYTES: usize = 48 * 1024;

/// The blocks of a [`Kernels::critic_head`] launch over `rows` rows (and so the rows of
/// its partial sums).
pub fn head_blocks(rows: usize) -> usize {
    rows.div_ceil(HEAD_WARPS * HEAD_ROWS)
}

/// The partial sums [`Kernels::critic_head`] needs for `rows` rows of `cols` hidden units:
/// a row of `2 cols + 2` per block.
pub fn critic_head_scratch_len(rows: usize, cols: usize) -> usize {
    head_blocks(rows) * (2 * cols + 2)
}

/// Whether [`Kernels::critic_head`] takes a last hidden layer of `cols` units: its warps'
/// sums must fit a block's shared memory (up to 767 units). Wider critics keep the
/// matmuls, `mse_loss`, `narrow_relu_grad` and the column sums.
pub fn critic_head_takes(cols: usize) -> bool {
    cols > 0 && HEAD_WARPS * (2 * cols + 2) * 4 <= SHARED_BYTES
}

/// The most hidden units [`Kernels::critic_head`] takes (see [`critic_head_takes`]).
pub const CRITIC_HEAD_MAX_UNITS: usize = (SHARED_BYTES / (4 * HEAD_WARPS) - 2) / 2;

/// Whether [`Kernels::relu_narrow_product`] takes `n` outputs from `cols` hidden units:
/// `n` at most [`NARROW_OUTPUTS`] and `n cols` weights in a block's shared memory.
/// Otherwise the input gradient is `relu_backward` and a GEMM.
pub fn relu_narrow_product_takes(cols: usize, n: usize) -> bool {
    (1..=NARROW_OUTPUTS).contains(&n) && cols > 0 && n * cols * 4 <= SHARED_BYTES
}

/// A launch of `blocks` blocks of [`HEAD_WARPS`] warps with `shared` bytes.
fn head_config(blocks: usize, shared: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (len_u32("head blocks", blocks)?, 1, 1),
        block_dim: ((HEAD_WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: len_u32("head shared bytes", shared)?,
    })
}

/// The most critics [`Kernels::min_soft_target`] and [`Kernels::min_actor_loss`] take
/// (`SAC_MIN_CRITICS`); past it, the step takes the running minimum a critic at a time.
pub const MIN_CRITICS: usize = 4;

/// The critics' outputs as the fused minimum's four pointers: 1 to [`MIN_CRITICS`] of
/// them, each `[n]`, the unused slots the first (never read).
fn critic_outputs<'a>(what: &str, qs: &[&'a Buf], n: usize) -> Result<([&'a Buf; 4], u32)> {
    critic_slots(what, qs, n, "outputs ([n])")
}

/// One buffer per critic as a fused kernel's four pointers (1 to [`MIN_CRITICS`] of
/// them, each `n` long, the unused slots the first, never read); `kind` names them in
/// the error for one of another length.
fn critic_slots<'a>(
    what: &str,
    bufs: &[&'a Buf],
    n: usize,
    kind: &str,
) -> Result<([&'a Buf; 4], u32)> {
    // (A caller of gradients checks their count against the outputs' first.)
    let Some(&first) = bufs.first().filter(|_| bufs.len() <= MIN_CRITICS) else {
        return Err(stepgraph::Error::Invalid(format!(
            "{what}: expected 1 to {MIN_CRITICS} critics' outputs, found {}",
            bufs.len()
        )));
    };
    let mut slots = [first; MIN_CRITICS];
    for (i, b) in bufs.iter().enumerate() {
        check_len(&format!("{what}: critic {i}'s {kind}"), b.len(), n)?;
        slots[i] = b;
    }
    Ok((slots, bufs.len() as u32))
}

/// `len / k`, where `len` must be a positive multiple of `k`.
fn whole(what: &str, len: usize, k: usize) -> Result<usize> {
    if len == 0 || !len.is_multiple_of(k) {
        return Err(stepgraph::Error::Invalid(format!(
            "{what}: expected a positive multiple of {k} elements, found {len}"
        )));
    }
    Ok(len / k)
}

/// The SAC step's kernels and the generic ones it uses, loaded once per device.
#[derive(Debug)]
pub struct Kernels {
    raw: raw::Kernels,
    /// The optimizer's kernels and `axpby` (`stepgraph-kernels`).
    pub generic: Arc<stepgraph_kernels::Kernels>,
}

impl Kernels {
    /// Loads this crate's module and the generic kernels into `device`'s context; each
    /// kernel's parameter list is checked against its CUDA signature.
    pub fn load(device: &Device) -> Result<Kernels> {
        Ok(Kernels {
            raw: raw::Kernels::load(device)?,
            generic: Arc::new(stepgraph_kernels::Kernels::load(device)?),
        })
    }

    /// A kernel of this crate, for launches without a wrapper.
    pub fn kernel(&self, id: KernelId) -> &stepgraph::Kernel {
        self.raw.kernel(id)
    }

    /// `out[b] = [x[b], a[b]]`: `x [rows, xs]`, `a [rows, as_]`, `out [rows, xs + as_]`.
    #[allow(clippy::too_many_arguments)]
    pub fn concat_cols(
        &self,
        stream: &CaptureStream<'_>,
        x: &Buf,
        a: &Buf,
        out: &mut Buf,
        rows: usize,
        xs: usize,
        as_: usize,
    ) -> Result<()> {
        self.raw
            .concat_cols_checked(stream, x, a, out, rows, xs, as_)
    }

    /// [`Kernels::relu_backward`] of `dz [rows, cols]` and the first pass of the column
    /// sums of its result, in one pass: `partials` as [`ColumnSumsPlan`] lays them out
    /// (at least [`column_sums_scratch_len`](stepgraph_kernels::column_sums_scratch_len)
    /// floats), for
    /// [`column_sums_finish`](stepgraph_kernels::Kernels::column_sums_finish) to add into
    /// the bias gradient `Σ_rows dz`, with the bits of `column_sums` over the `dz` written.
    pub fn relu_backward_sums(
        &self,
        stream: &CaptureStream<'_>,
        h: &Buf,
        dz: &mut Buf,
        cols: usize,
        partials: &mut Buf,
    ) -> Result<()> {
        let rows = whole("relu_backward_sums: h ([rows, cols])", h.len(), cols)?;
        check_len(
            "relu_backward_sums: dz (the length of h)",
            dz.len(),
            h.len(),
        )?;
        len_u32("relu_backward_sums: h", h.len())?;
        let plan = ColumnSumsPlan::new(rows, cols);
        check_scratch(
            "relu_backward_sums: partials (at least column_sums_scratch_len)",
            partials.len(),
            plan.partials_len(cols),
        )?;
        let (r, c) = (rows as u32, cols as u32);
        let per_chunk = len_u32("relu_backward_sums: rows per chunk", plan.rows_per_chunk)?;
        // SAFETY: block (i, y) touches columns c < cols of rows [y per_chunk, rows) of h and
        // dz (rows cols elements each, checked above) and writes partials[y cols + c] with
        // y < chunks: inside partials (checked above).
        unsafe {
            self.raw
                .relu_backward_sums(stream, plan.launch()?, h, dz, r, c, per_chunk, partials)
        }
    }

    /// `dz[i] = h[i] > 0 ? dz[i] : 0`, in place: ReLU's backward from its output.
    pub fn relu_backward(&self, stream: &CaptureStream<'_>, h: &Buf, dz: &mut Buf) -> Result<()> {
        self.raw.relu_backward_checked(stream, h, dz, h.len())
    }

    /// `dz[b, j] = h[b, j] > 0 ? Σ_o dout[b, o] w[o, j] : 0`: the gradient through a hidden
    /// ReLU of output `h [rows, cols]` from `dout [rows, k]`, the gradient of a narrow
    /// output layer of weights `w [k, cols]` (`k` at most [`NARROW_OUTPUTS`]), the sum in
    /// `o` order in f32.
    pub fn narrow_relu_grad(
        &self,
        stream: &CaptureStream<'_>,
        dout: &Buf,
        w: &Buf,
        h: &Buf,
        dz: &mut Buf,
        k: usize,
    ) -> Result<()> {
        if k == 0 || k > NARROW_OUTPUTS {
            return Err(stepgraph::Error::Invalid(format!(
                "narrow_relu_grad: the output layer's width must be 1 to {NARROW_OUTPUTS}, \
                 found {k}"
            )));
        }
        let rows = whole("narrow_relu_grad: dout ([rows, k])", dout.len(), k)?;
        let cols = whole("narrow_relu_grad: w ([k, cols])", w.len(), k)?;
        let n = product("narrow_relu_grad", &[rows, cols])?;
        check_len("narrow_relu_grad: h ([rows, cols])", h.len(), n)?;
        check_len("narrow_relu_grad: dz ([rows, cols])", dz.len(), n)?;
        let n = len_u32("narrow_relu_grad: dz", n)?;
        let (rows, cols) = (positive("narrow_relu_grad: rows", rows)?, cols as u32);
        // Four elements a thread where the rows are whole 16-byte vectors.
        let addresses = [w.device_address(), h.device_address(), dz.device_address()];
        let quads = if float4_rows(cols as usize, &addresses) {
            n / 4
        } else {
            0
        };
        let threads = if quads != 0 { quads } else { n };
        // SAFETY: a thread past `threads` returns. With `quads`, thread t reads h and
        // writes dz at 4t..4t + 4 (< n, as cols % 4 == 0 keeps the four in one row b) and
        // reads w[o, j..j + 4] for o < k, all 16-byte aligned (checked); otherwise thread
        // (b, j) reads dout[b, 0..k], w[0..k, j] and h[i] and writes dz[i]. Everything is
        // in range by the lengths checked above.
        unsafe {
            self.raw.narrow_relu_grad(
                stream,
                elementwise_config(threads),
                dout,
                w,
                h,
                dz,
                rows,
                cols,
                k as u32,
                quads,
            )
        }
    }

    /// The critic loss: `dq = 2 (q − y) / n`, `loss[0] = mean (q − y)²`, `n = q.len()`.
    pub fn mse_loss(
        &self,
        stream: &CaptureStream<'_>,
        q: &Buf,
        y: &Buf,
        dq: &mut Buf,
        loss: &mut Buf,
    ) -> Result<()> {
        self.raw.mse_loss_checked(stream, q, y, dq, loss, q.len())
    }

    /// A critic's output layer, its MSE against `y` and their backward in one pass over
    /// `h [rows, cols]`, the last hidden layer's ReLU output, for an output layer of one
    /// unit (`w [cols]`, `bias [1]`): `q = h w + bias`, `dq = 2 (q − y) / rows`,
    /// `dz = (dq wᵀ) ⊙ (h > 0)`, the output layer's gradients `gw = dqᵀ h`, `gb = Σ dq`,
    /// `loss = mean (q − y)²` and the hidden layer's bias gradient `gb_hidden = Σ_rows dz`
    /// (`[cols]`), all in f32 in a fixed order. `partial` holds at
    /// least [`critic_head_scratch_len`] floats. Two launches: the pass, then the sums of its
    /// blocks. A `cols` that [`critic_head_takes`] refuses is an error.
    #[allow(clippy::too_many_arguments)]
    pub fn critic_head(
        &self,
        stream: &CaptureStream<'_>,
        h: &Buf,
        w: &Buf,
        bias: &Buf,
        y: &Buf,
        q: &mut Buf,
        dq: &mut Buf,
        dz: &mut Buf,
        partial: &mut Buf,
        gw: &mut Buf,
        gb: &mut Buf,
        loss: &mut Buf,
        gb_hidden: &mut Buf,
    ) -> Result<()> {
        let rows = y.len();
        let r = positive("critic_head: y ([rows])", rows)?;
        let cols = w.len();
        if !critic_head_takes(cols) {
            return Err(stepgraph::Error::Invalid(format!(
                "critic_head: the last hidden layer must have 1 to {CRITIC_HEAD_MAX_UNITS} \
                 units (its warps' sums in {SHARED_BYTES} bytes of shared memory), found {cols}"
            )));
        }
        let n = product("critic_head", &[rows, cols])?;
        check_len("critic_head: h ([rows, cols])", h.len(), n)?;
        check_len("critic_head: dz ([rows, cols])", dz.len(), n)?;
        check_len("critic_head: bias ([1])", bias.len(), 1)?;
        check_len("critic_head: q ([rows])", q.len(), rows)?;
        check_len("critic_head: dq ([rows])", dq.len(), rows)?;
        check_len("critic_head: gw ([cols])", gw.len(), cols)?;
        check_len("critic_head: gb ([1])", gb.len(), 1)?;
        check_len("critic_head: loss ([1])", loss.len(), 1)?;
        check_len("critic_head: gb_hidden ([cols])", gb_hidden.len(), cols)?;
        check_scratch(
            "critic_head: partial (at least critic_head_scratch_len(rows, cols))",
            partial.len(),
            critic_head_scratch_len(rows, cols),
        )?;
        // Row indices up to the last block's end must not wrap in 32 bits.
        len_u32(
            "critic_head: rows rounded up to whole blocks",
            head_blocks(rows) * HEAD_WARPS * HEAD_ROWS,
        )?;
        let c = cols as u32;
        let config = head_config(head_blocks(rows), HEAD_WARPS * (2 * cols + 2) * 4)?;
        // float4s where every row of h, w and dz starts 16-byte aligned.
        let vec = u32::from(float4_rows(
            cols,
            &[h.device_address(), w.device_address(), dz.device_address()],
        ));
        let blocks = config.grid_dim.0;
        // SAFETY: warp w of block k takes rows (8k + w) 4 .. + 4 below `rows`, reading
        // h, y and writing q, dq, dz in those rows only, and w[j], bias[0] for j < cols;
        // it writes its own row of the (2 cols + 2) 8 floats of shared memory given; the
        // block writes partial's row k of 2 cols + 2 (at least blocks (2 cols + 2) long,
        // checked).
        unsafe {
            self.raw.critic_head(
                stream,
                config,
                h,
                w,
                bias,
                y,
                q,
                dq,
                dz,
                &mut *partial,
                r,
                c,
                vec,
            )
        }?;
        let finish = LaunchConfig {
            grid_dim: ((2 * c + 2).div_ceil(32), 1, 1),
            block_dim: (32, 32, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: column_block_sum reads partial's rows < blocks at columns < 2 cols + 2;
        // thread (c, 0) writes gw[c] for c < cols, gb[0] at c = cols, loss[0] at
        // c = cols + 1 and gb_hidden[c - cols - 2] above (lengths checked above).
        unsafe {
            self.raw.critic_head_finish(
                stream, finish, &*partial, gw, gb, loss, gb_hidden, blocks, c, r,
            )
        }
    }

    /// A critic's output and the gradient at its last hidden layer in one pass over
    /// `h [rows, cols]`, that layer's ReLU output, for an output layer of one unit
    /// (`w [cols]`, `bias [1]`) whose output's gradient `dq [rows]` is given:
    /// `q = h w + bias` (in f32, each lane's columns in order, then the warp's sum) and
    /// `dz[b, j] = h[b, j] > 0 ? dq[b] w[j] : 0` (the bits of
    /// [`Kernels::narrow_relu_grad`] with one output). The critics' passes for the actor,
    /// whose `dq` is `−1/B` at every row.
    #[allow(clippy::too_many_arguments)]
    pub fn critic_q_relu_grad(
        &self,
        stream: &CaptureStream<'_>,
        h: &Buf,
        w: &Buf,
        bias: &Buf,
        dq: &Buf,
        q: &mut Buf,
        dz: &mut Buf,
    ) -> Result<()> {
        let rows = dq.len();
        let r = positive("critic_q_relu_grad: dq ([rows])", rows)?;
        let cols = w.len();
        let c = positive("critic_q_relu_grad: w ([cols])", cols)?;
        let n = product("critic_q_relu_grad", &[rows, cols])?;
        check_len("critic_q_relu_grad: h ([rows, cols])", h.len(), n)?;
        check_len("critic_q_relu_grad: dz ([rows, cols])", dz.len(), n)?;
        check_len("critic_q_relu_grad: bias ([1])", bias.len(), 1)?;
        check_len("critic_q_relu_grad: q ([rows])", q.len(), rows)?;
        let addresses = [h.device_address(), w.device_address(), dz.device_address()];
        let vec = u32::from(float4_rows(cols, &addresses));
        let config = LaunchConfig {
            grid_dim: (
                len_u32("critic_q_relu_grad: blocks", rows.div_ceil(HEAD_WARPS))?,
                1,
                1,
            ),
            block_dim: ((HEAD_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: warp w of block k takes row b = 8k + w and returns when b >= rows; it
        // reads h's row b, w[0..cols], bias[0] and dq[b] and writes dz's row b and q[b],
        // all within the lengths checked above; with vec, every row starts 16-byte
        // aligned (checked), so its float4s are aligned.
        unsafe {
            self.raw
                .critic_q_relu_grad(stream, config, h, w, bias, dq, q, dz, r, c, vec)
        }
    }

    /// `dx[b, c] = Σ_j (h[b, j] > 0 ? dh[b, j] : 0) w[j, first + c]` for `c < n`: a
    /// critic's input gradient at the `n` columns from `first` of its input (the action's
    /// for the actor), from the gradient `dh [rows, cols]` at its first layer's ReLU output
    /// `h [rows, cols]` and that layer's weights `w [cols, inp]`. ReLU's backward and the
    /// narrow matmul in one pass, in f32 in a fixed order. Sizes that
    /// [`relu_narrow_product_takes`] refuses are an error.
    #[allow(clippy::too_many_arguments)]
    pub fn relu_narrow_product(
        &self,
        stream: &CaptureStream<'_>,
        dh: &Buf,
        h: &Buf,
        w: &Buf,
        inp: usize,
        first: usize,
        dx: &mut Buf,
    ) -> Result<()> {
        let i = positive("relu_narrow_product: inp", inp)?;
        let cols = whole("relu_narrow_product: w ([cols, inp])", w.len(), inp)?;
        let rows = whole("relu_narrow_product: h ([rows, cols])", h.len(), cols)?;
        check_len(
            "relu_narrow_product: dh (the length of h)",
            dh.len(),
            h.len(),
        )?;
        let n = whole("relu_narrow_product: dx ([rows, n])", dx.len(), rows)?;
        let within = first.checked_add(n).is_some_and(|end| end <= inp);
        if !within || !relu_narrow_product_takes(cols, n) {
            return Err(stepgraph::Error::Invalid(format!(
                "relu_narrow_product: expected 1 to {NARROW_OUTPUTS} columns from {first} \
                 within the input's {inp}, their n {cols} weights together in {SHARED_BYTES} \
                 bytes of shared memory; found {n} columns"
            )));
        }
        let r = len_u32("relu_narrow_product: rows", rows)?;
        // A warp a row at a time, the grid striding over the rows: at most
        // NARROW_PRODUCT_BLOCKS blocks, so that each stages w's columns once for many rows.
        let blocks = rows.div_ceil(HEAD_WARPS).min(NARROW_PRODUCT_BLOCKS);
        // The grid's stride past the last row must not wrap in 32 bits.
        len_u32(
            "relu_narrow_product: rows and one stride of the grid",
            rows + blocks * HEAD_WARPS,
        )?;
        let config = head_config(blocks, n * cols * 4)?;
        // float4s where every row of h and dh starts 16-byte aligned.
        let vec = u32::from(float4_rows(
            cols,
            &[h.device_address(), dh.device_address()],
        ));
        // SAFETY: the block stages w[j, first + c] (j < cols, c < n, first + n <= inp, so
        // within w's cols inp) into n cols floats of shared memory; its warps take rows
        // below `rows` only, reading h and dh in those rows (with vec, float4s of aligned
        // rows) and writing dx's (rows n long, checked).
        unsafe {
            self.raw.relu_narrow_product(
                stream,
                config,
                dh,
                h,
                w,
                dx,
                r,
                cols as u32,
                i,
                first as u32,
                n as u32,
                vec,
            )
        }
    }

    /// The tanh-Gaussian sample: `head [rows, 2 dims]` (mean, raw log_std), `eps [rows,
    /// dims]`; writes `act [rows, dims]` and `logp [rows]`.
    #[allow(clippy::too_many_arguments)]
    pub fn tanh_gauss_sample(
        &self,
        stream: &CaptureStream<'_>,
        head: &Buf,
        eps: &Buf,
        act: &mut Buf,
        logp: &mut Buf,
        rows: usize,
        dims: usize,
    ) -> Result<()> {
        self.raw
            .tanh_gauss_sample_checked(stream, head, eps, act, logp, rows, dims)
    }

    /// `out [cols, rows] = inᵀ`, `input [rows, cols]` row-major: a layer's weights laid
    /// out for the input gradient's matmul in the layout of its forward one (TF32 tensor
    /// cores read both operands along the inner dimension; PERF.md).
    pub fn transpose(
        &self,
        stream: &CaptureStream<'_>,
        input: &Buf,
        out: &mut Buf,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let n = product("transpose", &[rows, cols])?;
        let r = positive("transpose: rows", rows)?;
        let c = positive("transpose: cols", cols)?;
        check_len("transpose: in ([rows, cols])", input.len(), n)?;
        check_len("transpose: out ([cols, rows])", out.len(), n)?;
        len_u32("transpose: in", n)?;
        let config = LaunchConfig {
            grid_dim: (c.div_ceil(32), r.div_ceil(32), 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: block (x, y) reads in[r, c] and writes out[c, r] for r < rows, c < cols
        // only; both hold rows cols elements (checked).
        unsafe { self.raw.transpose(stream, config, input, out, r, c) }
    }

    /// The running minimum over the critics: critic `index`'s outputs `q [n]` into `qmin`
    /// and its index into `argmin` where it is smaller (the lower index on a tie);
    /// `index == 0` copies. Called once per critic, in index order.
    pub fn critic_min(
        &self,
        stream: &CaptureStream<'_>,
        q: &Buf,
        qmin: &mut Buf,
        argmin: &mut DeviceBuffer<u32>,
        index: usize,
    ) -> Result<()> {
        let index = len_u32("critic_min: index", index)?;
        self.raw
            .critic_min_checked(stream, q, qmin, argmin, index, q.len())
    }

    /// `y = r + γ (1 − done) (qmin − exp(log_alpha[0]) logp_next)`, all `[n]`, with
    /// `qmin` the target critics' minimum ([`Kernels::critic_min`]).
    #[allow(clippy::too_many_arguments)]
    pub fn soft_target(
        &self,
        stream: &CaptureStream<'_>,
        r: &Buf,
        done: &Buf,
        qmin: &Buf,
        logp_next: &Buf,
        log_alpha: &Buf,
        y: &mut Buf,
        gamma: f32,
    ) -> Result<()> {
        let n = y.len();
        self.raw
            .soft_target_checked(stream, r, done, qmin, logp_next, log_alpha, y, gamma, n)
    }

    /// [`Kernels::critic_min`] over the critics' outputs `qs` (1 to [`MIN_CRITICS`], in
    /// index order) and [`Kernels::soft_target`] from their minimum, in one launch, with
    /// the same values: `qmin`, `argmin` and `y`, all `[n]`.
    #[allow(clippy::too_many_arguments)]
    pub fn min_soft_target(
        &self,
        stream: &CaptureStream<'_>,
        qs: &[&Buf],
        r: &Buf,
        done: &Buf,
        logp_next: &Buf,
        log_alpha: &Buf,
        qmin: &mut Buf,
        argmin: &mut DeviceBuffer<u32>,
        y: &mut Buf,
        gamma: f32,
    ) -> Result<()> {
        let n = y.len();
        let ([q0, q1, q2, q3], count) = critic_outputs("min_soft_target", qs, n)?;
        self.raw.min_soft_target_checked(
            stream, q0, q1, q2, q3, count, r, done, logp_next, log_alpha, qmin, argmin, y, gamma, n,
        )
    }

    /// [`Kernels::critic_min`] over the critics' outputs `qs` (1 to [`MIN_CRITICS`], in
    /// index order) and [`Kernels::actor_loss`] from their minimum, in one launch, with
    /// the same values: `qmin`, `argmin` (`[n]`) and `loss[0]`.
    #[allow(clippy::too_many_arguments)]
    pub fn min_actor_loss(
        &self,
        stream: &CaptureStream<'_>,
        qs: &[&Buf],
        logp: &Buf,
        log_alpha: &Buf,
        qmin: &mut Buf,
        argmin: &mut DeviceBuffer<u32>,
        loss: &mut Buf,
    ) -> Result<()> {
        let ([q0, q1, q2, q3], count) = critic_outputs("min_actor_loss", qs, logp.len())?;
        self.raw.min_actor_loss_checked(
            stream,
            q0,
            q1,
            q2,
            q3,
            count,
            logp,
            log_alpha,
            qmin,
            argmin,
            loss,
            logp.len(),
        )
    }

    /// The actor loss `loss[0] = mean(α logp − qmin)`, `qmin` the critics' minimum.
    pub fn actor_loss(
        &self,
        stream: &CaptureStream<'_>,
        qmin: &Buf,
        logp: &Buf,
        log_alpha: &Buf,
        loss: &mut Buf,
    ) -> Result<()> {
        self.raw
            .actor_loss_checked(stream, qmin, logp, log_alpha, loss, qmin.len())
    }

    /// The actor loss's gradient with respect to the actor's head, `dhead [rows, 2 dims]`,
    /// from `da [rows, dims]` (the loss's gradient with respect to the action through the
    /// critics, summed), the sample's `head`, `eps` and `act`, and
    /// `log_alpha` (MODEL.md, "Actor").
    #[allow(clippy::too_many_arguments)]
    pub fn tanh_gauss_backward(
        &self,
        stream: &CaptureStream<'_>,
        head: &Buf,
        eps: &Buf,
        act: &Buf,
        da: &Buf,
        log_alpha: &Buf,
        dhead: &mut Buf,
        rows: usize,
        dims: usize,
    ) -> Result<()> {
        self.raw
            .tanh_gauss_backward_checked(stream, head, eps, act, da, log_alpha, dhead, rows, dims)
    }

    /// [`Kernels::tanh_gauss_backward`] with `da` taken, row by row, from the critic
    /// smallest at the actor's sample: `qs` the critics' outputs (1 to [`MIN_CRITICS`], in
    /// index order, each `[rows]`), `das` their gradients at the action (of `−q / rows`,
    /// each `[rows, dims]`, every row computed), the lower index on a tie. The same bits
    /// as [`Kernels::critic_min_select`] over the critics, then
    /// [`Kernels::tanh_gauss_backward`].
    #[allow(clippy::too_many_arguments)]
    pub fn tanh_gauss_backward_min(
        &self,
        stream: &CaptureStream<'_>,
        head: &Buf,
        eps: &Buf,
        act: &Buf,
        qs: &[&Buf],
        das: &[&Buf],
        log_alpha: &Buf,
        dhead: &mut Buf,
        rows: usize,
        dims: usize,
    ) -> Result<()> {
        let what = "tanh_gauss_backward_min";
        let rd = product(what, &[rows, dims])?;
        let ([q0, q1, q2, q3], count) = critic_outputs(what, qs, rows)?;
        if das.len() != qs.len() {
            return Err(stepgraph::Error::Invalid(format!(
                "tanh_gauss_backward_min: expected a gradient per critic's output ({}), found {}",
                qs.len(),
                das.len()
            )));
        }
        let gradient = "gradient at the action ([rows, dims])";
        let ([da0, da1, da2, da3], _) = critic_slots(what, das, rd, gradient)?;
        self.raw.tanh_gauss_backward_min_checked(
            stream, head, eps, act, q0, q1, q2, q3, count, da0, da1, da2, da3, log_alpha, dhead,
            rows, dims,
        )
    }

    /// The running minimum over the critics carrying the actor's gradient through the
    /// smallest, a critic at a time (0 first), for more critics than
    /// [`Kernels::tanh_gauss_backward_min`] takes: critic `index`'s outputs `q [rows]` and
    /// its gradient at the action `da [rows, dims]` into `qmin` and `da_min` where it is
    /// smaller than every critic before it (the lower index on a tie); index 0 copies.
    #[allow(clippy::too_many_arguments)]
    pub fn critic_min_select(
        &self,
        stream: &CaptureStream<'_>,
        q: &Buf,
        da: &Buf,
        qmin: &mut Buf,
        da_min: &mut Buf,
        index: usize,
        dims: usize,
    ) -> Result<()> {
        let index = len_u32("critic_min_select: index", index)?;
        self.raw
            .critic_min_select_checked(stream, q, da, qmin, da_min, index, q.len(), dims)
    }

    /// The temperature's gradient `grad[0] = −mean(logp + target_entropy)` and loss
    /// `loss[0] = −log_alpha[0] mean(logp + target_entropy)`.
    pub fn alpha_grad(
        &self,
        stream: &CaptureStream<'_>,
        logp: &Buf,
        log_alpha: &Buf,
        grad: &mut Buf,
        loss: &mut Buf,
        target_entropy: f32,
    ) -> Result<()> {
        self.raw.alpha_grad_checked(
            stream,
            logp,
            log_alpha,
            grad,
            loss,
            target_entropy,
            logp.len(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused kernels take the step's sizes and the odd ones, and leave to the
    /// matmuls what does not fit a block's shared memory.
    #[test]
    fn each_size_takes_the_path_it_should() {
        assert_eq!(CRITIC_HEAD_MAX_UNITS, 767);
        for cols in [256, 200, 1, 767] {
            assert!(critic_head_takes(cols), "{cols}");
        }
        for cols in [0, 768, 4096] {
            assert!(!critic_head_takes(cols), "{cols}");
        }
        for (cols, n) in [(256, 8), (200, 6), (256, 32), (1536, 8)] {
            assert!(relu_narrow_product_takes(cols, n), "{cols} {n}");
        }
        for (cols, n) in [(256, 0), (256, 33), (1537, 8), (0, 8)] {
            assert!(!relu_narrow_product_takes(cols, n), "{cols} {n}");
        }
        assert_eq!(head_blocks(16384), 512);
        assert_eq!(head_blocks(1001), 32);
        assert_eq!(critic_head_scratch_len(1000, 200), 32 * 402);
    }

    /// The constants here are the ones `cuda/sac.cu` defines.
    #[test]
    fn the_constants_agree_with_the_cuda_source() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda/sac.cu");
        let d = stepgraph_testkit::cuda_defines(std::path::Path::new(path)).unwrap();
        assert_eq!(d["SAC_REDUCE_THREADS"], REDUCE_THREADS.to_string());
        assert_eq!(d["SAC_LOG_STD_MIN"], "(-20.0f)");
        assert_eq!(d["SAC_LOG_STD_MAX"], "2.0f");
        assert_eq!(d["SAC_TANH_EPS"], "1e-6f");
        assert_eq!(d["SAC_HEAD_WARPS"], HEAD_WARPS.to_string());
        assert_eq!(d["SAC_HEAD_ROWS"], HEAD_ROWS.to_string());
        assert_eq!(d["SAC_NARROW_MAX"], NARROW_OUTPUTS.to_string());
        assert_eq!(d["SAC_MIN_CRITICS"], MIN_CRITICS.to_string());
    }
}
