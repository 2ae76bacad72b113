// The SAC step's own kernels (examples/sac/MODEL.md): the critic input's concatenation,
// ReLU's backward (alone, and after a narrow output layer), the critic loss, the tanh-Gaussian sample and
// its backward, the critics' minimum, the soft target, the actor loss and its routing to
// the critics, and the temperature's gradient. The
// matmuls (with their bias and ReLU epilogues), the optimizer and the Polyak update are
// cuBLASLt's and stepgraph-kernels'.
//
// Sums over the batch are done by one block of SAC_REDUCE_THREADS threads in a fixed
// order (each thread its strided elements in turn, then block_sum), so they give the same
// bits on every run.

#include "stepgraph/common.cuh"
#include "stepgraph/reduce.cuh"

#define SAC_REDUCE_THREADS 1024
#define SAC_LOG_SQRT_2PI 0.91893853320467274f
#define SAC_LOG_STD_MIN (-20.0f)
#define SAC_LOG_STD_MAX 2.0f
#define SAC_TANH_EPS 1e-6f

// out[b, :] = [x[b, :], a[b, :]]: x [B, S], a [B, A], out [B, S + A]. One thread per
// element of out.
extern "C" __global__ void concat_cols(const float* __restrict__ x, const float* __restrict__ a,
                                       float* __restrict__ out, unsigned rows, unsigned xs,
                                       unsigned as) {
    const unsigned i = global_index();
    const unsigned c = xs + as;
    if (i >= rows * c) {
        return;
    }
    const unsigned b = i / c;
    const unsigned j = i - b * c;
    out[i] = j < xs ? x[b * xs + j] : a[b * as + (j - xs)];
}

// dz[i] <- h[i] > 0 ? dz[i] : 0, in place: ReLU's backward from its output h. One thread
// per element.
extern "C" __global__ void relu_backward(const float* __restrict__ h, float* __restrict__ dz,
                                         unsigned n) {
    const unsigned i = global_index();
    if (i < n) {
        dz[i] = h[i] > 0.0f ? dz[i] : 0.0f;
    }
}

// The last hidden layer's gradient through its ReLU from the gradient dout [B, K] of a
// narrow output layer (K outputs: a critic's 1, the actor's 2A):
//   dz[b, j] = h[b, j] > 0 ? sum_o dout[b, o] w[o, j] : 0,
// h [B, H] the ReLU's output, w [K, H] the output layer's weights, the sum in o order in
// f32 (the first product, then fmaf). The matmul of inner size K and ReLU's backward in one
// pass over h, where cuBLASLt's GEMM and a relu_backward took a pass each.
// With quads != 0 (H % 4 == 0, every pointer 16-byte aligned) a thread takes 4 consecutive
// elements of a row, quads = B H / 4 of them, with 16-byte loads of h and of w's rows and
// one read of dout[b, o] for the four; otherwise a thread takes one element. The
// arithmetic of each element is the same either way.
extern "C" __global__ void narrow_relu_grad(const float* __restrict__ dout,
                                            const float* __restrict__ w,
                                            const float* __restrict__ h,
                                            float* __restrict__ dz, unsigned rows,
                                            unsigned cols, unsigned k, unsigned quads) {
    const unsigned t = global_index();
    if (quads != 0) {
        if (t >= quads) {
            return;
        }
        const size_t i0 = (size_t)t * 4;
        const unsigned b = (unsigned)(i0 / cols);
        const unsigned j = (unsigned)(i0 - (size_t)b * cols);
        const float4 hv = *reinterpret_cast<const float4*>(h + i0);
        const float* d = dout + (size_t)b * k;
        const float4 w0 = *reinterpret_cast<const float4*>(w + j);
        const float d0 = d[0];
        float4 acc = make_float4(d0 * w0.x, d0 * w0.y, d0 * w0.z, d0 * w0.w);
        for (unsigned o = 1; o < k; ++o) {
            const float4 wo = *reinterpret_cast<const float4*>(w + (size_t)o * cols + j);
            const float dd = d[o];
            acc.x = fmaf(dd, wo.x, acc.x);
            acc.y = fmaf(dd, wo.y, acc.y);
            acc.z = fmaf(dd, wo.z, acc.z);
            acc.w = fmaf(dd, wo.w, acc.w);
        }
        *reinterpret_cast<float4*>(dz + i0) =
            make_float4(hv.x > 0.0f ? acc.x : 0.0f, hv.y > 0.0f ? acc.y : 0.0f,
                        hv.z > 0.0f ? acc.z : 0.0f, hv.w > 0.0f ? acc.w : 0.0f);
        return;
    }
    if (t >= rows * cols) {
        return;
    }
    if (!(h[t] > 0.0f)) {
        dz[t] = 0.0f;
        return;
    }
    const unsigned b = t / cols;
    const unsigned j = t - b * cols;
    const float* d = dout + (size_t)b * k;
    float acc = d[0] * w[j];
    for (unsigned o = 1; o < k; ++o) {
        acc = fmaf(d[o], w[(size_t)o * cols + j], acc);
    }
    dz[t] = acc;
}

// The critic loss: dq[i] = 2 (q[i] - y[i]) / n, loss[0] = sum (q[i] - y[i])^2 / n. One
// block of SAC_REDUCE_THREADS.
extern "C" __global__ void mse_loss(const float* __restrict__ q, const float* __restrict__ y,
                                    float* __restrict__ dq, float* __restrict__ loss,
                                    unsigned n) {
    const float inv = 1.0f / (float)n;
    float acc = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
        const float d = q[i] - y[i];
        dq[i] = 2.0f * d * inv;
        acc = fmaf(d, d, acc);
    }
    const float s = block_sum(acc);
    if (threadIdx.x == 0) {
        loss[0] = s * inv;
    }
}

// The tanh-Gaussian sample: head [B, 2A] (mean, then raw log_std), eps [B, A];
// act = tanh(mean + exp(clamp(raw, -20, 2)) eps) [B, A], logp [B] (MODEL.md). One thread
// per row.
extern "C" __global__ void tanh_gauss_sample(const float* __restrict__ head,
                                             const float* __restrict__ eps,
                                             float* __restrict__ act, float* __restrict__ logp,
                                             unsigned rows, unsigned dims) {
    const unsigned b = global_index();
    if (b >= rows) {
        return;
    }
    float lp = 0.0f;
    for (unsigned j = 0; j < dims; ++j) {
        const float mean = head[b * 2 * dims + j];
        const float ls = fminf(fmaxf(head[b * 2 * dims + dims + j], SAC_LOG_STD_MIN),
                               SAC_LOG_STD_MAX);
        const float e = eps[b * dims + j];
        const float u = fmaf(expf(ls), e, mean);
        const float a = tanhf(u);
        act[b * dims + j] = a;
        lp += -0.5f * e * e - ls - SAC_LOG_SQRT_2PI - logf(1.0f - a * a + SAC_TANH_EPS);
    }
    logp[b] = lp;
}

// The running minimum over the critics, one critic at a time: critic `index` (0 first)
// with outputs q [n] into qmin and its index into argmin, the lower index on a tie. Index
// 0 copies. One thread per element.
extern "C" __global__ void critic_min(const float* __restrict__ q, float* __restrict__ qmin,
                                      unsigned* __restrict__ argmin, unsigned index,
                                      unsigned n) {
    const unsigned i = global_index();
    if (i >= n) {
        return;
    }
    if (index == 0 || q[i] < qmin[i]) {
        qmin[i] = q[i];
        argmin[i] = index;
    }
}

// y = r + gamma (1 - done) (qmin - exp(log_alpha[0]) logp_next), [n], with qmin the
// target critics' minimum. One thread per element.
extern "C" __global__ void soft_target(const float* __restrict__ r,
                                       const float* __restrict__ done,
                                       const float* __restrict__ qmin,
                                       const float* __restrict__ logp_next,
                                       const float* __restrict__ log_alpha,
                                       float* __restrict__ y, float gamma, unsigned n) {
    const unsigned i = global_index();
    if (i < n) {
        const float alpha = expf(log_alpha[0]);
        const float v = qmin[i] - alpha * logp_next[i];
        y[i] = r[i] + gamma * (1.0f - done[i]) * v;
    }
}

// The actor loss mean(alpha logp - qmin) into loss[0], qmin the critics' minimum. One
// block of SAC_REDUCE_THREADS.
extern "C" __global__ void actor_loss(const float* __restrict__ qmin,
                                      const float* __restrict__ logp,
                                      const float* __restrict__ log_alpha,
                                      float* __restrict__ loss, unsigned n) {
    const float inv = 1.0f / (float)n;
    const float alpha = expf(log_alpha[0]);
    float acc = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
        acc += fmaf(alpha, logp[i], -qmin[i]);
    }
    const float s = block_sum(acc);
    if (threadIdx.x == 0) {
        loss[0] = s * inv;
    }
}

// The actor loss's gradient with respect to critic `index`'s output: -1/n where it is the
// minimum, else 0. One thread per element.
extern "C" __global__ void argmin_grad(const unsigned* __restrict__ argmin,
                                       float* __restrict__ dq, unsigned index, unsigned n) {
    const unsigned i = global_index();
    if (i < n) {
        dq[i] = argmin[i] == index ? -1.0f / (float)n : 0.0f;
    }
}

// The actor loss's gradient with respect to the actor's head [B, 2A] (MODEL.md, "Actor"):
// from da [B, A], the loss's gradient with respect to the action through the critics, the
// entropy term alpha / B logp, through the tanh, the reparameterisation and the clamp.
// One thread per (b, j), j < A.
extern "C" __global__ void tanh_gauss_backward(const float* __restrict__ head,
                                               const float* __restrict__ eps,
                                               const float* __restrict__ act,
                                               const float* __restrict__ da,
                                               const float* __restrict__ log_alpha,
                                               float* __restrict__ dhead, unsigned rows,
                                               unsigned dims) {
    const unsigned i = global_index();
    if (i >= rows * dims) {
        return;
    }
    const unsigned b = i / dims;
    const unsigned j = i - b * dims;
    const float scale = expf(log_alpha[0]) / (float)rows;
    const float raw = head[b * 2 * dims + dims + j];
    const float ls = fminf(fmaxf(raw, SAC_LOG_STD_MIN), SAC_LOG_STD_MAX);
    const float a = act[i];
    const float one_minus = 1.0f - a * a;
    const float g = 2.0f * a * one_minus / (one_minus + SAC_TANH_EPS);
    const float du = fmaf(scale, g, da[i] * one_minus);
    const bool inside = raw >= SAC_LOG_STD_MIN && raw <= SAC_LOG_STD_MAX;
    dhead[b * 2 * dims + j] = du;
    dhead[b * 2 * dims + dims + j] = inside ? fmaf(du * expf(ls), eps[i], -scale) : 0.0f;
}

// The temperature's loss -log_alpha mean(logp + target_entropy) into loss[0] and its
// gradient -mean(logp + target_entropy) into grad[0]. One block of SAC_REDUCE_THREADS.
extern "C" __global__ void alpha_grad(const float* __restrict__ logp,
                                      const float* __restrict__ log_alpha,
                                      float* __restrict__ grad, float* __restrict__ loss,
                                      float target_entropy, unsigned n) {
    float acc = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
        acc += logp[i] + target_entropy;
    }
    const float s = block_sum(acc);
    if (threadIdx.x == 0) {
        const float mean = s / (float)n;
        grad[0] = -mean;
        loss[0] = -log_alpha[0] * mean;
    }
}
