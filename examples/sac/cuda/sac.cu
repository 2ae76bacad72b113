// The SAC step's own kernels (examples/sac/MODEL.md): the critic input's concatenation,
// ReLU's backward (alone, with the first pass of its result's column sums, and after a
// narrow output layer), the critic loss (alone, and fused with the critic's output layer
// and its backward: critic_head), a critic's output and last hidden gradient for the
// actor's pass (critic_q_relu_grad), ReLU's backward fused with a narrow input gradient
// (relu_narrow_product), the tanh-Gaussian sample and
// its backward (from the smallest critic's input gradient, row by row), the critics'
// minimum, the soft target, the actor loss, the temperature's gradient, and a transpose
// (a layer's weights for its input gradient's matmul). The
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
// stepgraph(unsafe): x[rows * xs], a[rows * as], out[rows * (xs + as)], rows > 0, xs > 0, as > 0,
// stepgraph(unsafe): grid = elementwise(rows * (xs + as))
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
// stepgraph(unsafe): dz[n], h[n], grid = elementwise(n)
extern "C" __global__ void relu_backward(const float* __restrict__ h, float* __restrict__ dz,
                                         unsigned n) {
    const unsigned i = global_index();
    if (i < n) {
        dz[i] = h[i] > 0.0f ? dz[i] : 0.0f;
    }
}

// ReLU's backward and the first pass of its result's column sums, in one pass over dz:
//   dz[r, c] <- h[r, c] > 0 ? dz[r, c] : 0   (relu_backward's),
//   partials[y, c] = the sum of the new dz[r, c] over the rows r of chunk y,
// in the order of stepgraph_kernels' column_sums (ColumnSumsPlan: each thread its rows
// in turn, then column_tile_sum), so that Kernels::column_sums_finish gives the bias
// gradient with column_sums' bits. It replaces relu_backward and column_sums_partial: two
// passes over dz, the second a read of the 16 MB the first had just written.
// Grid: ColumnSumsPlan's (ceil(cols / 32), chunks) blocks of (32, 32) threads.
extern "C" __global__ void __launch_bounds__(1024)
    relu_backward_sums(const float* __restrict__ h, float* __restrict__ dz, unsigned rows,
                       unsigned cols, unsigned rows_per_chunk, float* __restrict__ partials) {
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const unsigned r0 = blockIdx.y * rows_per_chunk;
    const unsigned r1 = rows - r0 <= rows_per_chunk ? rows : r0 + rows_per_chunk;
    float s = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (unsigned r = r0 + threadIdx.y; r < r1; r += 32) {
            const size_t i = (size_t)r * cols + c;
            const float v = h[i] > 0.0f ? dz[i] : 0.0f;
            dz[i] = v;
            s += v;
        }
    }
    const float t = column_tile_sum(s);
    if (threadIdx.y == 0 && c < cols) {
        partials[(size_t)blockIdx.y * cols + c] = t;
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
// stepgraph(unsafe): q[n], y[n], dq[n], loss[1], n > 0, grid = blocks(1, SAC_REDUCE_THREADS)
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
// stepgraph(unsafe): head[rows * 2 * dims], eps[rows * dims], act[rows * dims], logp[rows],
// stepgraph(unsafe): rows > 0, dims > 0, grid = elementwise(rows)
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
// stepgraph(unsafe): q[n], qmin[n], argmin[n], grid = elementwise(n)
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

// The soft target of one element, y = r + gamma (1 - done) (qmin - alpha logp_next): one
// definition for soft_target and min_soft_target, which must give the same bits.
__device__ __forceinline__ float soft_target_of(float r, float done, float qmin,
                                                float logp_next, float alpha, float gamma) {
    const float v = qmin - alpha * logp_next;
    return r + gamma * (1.0f - done) * v;
}

// One element's term of the actor loss, alpha logp - qmin (actor_loss, min_actor_loss).
__device__ __forceinline__ float actor_loss_term(float alpha, float logp, float qmin) {
    return fmaf(alpha, logp, -qmin);
}

// y = r + gamma (1 - done) (qmin - exp(log_alpha[0]) logp_next), [n], with qmin the
// target critics' minimum. One thread per element.
// stepgraph(unsafe): y[n], r[n], done[n], qmin[n], logp_next[n], log_alpha[1],
// stepgraph(unsafe): grid = elementwise(n)
extern "C" __global__ void soft_target(const float* __restrict__ r,
                                       const float* __restrict__ done,
                                       const float* __restrict__ qmin,
                                       const float* __restrict__ logp_next,
                                       const float* __restrict__ log_alpha,
                                       float* __restrict__ y, float gamma, unsigned n) {
    const unsigned i = global_index();
    if (i < n) {
        y[i] = soft_target_of(r[i], done[i], qmin[i], logp_next[i], expf(log_alpha[0]), gamma);
    }
}

// The actor loss mean(alpha logp - qmin) into loss[0], qmin the critics' minimum. One
// block of SAC_REDUCE_THREADS.
// stepgraph(unsafe): qmin[n], logp[n], log_alpha[1], loss[1], n > 0,
// stepgraph(unsafe): grid = blocks(1, SAC_REDUCE_THREADS)
extern "C" __global__ void actor_loss(const float* __restrict__ qmin,
                                      const float* __restrict__ logp,
                                      const float* __restrict__ log_alpha,
                                      float* __restrict__ loss, unsigned n) {
    const float inv = 1.0f / (float)n;
    const float alpha = expf(log_alpha[0]);
    float acc = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
        acc += actor_loss_term(alpha, logp[i], qmin[i]);
    }
    const float s = block_sum(acc);
    if (threadIdx.x == 0) {
        loss[0] = s * inv;
    }
}

// One element (b, j) of tanh_gauss_backward from its da: one definition for
// tanh_gauss_backward and tanh_gauss_backward_min, which must give the same bits.
__device__ __forceinline__ void tanh_gauss_backward_at(const float* __restrict__ head,
                                                       const float* __restrict__ eps,
                                                       const float* __restrict__ act, float da,
                                                       float scale, float* __restrict__ dhead,
                                                       unsigned i, unsigned b, unsigned j,
                                                       unsigned dims) {
    const float raw = head[b * 2 * dims + dims + j];
    const float ls = fminf(fmaxf(raw, SAC_LOG_STD_MIN), SAC_LOG_STD_MAX);
    const float a = act[i];
    const float one_minus = 1.0f - a * a;
    const float g = 2.0f * a * one_minus / (one_minus + SAC_TANH_EPS);
    const float du = fmaf(scale, g, da * one_minus);
    const bool inside = raw >= SAC_LOG_STD_MIN && raw <= SAC_LOG_STD_MAX;
    dhead[b * 2 * dims + j] = du;
    dhead[b * 2 * dims + dims + j] = inside ? fmaf(du * expf(ls), eps[i], -scale) : 0.0f;
}

// The actor loss's gradient with respect to the actor's head [B, 2A] (MODEL.md, "Actor"):
// from da [B, A], the loss's gradient with respect to the action through the critics, the
// entropy term alpha / B logp, through the tanh, the reparameterisation and the clamp.
// One thread per (b, j), j < A.
// stepgraph(unsafe): head[rows * 2 * dims], dhead[rows * 2 * dims], eps[rows * dims],
// stepgraph(unsafe): act[rows * dims], da[rows * dims], log_alpha[1], rows > 0, dims > 0,
// stepgraph(unsafe): grid = elementwise(rows * dims)
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
    tanh_gauss_backward_at(head, eps, act, da[i], scale, dhead, i, b, j, dims);
}

// The temperature's loss -log_alpha mean(logp + target_entropy) into loss[0] and its
// gradient -mean(logp + target_entropy) into grad[0]. One block of SAC_REDUCE_THREADS.
// stepgraph(unsafe): logp[n], log_alpha[1], grad[1], loss[1], n > 0,
// stepgraph(unsafe): grid = blocks(1, SAC_REDUCE_THREADS)
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

// A critic's output layer, its MSE against y and their backward in one pass over h, the
// last hidden layer's ReLU output [B, H] (MODEL.md, "Critics"); w [H] and bias [1] the
// output layer's (one unit). Per row b, in f32:
//   q[b] = bias + sum_j h[b, j] w[j]   (each lane its columns j = lane + 32 i in order,
//                                        then warp_sum)
//   dq[b] = 2 (q[b] - y[b]) / B,       dz[b, j] = h[b, j] > 0 ? dq[b] w[j] : 0,
// and the block's partial sums, row blockIdx.x of partial [blocks, 2 H + 2]: columns
// j < H sum_b dq[b] h[b, j] (the output weights' gradient), column H sum_b dq[b] (the
// bias's), column H + 1 sum_b (q[b] - y[b])^2 (the loss times B), columns H + 2 + j
// sum_b dz[b, j] (the hidden layer's bias gradient, summed as dz is written rather than
// read back by a column sum). critic_head_finish adds the blocks' rows. Each warp takes
// SAC_HEAD_ROWS consecutive rows in turn and keeps its sums in its own row of shared
// memory; the block adds its warps' rows in warp order. Every order is fixed: the same
// bits on every run. It replaces cuBLASLt's gemv and mse_loss
// forward, and the gemv, split-K reduction, column sums and narrow_relu_grad backward
// (seven kernels, each a pass over h or a one-block reduction) and the hidden layer's
// bias column sums (two more, a pass over dz) with one pass.
// With vec != 0 (H % 4 == 0, h, w and dz 16-byte aligned) and H at most 256, a lane
// takes float4s (critic_head_rows_f4). Launch: SAC_HEAD_WARPS warps a block,
// ceil(B / (SAC_HEAD_WARPS SAC_HEAD_ROWS)) blocks, SAC_HEAD_WARPS (2 H + 2) floats of
// dynamic shared memory.
#define SAC_HEAD_WARPS 8
#define SAC_HEAD_ROWS 4
// A row's output from its lanes' partial sums s of h w: q[b] = the warp's sum + b0 and
// dq[b] = 2 (q[b] - y[b]) / B (lane 0 writes both); returns dq[b], and d = q[b] - y[b].
__device__ __forceinline__ float critic_head_row(float s, float b0, const float* __restrict__ y,
                                                 unsigned b, float inv, unsigned lane,
                                                 float* __restrict__ q, float* __restrict__ dq,
                                                 float& d) {
    const float qv = warp_sum(s) + b0;
    d = qv - y[b];
    const float g = 2.0f * d * inv;
    if (lane == 0) {
        q[b] = qv;
        dq[b] = g;
    }
    return g;
}

// The rows of a warp, as critic_head's loops below, with float4s of four consecutive
// columns: lane l takes columns 4 l + 128 i (i < NQ), holds w's there and the rows' h in
// registers, and its sums over the rows (gw, the hidden bias's) in registers until they
// go to its warp's row of shared memory. Each sum adds in the loops' order: the same
// bits for gw, gb, the loss and the hidden bias's; q's dot adds four columns a lane.
#define SAC_F4_ZERO make_float4(0.0f, 0.0f, 0.0f, 0.0f)
template <int NQ>
__device__ __forceinline__ void critic_head_rows_f4(
    const float* __restrict__ h, const float* __restrict__ w, float b0,
    const float* __restrict__ y, float* __restrict__ q, float* __restrict__ dq,
    float* __restrict__ dz, float* mine, unsigned first, unsigned rows, unsigned cols,
    float inv, unsigned lane) {
    float4 wv[NQ], gw[NQ], gz[NQ];
#pragma unroll
    for (int i = 0; i < NQ; ++i) {
        const unsigned j = 4 * lane + 128 * i;
        wv[i] = j < cols ? *reinterpret_cast<const float4*>(w + j) : SAC_F4_ZERO;
        gw[i] = SAC_F4_ZERO;
        gz[i] = SAC_F4_ZERO;
    }
    float gb = 0.0f, sq = 0.0f;
    for (unsigned r = 0; r < SAC_HEAD_ROWS; ++r) {
        const unsigned b = first + r;
        if (b >= rows) {
            break;
        }
        const float* hr = h + (size_t)b * cols;
        float4 hv[NQ];
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < NQ; ++i) {
            const unsigned j = 4 * lane + 128 * i;
            hv[i] = j < cols ? *reinterpret_cast<const float4*>(hr + j) : SAC_F4_ZERO;
            s = fmaf(hv[i].x, wv[i].x, s);
            s = fmaf(hv[i].y, wv[i].y, s);
            s = fmaf(hv[i].z, wv[i].z, s);
            s = fmaf(hv[i].w, wv[i].w, s);
        }
        float d;
        const float g = critic_head_row(s, b0, y, b, inv, lane, q, dq, d);
        if (lane == 0) {
            gb += g;
            sq = fmaf(d, d, sq);
        }
        float* dzr = dz + (size_t)b * cols;
#pragma unroll
        for (int i = 0; i < NQ; ++i) {
            const unsigned j = 4 * lane + 128 * i;
            if (j < cols) {
                const float4 z = make_float4(
                    hv[i].x > 0.0f ? g * wv[i].x : 0.0f, hv[i].y > 0.0f ? g * wv[i].y : 0.0f,
                    hv[i].z > 0.0f ? g * wv[i].z : 0.0f, hv[i].w > 0.0f ? g * wv[i].w : 0.0f);
                *reinterpret_cast<float4*>(dzr + j) = z;
                gw[i].x = fmaf(g, hv[i].x, gw[i].x);
                gw[i].y = fmaf(g, hv[i].y, gw[i].y);
                gw[i].z = fmaf(g, hv[i].z, gw[i].z);
                gw[i].w = fmaf(g, hv[i].w, gw[i].w);
                gz[i].x += z.x;
                gz[i].y += z.y;
                gz[i].z += z.z;
                gz[i].w += z.w;
            }
        }
    }
    float* mine_dz = mine + cols + 2;
#pragma unroll
    for (int i = 0; i < NQ; ++i) {
        const unsigned j = 4 * lane + 128 * i;
        if (j < cols) {
            mine[j] = gw[i].x;
            mine[j + 1] = gw[i].y;
            mine[j + 2] = gw[i].z;
            mine[j + 3] = gw[i].w;
            mine_dz[j] = gz[i].x;
            mine_dz[j + 1] = gz[i].y;
            mine_dz[j + 2] = gz[i].z;
            mine_dz[j + 3] = gz[i].w;
        }
    }
    if (lane == 0) {
        mine[cols] = gb;
        mine[cols + 1] = sq;
    }
}

extern "C" __global__ void critic_head(const float* __restrict__ h, const float* __restrict__ w,
                                       const float* __restrict__ bias,
                                       const float* __restrict__ y, float* __restrict__ q,
                                       float* __restrict__ dq, float* __restrict__ dz,
                                       float* __restrict__ partial, unsigned rows,
                                       unsigned cols, unsigned vec) {
    extern __shared__ float head_acc[];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned width = 2 * cols + 2;
    float* mine = head_acc + warp * width;
    float* mine_dz = mine + cols + 2;
    for (unsigned j = lane; j < width; j += 32) {
        mine[j] = 0.0f;
    }
    __syncwarp();
    const float inv = 1.0f / (float)rows;
    const float b0 = bias[0];
    const unsigned first = (blockIdx.x * SAC_HEAD_WARPS + warp) * SAC_HEAD_ROWS;
    const unsigned nq = (cols + 127) / 128;
    // Up to 256 columns (two float4s a lane): more would hold more registers than the
    // scalar loops need, for every width.
    if (vec != 0 && nq == 1) {
        critic_head_rows_f4<1>(h, w, b0, y, q, dq, dz, mine, first, rows, cols, inv, lane);
    } else if (vec != 0 && nq == 2) {
        critic_head_rows_f4<2>(h, w, b0, y, q, dq, dz, mine, first, rows, cols, inv, lane);
    }
    for (unsigned r = 0; (vec == 0 || nq > 2) && r < SAC_HEAD_ROWS; ++r) {
        const unsigned b = first + r;
        if (b >= rows) {
            break;
        }
        const float* hr = h + (size_t)b * cols;
        float s = 0.0f;
        for (unsigned j = lane; j < cols; j += 32) {
            s = fmaf(hr[j], w[j], s);
        }
        float d;
        const float g = critic_head_row(s, b0, y, b, inv, lane, q, dq, d);
        if (lane == 0) {
            mine[cols] += g;
            mine[cols + 1] = fmaf(d, d, mine[cols + 1]);
        }
        float* dzr = dz + (size_t)b * cols;
        for (unsigned j = lane; j < cols; j += 32) {
            const float hv = hr[j];
            const float dzv = hv > 0.0f ? g * w[j] : 0.0f;
            dzr[j] = dzv;
            mine[j] = fmaf(g, hv, mine[j]);
            mine_dz[j] += dzv;
        }
    }
    __syncthreads();
    for (unsigned j = threadIdx.x; j < width; j += blockDim.x) {
        float t = 0.0f;
        for (unsigned k = 0; k < SAC_HEAD_WARPS; ++k) {
            t += head_acc[k * width + j];
        }
        partial[(size_t)blockIdx.x * width + j] = t;
    }
}

// The sums of critic_head's partial [blocks, 2 H + 2] down its columns (column_block_sum's
// fixed order): gw [H] the output weights' gradient, gb[0] the bias's, loss[0] the mean
// squared error, gb2 [H] the hidden layer's bias gradient. Blocks of (32, 32) threads,
// ceil((2 H + 2) / 32) of them.
extern "C" __global__ void critic_head_finish(const float* __restrict__ partial,
                                              float* __restrict__ gw, float* __restrict__ gb,
                                              float* __restrict__ loss, float* __restrict__ gb2,
                                              unsigned blocks, unsigned cols, unsigned rows) {
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const float t = column_block_sum(partial, 0, blocks, 2 * cols + 2, c);
    if (threadIdx.y != 0 || c >= 2 * cols + 2) {
        return;
    }
    if (c < cols) {
        gw[c] = t;
    } else if (c == cols) {
        gb[0] = t;
    } else if (c == cols + 1) {
        loss[0] = t / (float)rows;
    } else {
        gb2[c - cols - 2] = t;
    }
}

// A critic's output at the actor's sample and the gradient at its last hidden layer, in
// one pass over h, the last hidden layer's ReLU output [B, H], where cuBLASLt's gemv of
// the output layer and narrow_relu_grad took a pass each. w [H] and bias [1] are the
// output layer's (one unit); dq [B] is the gradient at the output, given (the actor's
// pass: -1/B at every row), so dz does not wait for q. Per row b, in f32:
//   q[b] = bias + sum_j h[b, j] w[j]   (each lane its columns in order, then warp_sum)
//   dz[b, j] = h[b, j] > 0 ? dq[b] w[j] : 0   (narrow_relu_grad's element for one output)
// With vec != 0 (H % 4 == 0, h, w and dz 16-byte aligned) a lane takes float4s of four
// consecutive columns, 32 float4s apart. A warp a row; SAC_HEAD_WARPS warps a block.
extern "C" __global__ void critic_q_relu_grad(const float* __restrict__ h,
                                              const float* __restrict__ w,
                                              const float* __restrict__ bias,
                                              const float* __restrict__ dq,
                                              float* __restrict__ q, float* __restrict__ dz,
                                              unsigned rows, unsigned cols, unsigned vec) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned b = blockIdx.x * SAC_HEAD_WARPS + warp;
    if (b >= rows) {
        return;
    }
    const float* hr = h + (size_t)b * cols;
    float* dzr = dz + (size_t)b * cols;
    const float d = dq[b];
    float s = 0.0f;
    if (vec != 0) {
        for (unsigned j = 4 * lane; j < cols; j += 128) {
            const float4 hv = *reinterpret_cast<const float4*>(hr + j);
            const float4 wv = *reinterpret_cast<const float4*>(w + j);
            s = fmaf(hv.x, wv.x, s);
            s = fmaf(hv.y, wv.y, s);
            s = fmaf(hv.z, wv.z, s);
            s = fmaf(hv.w, wv.w, s);
            *reinterpret_cast<float4*>(dzr + j) =
                make_float4(hv.x > 0.0f ? d * wv.x : 0.0f, hv.y > 0.0f ? d * wv.y : 0.0f,
                            hv.z > 0.0f ? d * wv.z : 0.0f, hv.w > 0.0f ? d * wv.w : 0.0f);
        }
    } else {
        for (unsigned j = lane; j < cols; j += 32) {
            const float hv = hr[j], wv = w[j];
            s = fmaf(hv, wv, s);
            dzr[j] = hv > 0.0f ? d * wv : 0.0f;
        }
    }
    s = warp_sum(s);
    if (lane == 0) {
        q[b] = s + bias[0];
    }
}

// A critic's input gradient at the columns the caller needs, after its first layer's
// ReLU: dx[b, c] = sum_j (h[b, j] > 0 ? dh[b, j] : 0) w[j, first + c] for c < n, with
// h [B, H] the first layer's ReLU output, dh [B, H] the gradient at it, w [H, inp] the
// first layer's weights (n <= SAC_NARROW_MAX columns, first + n <= inp). ReLU's backward
// and the matmul of n outputs in one pass over h and dh, where relu_backward and a
// cuBLASLt GEMM took three. w's n columns are staged in shared memory transposed
// (wt[c][j], so a warp's lanes read consecutive j); a warp takes a row at a time, each
// lane the columns j = lane + 32 i in order, then warp_sum per output: fixed order, the
// same whichever warp takes the row. Launch: SAC_HEAD_WARPS warps a block, any number of
// blocks (the caller's: a few per SM, so that the staging is paid a few times per SM, not
// per row), n H floats of dynamic shared memory.
#define SAC_NARROW_MAX 32
// The body for N outputs, known at compile time, so that the loops over the outputs are
// unrolled without a test per output. With vec (H % 4 == 0, h and dh 16-byte aligned)
// a lane takes float4s of four consecutive columns j = 4 lane + 128 i. The N sums of a
// row are reduced over the warp by a transposed butterfly (NP: N rounded up to a power of
// two, up to 16 outputs): at each of the first log2 NP steps a lane keeps half of its
// sums and adds its partner's copy of that half, so that after them each lane holds one
// output's sum over a group of lanes; the steps left add the groups. NP - 1 + 5 - log2 NP
// shuffles a row where a warp_sum per output takes 5 N (as it still does past 16
// outputs). Every order is fixed: the same bits whichever warp takes the row.
template <unsigned N>
__device__ __forceinline__ void relu_narrow_rows(const float* __restrict__ dh,
                                                 const float* __restrict__ h,
                                                 const float* __restrict__ wt,
                                                 float* __restrict__ dx, unsigned rows,
                                                 unsigned cols, bool vec) {
    constexpr unsigned NP = N <= 1 ? 1 : N <= 2 ? 2 : N <= 4 ? 4 : N <= 8 ? 8 : N <= 16 ? 16 : N;
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Each row's sums are its warp's alone, so the grid may stride over the rows.
    for (unsigned b = blockIdx.x * SAC_HEAD_WARPS + warp; b < rows;
         b += gridDim.x * SAC_HEAD_WARPS) {
        float acc[NP];
#pragma unroll
        for (unsigned c = 0; c < NP; ++c) {
            acc[c] = 0.0f;
        }
        const float* hr = h + (size_t)b * cols;
        const float* dhr = dh + (size_t)b * cols;
        if (vec) {
            for (unsigned j = 4 * lane; j < cols; j += 128) {
                const float4 hv = *reinterpret_cast<const float4*>(hr + j);
                const float4 dv = *reinterpret_cast<const float4*>(dhr + j);
                const float m0 = hv.x > 0.0f ? dv.x : 0.0f, m1 = hv.y > 0.0f ? dv.y : 0.0f;
                const float m2 = hv.z > 0.0f ? dv.z : 0.0f, m3 = hv.w > 0.0f ? dv.w : 0.0f;
#pragma unroll
                for (unsigned c = 0; c < N; ++c) {
                    const float4 wv = *reinterpret_cast<const float4*>(wt + c * cols + j);
                    acc[c] = fmaf(m0, wv.x, acc[c]);
                    acc[c] = fmaf(m1, wv.y, acc[c]);
                    acc[c] = fmaf(m2, wv.z, acc[c]);
                    acc[c] = fmaf(m3, wv.w, acc[c]);
                }
            }
        } else {
            for (unsigned j = lane; j < cols; j += 32) {
                const float m = hr[j] > 0.0f ? dhr[j] : 0.0f;
#pragma unroll
                for (unsigned c = 0; c < N; ++c) {
                    acc[c] = fmaf(m, wt[c * cols + j], acc[c]);
                }
            }
        }
        if constexpr (N > 16) {
            // Past 16 outputs the butterfly's halves would hold more registers than the
            // sums themselves: a warp_sum per output.
#pragma unroll
            for (unsigned c = 0; c < N; ++c) {
                const float t = warp_sum(acc[c]);
                if (lane == c) {
                    dx[(size_t)b * N + c] = t;
                }
            }
        } else {
            // The transposed butterfly: after the step at offset o, a lane with (lane & o)
            // holds the upper half of the sums it held, the others the lower half.
            unsigned out = 0;
#pragma unroll
            for (unsigned o = 16, m = NP; o >= 1; o >>= 1) {
                if (m > 1) {
                    const unsigned half = m / 2;
                    const bool upper = (lane & o) != 0;
#pragma unroll
                    for (unsigned i = 0; i < half; ++i) {
                        const float send = upper ? acc[i] : acc[i + half];
                        const float keep = upper ? acc[i + half] : acc[i];
                        acc[i] = keep + __shfl_xor_sync(FULL_MASK, send, o);
                    }
                    out += upper ? half : 0u;
                    m = half;
                } else {
                    acc[0] += __shfl_xor_sync(FULL_MASK, acc[0], o);
                }
            }
            // Lanes that differ only below the last halving step hold the same sum.
            constexpr unsigned low = (32 / NP) - 1;
            if ((lane & low) == 0 && out < N) {
                dx[(size_t)b * N + out] = acc[0];
            }
        }
    }
}

extern "C" __global__ void relu_narrow_product(const float* __restrict__ dh,
                                               const float* __restrict__ h,
                                               const float* __restrict__ w,
                                               float* __restrict__ dx, unsigned rows,
                                               unsigned cols, unsigned inp, unsigned first,
                                               unsigned n, unsigned vec) {
    extern __shared__ float wt[];
    // Read w's rows' n columns in order (coalesced), stored transposed.
    for (unsigned i = threadIdx.x; i < n * cols; i += blockDim.x) {
        const unsigned j = i / n, c = i - j * n;
        wt[c * cols + j] = w[(size_t)j * inp + first + c];
    }
    __syncthreads();
    switch (n) {
#define SAC_NARROW_CASE(N) \
    case N:                \
        relu_narrow_rows<N>(dh, h, wt, dx, rows, cols, vec != 0); \
        break;
        SAC_NARROW_CASE(1) SAC_NARROW_CASE(2) SAC_NARROW_CASE(3) SAC_NARROW_CASE(4)
        SAC_NARROW_CASE(5) SAC_NARROW_CASE(6) SAC_NARROW_CASE(7) SAC_NARROW_CASE(8)
        SAC_NARROW_CASE(9) SAC_NARROW_CASE(10) SAC_NARROW_CASE(11) SAC_NARROW_CASE(12)
        SAC_NARROW_CASE(13) SAC_NARROW_CASE(14) SAC_NARROW_CASE(15) SAC_NARROW_CASE(16)
        SAC_NARROW_CASE(17) SAC_NARROW_CASE(18) SAC_NARROW_CASE(19) SAC_NARROW_CASE(20)
        SAC_NARROW_CASE(21) SAC_NARROW_CASE(22) SAC_NARROW_CASE(23) SAC_NARROW_CASE(24)
        SAC_NARROW_CASE(25) SAC_NARROW_CASE(26) SAC_NARROW_CASE(27) SAC_NARROW_CASE(28)
        SAC_NARROW_CASE(29) SAC_NARROW_CASE(30) SAC_NARROW_CASE(31) SAC_NARROW_CASE(32)
#undef SAC_NARROW_CASE
    default:
        break;
    }
}

// The minimum over up to SAC_MIN_CRITICS critics' outputs q0..q{count-1} [n] at row i, in
// critic order, the lower index on a tie (critic_min's running minimum, in one pass).
#define SAC_MIN_CRITICS 4
__device__ __forceinline__ float critics_min(const float* __restrict__ q0,
                                             const float* __restrict__ q1,
                                             const float* __restrict__ q2,
                                             const float* __restrict__ q3, unsigned count,
                                             unsigned i, unsigned* index) {
    const float* qs[SAC_MIN_CRITICS] = {q0, q1, q2, q3};
    float m = q0[i];
    unsigned k = 0;
#pragma unroll
    for (unsigned c = 1; c < SAC_MIN_CRITICS; ++c) {
        if (c < count) {
            const float v = qs[c][i];
            if (v < m) {
                m = v;
                k = c;
            }
        }
    }
    *index = k;
    return m;
}

// critic_min over `count` critics, then soft_target, in one launch: qmin, argmin and y
// [n], the same values as the running minimum and soft_target give. One thread per
// element.
// stepgraph(unsafe): y[n], q0[n], q1[n], q2[n], q3[n], r[n], done[n], logp_next[n], qmin[n],
// stepgraph(unsafe): argmin[n], log_alpha[1], grid = elementwise(n)
extern "C" __global__ void min_soft_target(const float* __restrict__ q0,
                                           const float* __restrict__ q1,
                                           const float* __restrict__ q2,
                                           const float* __restrict__ q3, unsigned count,
                                           const float* __restrict__ r,
                                           const float* __restrict__ done,
                                           const float* __restrict__ logp_next,
                                           const float* __restrict__ log_alpha,
                                           float* __restrict__ qmin,
                                           unsigned* __restrict__ argmin,
                                           float* __restrict__ y, float gamma, unsigned n) {
    const unsigned i = global_index();
    if (i >= n) {
        return;
    }
    unsigned k;
    const float m = critics_min(q0, q1, q2, q3, count, i, &k);
    qmin[i] = m;
    argmin[i] = k;
    y[i] = soft_target_of(r[i], done[i], m, logp_next[i], expf(log_alpha[0]), gamma);
}

// critic_min over `count` critics, then actor_loss, in one block of SAC_REDUCE_THREADS:
// qmin and argmin [n], loss[0] = mean(alpha logp - qmin), the sum in actor_loss's order.
// stepgraph(unsafe): logp[n], q0[n], q1[n], q2[n], q3[n], qmin[n], argmin[n], log_alpha[1],
// stepgraph(unsafe): loss[1], n > 0, grid = blocks(1, SAC_REDUCE_THREADS)
extern "C" __global__ void min_actor_loss(const float* __restrict__ q0,
                                          const float* __restrict__ q1,
                                          const float* __restrict__ q2,
                                          const float* __restrict__ q3, unsigned count,
                                          const float* __restrict__ logp,
                                          const float* __restrict__ log_alpha,
                                          float* __restrict__ qmin,
                                          unsigned* __restrict__ argmin,
                                          float* __restrict__ loss, unsigned n) {
    const float inv = 1.0f / (float)n;
    const float alpha = expf(log_alpha[0]);
    float acc = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
        unsigned k;
        const float m = critics_min(q0, q1, q2, q3, count, i, &k);
        qmin[i] = m;
        argmin[i] = k;
        acc += actor_loss_term(alpha, logp[i], m);
    }
    const float s = block_sum(acc);
    if (threadIdx.x == 0) {
        loss[0] = s * inv;
    }
}

// The running minimum over the critics with the actor's gradient through the smallest,
// one critic at a time: critic `index` (0 first) with outputs q [rows] and its gradient
// at the action da [rows, dims] (of -q / rows) into qmin [rows] and da_min [rows, dims],
// where it is smaller than the critics before it (the lower index on a tie, as
// critic_min). Index 0 copies. One thread per row.
// stepgraph(unsafe): q[rows], qmin[rows], da[rows * dims], da_min[rows * dims], rows > 0,
// stepgraph(unsafe): dims > 0, grid = elementwise(rows)
extern "C" __global__ void critic_min_select(const float* __restrict__ q,
                                             const float* __restrict__ da,
                                             float* __restrict__ qmin,
                                             float* __restrict__ da_min, unsigned index,
                                             unsigned rows, unsigned dims) {
    const unsigned b = global_index();
    if (b >= rows) {
        return;
    }
    if (index == 0 || q[b] < qmin[b]) {
        qmin[b] = q[b];
        for (unsigned j = 0; j < dims; ++j) {
            da_min[(size_t)b * dims + j] = da[(size_t)b * dims + j];
        }
    }
}

// tanh_gauss_backward with da taken, row by row, from the smallest of up to
// SAC_MIN_CRITICS critics at the actor's sample (critics_min: q0..q{count-1} [rows], the
// lower index on a tie): da{k} [rows, dims] is the gradient at the action of critic k's
// -q / rows, computed for every row, so that no critic's pass waits for the minimum. The
// same bits as critic_min_select over the critics followed by tanh_gauss_backward. One
// thread per (b, j), j < dims.
// stepgraph(unsafe): q0[rows], q1[rows], q2[rows], q3[rows], da0[rows * dims],
// stepgraph(unsafe): da1[rows * dims], da2[rows * dims], da3[rows * dims], head[rows * 2 * dims],
// stepgraph(unsafe): dhead[rows * 2 * dims], eps[rows * dims], act[rows * dims], log_alpha[1],
// stepgraph(unsafe): rows > 0, dims > 0, grid = elementwise(rows * dims)
extern "C" __global__ void tanh_gauss_backward_min(
    const float* __restrict__ head, const float* __restrict__ eps,
    const float* __restrict__ act, const float* __restrict__ q0, const float* __restrict__ q1,
    const float* __restrict__ q2, const float* __restrict__ q3, unsigned count,
    const float* __restrict__ da0, const float* __restrict__ da1,
    const float* __restrict__ da2, const float* __restrict__ da3,
    const float* __restrict__ log_alpha, float* __restrict__ dhead, unsigned rows,
    unsigned dims) {
    const unsigned i = global_index();
    if (i >= rows * dims) {
        return;
    }
    const unsigned b = i / dims;
    const unsigned j = i - b * dims;
    unsigned k;
    critics_min(q0, q1, q2, q3, count, b, &k);
    // A chain of selects, not an array indexed at run time (which lives on the stack).
    const float* da = k == 0 ? da0 : k == 1 ? da1 : k == 2 ? da2 : da3;
    const float scale = expf(log_alpha[0]) / (float)rows;
    tanh_gauss_backward_at(head, eps, act, da[i], scale, dhead, i, b, j, dims);
}

// out [cols, rows] = in [rows, cols] transposed, by 32 x 32 tiles through shared memory
// (a column of padding, so that neither the reads nor the writes of a tile conflict).
// Blocks of 32 x 8 threads, a tile each: grid (ceil(cols / 32), ceil(rows / 32)).
extern "C" __global__ void __launch_bounds__(256)
    transpose(const float* __restrict__ in, float* __restrict__ out, unsigned rows,
              unsigned cols) {
    __shared__ float tile[32][33];
    const unsigned c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (unsigned i = threadIdx.y; i < 32; i += 8) {
        const unsigned r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) {
            tile[i][threadIdx.x] = in[(size_t)r * cols + c];
        }
    }
    __syncthreads();
    for (unsigned i = threadIdx.y; i < 32; i += 8) {
        const unsigned c = c0 + i, r = r0 + threadIdx.x;
        if (r < rows && c < cols) {
            out[(size_t)c * rows + r] = tile[threadIdx.x][i];
        }
    }
}
