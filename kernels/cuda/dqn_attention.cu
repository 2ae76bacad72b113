// The DQN step's attention head (examples/dqn/MODEL.md): multi-head self-attention over
// each sample's window of W past states, its backward, and the pooled reward prediction's
// loss with its gradients. The projections (emb, qkv, o) are cuBLASLt GEMMs around these.
//
// Per sample the window is tiny (W = 8 rows of qkv, 3E = 192 floats each), so a block takes
// `spb` whole samples, stages them in shared memory with coalesced loads, and computes
// everything there; no atomics, no cross-block reductions, deterministic.
//
// Shapes: qkv [B W, 3E] with Q, K, V in column blocks [0, E), [E, 2E), [2E, 3E); head hd
// uses columns hd dh .. (hd + 1) dh of each, dh = E / heads. att, datt: [B W, E];
// probs: [B, heads, W, W] (query row i, key column k).
//
// Shared-memory row strides (`ld` for qkv rows, `lda` for datt rows) come from the wrapper:
// 3E + 4 and E + 4 when those widths are multiples of 4 (rows stay 16-byte aligned for the
// vector stores, and a stride of 4 mod 32 banks keeps the 8 rows a warp reads at once in
// distinct banks), else 3E + 1 and E + 1.

#include "dqn_common.cuh"

// Copies `rows` rows of `cols` floats, contiguous in global memory, into shared memory with
// row stride ld: 16-byte accesses when both ends are 16-byte aligned and cols and ld are
// multiples of 4, else 4-byte ones.
__device__ __forceinline__ void stage_rows(const float* __restrict__ src, unsigned rows,
                                           unsigned cols, float* dst, unsigned ld) {
    const unsigned n = rows * cols;
    const bool aligned = ((reinterpret_cast<size_t>(src) | reinterpret_cast<size_t>(dst)) & 15) == 0;
    if (aligned && (cols & 3) == 0 && (ld & 3) == 0) {
        const unsigned c4 = cols / 4;
#pragma unroll 4
        for (unsigned i = threadIdx.x; i < n / 4; i += blockDim.x) {
            const unsigned r = i / c4, c = (i - r * c4) * 4;
            st4(dst + r * ld + c, ld4(src + 4 * (size_t)i));
        }
    } else {
#pragma unroll 4
        for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
            const unsigned r = i / cols, c = i - r * cols;
            dst[r * ld + c] = __ldg(src + i);
        }
    }
}

// Forward: per sample, head hd, query i, key k,
//   s[hd, i, k] = scale sum_c Q[i, hd dh + c] K[k, hd dh + c],   probs = softmax_k s,
//   att[i, hd dh + c] = sum_k probs[hd, i, k] V[k, hd dh + c].
// Grid: ceil(B / spb) blocks of 256 threads; block x takes samples x spb .. x spb + spb - 1.
// Dynamic shared memory: (spb W ld + spb heads W W) floats.
extern "C" __global__ void __launch_bounds__(256)
    attention_forward(const float* __restrict__ qkv, float* __restrict__ att,
                      float* __restrict__ probs, unsigned B, unsigned W, unsigned E,
                      unsigned heads, unsigned spb, unsigned ld, float scale) {
    extern __shared__ float4 smem4[];
    float* sq = reinterpret_cast<float*>(smem4);  // [spb W][ld]
    float* ss = sq + spb * W * ld;                // [spb][heads][W][W]
    const unsigned b0 = blockIdx.x * spb;
    if (b0 >= B) {
        return;  // whole block: no barrier is skipped by part of it
    }
    const unsigned nb = min(spb, B - b0);
    const unsigned E3 = 3 * E, dh = E / heads, WW = W * W;
    stage_rows(qkv + (size_t)b0 * W * E3, nb * W, E3, sq, ld);
    __syncthreads();

    const unsigned n_scores = nb * heads * WW;
    for (unsigned e = threadIdx.x; e < n_scores; e += blockDim.x) {
        const unsigned k = e % W, i = (e / W) % W, hd = (e / WW) % heads, s = e / (WW * heads);
        const float* q = sq + (s * W + i) * ld + hd * dh;
        const float* kr = sq + (s * W + k) * ld + E + hd * dh;
        float dot = 0.0f;
        for (unsigned c = 0; c < dh; ++c) {
            dot = fmaf(q[c], kr[c], dot);
        }
        ss[e] = dot * scale;
    }
    __syncthreads();

    const unsigned n_rows = nb * heads * W;
    for (unsigned row = threadIdx.x; row < n_rows; row += blockDim.x) {
        float* p = ss + row * W;
        float mx = -INFINITY;
        for (unsigned k = 0; k < W; ++k) {
            mx = fmaxf(mx, p[k]);
        }
        float sum = 0.0f;
        for (unsigned k = 0; k < W; ++k) {
            const float x = expf(p[k] - mx);
            p[k] = x;
            sum += x;
        }
        for (unsigned k = 0; k < W; ++k) {
            p[k] = p[k] / sum;
        }
    }
    __syncthreads();

    float* pb = probs + (size_t)b0 * heads * WW;
    for (unsigned e = threadIdx.x; e < n_scores; e += blockDim.x) {
        pb[e] = ss[e];
    }
    const unsigned n_out = nb * W * E;
    float* ab = att + (size_t)b0 * W * E;
    for (unsigned e = threadIdx.x; e < n_out; e += blockDim.x) {
        const unsigned col = e % E, r = e / E, s = r / W, i = r - s * W, hd = col / dh;
        const float* p = ss + ((s * heads + hd) * W + i) * W;
        const float* v = sq + s * W * ld + 2 * E + col;
        float acc = 0.0f;
        for (unsigned k = 0; k < W; ++k) {
            acc = fmaf(p[k], v[k * ld], acc);
        }
        ab[e] = acc;
    }
}

// Backward, from the saved probs P and datt = dA:
//   dV[k, c] = sum_i P[hd, i, k] dA[i, c]
//   dP[hd, i, k] = sum_{c in head hd} dA[i, c] V[k, c]
//   dS[hd, i, k] = P[hd, i, k] (dP[hd, i, k] - sum_k' P[hd, i, k'] dP[hd, i, k'])
//   dQ[i, c] = scale sum_k dS[hd, i, k] K[k, c],   dK[k, c] = scale sum_i dS[hd, i, k] Q[i, c]
// written as dqkv[B W, 3E] in qkv's layout (hd = the head of column c).
// Grid: ceil(B / spb) blocks of 256 threads. Dynamic shared memory:
// (spb W ld + spb W lda + 2 spb heads W W) floats.
extern "C" __global__ void __launch_bounds__(256)
    attention_backward(const float* __restrict__ qkv, const float* __restrict__ probs,
                       const float* __restrict__ datt, float* __restrict__ dqkv, unsigned B,
                       unsigned W, unsigned E, unsigned heads, unsigned spb, unsigned ld,
                       unsigned lda, float scale) {
    extern __shared__ float4 smem4[];
    float* sq = reinterpret_cast<float*>(smem4);  // [spb W][ld]
    float* sa = sq + spb * W * ld;                // [spb W][lda]
    float* sp = sa + spb * W * lda;               // [spb][heads][W][W]: P
    float* sd = sp + spb * heads * W * W;         // [spb][heads][W][W]: dP, then dS
    const unsigned b0 = blockIdx.x * spb;
    if (b0 >= B) {
        return;
    }
    const unsigned nb = min(spb, B - b0);
    const unsigned E3 = 3 * E, dh = E / heads, WW = W * W;
    const unsigned n_scores = nb * heads * WW;
    stage_rows(qkv + (size_t)b0 * W * E3, nb * W, E3, sq, ld);
    stage_rows(datt + (size_t)b0 * W * E, nb * W, E, sa, lda);
    stage_rows(probs + (size_t)b0 * heads * WW, 1, n_scores, sp, n_scores);
    __syncthreads();

    for (unsigned e = threadIdx.x; e < n_scores; e += blockDim.x) {
        const unsigned k = e % W, i = (e / W) % W, hd = (e / WW) % heads, s = e / (WW * heads);
        const float* da = sa + (s * W + i) * lda + hd * dh;
        const float* v = sq + (s * W + k) * ld + 2 * E + hd * dh;
        float dot = 0.0f;
        for (unsigned c = 0; c < dh; ++c) {
            dot = fmaf(da[c], v[c], dot);
        }
        sd[e] = dot;
    }
    __syncthreads();

    const unsigned n_rows = nb * heads * W;
    for (unsigned row = threadIdx.x; row < n_rows; row += blockDim.x) {
        const float* p = sp + row * W;
        float* d = sd + row * W;
        float rd = 0.0f;
        for (unsigned k = 0; k < W; ++k) {
            rd = fmaf(p[k], d[k], rd);
        }
        for (unsigned k = 0; k < W; ++k) {
            d[k] = p[k] * (d[k] - rd);
        }
    }
    __syncthreads();

    const unsigned n_out = nb * W * E3;
    float* ob = dqkv + (size_t)b0 * W * E3;
    for (unsigned e = threadIdx.x; e < n_out; e += blockDim.x) {
        const unsigned col = e % E3, r = e / E3, s = r / W, w = r - s * W;
        const unsigned part = col / E, c = col - part * E, hd = c / dh;
        const float* head_p = sp + (s * heads + hd) * WW;
        const float* head_d = sd + (s * heads + hd) * WW;
        const float* rows = sq + s * W * ld;
        float acc = 0.0f;
        if (part == 0) {  // dQ[w, c] = scale sum_k dS[w, k] K[k, c]
            for (unsigned k = 0; k < W; ++k) {
                acc = fmaf(head_d[w * W + k], rows[k * ld + E + c], acc);
            }
            acc *= scale;
        } else if (part == 1) {  // dK[w, c] = scale sum_i dS[i, w] Q[i, c]
            for (unsigned i = 0; i < W; ++i) {
                acc = fmaf(head_d[i * W + w], rows[i * ld + c], acc);
            }
            acc *= scale;
        } else {  // dV[w, c] = sum_i P[i, w] dA[i, c]
            const float* arows = sa + s * W * lda;
            for (unsigned i = 0; i < W; ++i) {
                acc = fmaf(head_p[i * W + w], arows[i * lda + c], acc);
            }
        }
        ob[e] = acc;
    }
}

// The pooled reward prediction, its loss and gradients:
//   m[b, e] = mean_w o[b, w, e],  pred[b] = sum_e m[b, e] wp[e] + bp,
//   L_attn = mean_b (pred[b] - r[b])^2,  dpred[b] = coef dL_attn/dpred = 2 coef (pred - r) / B,
//   do[b, w, e] = dpred[b] wp[e] / W,  dwp[e] = sum_b dpred[b] m[b, e],  dbp = sum_b dpred[b].
// o, do: [B W, E]; wp: [E]; bp: [1]; r, pred: [B].
// The sums over the batch are two-pass and deterministic: one warp per block, the block
// takes samples b = blockIdx.x, + gridDim.x, ... and owns partial row
// partials[blockIdx.x, E + 2] = [dwp (E) | dbp | sum of (pred - r)^2]; lane l owns
// columns l, l + 32, ... and accumulates them in place. attn_pool_finish adds the rows.
// Grid: min(B, ATTN_POOL_BLOCKS) blocks of 32 threads.
extern "C" __global__ void __launch_bounds__(32)
    attn_pool_loss(const float* __restrict__ o, const float* __restrict__ wp,
                   const float* __restrict__ bp, const float* __restrict__ r,
                   float* __restrict__ pred, float* __restrict__ d_o, float* __restrict__ partials,
                   unsigned B, unsigned W, unsigned E, float coef) {
    const unsigned lane = threadIdx.x;
    const float fw = (float)W;
    const float scale = 2.0f * coef / (float)B;
    const float bp0 = bp[0];
    float* row = partials + (size_t)blockIdx.x * (E + 2);
    for (unsigned e = lane; e < E; e += 32) {
        row[e] = 0.0f;
    }
    float dbp = 0.0f, loss = 0.0f;
    for (unsigned b = blockIdx.x; b < B; b += gridDim.x) {
        const float* ob = o + (size_t)b * W * E;
        float dot = 0.0f;
        for (unsigned e = lane; e < E; e += 32) {
            float m = 0.0f;
            for (unsigned w = 0; w < W; ++w) {
                m += ob[(size_t)w * E + e];
            }
            dot = fmaf(m / fw, wp[e], dot);
        }
        dot = warp_sum(dot);
        const float pb = dot + bp0;
        const float diff = pb - r[b];
        if (lane == 0) {
            pred[b] = pb;
        }
        loss += diff * diff;
        const float dp = scale * diff;
        dbp += dp;
        float* db = d_o + (size_t)b * W * E;
        for (unsigned e = lane; e < E; e += 32) {
            float m = 0.0f;
            for (unsigned w = 0; w < W; ++w) {
                m += ob[(size_t)w * E + e];
            }
            row[e] = fmaf(dp, m / fw, row[e]);
            const float g = dp * wp[e] / fw;
            for (unsigned w = 0; w < W; ++w) {
                db[(size_t)w * E + e] = g;
            }
        }
    }
    if (lane == 0) {
        row[E] = dbp;
        row[E + 1] = loss;
    }
}

// Finishes attn_pool_loss: adds the `rows` partial rows of [rows, E + 2] in order, writes
// dwp[E] and dbp[0], adds L_attn = (loss sum) / B into losses[LOSS_ATTN] and coef * L_attn
// into losses[LOSS_TOTAL]. Grid: ceil((E + 2) / 32) blocks of (32, 32) threads.
extern "C" __global__ void __launch_bounds__(1024)
    attn_pool_finish(const float* __restrict__ partials, unsigned rows, unsigned E,
                     float* __restrict__ dwp, float* __restrict__ dbp, float* __restrict__ losses,
                     unsigned B, float coef) {
    const unsigned cols = E + 2;
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const float s = column_block_sum(partials, 0, rows, cols, c);
    if (threadIdx.y != 0 || c >= cols) {
        return;
    }
    if (c < E) {
        dwp[c] = s;
    } else if (c == E) {
        dbp[0] = s;
    } else {
        const float l = s / (float)B;
        atomicAdd(&losses[LOSS_ATTN], l);
        atomicAdd(&losses[LOSS_TOTAL], coef * l);
    }
}
