//! The SAC step's own kernels (`cuda/sac.cu`, MODEL.md), built by stepgraph-build like any
//! user crate's, each behind a wrapper that checks sizes before it launches; the
//! optimizer's kernels and `axpby` (the Polyak update) come from `stepgraph-kernels`.
//!
//! Shapes are row-major (`[B, X]` puts row `b` at offset `b X`). Every wrapper fails with
//! [`Error::LengthMismatch`](stepgraph::Error::LengthMismatch) or [`Error::Invalid`](stepgraph::Error::Invalid) before anything is launched when a
//! buffer's length does not match the sizes it is given. Each kernel has a CPU reference
//! in [`reference`](crate::reference).

use std::sync::Arc;

use stepgraph::{CaptureStream, Device, DeviceBuffer, LaunchConfig, Result};
use stepgraph_kernels::launch::{
    check_len, elementwise_config, float4_rows, len_u32, positive, product,
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

/// The widest output layer [`Kernels::narrow_relu_grad`] takes: past it, the matmul is a
/// GEMM's work.
pub const NARROW_OUTPUTS: usize = 32;

/// `len / k`, where `len` must be a positive multiple of `k`.
fn whole(what: &str, len: usize, k: usize) -> Result<usize> {
    if len == 0 || len % k != 0 {
        return Err(stepgraph::Error::Invalid(format!(
            "{what}: expected a positive multiple of {k} elements, found {len}"
        )));
    }
    Ok(len / k)
}

/// One block of [`REDUCE_THREADS`]: a fixed-order sum over the whole batch.
fn reduce_config() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (REDUCE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
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
        let r = positive("concat_cols: rows", rows)?;
        let c1 = positive("concat_cols: xs", xs)?;
        let c2 = positive("concat_cols: as", as_)?;
        check_len(
            "concat_cols: x ([rows, xs])",
            x.len(),
            product("concat_cols", &[rows, xs])?,
        )?;
        check_len(
            "concat_cols: a ([rows, as])",
            a.len(),
            product("concat_cols", &[rows, as_])?,
        )?;
        let n = product("concat_cols", &[rows, xs + as_])?;
        check_len("concat_cols: out ([rows, xs + as])", out.len(), n)?;
        let n = len_u32("concat_cols: out", n)?;
        // SAFETY: threads with i >= n = rows (xs + as) return; thread i reads x[b xs + j]
        // (j < xs) or a[b as + j - xs] (j - xs < as) with b < rows, all in range (lengths
        // checked above), and writes out[i].
        unsafe {
            self.raw
                .concat_cols(stream, elementwise_config(n), x, a, out, r, c1, c2)
        }
    }

    /// `dz[i] = h[i] > 0 ? dz[i] : 0`, in place: ReLU's backward from its output.
    pub fn relu_backward(&self, stream: &CaptureStream<'_>, h: &Buf, dz: &mut Buf) -> Result<()> {
        check_len("relu_backward: dz (the length of h)", dz.len(), h.len())?;
        let n = len_u32("relu_backward: h", h.len())?;
        // SAFETY: threads with i >= n return; h and dz hold n elements (checked above).
        unsafe {
            self.raw
                .relu_backward(stream, elementwise_config(n), h, dz, n)
        }
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
        let n = positive("mse_loss: q", q.len())?;
        check_len("mse_loss: y (the length of q)", y.len(), q.len())?;
        check_len("mse_loss: dq (the length of q)", dq.len(), q.len())?;
        check_len("mse_loss: loss ([1])", loss.len(), 1)?;
        // SAFETY: one block strides over i < n of q, y and dq (all n long, checked) and
        // writes loss[0].
        unsafe {
            self.raw
                .mse_loss(stream, reduce_config(), q, y, dq, loss, n)
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
        let r = positive("tanh_gauss_sample: rows", rows)?;
        let d = positive("tanh_gauss_sample: dims", dims)?;
        let rd = product("tanh_gauss_sample", &[rows, dims])?;
        check_len(
            "tanh_gauss_sample: head ([rows, 2 dims])",
            head.len(),
            product("tanh_gauss_sample", &[rows, 2, dims])?,
        )?;
        len_u32("tanh_gauss_sample: head", head.len())?;
        check_len("tanh_gauss_sample: eps ([rows, dims])", eps.len(), rd)?;
        check_len("tanh_gauss_sample: act ([rows, dims])", act.len(), rd)?;
        check_len("tanh_gauss_sample: logp ([rows])", logp.len(), rows)?;
        // SAFETY: threads with b >= rows return; thread b touches row b of head, eps, act
        // and logp, all holding `rows` rows (checked above).
        unsafe {
            self.raw
                .tanh_gauss_sample(stream, elementwise_config(r), head, eps, act, logp, r, d)
        }
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
        let n = len_u32("critic_min: q", q.len())?;
        check_len("critic_min: qmin (the length of q)", qmin.len(), q.len())?;
        check_len(
            "critic_min: argmin (the length of q)",
            argmin.len(),
            q.len(),
        )?;
        let index = len_u32("critic_min: index", index)?;
        // SAFETY: threads with i >= n return; q, qmin and argmin hold n elements (checked).
        unsafe {
            self.raw
                .critic_min(stream, elementwise_config(n), q, qmin, argmin, index, n)
        }
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
        let n = len_u32("soft_target: y", y.len())?;
        for (what, len) in [
            ("soft_target: r (the length of y)", r.len()),
            ("soft_target: done (the length of y)", done.len()),
            ("soft_target: qmin (the length of y)", qmin.len()),
            ("soft_target: logp_next (the length of y)", logp_next.len()),
        ] {
            check_len(what, len, y.len())?;
        }
        check_len("soft_target: log_alpha ([1])", log_alpha.len(), 1)?;
        // SAFETY: threads with i >= n return; every [n] input holds n elements and
        // log_alpha one (checked above).
        unsafe {
            self.raw.soft_target(
                stream,
                elementwise_config(n),
                r,
                done,
                qmin,
                logp_next,
                log_alpha,
                y,
                gamma,
                n,
            )
        }
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
        let n = positive("actor_loss: qmin", qmin.len())?;
        check_len(
            "actor_loss: logp (the length of qmin)",
            logp.len(),
            qmin.len(),
        )?;
        check_len("actor_loss: log_alpha ([1])", log_alpha.len(), 1)?;
        check_len("actor_loss: loss ([1])", loss.len(), 1)?;
        // SAFETY: one block strides over i < n of qmin and logp (checked) and writes
        // loss[0]; log_alpha holds one element.
        unsafe {
            self.raw
                .actor_loss(stream, reduce_config(), qmin, logp, log_alpha, loss, n)
        }
    }

    /// The actor loss's gradient with respect to critic `index`'s output: `dq = −1/n`
    /// where `argmin` names it, else 0.
    pub fn argmin_grad(
        &self,
        stream: &CaptureStream<'_>,
        argmin: &DeviceBuffer<u32>,
        dq: &mut Buf,
        index: usize,
    ) -> Result<()> {
        let n = positive("argmin_grad: argmin", argmin.len())?;
        check_len(
            "argmin_grad: dq (the length of argmin)",
            dq.len(),
            argmin.len(),
        )?;
        let index = len_u32("argmin_grad: index", index)?;
        // SAFETY: threads with i >= n return; argmin and dq hold n elements (checked).
        unsafe {
            self.raw
                .argmin_grad(stream, elementwise_config(n), argmin, dq, index, n)
        }
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
        let r = positive("tanh_gauss_backward: rows", rows)?;
        let d = positive("tanh_gauss_backward: dims", dims)?;
        let what = "tanh_gauss_backward";
        let rd = product(what, &[rows, dims])?;
        let heads = product(what, &[rows, 2, dims])?;
        check_len(
            "tanh_gauss_backward: head ([rows, 2 dims])",
            head.len(),
            heads,
        )?;
        check_len(
            "tanh_gauss_backward: dhead ([rows, 2 dims])",
            dhead.len(),
            heads,
        )?;
        check_len("tanh_gauss_backward: eps ([rows, dims])", eps.len(), rd)?;
        check_len("tanh_gauss_backward: act ([rows, dims])", act.len(), rd)?;
        check_len("tanh_gauss_backward: da ([rows, dims])", da.len(), rd)?;
        check_len("tanh_gauss_backward: log_alpha ([1])", log_alpha.len(), 1)?;
        len_u32("tanh_gauss_backward: head", heads)?;
        let n = len_u32("tanh_gauss_backward: act", rd)?;
        // SAFETY: threads with i >= rows dims return; thread (b, j) reads row b of head,
        // eps, act and da at columns < their widths and writes row b of dhead, all of the
        // lengths checked above.
        unsafe {
            self.raw.tanh_gauss_backward(
                stream,
                elementwise_config(n),
                head,
                eps,
                act,
                da,
                log_alpha,
                dhead,
                r,
                d,
            )
        }
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
        let n = positive("alpha_grad: logp", logp.len())?;
        check_len("alpha_grad: log_alpha ([1])", log_alpha.len(), 1)?;
        check_len("alpha_grad: grad ([1])", grad.len(), 1)?;
        check_len("alpha_grad: loss ([1])", loss.len(), 1)?;
        // SAFETY: one block strides over logp's n elements and writes grad[0] and
        // loss[0]; log_alpha holds one element (checked above).
        unsafe {
            self.raw.alpha_grad(
                stream,
                reduce_config(),
                logp,
                log_alpha,
                grad,
                loss,
                target_entropy,
                n,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants here are the ones `cuda/sac.cu` defines.
    #[test]
    fn the_constants_agree_with_the_cuda_source() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda/sac.cu");
        let d = stepgraph_testkit::cuda_defines(std::path::Path::new(path)).unwrap();
        assert_eq!(d["SAC_REDUCE_THREADS"], REDUCE_THREADS.to_string());
        assert_eq!(d["SAC_LOG_STD_MIN"], "(-20.0f)");
        assert_eq!(d["SAC_LOG_STD_MAX"], "2.0f");
        assert_eq!(d["SAC_TANH_EPS"], "1e-6f");
    }
}
