//! The trainer's kernels (`cuda/*.cu`), loaded once into a context, with one launch
//! function each that checks every buffer's length before it launches.
//!
//! Shapes are row-major: `[R, C]` puts row `r` at offset `r·C`. A launch function issues
//! one kernel on the stream it is given and does nothing else on the host, so it can be
//! captured.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::error::{Error, Result};

/// One image nvcc compiled from a `cuda/*.cu` file (see `build.rs`).
struct Image {
    /// The file's stem: `layers` for `cuda/layers.cu`.
    module: &'static str,
    /// PTX (NUL-terminated, JIT-compiled by the driver) rather than a cubin.
    #[cfg_attr(not(test), allow(dead_code))]
    ptx: bool,
    bytes: &'static [u8],
}

/// Every image, per module cubins first and newer targets first: the order to try them in.
const IMAGES: &[Image] = include!(concat!(env!("OUT_DIR"), "/images.rs"));

/// Threads per block of the elementwise kernels.
pub const BLOCK_THREADS: u32 = 256;

/// Threads per block of the kernels that reduce with `block_sum` (`cuda/reduce.cuh`,
/// which defines the same number): its tree assumes exactly this many.
pub const REDUCE_THREADS: u32 = 256;

/// The most threads (or elements) one launch covers: the kernels index with 32-bit
/// unsigned integers, and `blockIdx.x·blockDim.x + threadIdx.x` must not wrap in the last
/// block.
pub const MAX_ELEMS: usize = i32::MAX as usize;

/// The trainer's kernels, loaded into one context.
#[derive(Debug)]
pub struct Kernels {
    add_bias: CudaFunction,
    col_sum: CudaFunction,
    sum_scaled: CudaFunction,
    sgd: CudaFunction,
    cos_embed: CudaFunction,
    broadcast_mul: CudaFunction,
    quantile_huber: CudaFunction,
    attn_scores: CudaFunction,
    softmax_rows: CudaFunction,
    attn_context: CudaFunction,
    mse_rows: CudaFunction,
}

/// Loads module `name`, trying its images in order; the first image's error if the
/// driver refuses them all (a cubin for another GPU is refused, its PTX then JIT-compiled).
fn load_module(ctx: &Arc<CudaContext>, name: &str) -> Result<Arc<CudaModule>> {
    let mut first_error = None;
    for image in IMAGES.iter().filter(|i| i.module == name) {
        match ctx.load_module(Ptx::from_binary(image.bytes.to_vec())) {
            Ok(module) => return Ok(module),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(Error::driver("cuModuleLoadData")(e)),
        None => Err(Error::Invalid(format!(
            "no compiled image of cuda/{name}.cu was embedded"
        ))),
    }
}

fn function(module: &Arc<CudaModule>, name: &str) -> Result<CudaFunction> {
    module
        .load_function(name)
        .map_err(Error::driver("cuModuleGetFunction"))
}

/// `count` elements, one thread each, [`BLOCK_THREADS`] per block.
fn elementwise(count: u32) -> LaunchConfig {
    blocks(count.div_ceil(BLOCK_THREADS), BLOCK_THREADS)
}

fn blocks(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The product of `factors` as the kernels' `unsigned`: nonzero (a launch of no blocks is
/// an error) and at most [`MAX_ELEMS`].
pub fn count(kernel: &str, what: &str, factors: &[usize]) -> Result<u32> {
    let n = factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .filter(|&n| n <= MAX_ELEMS);
    match n {
        Some(0) => Err(Error::Invalid(format!("{kernel}: {what} is empty"))),
        Some(n) => u32::try_from(n)
            .map_err(|_| Error::Invalid(format!("{kernel}: {what} does not fit a u32"))),
        None => Err(Error::Invalid(format!(
            "{kernel}: {what} ({}) is more than one launch covers ({MAX_ELEMS})",
            factors
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" x ")
        ))),
    }
}

/// Checks that `operand` of `kernel` holds exactly `want` elements.
pub fn expect_len(kernel: &str, operand: &str, len: usize, want: usize) -> Result<()> {
    if len == want {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{kernel}: {operand} holds {len} elements, and the sizes given need {want}"
        )))
    }
}

fn launched<T>(r: std::result::Result<T, cudarc::driver::DriverError>) -> Result<()> {
    r.map(|_| ()).map_err(Error::driver("cuLaunchKernel"))
}

impl Kernels {
    /// Loads `cuda/layers.cu`, `iqn.cu` and `attention.cu` into `ctx` and looks up every
    /// kernel, once, before any capture.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        let layers = load_module(ctx, "layers")?;
        let iqn = load_module(ctx, "iqn")?;
        let attention = load_module(ctx, "attention")?;
        Ok(Kernels {
            add_bias: function(&layers, "add_bias")?,
            col_sum: function(&layers, "col_sum")?,
            sum_scaled: function(&layers, "sum_scaled")?,
            sgd: function(&layers, "sgd")?,
            cos_embed: function(&iqn, "cos_embed")?,
            broadcast_mul: function(&iqn, "broadcast_mul")?,
            quantile_huber: function(&iqn, "quantile_huber")?,
            attn_scores: function(&attention, "attn_scores")?,
            softmax_rows: function(&attention, "softmax_rows")?,
            attn_context: function(&attention, "attn_context")?,
            mse_rows: function(&attention, "mse_rows")?,
        })
    }

    /// `y[r, c] = act(y[r, c] + bias[c])` in place, `act` a ReLU when `relu`; `y` is
    /// `[rows, cols]`.
    pub fn add_bias(
        &self,
        stream: &Arc<CudaStream>,
        y: &mut CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        relu: bool,
    ) -> Result<()> {
        const K: &str = "add_bias";
        let n = count(K, "y", &[rows, cols])?;
        expect_len(K, "y", y.len(), rows * cols)?;
        expect_len(K, "bias", bias.len(), cols)?;
        let (rows, cols, relu) = (rows as u32, cols as u32, i32::from(relu));
        let mut launch = stream.launch_builder(&self.add_bias);
        launch.arg(y).arg(bias).arg(&rows).arg(&cols).arg(&relu);
        // SAFETY: the arguments are the kernel's (float*, const float*, unsigned,
        // unsigned, int) in order; y holds rows·cols = n elements and bias cols, checked
        // above, and the kernel returns for i >= n.
        launched(unsafe { launch.launch(elementwise(n)) })
    }

    /// `out[c] = Σ_r x[r, c]` for `x` `[rows, cols]`: a bias gradient.
    pub fn col_sum(
        &self,
        stream: &Arc<CudaStream>,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        const K: &str = "col_sum";
        count(K, "x", &[rows, cols])?;
        expect_len(K, "x", x.len(), rows * cols)?;
        expect_len(K, "out", out.len(), cols)?;
        let (rows, cols) = (rows as u32, cols as u32);
        let mut launch = stream.launch_builder(&self.col_sum);
        launch.arg(x).arg(out).arg(&rows).arg(&cols);
        // SAFETY: (const float*, float*, unsigned, unsigned) in order; x holds rows·cols
        // and out cols elements, checked above; block c reads column c of rows rows and
        // writes out[c], with the REDUCE_THREADS threads its reduction assumes.
        launched(unsafe { launch.launch(blocks(cols, REDUCE_THREADS)) })
    }

    /// `out[0] = scale·Σ_i x[i]`: a mean loss from per-row losses.
    pub fn sum_scaled(
        &self,
        stream: &Arc<CudaStream>,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        scale: f32,
    ) -> Result<()> {
        const K: &str = "sum_scaled";
        let n = count(K, "x", &[x.len()])?;
        expect_len(K, "out", out.len(), 1)?;
        let mut launch = stream.launch_builder(&self.sum_scaled);
        launch.arg(x).arg(out).arg(&n).arg(&scale);
        // SAFETY: (const float*, float*, unsigned, float) in order; x holds n elements and
        // out one; one block of the REDUCE_THREADS threads its reduction assumes.
        launched(unsafe { launch.launch(blocks(1, REDUCE_THREADS)) })
    }

    /// `w[i] -= lr·g[i]`: one SGD step.
    pub fn sgd(
        &self,
        stream: &Arc<CudaStream>,
        w: &mut CudaSlice<f32>,
        g: &CudaSlice<f32>,
        lr: f32,
    ) -> Result<()> {
        const K: &str = "sgd";
        let n = count(K, "w", &[w.len()])?;
        expect_len(K, "g", g.len(), w.len())?;
        let mut launch = stream.launch_builder(&self.sgd);
        launch.arg(w).arg(g).arg(&n).arg(&lr);
        // SAFETY: (float*, const float*, unsigned, float) in order; w and g hold n
        // elements, checked above, and the kernel returns for i >= n.
        launched(unsafe { launch.launch(elementwise(n)) })
    }

    /// `cosf[r, i] = cos(π·(i + 1)·tau[r])` for `i < dim`: IQN's embedding of its quantile
    /// fractions; `tau` is `[rows]`, `cosf` `[rows, dim]`.
    pub fn cos_embed(
        &self,
        stream: &Arc<CudaStream>,
        tau: &CudaSlice<f32>,
        cosf: &mut CudaSlice<f32>,
        dim: usize,
    ) -> Result<()> {
        const K: &str = "cos_embed";
        let rows = tau.len();
        let n = count(K, "cosf", &[rows, dim])?;
        expect_len(K, "cosf", cosf.len(), rows * dim)?;
        let (rows, dim) = (rows as u32, dim as u32);
        let mut launch = stream.launch_builder(&self.cos_embed);
        launch.arg(tau).arg(cosf).arg(&rows).arg(&dim);
        // SAFETY: (const float*, float*, unsigned, unsigned) in order; tau holds rows and
        // cosf rows·dim = n elements, and the kernel returns for i >= n.
        launched(unsafe { launch.launch(elementwise(n)) })
    }

    /// `out[r, c] = x[r, c]·h[r / group, c]`: each row of `h` scales `group` consecutive
    /// rows of `x`. `x` and `out` are `[rows, cols]`, `h` `[rows / group, cols]`.
    #[allow(clippy::too_many_arguments)]
    pub fn broadcast_mul(
        &self,
        stream: &Arc<CudaStream>,
        x: &CudaSlice<f32>,
        h: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
        group: usize,
    ) -> Result<()> {
        const K: &str = "broadcast_mul";
        let n = count(K, "x", &[rows, cols])?;
        if group == 0 || !rows.is_multiple_of(group) {
            return Err(Error::Invalid(format!(
                "{K}: {rows} rows do not split into groups of {group}"
            )));
        }
        expect_len(K, "x", x.len(), rows * cols)?;
        expect_len(K, "out", out.len(), rows * cols)?;
        expect_len(K, "h", h.len(), rows / group * cols)?;
        let (rows, cols, group) = (rows as u32, cols as u32, group as u32);
        let mut launch = stream.launch_builder(&self.broadcast_mul);
        launch
            .arg(x)
            .arg(h)
            .arg(out)
            .arg(&rows)
            .arg(&cols)
            .arg(&group);
        // SAFETY: (const float*, const float*, float*, unsigned x3) in order; x and out
        // hold n = rows·cols elements and h (rows / group)·cols, checked above, with rows
        // a multiple of group; the kernel returns for i >= n.
        launched(unsafe { launch.launch(elementwise(n)) })
    }

    /// IQN's quantile Huber loss and its gradient (`cuda/iqn.cu` states them): for each
    /// sample `b`, `row_loss[b] = Σ_{j,a} |tau[b,j] − 1(u < 0)|·huber_κ(u)` with
    /// `u = target[b,a] − z[b,j,a]`, and `dz = grad_scale·∂(Σ_b row_loss[b])/∂z`.
    /// `z` and `dz` are `[batch, quantiles, outputs]`, `target` `[batch, outputs]`, `tau`
    /// `[batch, quantiles]`, `row_loss` `[batch]`.
    #[allow(clippy::too_many_arguments)]
    pub fn quantile_huber(
        &self,
        stream: &Arc<CudaStream>,
        z: &CudaSlice<f32>,
        target: &CudaSlice<f32>,
        tau: &CudaSlice<f32>,
        dz: &mut CudaSlice<f32>,
        row_loss: &mut CudaSlice<f32>,
        batch: usize,
        quantiles: usize,
        outputs: usize,
        kappa: f32,
        grad_scale: f32,
    ) -> Result<()> {
        const K: &str = "quantile_huber";
        let samples = count(K, "batch", &[batch])?;
        count(K, "z", &[batch, quantiles, outputs])?;
        // The Huber loss needs a positive threshold (at 0 it is |u|, whose gradient the
        // clamp would zero).
        if kappa.is_nan() || kappa <= 0.0 {
            return Err(Error::Invalid(format!(
                "{K}: the Huber threshold must be positive, not {kappa}"
            )));
        }
        let elems = batch * quantiles * outputs;
        expect_len(K, "z", z.len(), elems)?;
        expect_len(K, "dz", dz.len(), elems)?;
        expect_len(K, "target", target.len(), batch * outputs)?;
        expect_len(K, "tau", tau.len(), batch * quantiles)?;
        expect_len(K, "row_loss", row_loss.len(), batch)?;
        let (quantiles, outputs) = (quantiles as u32, outputs as u32);
        let mut launch = stream.launch_builder(&self.quantile_huber);
        launch
            .arg(z)
            .arg(target)
            .arg(tau)
            .arg(dz)
            .arg(row_loss)
            .arg(&quantiles)
            .arg(&outputs)
            .arg(&kappa)
            .arg(&grad_scale);
        // SAFETY: (const float* x3, float* x2, unsigned x2, float x2) in order; every
        // buffer's length was checked against batch, quantiles and outputs above; block b
        // < batch touches sample b's elements only, with the REDUCE_THREADS threads its
        // reduction assumes.
        launched(unsafe { launch.launch(blocks(samples, REDUCE_THREADS)) })
    }

    /// `scores[b,i,j] = scale·q[b,i]·k[b,j]` for the packed projections `qkv`
    /// `[batch·tokens, 3·width]` (query, key, value of each token); `scores` is
    /// `[batch·tokens, tokens]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_scores(
        &self,
        stream: &Arc<CudaStream>,
        qkv: &CudaSlice<f32>,
        scores: &mut CudaSlice<f32>,
        batch: usize,
        tokens: usize,
        width: usize,
        scale: f32,
    ) -> Result<()> {
        const K: &str = "attn_scores";
        let n = count(K, "scores", &[batch, tokens, tokens])?;
        count(K, "qkv", &[batch, tokens, 3, width])?;
        expect_len(K, "qkv", qkv.len(), batch * tokens * 3 * width)?;
        expect_len(K, "scores", scores.len(), batch * tokens * tokens)?;
        let (batch, tokens, width) = (batch as u32, tokens as u32, width as u32);
        let mut launch = stream.launch_builder(&self.attn_scores);
        launch
            .arg(qkv)
            .arg(scores)
            .arg(&batch)
            .arg(&tokens)
            .arg(&width)
            .arg(&scale);
        // SAFETY: (const float*, float*, unsigned x3, float) in order; qkv holds
        // batch·tokens rows of 3·width and scores n = batch·tokens² elements, checked
        // above; the kernel returns for idx >= n.
        launched(unsafe { launch.launch(elementwise(n)) })
    }

    /// Each row of `x` `[rows, cols]` becomes its softmax, in place.
    pub fn softmax_rows(
        &self,
        stream: &Arc<CudaStream>,
        x: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        const K: &str = "softmax_rows";
        count(K, "x", &[rows, cols])?;
        // One warp per row.
        let threads = count(K, "its threads", &[rows, 32])?;
        expect_len(K, "x", x.len(), rows * cols)?;
        let (rows, cols) = (rows as u32, cols as u32);
        let mut launch = stream.launch_builder(&self.softmax_rows);
        launch.arg(x).arg(&rows).arg(&cols);
        // SAFETY: (float*, unsigned, unsigned) in order; x holds rows·cols elements; the
        // grid is whole warps (BLOCK_THREADS is a multiple of 32), one per row, and a warp
        // past the last row returns.
        launched(unsafe { launch.launch(elementwise(threads)) })
    }

    /// `ctx[b,i,e] = Σ_j p[b,i,j]·v[b,j,e]`: the attention-weighted values; `p` is
    /// `[batch·tokens, tokens]`, `qkv` as for [`attn_scores`](Kernels::attn_scores),
    /// `ctx` `[batch·tokens, width]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_context(
        &self,
        stream: &Arc<CudaStream>,
        p: &CudaSlice<f32>,
        qkv: &CudaSlice<f32>,
        ctx: &mut CudaSlice<f32>,
        batch: usize,
        tokens: usize,
        width: usize,
    ) -> Result<()> {
        const K: &str = "attn_context";
        let n = count(K, "ctx", &[batch, tokens, width])?;
        count(K, "qkv", &[batch, tokens, 3, width])?;
        expect_len(K, "p", p.len(), batch * tokens * tokens)?;
        expect_len(K, "qkv", qkv.len(), batch * tokens * 3 * width)?;
        expect_len(K, "ctx", ctx.len(), batch * tokens * width)?;
        let (batch, tokens, width) = (batch as u32, tokens as u32, width as u32);
        let mut launch = stream.launch_builder(&self.attn_context);
        launch
            .arg(p)
            .arg(qkv)
            .arg(ctx)
            .arg(&batch)
            .arg(&tokens)
            .arg(&width);
        // SAFETY: (const float* x2, float*, unsigned x3) in order; every length was checked
        // above; the kernel returns for idx >= n = batch·tokens·width.
        launched(unsafe { launch.launch(elementwise(n)) })
    }

    /// The squared error of each row and its gradient: `row_loss[r] = Σ_c (pred − target)²`
    /// and `dpred = grad_scale·(pred − target)`, for `[rows, cols]` `pred`, `target` and
    /// `dpred`, and `[rows]` `row_loss`.
    #[allow(clippy::too_many_arguments)]
    pub fn mse_rows(
        &self,
        stream: &Arc<CudaStream>,
        pred: &CudaSlice<f32>,
        target: &CudaSlice<f32>,
        dpred: &mut CudaSlice<f32>,
        row_loss: &mut CudaSlice<f32>,
        rows: usize,
        cols: usize,
        grad_scale: f32,
    ) -> Result<()> {
        const K: &str = "mse_rows";
        count(K, "pred", &[rows, cols])?;
        let n = count(K, "row_loss", &[rows])?;
        for (name, len) in [
            ("pred", pred.len()),
            ("target", target.len()),
            ("dpred", dpred.len()),
        ] {
            expect_len(K, name, len, rows * cols)?;
        }
        expect_len(K, "row_loss", row_loss.len(), rows)?;
        let (rows, cols) = (rows as u32, cols as u32);
        let mut launch = stream.launch_builder(&self.mse_rows);
        launch
            .arg(pred)
            .arg(target)
            .arg(dpred)
            .arg(row_loss)
            .arg(&rows)
            .arg(&cols)
            .arg(&grad_scale);
        // SAFETY: (const float* x2, float* x2, unsigned x2, float) in order; the lengths
        // were checked above; thread r < rows touches row r only and the kernel returns
        // for r >= rows.
        launched(unsafe { launch.launch(elementwise(n)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reduction_width_is_the_one_the_header_defines() {
        let header = include_str!("../cuda/reduce.cuh");
        let line = format!("#define REDUCE_THREADS {REDUCE_THREADS}\n");
        assert!(header.contains(&line), "cuda/reduce.cuh must say {line:?}");
        assert!(
            REDUCE_THREADS.is_power_of_two(),
            "the tree halves the block"
        );
        assert_eq!(BLOCK_THREADS % 32, 0, "softmax_rows needs whole warps");
    }

    #[test]
    fn every_module_has_an_image_and_cubins_come_first() {
        for module in ["layers", "iqn", "attention"] {
            let images: Vec<&Image> = IMAGES.iter().filter(|i| i.module == module).collect();
            assert!(!images.is_empty(), "no image of {module}");
            let first_ptx = images.iter().position(|i| i.ptx).unwrap_or(images.len());
            assert!(images[first_ptx..].iter().all(|i| i.ptx), "{module}");
            for image in images.iter().filter(|i| i.ptx) {
                assert_eq!(image.bytes.last(), Some(&0), "PTX is read as a C string");
            }
        }
    }

    #[test]
    fn counts_refuse_empty_and_oversized_launches() {
        assert_eq!(count("k", "x", &[256, 32, 8]).unwrap(), 65536);
        let e = count("k", "x", &[4, 0]).unwrap_err().to_string();
        assert_eq!(e, "k: x is empty");
        let e = count("k", "x", &[1 << 16, 1 << 16])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("65536 x 65536") && e.contains("more than one launch"),
            "{e}"
        );
        assert!(count("k", "x", &[usize::MAX, 2]).is_err());
    }

    #[test]
    fn a_length_mismatch_names_the_kernel_and_the_operand() {
        assert!(expect_len("add_bias", "bias", 64, 64).is_ok());
        let e = expect_len("add_bias", "bias", 63, 64)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "add_bias: bias holds 63 elements, and the sizes given need 64"
        );
    }
}
