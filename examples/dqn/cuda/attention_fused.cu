// The DQN step's whole attention head in one kernel (MODEL.md, "Attention over the window"):
// the embedding, the fused QKV projection, each head's attention, the pooled reward
// prediction and its loss, and the backward to every weight gradient, for the step's sizes
// S = E = 64, W = 8, Hh = 4 (dh = 16). attention_fused_fold folds the weights (below);
// attention_fused writes one partial row per block; attention_fused_sums adds the rows in
// order and attention_fused_grads turns the sums into the gradients (deterministic: no
// atomics but the loss slots' adds, as every loss kernel of the step does).
//
// Why one kernel: the unfused head (attention.cu and five cuBLASLt GEMMs, then three
// weight-gradient GEMMs) moves [B W, E] .. [B W, 3E] activations of 131072 rows through
// memory between every pair of its 17 kernels, about 0.4 GB a step. Here a tile of 8
// samples (64 rows) stays in shared memory from the windows it reads to the sums it adds
// to, and the weights are staged once per block.
//
// The output projection needs no product: pred depends on att only through its mean over
// the window, so with v = wpᵀ wo ([E], v[c] = sum_e wp[e] wo[e, c]) and the loss's
// gradient g_b = 2 coef (pred_b - r_b) / B,
//   pred_b = mean_w(att_b) . v + bp,        datt[b, w, :] = (g_b / W) v   (every w),
//   dwo[e, c] = wp[e] Sum[c],  dwp[e] = sum_c Sum[c] wo[e, c],  Sum = sum_b g_b mean_w(att_b),
// and datt being the same for every row of a sample, so is dP[hd, i, k] = datt_i . V_k.
//
// Nor does the embedding. emb = win wembᵀ + bemb enters only qkv = emb wqkvᵀ and the
// gradients, so with W' = wqkv wemb ([3E, S]) and b' = wqkv bemb ([3E]), both computed once
// by attention_fused_fold in FP32,
//   qkv   = win W'ᵀ + b',                  G = sum over rows of dqkvᵀ win   ([3E, S]),
//   dwqkv = G wembᵀ + csum bembᵀ,          dwemb = wqkvᵀ G,   dbemb = wqkvᵀ csum,
// where csum = sum over rows of dqkv ([3E]). Its K part is 0 (each row of dS sums to 0, so
// the sum over keys of dK is), and its V part is dbp v (dV_k = (g / W) v sum_i P[i, k],
// and the P of a query sums to 1): only its Q part is summed here. A tile then takes two
// products (qkv and G: 1536 mma.sync) where emb, qkv, dwqkv, demb and dwemb took five
// (2816), and neither emb nor demb is stored.
//
// A persistent block of 8 warps takes tiles blockIdx.x, + gridDim.x, ... Per tile:
//   1. qkv = win W'ᵀ + b'                         mma.sync, M 64  N 192  K 64
//   2. attention forward and backward, FP32: thread (sample = warp, head = lane / 8,
//      row = lane % 8); pred, the loss, dqkv, the Q part of csum
//   3. G += dqkvᵀ win                             mma.sync, M 192 N 64   K 64 (registers)
// with a block barrier between phases, and the next tile's windows copied in (cp.async)
// while this one computes. The products' operands are rounded to TF32 (cvt.rna) once,
// where they are stored (W' by the fold, in global memory; the others in shared memory); the products run on the tensor cores as
// cuBLASLt's FAST_TF32 GEMMs do, and the attention itself in FP32 as attention.cu does.
//
// Shared memory holds every matrix row-major with rows of 64 or 192 floats, element
// (r, c) at r ld + (c ^ swz(r)), swz(r) = 8 (r % 4) + 4 ((r / 4) % 2): the XOR moves c
// within its block of 32 columns. An mma.sync fragment reads either 8 rows by 4 columns
// (an operand stored as [m][k] or [n][k]) or 4 rows by 8 columns (stored as [k][m] or
// [k][n]); both hit 32 distinct banks under that map, so every product reads its
// operands in whichever layout the previous phase wrote, without bank conflicts.

#include "dqn.cuh"

#define AF_S 64
#define AF_W 8
#define AF_E 64
#define AF_HEADS 4
#define AF_DH 16
#define AF_E3 (3 * AF_E)
// A tile: 8 samples of 8 window rows.
#define AF_SAMPLES 8
#define AF_ROWS (AF_SAMPLES * AF_W)
#define AF_THREADS 256

// Shared memory, in floats: W', two tiles of windows, qkv, dqkv, each head's dS, v and b'.
#define AF_OFF_WP 0
#define AF_OFF_WIN (AF_OFF_WP + AF_E3 * AF_S)
#define AF_OFF_QKV (AF_OFF_WIN + 2 * AF_ROWS * AF_S)
#define AF_OFF_DQKV (AF_OFF_QKV + AF_ROWS * AF_E3)
#define AF_OFF_DS (AF_OFF_DQKV + AF_ROWS * AF_E3)
#define AF_OFF_V (AF_OFF_DS + AF_SAMPLES * AF_HEADS * AF_W * AF_W)
#define AF_OFF_BP (AF_OFF_V + AF_E)
#define AF_SMEM_FLOATS (AF_OFF_BP + AF_E3)
// Mirrored in kernels.rs (ATTENTION_FUSED_SHARED_BYTES), hence a literal.
#define AF_SMEM_BYTES 189440
static_assert(AF_SMEM_BYTES == 4 * AF_SMEM_FLOATS, "the shared memory layout's size");
// attention_fused_grads stages wemb with rows of 65 floats: a warp's 32 threads read 32
// rows at one column, on 32 banks.
#define AF_WEMB_LD 65

// A block's partial row: [G (3E S) | csum's Q part (E) | Sum (E) | dbp | loss].
#define AF_P_G 0
#define AF_P_CSQ (AF_P_G + AF_E3 * AF_S)
#define AF_P_SUM (AF_P_CSQ + AF_E)
#define AF_P_DBP (AF_P_SUM + AF_E)
#define AF_P_LOSS (AF_P_DBP + 1)
// Mirrored in kernels.rs (ATTENTION_FUSED_ROW_LEN), hence a literal. Not a multiple of 4:
// a block's row is only 8-byte aligned (its stores are float2s and floats).
#define AF_ROW_LEN 12418
static_assert(AF_ROW_LEN == AF_P_LOSS + 1, "the partial row's length");
// What attention_fused_fold writes for the other kernels: [W' (3E S, TF32, row-major) | b'
// (3E) | v (E)], in the scratch after the partial rows and their sums (af_fold_at).
// Mirrored in kernels.rs (ATTENTION_FUSED_FOLD_LEN).
#define AF_F_WP 0
#define AF_F_BP (AF_F_WP + AF_E3 * AF_S)
#define AF_F_V (AF_F_BP + AF_E3)
#define AF_FOLD_LEN 12544
static_assert(AF_FOLD_LEN == AF_F_V + AF_E, "the fold's length");
// A scratch of `rows` partial rows holds, after them, their sums (af_sums_at) and then the
// fold (af_fold_at), each at a multiple of 4 floats: both are read as float4s.
#define af_align4(n) (((size_t)(n) + 3) & ~(size_t)3)
#define af_sums_at(scratch, rows) ((scratch) + af_align4((size_t)(rows) * AF_ROW_LEN))
#define af_fold_at(scratch, rows) (af_sums_at(scratch, rows) + af_align4(AF_ROW_LEN))
// The fold's blocks: 4 rows of W' each. Mirrored in kernels.rs.
#define AF_FOLD_BLOCKS 48
static_assert(4 * AF_FOLD_BLOCKS == AF_E3, "4 rows of W' a block");

// The XOR of row r's columns: 8 (r % 4) + 4 ((r / 4) % 2).
__device__ __forceinline__ unsigned af_swz(unsigned r) {
    return ((r & 3u) << 3) | (r & 4u);
}

// Where element (r, c) of a matrix with rows of ld floats (a multiple of 32) lives.
__device__ __forceinline__ unsigned af_at(unsigned r, unsigned c, unsigned ld) {
    return r * ld + (c ^ af_swz(r));
}

// Operand element (m, k) of a matrix stored as [m][k], or as [k][m] when KM: the bits of a
// TF32 value stored rounded.
template <bool KM>
__device__ __forceinline__ unsigned af_ld(const float* s, unsigned ld, unsigned m, unsigned k) {
    return __float_as_uint(KM ? s[af_at(k, m, ld)] : s[af_at(m, k, ld)]);
}

__device__ __forceinline__ float af_tf32(float x) {
    return __uint_as_float(tf32_bits(x));
}

// acc += A B over K for a warp's MT x NT tiles of m16n8 at (m0, n0). A is [m][k], or
// [k][m] when A_KM; B is [n][k] (a weight, as nn.Linear stores it), or [k][n] when B_KN.
// When both are stored along k, each k-block of 8 is read in another order: fragment
// slots t and t + 4 take columns 2t and 2t + 1, one 8-byte load for both (the XOR of the
// swizzle leaves bit 0 of a column alone, and the 16 lanes of each half-warp still hit 32
// distinct banks). The product sums the same terms; the tensor cores may add them in
// another order.
template <int MT, int NT, int K, bool A_KM, bool B_KN>
__device__ __forceinline__ void af_mma(float (&acc)[MT][NT][4], const float* A, unsigned lda,
                                       unsigned m0, const float* Bm, unsigned ldb, unsigned n0,
                                       unsigned lane) {
    constexpr bool PAIRS = !A_KM && !B_KN;
    const unsigned g = lane >> 2, t = lane & 3;
    // Whole (K = 64: 8 k-steps), so that the next steps' fragment loads are in flight
    // beside this step's products: 4.5% off the kernel against 2 steps at a time, the same
    // bits.
#pragma unroll
    for (unsigned k0 = 0; k0 < K; k0 += 8) {
        unsigned a[MT][4], b[NT][2];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            const unsigned m = m0 + 16 * i + g;
            if (PAIRS) {
                const float2 lo = *reinterpret_cast<const float2*>(A + af_at(m, k0 + 2 * t, lda));
                const float2 hi =
                    *reinterpret_cast<const float2*>(A + af_at(m + 8, k0 + 2 * t, lda));
                a[i][0] = __float_as_uint(lo.x), a[i][2] = __float_as_uint(lo.y);
                a[i][1] = __float_as_uint(hi.x), a[i][3] = __float_as_uint(hi.y);
            } else {
                a[i][0] = af_ld<A_KM>(A, lda, m, k0 + t);
                a[i][1] = af_ld<A_KM>(A, lda, m + 8, k0 + t);
                a[i][2] = af_ld<A_KM>(A, lda, m, k0 + t + 4);
                a[i][3] = af_ld<A_KM>(A, lda, m + 8, k0 + t + 4);
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const unsigned n = n0 + 8 * j + g;
            if (PAIRS) {
                const float2 x = *reinterpret_cast<const float2*>(Bm + af_at(n, k0 + 2 * t, ldb));
                b[j][0] = __float_as_uint(x.x), b[j][1] = __float_as_uint(x.y);
            } else {
                b[j][0] = af_ld<B_KN>(Bm, ldb, n, k0 + t);
                b[j][1] = af_ld<B_KN>(Bm, ldb, n, k0 + t + 4);
            }
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                mma_tf32(acc[i][j], a[i], b[j][0], b[j][1]);
            }
        }
    }
}

template <int MT, int NT>
__device__ __forceinline__ void af_zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
        }
    }
}

// Calls put(m, n, c) for each 16 x 8 tile of a warp's mma.sync accumulators at (m0, n0):
// c[0], c[1] are (m, n), (m, n + 1), and c[2], c[3] the same columns of row m + 8.
template <int MT, int NT, typename Put>
__device__ __forceinline__ void af_for_tiles(const float (&acc)[MT][NT][4], unsigned m0,
                                             unsigned n0, unsigned lane, Put put) {
    const unsigned g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            put(m0 + 16 * i + g, n0 + 8 * j + 2 * t, acc[i][j]);
        }
    }
}

// Stores a warp's tiles as [m][n] (rows of ld), plus bias[n] when given, rounded to TF32
// when ROUND (the value is then only a product's operand).
template <int MT, int NT, bool ROUND>
__device__ __forceinline__ void af_store(const float (&acc)[MT][NT][4], float* s, unsigned ld,
                                         unsigned m0, unsigned n0, const float* bias,
                                         unsigned lane) {
    af_for_tiles(acc, m0, n0, lane, [&](unsigned m, unsigned n, const float (&c)[4]) {
        const float b0 = bias ? bias[n] : 0.0f, b1 = bias ? bias[n + 1] : 0.0f;
        float2 lo = make_float2(c[0] + b0, c[1] + b1);
        float2 hi = make_float2(c[2] + b0, c[3] + b1);
        if (ROUND) {
            lo = make_float2(af_tf32(lo.x), af_tf32(lo.y));
            hi = make_float2(af_tf32(hi.x), af_tf32(hi.y));
        }
        *reinterpret_cast<float2*>(s + af_at(m, n, ld)) = lo;
        *reinterpret_cast<float2*>(s + af_at(m + 8, n, ld)) = hi;
    });
}

// Writes a warp's tiles into a partial row's [M][N] block at p (global memory).
template <int MT, int NT>
__device__ __forceinline__ void af_store_global(const float (&acc)[MT][NT][4], float* p,
                                                unsigned n_cols, unsigned m0, unsigned n0,
                                                unsigned lane) {
    af_for_tiles(acc, m0, n0, lane, [&](unsigned m, unsigned n, const float (&c)[4]) {
        *reinterpret_cast<float2*>(p + (size_t)m * n_cols + n) = make_float2(c[0], c[1]);
        *reinterpret_cast<float2*>(p + (size_t)(m + 8) * n_cols + n) = make_float2(c[2], c[3]);
    });
}

// A 16-byte copy from global to shared memory, or 16 zero bytes when !valid (src is then
// not read).
__device__ __forceinline__ void af_cp_async16(float* dst, const float* src, bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const unsigned n = valid ? 16u : 0u;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n)
                 : "memory");
}

__device__ __forceinline__ void af_cp_async_wait_all() {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// The chunks of 4 floats of a tile of windows that thread tid copies (and later rounds):
// chunk e = tid + 256 q is row e / 16, columns 4 (e % 16) ...
#define AF_WIN_CHUNKS_PER_THREAD (AF_ROWS * AF_S / 4 / AF_THREADS)

__device__ __forceinline__ void af_stage_win(float* dst, const float* __restrict__ win,
                                             unsigned tile, unsigned B) {
    const unsigned rows = B * AF_W;
#pragma unroll
    for (unsigned q = 0; q < AF_WIN_CHUNKS_PER_THREAD; ++q) {
        const unsigned e = threadIdx.x + AF_THREADS * q, r = e / 16, c = 4 * (e % 16);
        const unsigned gr = tile * AF_ROWS + r;
        const bool valid = gr < rows;
        af_cp_async16(dst + af_at(r, c, AF_S), valid ? win + (size_t)gr * AF_S + c : win, valid);
    }
}

// Rounds the chunks this thread copied to TF32, in place (after its copies landed).
__device__ __forceinline__ void af_round_win(float* dst) {
#pragma unroll
    for (unsigned q = 0; q < AF_WIN_CHUNKS_PER_THREAD; ++q) {
        const unsigned e = threadIdx.x + AF_THREADS * q, r = e / 16, c = 4 * (e % 16);
        float4* p = reinterpret_cast<float4*>(dst + af_at(r, c, AF_S));
        const float4 x = *p;
        *p = make_float4(af_tf32(x.x), af_tf32(x.y), af_tf32(x.z), af_tf32(x.w));
    }
}

// Where thread (sample rows r0 .. r0 + 7, head hd) finds its head slices in qkv and dqkv,
// whose rows are AF_E3 floats. r0 is a multiple of 8, so row r0 + k's swizzle is a constant
// once k is (the loops over k are unrolled), and of its bits (4, 3, 2) only bit 4 meets
// the slice's column dh hd = 16 hd: an address is one of two bases plus a constant, with
// no swizzle arithmetic per load (which had been a fifth of phase 3's instructions). The
// thread's own row r0 + i has a swizzle known only at run time: its base and the four
// (4 q) ^ swizzle offsets are computed once.
struct AfRows {
    unsigned k_base[2];  // r0 AF_E3 + (16 hd), and with bit 4 of the column flipped
    unsigned own;        // (r0 + i) AF_E3 + (16 hd ^ (bit 4 of its swizzle))
    unsigned own_low[4]; // (4 q) ^ (bits 3, 2 of its swizzle)
};

__device__ __forceinline__ AfRows af_rows(unsigned r0, unsigned i, unsigned hd) {
    AfRows a;
    a.k_base[0] = r0 * AF_E3 + AF_DH * hd;
    a.k_base[1] = r0 * AF_E3 + ((AF_DH * hd) ^ 16u);
    const unsigned swz = af_swz(r0 + i);
    a.own = (r0 + i) * AF_E3 + ((AF_DH * hd) ^ (swz & 16u));
#pragma unroll
    for (unsigned q = 0; q < AF_DH / 4; ++q) {
        a.own_low[q] = (4 * q) ^ (swz & 12u);
    }
    return a;
}

// af_at(r0 + k, part E + 16 hd + 4 q, AF_E3), for k, part and q constants.
__device__ __forceinline__ unsigned af_k_at(const AfRows& a, unsigned k, unsigned part,
                                            unsigned q) {
    const unsigned swz = af_swz(k);
    return a.k_base[(swz >> 4) & 1u] + k * AF_E3 + part * AF_E + ((4 * q) ^ (swz & 12u));
}

// af_at(r0 + i, part E + 16 hd + 4 q, AF_E3), for part and q constants.
__device__ __forceinline__ unsigned af_own_at(const AfRows& a, unsigned part, unsigned q) {
    return a.own + part * AF_E + a.own_low[q];
}

__device__ __forceinline__ void af_put4(float (&v)[AF_DH], unsigned q, float4 x) {
    v[4 * q] = x.x, v[4 * q + 1] = x.y, v[4 * q + 2] = x.z, v[4 * q + 3] = x.w;
}

// Head slice `part` (0 Q, 1 K, 2 V) of row r0 + k (own: of row r0 + i) of qkv.
__device__ __forceinline__ void af_slice_k(float (&v)[AF_DH], const float* sq, const AfRows& a,
                                           unsigned k, unsigned part) {
#pragma unroll
    for (unsigned q = 0; q < AF_DH / 4; ++q) {
        af_put4(v, q, *reinterpret_cast<const float4*>(sq + af_k_at(a, k, part, q)));
    }
}

__device__ __forceinline__ void af_slice_own(float (&v)[AF_DH], const float* sq,
                                             const AfRows& a, unsigned part) {
#pragma unroll
    for (unsigned q = 0; q < AF_DH / 4; ++q) {
        af_put4(v, q, *reinterpret_cast<const float4*>(sq + af_own_at(a, part, q)));
    }
}

// out = sum_k w[k] (head slice `part` of row r0 + k): the weighted sum of a sample's rows
// that the attention's forward (P V) and backward (dS K, dSᵀ Q) take.
__device__ __forceinline__ void af_rows_times(float (&out)[AF_DH], const float (&w)[AF_W],
                                              const float* sq, const AfRows& a, unsigned part) {
    float x[AF_DH];
#pragma unroll
    for (unsigned c = 0; c < AF_DH; ++c) {
        out[c] = 0.0f;
    }
#pragma unroll
    for (unsigned k = 0; k < AF_W; ++k) {
        af_slice_k(x, sq, a, k, part);
#pragma unroll
        for (unsigned c = 0; c < AF_DH; ++c) {
            out[c] = fmaf(w[k], x[c], out[c]);
        }
    }
}

// Stores a head slice into row r0 + i of dqkv, rounded to TF32 (it is only a product's
// operand).
__device__ __forceinline__ void af_store_own(float* sd, const float (&v)[AF_DH], const AfRows& a,
                                             unsigned part) {
#pragma unroll
    for (unsigned q = 0; q < AF_DH / 4; ++q) {
        *reinterpret_cast<float4*>(sd + af_own_at(a, part, q)) =
            make_float4(af_tf32(v[4 * q]), af_tf32(v[4 * q + 1]), af_tf32(v[4 * q + 2]),
                        af_tf32(v[4 * q + 3]));
    }
}

// What phase 2 carries from tile to tile: thread (head hd, row i) of warp s owns columns
// hd dh + 2i, + 1 of Sum and of csum's Q part (for its warp's samples), lane 0 the loss
// and dbp.
struct AfPool {
    float sum0, sum1, csq0, csq1, dbp, loss;
};

// Phase 2 for sample s of the tile (this warp), head hd = lane / 8, row i = lane % 8. rb is
// the sample's reward (0 past B), loaded at the tile's start so that its latency is hidden
// behind phase 1.
__device__ __forceinline__ void af_attention(const float* sq, float* sd, float* sds,
                                             const float* sv, float bp, float rb,
                                             float* __restrict__ pred, unsigned tile, unsigned B,
                                             float coef, AfPool& pool) {
    const unsigned lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const unsigned hd = lane >> 3, i = lane & 7, base = lane & ~7u;
    const AfRows rows = af_rows(s * AF_W, i, hd);
    const unsigned b = tile * AF_SAMPLES + s;
    const bool valid = b < B;
    // 1 / sqrt(dh), a power of two: multiplying by it is exact, so where it is applied
    // (to a score, or to dS before its products) does not change a bit.
    const float scale = 0.25f;

    // Forward: scores, softmax, att_i.
    float q[AF_DH], x[AF_DH], p[AF_W];
    af_slice_own(q, sq, rows, 0);
#pragma unroll
    for (unsigned k = 0; k < AF_W; ++k) {
        af_slice_k(x, sq, rows, k, 1);
        float dot = 0.0f;
#pragma unroll
        for (unsigned c = 0; c < AF_DH; ++c) {
            dot = fmaf(q[c], x[c], dot);
        }
        p[k] = dot * scale;
    }
    float mx = -INFINITY;
#pragma unroll
    for (unsigned k = 0; k < AF_W; ++k) {
        mx = fmaxf(mx, p[k]);
    }
    // The exponentials by the special-function unit (arguments at most 0, relative error
    // about 1e-6) and one reciprocal, where expf's range checks and eight IEEE divisions
    // took about 150 instructions a thread.
    float sum = 0.0f;
#pragma unroll
    for (unsigned k = 0; k < AF_W; ++k) {
        p[k] = __expf(p[k] - mx);
        sum += p[k];
    }
    const float inv = 1.0f / sum;
#pragma unroll
    for (unsigned k = 0; k < AF_W; ++k) {
        p[k] *= inv;
    }
    float a[AF_DH];
    af_rows_times(a, p, sq, rows, 2);

    // The mean over the window: afterwards lane i holds columns 2i, 2i + 1 of the head's
    // slice summed over its 8 rows (reduce-scatter over lane bits 2, 1, 0).
    reduce_scatter_step<8>(a, lane, 4);
    reduce_scatter_step<4>(a, lane, 2);
    reduce_scatter_step<2>(a, lane, 1);
    const unsigned c0 = hd * AF_DH + 2 * i;
    const float m0 = a[0] / (float)AF_W, m1 = a[1] / (float)AF_W;
    const float pb = warp_sum(fmaf(m0, sv[c0], m1 * sv[c0 + 1])) + bp;
    const float diff = valid ? pb - rb : 0.0f;
    const float g = 2.0f * coef / (float)B * diff;
    if (lane == 0) {
        if (valid) {
            pred[b] = pb;
        }
        pool.loss = fmaf(diff, diff, pool.loss);
        pool.dbp += g;
    }
    pool.sum0 = fmaf(g, m0, pool.sum0);
    pool.sum1 = fmaf(g, m1, pool.sum1);

    // Backward. datt_i = (g / W) v for every row; u is its head slice.
    const float gw = g / (float)AF_W;
    float u[AF_DH];
#pragma unroll
    for (unsigned c = 0; c < AF_DH; ++c) {
        u[c] = gw * sv[hd * AF_DH + c];
    }
    // dV_i = (sum_i' P[i', i]) u: the column sums of P by reduce-scatter (lane i gets
    // column i).
    float cs[AF_W];
#pragma unroll
    for (unsigned k = 0; k < AF_W; ++k) {
        cs[k] = p[k];
    }
    reduce_scatter_step<4>(cs, lane, 4);
    reduce_scatter_step<2>(cs, lane, 2);
    reduce_scatter_step<1>(cs, lane, 1);
    float dv[AF_DH];
#pragma unroll
    for (unsigned c = 0; c < AF_DH; ++c) {
        dv[c] = cs[0] * u[c];
    }
    af_store_own(sd, dv, rows, 2);
    // dP[i, k] = u . V_k, the same for every i: lane i computes it for k = i.
    af_slice_own(x, sq, rows, 2);
    float ci = 0.0f;
#pragma unroll
    for (unsigned c = 0; c < AF_DH; ++c) {
        ci = fmaf(u[c], x[c], ci);
    }
    float ck[AF_W];
    float pc = 0.0f;
#pragma unroll
    for (unsigned k = 0; k < AF_W; ++k) {
        ck[k] = __shfl_sync(FULL_MASK, ci, base + k);
        pc = fmaf(p[k], ck[k], pc);
    }
    // scale dS here, once, rather than dQ and dK after their products (exact either way).
    float ds[AF_W];
#pragma unroll
    for (unsigned k = 0; k < AF_W; ++k) {
        ds[k] = p[k] * (ck[k] - pc) * scale;
    }
    // dQ_i = scale sum_k dS[i, k] K_k, rounded to TF32 here: G's operand, and csum's Q part
    // sums the same values (the sample's 8 rows by reduce-scatter: lane i gets columns
    // 2i, 2i + 1 of the head's slice).
    float dq[AF_DH];
    af_rows_times(dq, ds, sq, rows, 1);
#pragma unroll
    for (unsigned c = 0; c < AF_DH; ++c) {
        dq[c] = af_tf32(dq[c]);
    }
    af_store_own(sd, dq, rows, 0);
    reduce_scatter_step<8>(dq, lane, 4);
    reduce_scatter_step<4>(dq, lane, 2);
    reduce_scatter_step<2>(dq, lane, 1);
    pool.csq0 += dq[0];
    pool.csq1 += dq[1];
    // dK_i = scale sum_i' dS[i', i] Q_i': dS through shared memory (this warp's only).
    float* my_ds = sds + ((s * AF_HEADS + hd) * AF_W) * AF_W;
    *reinterpret_cast<float4*>(my_ds + i * AF_W) = make_float4(ds[0], ds[1], ds[2], ds[3]);
    *reinterpret_cast<float4*>(my_ds + i * AF_W + 4) = make_float4(ds[4], ds[5], ds[6], ds[7]);
    __syncwarp();
    float ds_col[AF_W], dk[AF_DH];
#pragma unroll
    for (unsigned k = 0; k < AF_W; ++k) {
        ds_col[k] = my_ds[k * AF_W + i];
    }
    af_rows_times(dk, ds_col, sq, rows, 0);
    af_store_own(sd, dk, rows, 1);
    // The next tile overwrites my_ds only after the block barriers between.
}

// Phase clocks, for bench/probes/attention only (built with -DAF_PHASE_CLOCKS; the step's
// build has none of it): thread 0 of each block adds the cycles from one of its marks to the
// next. The marks after block barriers time the block's slowest warp; those without (the
// prologue's, phase 3's) time warp 0's own progress. AF_PHASE_NAMES names them for the
// probe; phases 1 to AF_PHASES - 2 are per tile.
#define AF_PHASE_NAMES                                                                \
    {"prologue (the fold)", "windows: wait, round", "1 qkv", "2 attention fwd+bwd", \
     "3 G (warp 0)", "epilogue (partial row)"}
#ifdef AF_PHASE_CLOCKS
#define AF_PHASES 6
#define AF_CLOCK_BLOCKS 1024
__device__ unsigned long long af_phase_clocks[AF_CLOCK_BLOCKS][AF_PHASES];
#define AF_CLOCK_INIT()             \
    long long af_clk_t = clock64(); \
    unsigned long long af_clk[AF_PHASES] = {0, 0, 0, 0, 0, 0};
#define AF_CLOCK(p)                              \
    do {                                         \
        if (tid == 0) {                          \
            const long long af_now = clock64();  \
            af_clk[p] += af_now - af_clk_t;      \
            af_clk_t = af_now;                   \
        }                                        \
    } while (0)
#define AF_CLOCK_STORE()                                         \
    do {                                                         \
        if (tid == 0 && blockIdx.x < AF_CLOCK_BLOCKS) {          \
            for (int af_p = 0; af_p < AF_PHASES; ++af_p) {       \
                af_phase_clocks[blockIdx.x][af_p] = af_clk[af_p]; \
            }                                                    \
        }                                                        \
    } while (0)
#else
#define AF_CLOCK_INIT()
#define AF_CLOCK(p)
#define AF_CLOCK_STORE()
#endif

// The weights folded, once a step: W' = wqkv wemb rounded to TF32, b' = wqkv bemb and
// v = wpᵀ wo, in FP32, into the fold of a scratch of `rows` partial rows. Block b takes rows
// 4b .. 4b + 3 of W' and b' (thread t: row 4b + t / 64, column t % 64, a sum of 64 terms from
// shared memory); block 0 also v. Grid: AF_FOLD_BLOCKS blocks of AF_THREADS threads.
extern "C" __global__ void __launch_bounds__(AF_THREADS)
    attention_fused_fold(const float* __restrict__ wemb, const float* __restrict__ bemb,
                         const float* __restrict__ wqkv, const float* __restrict__ wo,
                         const float* __restrict__ wp, float* __restrict__ scratch,
                         unsigned rows) {
    float* fold = af_fold_at(scratch, rows);
    __shared__ __align__(16) float s_wemb[AF_E * AF_S];
    __shared__ float s_wq[4][AF_E];
    const unsigned tid = threadIdx.x, j0 = 4 * blockIdx.x;
    for (unsigned e = tid; e < AF_E * AF_S / 4; e += AF_THREADS) {
        reinterpret_cast<float4*>(s_wemb)[e] = reinterpret_cast<const float4*>(wemb)[e];
    }
    s_wq[tid / AF_E][tid % AF_E] = wqkv[j0 * AF_E + tid];
    __syncthreads();
    const unsigned jl = tid / AF_S, c = tid % AF_S;
    float d = 0.0f;
#pragma unroll 16
    for (unsigned e = 0; e < AF_E; ++e) {
        d = fmaf(s_wq[jl][e], s_wemb[e * AF_S + c], d);
    }
    fold[AF_F_WP + (j0 + jl) * AF_S + c] = af_tf32(d);
    if (tid < 4) {
        float b = 0.0f;
        for (unsigned e = 0; e < AF_E; ++e) {
            b = fmaf(s_wq[tid][e], bemb[e], b);
        }
        fold[AF_F_BP + j0 + tid] = b;
    }
    if (blockIdx.x == 0 && tid >= 64 && tid < 128) {
        const unsigned k = tid - 64;
        float v = 0.0f;
#pragma unroll 8
        for (unsigned e = 0; e < AF_E; ++e) {
            v = fmaf(wp[e], wo[e * AF_E + k], v);
        }
        fold[AF_F_V + k] = v;
    }
}

// The fold into shared memory: W' swizzled as [3E][S] (qkv's B operand), b', v.
__device__ __forceinline__ void af_load_fold(const float* __restrict__ fold, float* s_wp,
                                             float* s_bp, float* s_v) {
    for (unsigned q = threadIdx.x; q < AF_E3 * AF_S / 4; q += AF_THREADS) {
        const unsigned r = q / (AF_S / 4), c = 4 * (q % (AF_S / 4));
        *reinterpret_cast<float4*>(s_wp + af_at(r, c, AF_S)) =
            reinterpret_cast<const float4*>(fold + AF_F_WP)[q];
    }
    if (threadIdx.x < AF_E3) {
        s_bp[threadIdx.x] = fold[AF_F_BP + threadIdx.x];
    } else if (threadIdx.x < AF_E3 + AF_E) {
        s_v[threadIdx.x - AF_E3] = fold[AF_F_V + threadIdx.x - AF_E3];
    }
}

// The whole head, forward and backward, for tiles of 8 samples: see the top of the file.
// win [B W, S], bp [1], r [B], and the scratch's fold (attention_fused_fold's, for this
// grid); writes pred[b < B] and the scratch's partial rows [gridDim.x, AF_ROW_LEN]. Grid:
// at most ceil(B / 8) blocks of AF_THREADS threads, AF_SMEM_BYTES of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(AF_THREADS, 1)
    attention_fused(const float* __restrict__ win, const float* __restrict__ bp,
                    const float* __restrict__ r, float* __restrict__ pred, float* scratch,
                    unsigned B, float coef) {
    const float* fold = af_fold_at(scratch, gridDim.x);
    float* partials = scratch;
    extern __shared__ float4 af_smem4[];
    float* smem = reinterpret_cast<float*>(af_smem4);
    float* s_wp = smem + AF_OFF_WP;
    float* s_qkv = smem + AF_OFF_QKV;
    float* s_dqkv = smem + AF_OFF_DQKV;
    float* s_ds = smem + AF_OFF_DS;
    float* s_v = smem + AF_OFF_V;
    float* s_bp = smem + AF_OFF_BP;
    const unsigned tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const unsigned tiles = (B + AF_SAMPLES - 1) / AF_SAMPLES;
    AF_CLOCK_INIT();

    if (blockIdx.x < tiles) {
        af_stage_win(smem + AF_OFF_WIN, win, blockIdx.x, B);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    af_load_fold(fold, s_wp, s_bp, s_v);
    const float bp0 = bp[0];

    // Carried across tiles: G (warp tile 48 x 32 at (48 (wid % 4), 32 (wid / 4))) and the
    // pool's sums.
    float G[3][4][4];
    af_zero(G);
    AfPool pool = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const unsigned mb4 = wid & 3, nb2 = wid >> 2;

    unsigned it = 0;
    AF_CLOCK(0);  // the fold's loads issued (the first barrier waits for them)
    for (unsigned tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++it) {
        float* s_win = smem + AF_OFF_WIN + (it & 1) * AF_ROWS * AF_S;
        af_cp_async_wait_all();
        af_round_win(s_win);
        // Every thread's windows are in and rounded, the fold stored, and the last tile's
        // phase 3 is done with dqkv and the other window buffer.
        __syncthreads();
        AF_CLOCK(1);
        // This warp's sample's reward, for phase 2.
        const float rb = tile * AF_SAMPLES + wid < B ? r[tile * AF_SAMPLES + wid] : 0.0f;
        if (tile + gridDim.x < tiles) {
            af_stage_win(smem + AF_OFF_WIN + ((it + 1) & 1) * AF_ROWS * AF_S, win,
                         tile + gridDim.x, B);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");

        // 1. qkv = win W'ᵀ + b' (warp tile 32 x 48).
        {
            float acc[2][6][4];
            af_zero(acc);
            af_mma<2, 6, AF_S, false, false>(acc, s_win, AF_S, 32 * (wid & 1), s_wp, AF_S,
                                             48 * (wid >> 1), lane);
            af_store<2, 6, false>(acc, s_qkv, AF_E3, 32 * (wid & 1), 48 * (wid >> 1), s_bp,
                                  lane);
        }
        __syncthreads();
        AF_CLOCK(2);
        // 2. Attention, the pool and the loss, dqkv and csum's Q part.
        af_attention(s_qkv, s_dqkv, s_ds, s_v, bp0, rb, pred, tile, B, coef, pool);
        __syncthreads();
        AF_CLOCK(3);
        // 3. G += dqkvᵀ win.
        af_mma<3, 4, AF_ROWS, true, true>(G, s_dqkv, AF_E3, 48 * mb4, s_win, AF_S, 32 * nb2,
                                          lane);
        AF_CLOCK(4);
    }
    af_cp_async_wait_all();

    // The block's partial row. G goes straight out; the pool's sums and the loss are added
    // over warps in a fixed order, through shared memory.
    float* row = partials + (size_t)blockIdx.x * AF_ROW_LEN;
    af_store_global(G, row + AF_P_G, AF_S, 48 * mb4, 32 * nb2, lane);
    // s_ds's last use was phase 2's, before a barrier already; this one keeps the
    // epilogue's shared writes apart from every warp's last products.
    __syncthreads();
    float* red_sum = s_ds;                   // [8 warps][E]
    float* red_csq = s_ds + 8 * AF_E;        // [8 warps][E]
    float* red_scalar = s_ds + 16 * AF_E;    // [8 warps][2]
    {
        const unsigned hd = lane >> 3, i = lane & 7, c = hd * AF_DH + 2 * i;
        red_sum[wid * AF_E + c] = pool.sum0;
        red_sum[wid * AF_E + c + 1] = pool.sum1;
        red_csq[wid * AF_E + c] = pool.csq0;
        red_csq[wid * AF_E + c + 1] = pool.csq1;
    }
    if (lane == 0) {
        red_scalar[2 * wid] = pool.dbp;
        red_scalar[2 * wid + 1] = pool.loss;
    }
    __syncthreads();
    if (tid < AF_E) {
        float ss = 0.0f, sq = 0.0f;
        for (unsigned w = 0; w < AF_THREADS / 32; ++w) {
            ss += red_sum[w * AF_E + tid];
            sq += red_csq[w * AF_E + tid];
        }
        row[AF_P_SUM + tid] = ss;
        row[AF_P_CSQ + tid] = sq;
    } else if (tid < AF_E + 2) {
        const unsigned k = tid - AF_E;
        float x = 0.0f;
        for (unsigned w = 0; w < AF_THREADS / 32; ++w) {
            x += red_scalar[2 * w + k];
        }
        row[AF_P_DBP + k] = x;
    }
    AF_CLOCK(5);
    AF_CLOCK_STORE();
}

// Adds attention_fused's `rows` partial rows in order, each column of a row summed by
// column_block_sum, into the sums' row after them (af_sums_at), which attention_fused_grads
// reads. Grid: ceil(AF_ROW_LEN / 32) blocks of (32, 32) threads.
extern "C" __global__ void __launch_bounds__(1024)
    attention_fused_sums(float* partials, unsigned rows) {
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const float s = column_block_sum(partials, 0, rows, AF_ROW_LEN, c);
    if (threadIdx.y == 0 && c < AF_ROW_LEN) {
        af_sums_at(partials, rows)[c] = s;
    }
}

// csum[j], the sum over rows of dqkv's column j, from the summed row T and the fold's v:
// its Q part as summed, its K part 0 and its V part dbp v (see the top of the file).
__device__ __forceinline__ float af_csum(const float* T, const float* v, unsigned j) {
    return j < AF_E ? T[AF_P_CSQ + j] : j < 2 * AF_E ? 0.0f : T[AF_P_DBP] * v[j - 2 * AF_E];
}

// The gradients from the summed row T (attention_fused_sums'), the fold's
// v and the weights, every operand staged in shared memory first (the sums read from global memory
// one term at a time had taken 47 us):
//   blocks 0-47   dwqkv[j, c] = sum_s G[j, s] wemb[c, s] + csum[j] bemb[c], 4 rows j a block
//   blocks 48-63  dwemb[e, s] = sum_j wqkv[j, e] G[j, s], 4 rows e a block, G staged in
//                 three chunks of 64 rows
//   block 64      dbemb[e] = sum_j wqkv[j, e] csum[j] (four partial sums of 48 terms,
//                 added in order); dwo[e, c] = wp[e] Sum[c], dwp[e] = sum_c Sum[c] wo[e, c],
//                 dbp; L_attn = (loss sum) / B into losses[LOSS_ATTN], coef L_attn into
//                 losses[LOSS_TOTAL].
// Every sum in FP32 in a fixed order. Grid: AF_GRADS_BLOCKS blocks of AF_THREADS threads.
#define AF_GRADS_BLOCKS 65
extern "C" __global__ void __launch_bounds__(AF_THREADS)
    attention_fused_grads(const float* __restrict__ partials, unsigned rows,
                          const float* __restrict__ wemb,
                          const float* __restrict__ bemb, const float* __restrict__ wqkv,
                          const float* __restrict__ wo, const float* __restrict__ wp,
                          float* __restrict__ dwqkv, float* __restrict__ dwemb,
                          float* __restrict__ dbemb, float* __restrict__ dwo,
                          float* __restrict__ dwp, float* __restrict__ dbp,
                          float* __restrict__ losses, unsigned B, float coef) {
    const float* T = af_sums_at(partials, rows);
    const float* v = af_fold_at(partials, rows) + AF_F_V;
    const unsigned tid = threadIdx.x;
    // wemb or wo with rows of AF_WEMB_LD (a warp reads 32 rows at one column), or a chunk
    // of G's rows.
    __shared__ __align__(16) float s_x[AF_E * AF_WEMB_LD];
    __shared__ float s_y[AF_THREADS];  // 4 rows of G, 4 columns of a chunk of wqkv, or csum
    __shared__ float s_part[4][AF_E];
    if (blockIdx.x < 48) {
        const unsigned j0 = 4 * blockIdx.x;
        for (unsigned e = tid; e < AF_E * AF_S; e += AF_THREADS) {
            s_x[(e / AF_S) * AF_WEMB_LD + e % AF_S] = wemb[e];
        }
        s_y[tid] = T[AF_P_G + j0 * AF_S + tid];
        __syncthreads();
        const unsigned jl = tid / AF_E, c = tid % AF_E;
        float d = 0.0f;
#pragma unroll 16
        for (unsigned k = 0; k < AF_S; ++k) {
            d = fmaf(s_y[jl * AF_S + k], s_x[c * AF_WEMB_LD + k], d);
        }
        dwqkv[(j0 + jl) * AF_E + c] = fmaf(af_csum(T, v, j0 + jl), bemb[c], d);
    } else if (blockIdx.x < 64) {
        const unsigned e0 = 4 * (blockIdx.x - 48), el = tid / AF_S, k = tid % AF_S;
        float d = 0.0f;
        for (unsigned j0 = 0; j0 < AF_E3; j0 += 64) {
            __syncthreads();  // the last chunk is read
            for (unsigned q = tid; q < 64 * AF_S / 4; q += AF_THREADS) {
                reinterpret_cast<float4*>(s_x)[q] =
                    reinterpret_cast<const float4*>(T + AF_P_G + j0 * AF_S)[q];
            }
            s_y[tid] = wqkv[(j0 + tid / 4) * AF_E + e0 + tid % 4];
            __syncthreads();
#pragma unroll 16
            for (unsigned jj = 0; jj < 64; ++jj) {
                d = fmaf(s_y[4 * jj + el], s_x[jj * AF_S + k], d);
            }
        }
        dwemb[(e0 + el) * AF_S + k] = d;
    } else {
        for (unsigned e = tid; e < AF_E * AF_E; e += AF_THREADS) {
            s_x[(e / AF_E) * AF_WEMB_LD + e % AF_E] = wo[e];
        }
        if (tid < AF_E3) {
            s_y[tid] = af_csum(T, v, tid);
        }
        __syncthreads();
        {
            const unsigned e = tid % AF_E, q = tid / AF_E;
            float d = 0.0f;
#pragma unroll 8
            for (unsigned j = 48 * q; j < 48 * q + 48; ++j) {
                d = fmaf(wqkv[j * AF_E + e], s_y[j], d);
            }
            s_part[q][e] = d;
        }
        __syncthreads();
        if (tid < AF_E) {
            dbemb[tid] = ((s_part[0][tid] + s_part[1][tid]) + s_part[2][tid]) + s_part[3][tid];
        } else if (tid < 2 * AF_E) {
            const unsigned e = tid - AF_E;
            float p = 0.0f;
            for (unsigned c = 0; c < AF_E; ++c) {
                p = fmaf(T[AF_P_SUM + c], s_x[e * AF_WEMB_LD + c], p);
            }
            dwp[e] = p;
        } else if (tid == 2 * AF_E) {
            dbp[0] = T[AF_P_DBP];
            add_loss_term(losses, LOSS_ATTN, T[AF_P_LOSS] / (float)B, coef);
        }
        for (unsigned x = tid; x < AF_E * AF_E; x += AF_THREADS) {
            dwo[x] = wp[x / AF_E] * T[AF_P_SUM + x % AF_E];
        }
    }
}
