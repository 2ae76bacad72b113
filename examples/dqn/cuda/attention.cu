// The DQN step's attention head (examples/dqn/MODEL.md): multi-head self-attention over
// each sample's window of W past states, its backward, and the pooled reward prediction's
// loss with its gradients. The projections (emb, qkv, o) are cuBLASLt GEMMs around these.
//
// Shapes: qkv [B W, 3E] with Q, K, V in column blocks [0, E), [E, 2E), [2E, 3E); head hd
// uses columns hd dh .. (hd + 1) dh of each, dh = E / heads. att, datt: [B W, E];
// probs: [B, heads, W, W] (query row i, key column k).
//
// The two attention kernels have two paths each, picked by the wrapper (`attention_plan` in
// lib.rs) and passed as `warp_path`; both compute every output element with the same
// operations in the same order, so they agree bit for bit where both apply:
//
// - Warp per sample (dh == ATT_DH, W <= ATT_WMAX): a block of up to ATT_MAX_WARPS warps,
//   warp w of block x takes sample x warps + w alone. The warp copies the sample's rows into
//   its own slice of shared memory with cp.async (16-byte, coalesced), then lane t takes task
//   (head hd, row i) = (t / W, t % W) (and t + 32, ... when W heads > 32) and keeps that
//   row's head slice, scores and accumulators in registers; other rows' slices are read from
//   shared memory, where the lanes of one head read the same address (a broadcast). Results
//   go straight from registers to global memory, two lanes filling each 32-byte sector
//   (store_pair). Only __syncwarp, no block barrier: a warp never waits for another sample,
//   and the many small blocks keep the loads of other warps in flight while one computes.
// - Block of samples (any other size): a block of 256 threads stages `spb` whole samples in
//   shared memory and computes everything there, with block barriers between the phases.
//
// No atomics, no cross-block reductions: deterministic.
//
// Shared-memory row strides (`ld` for qkv rows, `lda` for datt rows) come from the wrapper:
// 3E + 4 and E + 4 when those widths are multiples of 4 (rows stay 16-byte aligned for the
// vector stores, and a stride of 4 mod 32 banks keeps the 8 rows a warp reads at once in
// distinct banks), else 3E + 1 and E + 1.

#include "dqn.cuh"

// ---- Block of samples (the general path) ----

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

// Forward, per sample, head hd, query i, key k,
//   s[hd, i, k] = scale sum_c Q[i, hd dh + c] K[k, hd dh + c],   probs = softmax_k s,
//   att[i, hd dh + c] = sum_k probs[hd, i, k] V[k, hd dh + c].
// Block of samples: ceil(B / spb) blocks of 256 threads; block x takes samples
// x spb .. x spb + spb - 1. Dynamic shared memory: (spb W ld + spb heads W W) floats.
__device__ __forceinline__ void attention_forward_block(const float* __restrict__ qkv,
                                                        float* __restrict__ att,
                                                        float* __restrict__ probs, unsigned B,
                                                        unsigned W, unsigned E, unsigned heads,
                                                        unsigned spb, unsigned ld, float scale) {
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
// Block of samples: ceil(B / spb) blocks of 256 threads. Dynamic shared memory:
// (spb W ld + spb W lda + 2 spb heads W W) floats.
__device__ __forceinline__ void attention_backward_block(
    const float* __restrict__ qkv, const float* __restrict__ probs, const float* __restrict__ datt,
    float* __restrict__ dqkv, unsigned B, unsigned W, unsigned E, unsigned heads, unsigned spb,
    unsigned ld, unsigned lda, float scale) {
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

// ---- Warp per sample (dh == ATT_DH, W <= ATT_WMAX) ----

// The head width the warp path handles (its row slices live in registers), the longest
// window (scores and probabilities live in registers), and the most warps (samples) per
// block; mirrored in lib.rs.
#define ATT_DH 16
#define ATT_WMAX 8
#define ATT_MAX_WARPS 4

// A 16-byte copy from global to shared memory that does not pass through registers
// (cp.async, sm_80+); cp_async_wait_all waits for this thread's copies. Other lanes see the
// data after a __syncwarp.
__device__ __forceinline__ void cp_async16(float4* dst, const float4* src) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// A staged tile holds `rows` rows of `cpr` 16-byte chunks (cpr % 4 == 0) with row stride
// cpr + 1 chunks (ld / 4 of the block path: rows land one bank quad apart, so the 8 lanes of
// one head that read their own rows at once hit 8 distinct quads). Within a row, the chunks
// of head slice g (chunks 4g .. 4g + 3: slice g = part heads + hd) keep their group of four,
// but when bit 1 of g is set the two halves of the group swap: chunk c of the slice sits at
// 4g + (c ^ (g & 2)). So slices g and g + 2, which are 64 floats apart, start in different
// bank quads, and the four heads' chunks that the lanes of a warp read at once (a broadcast
// per head) hit four distinct quads.
__device__ __forceinline__ unsigned swizzled_chunk(unsigned j) {
    return j ^ ((j >> 2) & 2u);
}

// Copies `rows` rows of `cpr` chunks, contiguous at src, into such a tile; lane `lane` of the
// warp issues chunks lane, lane + 32, ... Chunk e is chunk e - r cpr of row r = e / cpr,
// divided as floor(e m / 2^32) with m = ceil(2^32 / cpr), exact while e cpr < 2^32 (a tile
// fits 48 KB: e, cpr < 3072).
__device__ __forceinline__ void stage_tile(float4* tile, const float* __restrict__ src,
                                           unsigned rows, unsigned cpr, unsigned lane) {
    const float4* s4 = reinterpret_cast<const float4*>(src);
    const unsigned n = rows * cpr, m = 0xffffffffu / cpr + 1;
#pragma unroll 4
    for (unsigned e = lane; e < n; e += 32) {
        const unsigned r = __umulhi(e, m), j = e - r * cpr;
        cp_async16(tile + r * (cpr + 1) + swizzled_chunk(j), s4 + e);
    }
}

// Where head slice g of a tile's rows lives: chunks 0, 1 at lo, chunks 2, 3 at hi (see
// swizzled_chunk); row k is k ldc chunks further on.
struct SliceAt {
    const float4* lo;
    const float4* hi;
};

__device__ __forceinline__ SliceAt slice_at(const float4* tile, unsigned g) {
    const unsigned s = g & 2u;
    return {tile + 4 * g + s, tile + 4 * g + (2 - s)};
}

// The slice's 16 floats in the row `off` chunks on, in order.
__device__ __forceinline__ void load_slice(float (&v)[ATT_DH], SliceAt at, unsigned off) {
    const float4 a = at.lo[off], b = at.lo[off + 1], c = at.hi[off], d = at.hi[off + 1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    v[8] = c.x, v[9] = c.y, v[10] = c.z, v[11] = c.w;
    v[12] = d.x, v[13] = d.y, v[14] = d.z, v[15] = d.w;
}

// Whether row k of the window exists: always when the window is full (W == ATT_WMAX, a
// compile-time fact in that instantiation, so its loops have no branches), else k < W.
template <bool FULL>
__device__ __forceinline__ bool in_window(unsigned k, unsigned W) {
    return FULL || k < W;
}

__device__ __forceinline__ float4 shfl_xor4(float4 v, int m) {
    return make_float4(__shfl_xor_sync(FULL_MASK, v.x, m), __shfl_xor_sync(FULL_MASK, v.y, m),
                       __shfl_xor_sync(FULL_MASK, v.z, m), __shfl_xor_sync(FULL_MASK, v.w, m));
}

// Stores task t's N 16-byte chunks x (N even) at base + off floats (16-byte aligned), with
// lane pairs (2m, 2m + 1), tasks t and t ^ 1, sharing the work so that each store
// instruction of the pair fills whole 32-byte sectors: for sector s of the even task's row
// the even lane writes chunk 2s and the odd lane chunk 2s + 1 (sent over by a shuffle),
// then the same for the odd task's row. A lane storing its own 16-byte chunks alone would
// fill half of each sector per instruction, doubling the L2 write requests. Every lane of
// the warp must call it (the shuffles); tasks >= `tasks` store nothing, and an even task
// without a partner stores its own chunks.
template <int N>
__device__ __forceinline__ void store_pair(float* __restrict__ base, unsigned off,
                                           const float4 (&x)[N], unsigned t, unsigned tasks) {
    const unsigned odd = t & 1;
    const unsigned other = __shfl_xor_sync(FULL_MASK, off, 1);
    float4 recv[N / 2];
#pragma unroll
    for (int s = 0; s < N / 2; ++s) {
        recv[s] = shfl_xor4(odd ? x[2 * s] : x[2 * s + 1], 1);
    }
    if ((t | 1) < tasks) {
        float* even_row = base + (odd ? other : off);
        float* odd_row = base + (odd ? off : other);
#pragma unroll
        for (int s = 0; s < N / 2; ++s) {
            st4(even_row + 4 * (2 * s + odd), odd ? recv[s] : x[2 * s]);
        }
#pragma unroll
        for (int s = 0; s < N / 2; ++s) {
            st4(odd_row + 4 * (2 * s + odd), odd ? x[2 * s + 1] : recv[s]);
        }
    } else if (t < tasks) {
#pragma unroll
        for (int c = 0; c < N; ++c) {
            st4(base + off + 4 * c, x[c]);
        }
    }
}

// A head slice times `scale`, as chunks for store_pair.
__device__ __forceinline__ void scaled_chunks(float4 (&x)[ATT_DH / 4], const float (&v)[ATT_DH],
                                              float scale) {
#pragma unroll
    for (int c = 0; c < ATT_DH / 4; ++c) {
        x[c] = make_float4(v[4 * c] * scale, v[4 * c + 1] * scale, v[4 * c + 2] * scale,
                           v[4 * c + 3] * scale);
    }
}

// The lanes of a warp take tasks t = base + lane for base = 0, 32, ... < tasks, all 32 lanes
// in every round (store_pair shuffles); a lane past the end computes task tasks - 1 again
// (valid addresses) and stores nothing.

// Forward, warp per sample: ceil(B / warps) blocks of 32 warps threads. Dynamic shared
// memory: warps W ld floats (ld = 3E + 4), one tile per warp. FULL: W == ATT_WMAX.
template <bool FULL>
__device__ __forceinline__ void attention_forward_warp(const float* __restrict__ qkv,
                                                       float* __restrict__ att,
                                                       float* __restrict__ probs, unsigned B,
                                                       unsigned W, unsigned E, unsigned heads,
                                                       unsigned ld, float scale) {
    if (FULL) {
        W = ATT_WMAX;  // a constant for the compiler: shifts for / W, immediates for k W
    }
    extern __shared__ float4 smem4[];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned b = blockIdx.x * (blockDim.x >> 5) + warp;
    if (b >= B) {
        return;  // whole warp; the path has no block barrier
    }
    const unsigned E3 = 3 * E, ldc = ld / 4, tasks = W * heads;
    float4* tile = smem4 + warp * W * ldc;
    stage_tile(tile, qkv + (size_t)b * W * E3, W, E3 / 4, lane);
    cp_async_wait_all();
    __syncwarp();

    for (unsigned base = 0; base < tasks; base += 32) {
        const unsigned t = base + lane, tc = min(t, tasks - 1);
        const unsigned hd = tc / W, i = tc - hd * W;
        const SliceAt qs = slice_at(tile, hd), ks = slice_at(tile, heads + hd),
                      vs = slice_at(tile, 2 * heads + hd);
        float q[ATT_DH];
        load_slice(q, qs, i * ldc);
        float p[ATT_WMAX];
#pragma unroll
        for (unsigned k = 0; k < ATT_WMAX; ++k) {
            p[k] = -INFINITY;
            if (in_window<FULL>(k, W)) {
                float kv[ATT_DH];
                load_slice(kv, ks, k * ldc);
                float dot = 0.0f;
#pragma unroll
                for (unsigned c = 0; c < ATT_DH; ++c) {
                    dot = fmaf(q[c], kv[c], dot);
                }
                p[k] = dot * scale;
            }
        }
        float mx = -INFINITY;
#pragma unroll
        for (unsigned k = 0; k < ATT_WMAX; ++k) {
            if (in_window<FULL>(k, W)) {
                mx = fmaxf(mx, p[k]);
            }
        }
        float sum = 0.0f;
#pragma unroll
        for (unsigned k = 0; k < ATT_WMAX; ++k) {
            if (in_window<FULL>(k, W)) {
                p[k] = expf(p[k] - mx);
                sum += p[k];
            }
        }
#pragma unroll
        for (unsigned k = 0; k < ATT_WMAX; ++k) {
            if (in_window<FULL>(k, W)) {
                p[k] = p[k] / sum;
            }
        }

        float acc[ATT_DH];
#pragma unroll
        for (unsigned c = 0; c < ATT_DH; ++c) {
            acc[c] = 0.0f;
        }
#pragma unroll
        for (unsigned k = 0; k < ATT_WMAX; ++k) {
            if (in_window<FULL>(k, W)) {
                float v[ATT_DH];
                load_slice(v, vs, k * ldc);
#pragma unroll
                for (unsigned c = 0; c < ATT_DH; ++c) {
                    acc[c] = fmaf(p[k], v[c], acc[c]);
                }
            }
        }
        // Offsets into the whole buffers fit 32 bits (the wrapper checks B W 3E < 2^32).
        float4 out[ATT_DH / 4];
        scaled_chunks(out, acc, 1.0f);
        store_pair(att, (b * W + i) * E + hd * ATT_DH, out, t, tasks);
        // Row (hd, i) of the sample's probs is row t: the warp's rows are contiguous.
        if (FULL) {
            const float4 row[2] = {make_float4(p[0], p[1], p[2], p[3]),
                                   make_float4(p[4], p[5], p[6], p[7])};
            store_pair(probs, (b * heads * W + tc) * ATT_WMAX, row, t, tasks);
        } else if (t < tasks) {
#pragma unroll
            for (unsigned k = 0; k < ATT_WMAX; ++k) {
                if (k < W) {
                    probs[(b * heads * W + t) * W + k] = p[k];
                }
            }
        }
    }
}

// Backward, warp per sample: ceil(B / warps) blocks of 32 warps threads. Dynamic shared
// memory per warp: a qkv tile (W ld floats), a datt tile (W lda floats, lda = E + 4), and
// the exchange x[heads W][W + 1] of float2 (P, dS), rounded up to 16 bytes: lane (hd, i)
// writes row (hd, i) of P and dS, lane (hd, k) then reads column k (stride W + 1 float2s:
// two wavefronts a read, the fewest for 8-byte accesses, at W = 8). FULL: W == ATT_WMAX.
template <bool FULL>
__device__ __forceinline__ void attention_backward_warp(
    const float* __restrict__ qkv, const float* __restrict__ probs, const float* __restrict__ datt,
    float* __restrict__ dqkv, unsigned B, unsigned W, unsigned E, unsigned heads, unsigned ld,
    unsigned lda, float scale) {
    if (FULL) {
        W = ATT_WMAX;  // a constant for the compiler: shifts for / W, immediates for k W
    }
    extern __shared__ float4 smem4[];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned b = blockIdx.x * (blockDim.x >> 5) + warp;
    if (b >= B) {
        return;
    }
    const unsigned E3 = 3 * E, ldc = ld / 4, ldac = lda / 4, WW = W * W, tasks = W * heads;
    float4* qtile = smem4 + warp * (W * (ldc + ldac) + (tasks * (W + 1) + 1) / 2);
    float4* atile = qtile + W * ldc;
    float2* xch = reinterpret_cast<float2*>(atile + W * ldac);
    stage_tile(qtile, qkv + (size_t)b * W * E3, W, E3 / 4, lane);
    stage_tile(atile, datt + (size_t)b * W * E, W, E / 4, lane);

    // Row t (head hd, query i) of P into registers; the first round's while the copies fly.
    const float* pb = probs + (size_t)b * heads * WW;
    float p[ATT_WMAX];
    auto load_p = [&](unsigned t) {
        const float* pr = pb + (size_t)t * W;
        if (FULL) {
            const float4 lo = ld4(pr), hi = ld4(pr + 4);
            p[0] = lo.x, p[1] = lo.y, p[2] = lo.z, p[3] = lo.w;
            p[4] = hi.x, p[5] = hi.y, p[6] = hi.z, p[7] = hi.w;
        } else {
#pragma unroll
            for (unsigned k = 0; k < ATT_WMAX; ++k) {
                p[k] = k < W ? __ldg(pr + k) : 0.0f;
            }
        }
    };
    load_p(min(lane, tasks - 1));
    cp_async_wait_all();
    __syncwarp();

    // Offsets into the whole of dqkv fit 32 bits (the wrapper checks B W 3E < 2^32).
    const unsigned ob = b * W * E3;
    // Query role: lane (hd, i) computes dP, dS and dQ of row i.
    for (unsigned base = 0; base < tasks; base += 32) {
        const unsigned t = base + lane, tc = min(t, tasks - 1);
        const unsigned hd = tc / W, i = tc - hd * W;
        if (base != 0) {
            load_p(tc);
        }
        const SliceAt das = slice_at(atile, hd), ks = slice_at(qtile, heads + hd),
                      vs = slice_at(qtile, 2 * heads + hd);
        float da[ATT_DH];
        load_slice(da, das, i * ldac);
        float ds[ATT_WMAX];
#pragma unroll
        for (unsigned k = 0; k < ATT_WMAX; ++k) {
            ds[k] = 0.0f;
            if (in_window<FULL>(k, W)) {
                float v[ATT_DH];
                load_slice(v, vs, k * ldc);
                float dot = 0.0f;
#pragma unroll
                for (unsigned c = 0; c < ATT_DH; ++c) {
                    dot = fmaf(da[c], v[c], dot);
                }
                ds[k] = dot;
            }
        }
        float rd = 0.0f;
#pragma unroll
        for (unsigned k = 0; k < ATT_WMAX; ++k) {
            if (in_window<FULL>(k, W)) {
                rd = fmaf(p[k], ds[k], rd);
            }
        }
        float dq[ATT_DH];
#pragma unroll
        for (unsigned c = 0; c < ATT_DH; ++c) {
            dq[c] = 0.0f;
        }
        float2* xrow = xch + tc * (W + 1);
#pragma unroll
        for (unsigned k = 0; k < ATT_WMAX; ++k) {
            if (in_window<FULL>(k, W)) {
                ds[k] = p[k] * (ds[k] - rd);
                if (t < tasks) {
                    xrow[k] = make_float2(p[k], ds[k]);
                }
                float kv[ATT_DH];
                load_slice(kv, ks, k * ldc);
#pragma unroll
                for (unsigned c = 0; c < ATT_DH; ++c) {
                    dq[c] = fmaf(ds[k], kv[c], dq[c]);
                }
            }
        }
        float4 out[ATT_DH / 4];
        scaled_chunks(out, dq, scale);
        store_pair(dqkv, ob + i * E3 + hd * ATT_DH, out, t, tasks);
    }
    __syncwarp();

    // Key role: lane (hd, k) computes dK and dV of row k from column k of P and dS.
    for (unsigned base = 0; base < tasks; base += 32) {
        const unsigned t = base + lane, tc = min(t, tasks - 1);
        const unsigned hd = tc / W, k = tc - hd * W;
        const SliceAt qs = slice_at(qtile, hd), das = slice_at(atile, hd);
        const float2* xcol = xch + hd * W * (W + 1) + k;
        float dk[ATT_DH], dv[ATT_DH];
#pragma unroll
        for (unsigned c = 0; c < ATT_DH; ++c) {
            dk[c] = 0.0f;
            dv[c] = 0.0f;
        }
#pragma unroll
        for (unsigned i = 0; i < ATT_WMAX; ++i) {
            if (in_window<FULL>(i, W)) {
                const float2 x = xcol[i * (W + 1)];
                float qv[ATT_DH], av[ATT_DH];
                load_slice(qv, qs, i * ldc);
                load_slice(av, das, i * ldac);
#pragma unroll
                for (unsigned c = 0; c < ATT_DH; ++c) {
                    dk[c] = fmaf(x.y, qv[c], dk[c]);
                    dv[c] = fmaf(x.x, av[c], dv[c]);
                }
            }
        }
        const unsigned off = ob + k * E3 + hd * ATT_DH;
        float4 out[ATT_DH / 4];
        scaled_chunks(out, dk, scale);
        store_pair(dqkv, off + E, out, t, tasks);
        scaled_chunks(out, dv, 1.0f);
        store_pair(dqkv, off + 2 * E, out, t, tasks);
    }
}

// ---- The kernels ----

// Forward. warp_path != 0: warp per sample (spb = warps per block, blocks of 32 spb
// threads), in its branch-free instantiation when W == ATT_WMAX; else block of samples (spb
// samples, 256 threads). See the functions above.
// ptxas takes 64 registers without spills, so the warp path's blocks of 4 warps fit 8 to an
// SM by registers (1024 threads) as by shared memory (8 x 24.5 KB at W = 8, E = 64): 32
// warps. (Capping at 64 with __launch_bounds__(256, 4) or __maxnreg__(64) makes ptxas
// spill a few values; check `-Xptxas -v` after a change.)
extern "C" __global__ void __launch_bounds__(256)
    attention_forward(const float* __restrict__ qkv, float* __restrict__ att,
                      float* __restrict__ probs, unsigned B, unsigned W, unsigned E,
                      unsigned heads, unsigned spb, unsigned ld, unsigned warp_path,
                      float scale) {
    if (warp_path != 0 && W == ATT_WMAX) {
        attention_forward_warp<true>(qkv, att, probs, B, W, E, heads, ld, scale);
    } else if (warp_path != 0) {
        attention_forward_warp<false>(qkv, att, probs, B, W, E, heads, ld, scale);
    } else {
        attention_forward_block(qkv, att, probs, B, W, E, heads, spb, ld, scale);
    }
}

// Backward. warp_path as for attention_forward. 88 registers (__maxnreg__; unbounded,
// ptxas takes 80 and spills, and __launch_bounds__(256, 3) caps at 85 and spills more):
// 5 of the warp path's blocks of 4 warps fit an SM by registers as by shared memory
// (5 x 42 KB at W = 8, E = 64), 20 warps.
extern "C" __global__ void __maxnreg__(88)
    attention_backward(const float* __restrict__ qkv, const float* __restrict__ probs,
                       const float* __restrict__ datt, float* __restrict__ dqkv, unsigned B,
                       unsigned W, unsigned E, unsigned heads, unsigned spb, unsigned ld,
                       unsigned lda, unsigned warp_path, float scale) {
    if (warp_path != 0 && W == ATT_WMAX) {
        attention_backward_warp<true>(qkv, probs, datt, dqkv, B, W, E, heads, ld, lda, scale);
    } else if (warp_path != 0) {
        attention_backward_warp<false>(qkv, probs, datt, dqkv, B, W, E, heads, ld, lda, scale);
    } else {
        attention_backward_block(qkv, probs, datt, dqkv, B, W, E, heads, spb, ld, lda, scale);
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
#define ATTN_POOL_BLOCKS 2048
// stepgraph(unsafe): o[B * W * E], wp[E], bp[1], r[B], pred[B], d_o[B * W * E],
// stepgraph(unsafe): partials[>= min(B, ATTN_POOL_BLOCKS) * (E + 2)], B > 0, W > 0, E > 0,
// stepgraph(unsafe): grid = blocks(min(B, ATTN_POOL_BLOCKS), 32)
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
// stepgraph(unsafe): partials[>= rows * (E + 2)], dwp[E], dbp[1], losses[LOSS_SLOT_COUNT], B > 0,
// stepgraph(unsafe): grid = tiles(cdiv(E + 2, 32), 1)
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
        add_loss_term(losses, LOSS_ATTN, l, coef);
    }
}
