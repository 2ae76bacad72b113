// rejax's SAC update, `epochs` of them in a row, and the Polyak step of the target
// critics, fused in one launch: SAC_CLUSTER thread blocks per agent, all of an agent's
// networks in every block's shared memory for the whole launch.
//
// Per epoch (rejax's `update`): draw B distinct ring slots, gather and normalise them with
// the agent's current observation statistics, then
//   1. the actor: a ~ pi(s) with noise of PURPOSE_SAC_ACTOR, loss mean(alpha logp -
//      min_k Q_k(s, a)) through both critics (their parameters before this update), its
//      gradient, an Adam step;
//   2. the critics: a' ~ pi_new(s') with noise of PURPOSE_SAC_TARGET, targets
//      y = r + gamma (1 - done) (min_k Qtarget_k(s', a') - alpha logp'), loss
//      sum_k mean 0.5 (Q_k(s, a) - y)^2, its gradient, an Adam step;
//   3. the temperature: loss mean(-exp(log_alpha) (logp + target_entropy)) with the actor
//      phase's logp, an Adam step of log_alpha.
// alpha = exp(log_alpha) before the update, in all three. Then, every launch, trained or
// not (rejax updates the targets every iteration): target = keep target + mix critic.
//
// Where the work goes. An update is about 17 million multiply-adds at a batch of 256
// (sixteen 256 x 64 x 64 products: forward and backward through the actor and both
// critics, the target critics), which keep one SM busy for about 100 us. So on compute
// capability 9.0 an agent is a cluster of SAC_CLUSTER = 8 blocks (__cluster_dims__), one
// per SM: block r takes rows [r B / 8, (r + 1) B / 8) of the batch (every block draws the
// whole batch, a cheap hash, and gathers its rows), computes its part of each gradient,
// and the blocks meet twice per network through distributed shared memory: after a
// cluster barrier, block r sums the 8 partial gradients of its eighth of the parameters
// (in rank order, so a launch is bit-for-bit reproducible), takes the Adam step and writes
// the new values into all 8 blocks' copies; a second barrier, and every block holds the
// updated network. Older GPUs build this file without clusters: one block per agent takes
// every row, in chunks, and the same code meets itself (SAC_CLUSTER = 1).
//
// Within a block (SAC_UPDATE_THREADS = 256), rows go through the networks in chunks of
// CHUNK = 32 (one chunk per block at B = 256 in a cluster):
// - dense layers of a chunk: thread (rg, cg) computes 4 adjacent outputs (cg) of rows rg
//   and rg + 16, from float4 loads of 4 weights and of the inputs; the one-unit heads
//   (mean, log-std, Q) are dot products in the second layer's epilogue, summed over the
//   16 threads of a row by shuffles;
// - W2's gradient: a 4 x 4 tile per thread, summed over the block's rows in registers;
// - the other gradients (W1, b1, b2, heads: under 450 a network) one or two per thread;
// - no atomics outside the sampler's hash table.
//
// Shared memory (floats; 148 432 bytes, fixed: SAC_UPDATE_SMEM_FLOATS; the H100 and H200
// grant a block 227 KiB, the A100 163 KiB):
//   PA  [SAC_PAD]                 the actor, updated by the Adam steps
//   PC  [NUM_CRITICS SAC_PAD]     the critics, likewise
//   PG  [NUM_CRITICS SAC_PAD]     the block's part of the actor's gradient (phase 1); the
//                                 target critics (phase 2's targets); its part of the
//                                 critics' gradient
//   BUF [4][CHUNK SAC_RS]         a chunk's activations and their gradients
//   XA, XN [SAC_MAX_BATCH][4]     the normalised observations with the replay's action;
//                                 the normalised next observations with a'
//   XP  [CHUNK][4]                a chunk's observations with the policy's action
//   Y, DN, LP, LA, LC [SAC_MAX_BATCH]  rewards then targets, done, logp of phase 1,
//                                 the actor's and the critics' loss terms
//   SLOT, T, DUP [SAC_MAX_BATCH], HK, HI [SAC_HT]  the sampler's draws and hash table
//   CS  [CS_ROWS][CHUNK]          per-row values of a chunk (heads, tanh, gradients)
//   RED [32]                      the block's partial sums, which the others read
// Rows of BUF are padded to SAC_RS = 68 floats: float4 loads stay aligned and two rows a
// warp reads at once start in different banks.

#include <cuda_pipeline.h>

#include "cluster.cuh"
#include "sac.cuh"

#define SAC_UPDATE_THREADS 256
#define SAC_MAX_BATCH 256
#define CHUNK 32
#define SAC_RS 68
#define SAC_CG 16
#define SAC_RG 16
#define SAC_RPT 2
#define SAC_PAD 4548
#define SAC_HT 512
#define CS_ROWS 12
#define SAC_UPDATE_SMEM_FLOATS 37108
// Blocks of an agent where the GPU has clusters (compute capability 9.0).
#define SAC_CLUSTER 8
static_assert(SAC_CG * 4 == SAC_HIDDEN, "a column group is 4 outputs");
static_assert((SAC_HIDDEN & (SAC_HIDDEN - 1)) == 0, "backward1's skew wraps with a mask");
static_assert(SAC_CG * SAC_RG == SAC_UPDATE_THREADS, "tile threads");
static_assert(SAC_RPT * SAC_RG == CHUNK, "rows of a thread");
static_assert(SAC_PAD >= ACTOR_PARAMS && SAC_PAD >= CRITIC_PARAMS && SAC_PAD % 4 == 0, "pad");
static_assert(SAC_RS >= SAC_HIDDEN && SAC_RS % 4 == 0, "aligned rows");
static_assert(SAC_HT >= 2 * SAC_MAX_BATCH && (SAC_HT & (SAC_HT - 1)) == 0, "hash table");
static_assert(SAC_UPDATE_SMEM_FLOATS == (1 + 2 * NUM_CRITICS) * SAC_PAD + 4 * CHUNK * SAC_RS +
                                           8 * SAC_MAX_BATCH + 4 * CHUNK +
                                           5 * SAC_MAX_BATCH + 3 * SAC_MAX_BATCH +
                                           2 * SAC_HT + CS_ROWS * CHUNK + 32,
              "shared memory");
// The owners of the small gradients: 64 per head and the head biases at 0 .., b2 at
// 192 .., W1 then b1 at t and t + 256 of 0 .. 64 (SAC_IN + 1).
static_assert(2 * SAC_HIDDEN + 2 <= 192 && 192 + SAC_HIDDEN <= SAC_UPDATE_THREADS, "owners");
static_assert(SAC_HIDDEN * (SAC_IN + 1) <= 2 * SAC_UPDATE_THREADS, "owners");
static_assert(SAC_HIDDEN == 4 * SAC_CG && SAC_HIDDEN * SAC_HIDDEN == 16 * SAC_UPDATE_THREADS,
              "a 4 x 4 tile of W2's gradient a thread");

// The cluster (cluster.cuh): SAC_CLUSTER blocks per agent on compute capability 9.0,
// one elsewhere.
#if AGENTS_HAVE_CLUSTERS
#define SAC_CLUSTER_DIMS __cluster_dims__(SAC_CLUSTER, 1, 1)
__device__ constexpr unsigned kClusterBlocks = SAC_CLUSTER;
#else
#define SAC_CLUSTER_DIMS
__device__ constexpr unsigned kClusterBlocks = 1;
#endif
static_assert(NUM_CRITICS == 2, "the min over critics is written for two");

// The per-row values of a chunk, rows of CS.
#define CS_MU 0    // actor mean
#define CS_LS 1    // actor raw log-std
#define CS_Q0 2    // critic 0
#define CS_Q1 3    // critic 1
#define CS_DQ0 4   // d Q0 / d a
#define CS_DQ1 5   // d Q1 / d a
#define CS_GMU 6   // d loss / d mean
#define CS_GLS 7   // d loss / d raw log-std
#define CS_T 8     // tanh(u)
#define CS_SE 9    // sigma eps
#define CS_CLIP 10 // d ls / d ls_raw
#define CS_LOGP 11 // logp' of the targets

__device__ __forceinline__ float4 ld4(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float comp(const float4& v, int c) {
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// Sum over the 16 threads of a row group (a half warp), every one getting the total.
__device__ __forceinline__ float group_sum(float x) {
    for (int o = 8; o > 0; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
    }
    return x;
}

// acc[r][c] = b[n0 + c] + sum_k in[i, k] w[k, n0 + c] for this thread's rows
// i = rg + SAC_RG r (rows past nrows compute row nrows - 1 again) and n0 = 4 cg; the sum
// adds k = 0, 1, ... with fmaf.
template <int K, int IN_STRIDE>
__device__ __forceinline__ void dense_acc(const float* in, const float* w, const float* b,
                                          unsigned nrows, float (&acc)[SAC_RPT][4]) {
    const unsigned n0 = (threadIdx.x % SAC_CG) * 4, rg = threadIdx.x / SAC_CG;
    const float4 bias = ld4(b + n0);
#pragma unroll
    for (int r = 0; r < SAC_RPT; ++r) {
        acc[r][0] = bias.x;
        acc[r][1] = bias.y;
        acc[r][2] = bias.z;
        acc[r][3] = bias.w;
    }
    if constexpr (K % 4 == 0) {
#pragma unroll 4
        for (int k = 0; k < K; k += 4) {
            float4 wk[4];
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                wk[kk] = ld4(w + (k + kk) * SAC_HIDDEN + n0);
            }
#pragma unroll
            for (int r = 0; r < SAC_RPT; ++r) {
                const unsigned i = min(rg + SAC_RG * r, nrows - 1);
                const float4 h = ld4(in + i * IN_STRIDE + k);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float a = acc[r][c];
                    a = fmaf(h.x, comp(wk[0], c), a);
                    a = fmaf(h.y, comp(wk[1], c), a);
                    a = fmaf(h.z, comp(wk[2], c), a);
                    a = fmaf(h.w, comp(wk[3], c), a);
                    acc[r][c] = a;
                }
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const float4 wk = ld4(w + k * SAC_HIDDEN + n0);
#pragma unroll
            for (int r = 0; r < SAC_RPT; ++r) {
                const unsigned i = min(rg + SAC_RG * r, nrows - 1);
                const float h = in[i * IN_STRIDE + k];
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    acc[r][c] = fmaf(h, comp(wk, c), acc[r][c]);
                }
            }
        }
    }
}

// The first layer: out[i, n] = swish(in[i, :K] W1 + b1) for the chunk's rows.
template <int K>
__device__ __forceinline__ void layer1(const float* in, const float* p, int off_w, int off_b,
                                       float* out, unsigned nrows) {
    float acc[SAC_RPT][4];
    dense_acc<K, 4>(in, p + off_w, p + off_b, nrows, acc);
    const unsigned n0 = (threadIdx.x % SAC_CG) * 4, rg = threadIdx.x / SAC_CG;
#pragma unroll
    for (int r = 0; r < SAC_RPT; ++r) {
        const unsigned i = rg + SAC_RG * r;
        if (i < nrows) {
            st4(out + i * SAC_RS + n0, make_float4(swish(acc[r][0]), swish(acc[r][1]),
                                                   swish(acc[r][2]), swish(acc[r][3])));
        }
    }
}

// What the second layer's epilogue keeps besides the heads.
enum L2Mode {
    L2_HEADS,   // the heads only
    L2_Z,       // z2 into `keep` (the actor's backward)
    L2_DQDA,    // wq swish'(z2) into `keep`: the start of d Q / d input
    L2_LOSS,    // the critic loss: dq = (q - y) / B, wq dq swish'(z2) into `keep`,
                // swish(z2) into `keep2`, dq into heads[1], 0.5 (q - y)^2 into heads[2]
};

// The second layer and its one-unit heads: z2 = h1 W2 + b2, and head j of row i,
// sum_n swish(z2[i, n]) p[off_hw[j] + n] + p[off_hb[j]], into heads[j][i]; the epilogue
// keeps what MODE says.
template <int NH, L2Mode MODE>
__device__ __forceinline__ void layer2(const float* h1, const float* p, int off_w, int off_b,
                                       const int (&off_hw)[NH], const int (&off_hb)[NH],
                                       float* const (&heads)[3], float* keep, float* keep2,
                                       const float* y, unsigned row0, float inv_b,
                                       unsigned nrows) {
    float acc[SAC_RPT][4];
    dense_acc<SAC_HIDDEN, SAC_RS>(h1, p + off_w, p + off_b, nrows, acc);
    const unsigned n0 = (threadIdx.x % SAC_CG) * 4, rg = threadIdx.x / SAC_CG;
    const bool leader = threadIdx.x % SAC_CG == 0;
#pragma unroll
    for (int r = 0; r < SAC_RPT; ++r) {
        const unsigned i = rg + SAC_RG * r;
        // One sigmoid an element, for swish and, in the backward modes, its derivative.
        float sg[4], h[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            sg[c] = sigmoid(acc[r][c]);
            h[c] = acc[r][c] * sg[c];
        }
        float out[NH];
#pragma unroll
        for (int j = 0; j < NH; ++j) {
            float s = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                s = fmaf(h[c], p[off_hw[j] + n0 + c], s);
            }
            out[j] = group_sum(s) + p[off_hb[j]];
        }
        if (i >= nrows) {
            continue;
        }
        if (leader) {
#pragma unroll
            for (int j = 0; j < NH; ++j) {
                heads[j][i] = out[j];
            }
        }
        if constexpr (MODE == L2_Z) {
            st4(keep + i * SAC_RS + n0, make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        } else if constexpr (MODE == L2_DQDA) {
            float g[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                g[c] = p[off_hw[0] + n0 + c] * swish_grad_of(acc[r][c], sg[c]);
            }
            st4(keep + i * SAC_RS + n0, make_float4(g[0], g[1], g[2], g[3]));
        } else if constexpr (MODE == L2_LOSS) {
            const float d = out[0] - y[row0 + i];
            const float dq = d * inv_b;
            float g[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                g[c] = p[off_hw[0] + n0 + c] * dq * swish_grad_of(acc[r][c], sg[c]);
            }
            st4(keep + i * SAC_RS + n0, make_float4(g[0], g[1], g[2], g[3]));
            st4(keep2 + i * SAC_RS + n0, make_float4(h[0], h[1], h[2], h[3]));
            if (leader) {
                heads[1][i] = dq;
                heads[2][i] = 0.5f * d * d;
            }
        }
    }
}

// The backward through the second layer to the first's pre-activation:
// g1[i, k] = (sum_n g2[i, n] W2[k, n]) swish'(z1[i, k]) (the sum over n in the order
// 4 (k / 4), 4 (k / 4) + 1, ..., wrapping at SAC_HIDDEN), z1 recomputed from the inputs
// `x` (stride 4, K of them) as the forward computed it (bias, then fmaf over x). With
// DQDA it returns d out / d x[K - 1] (the action, a critic's last input:
// sum_k g1[i, k] W1[K - 1, k]) into dqda[i]; otherwise it stores g1 into `out`.
template <int K, bool DQDA>
__device__ __forceinline__ void backward1(const float* g2, const float* x, const float* p,
                                          int off_w1, int off_b1, int off_w2, float* out,
                                          float* dqda, unsigned nrows) {
    const unsigned k0 = (threadIdx.x % SAC_CG) * 4, rg = threadIdx.x / SAC_CG;
    float acc[SAC_RPT][4] = {};
    // Thread cg walks the columns from 4 cg on, wrapping: W2's rows are 64 floats apart,
    // a whole number of bank rows, so threads reading rows k0 at one column would all hit
    // the same banks; skewed, each phase of a float4 load touches 8 distinct ones (the
    // same for g2's row, which the 16 threads of a row group now read at 16 columns).
#pragma unroll 4
    for (int step = 0; step < SAC_HIDDEN; step += 4) {
        const int n = (step + (int)k0) & (SAC_HIDDEN - 1);
        float4 w[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            w[c] = ld4(p + off_w2 + (k0 + c) * SAC_HIDDEN + n);
        }
#pragma unroll
        for (int r = 0; r < SAC_RPT; ++r) {
            const unsigned i = min(rg + SAC_RG * r, nrows - 1);
            const float4 g = ld4(g2 + i * SAC_RS + n);
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                float a = acc[r][c];
                a = fmaf(g.x, w[c].x, a);
                a = fmaf(g.y, w[c].y, a);
                a = fmaf(g.z, w[c].z, a);
                a = fmaf(g.w, w[c].w, a);
                acc[r][c] = a;
            }
        }
    }
    const float4 bias = ld4(p + off_b1 + k0);
#pragma unroll
    for (int r = 0; r < SAC_RPT; ++r) {
        const unsigned i = rg + SAC_RG * r;
        const float4 xi = ld4(x + min(i, nrows - 1) * 4);
        float g1[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float z = comp(bias, c);
#pragma unroll
            for (int j = 0; j < K; ++j) {
                z = fmaf(comp(xi, j), p[off_w1 + j * SAC_HIDDEN + k0 + c], z);
            }
            g1[c] = acc[r][c] * swish_grad(z);
        }
        if constexpr (DQDA) {
            float s = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                s = fmaf(g1[c], p[off_w1 + (K - 1) * SAC_HIDDEN + k0 + c], s);
            }
            s = group_sum(s);
            if (i < nrows && k0 == 0) {
                dqda[i] = s;
            }
        } else if (i < nrows) {
            st4(out + i * SAC_RS + k0, make_float4(g1[0], g1[1], g1[2], g1[3]));
        }
    }
}

// W2's gradient: this thread's 4 x 4 tile (rows k0 .. k0 + 3, columns n0 .. n0 + 3) plus
// sum_i h1[i, k] g2[i, n] over the chunk's rows.
__device__ __forceinline__ void w2_grad(const float* h1, const float* g2, unsigned nrows,
                                        float (&tile)[4][4]) {
    const unsigned k0 = (threadIdx.x / SAC_CG) * 4, n0 = (threadIdx.x % SAC_CG) * 4;
#pragma unroll 2
    for (unsigned i = 0; i < nrows; ++i) {
        const float4 h = ld4(h1 + i * SAC_RS + k0);
        const float4 g = ld4(g2 + i * SAC_RS + n0);
#pragma unroll
        for (int a = 0; a < 4; ++a) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                tile[a][c] = fmaf(comp(h, a), comp(g, c), tile[a][c]);
            }
        }
    }
}

// The tile into the gradient's W2 (at `g + off_w2`).
__device__ __forceinline__ void w2_store(float* g, int off_w2, const float (&tile)[4][4]) {
    const unsigned k0 = (threadIdx.x / SAC_CG) * 4, n0 = (threadIdx.x % SAC_CG) * 4;
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        st4(g + off_w2 + (k0 + a) * SAC_HIDDEN + n0,
            make_float4(tile[a][0], tile[a][1], tile[a][2], tile[a][3]));
    }
}

// The first layer's gradient, summed over the chunk's rows into this thread's `acc`:
// entry e = t + 256 j (j = 0, 1) of W1 then b1 (W1[e / 64, e % 64]: x[i, c] g1[i, k];
// b1[e - 64 K]: g1[i, k]), which is parameter W1 + e of the network.
template <int K>
__device__ __forceinline__ void w1_grad(const float* g1, const float* x, unsigned nrows,
                                        float (&acc)[2]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const unsigned e = threadIdx.x + j * SAC_UPDATE_THREADS;
        const unsigned k = e % SAC_HIDDEN;
        if (e < K * SAC_HIDDEN) {
            const unsigned c = e / SAC_HIDDEN;
#pragma unroll 8
            for (unsigned i = 0; i < nrows; ++i) {
                acc[j] = fmaf(x[i * 4 + c], g1[i * SAC_RS + k], acc[j]);
            }
        } else if (e < (K + 1) * SAC_HIDDEN) {
#pragma unroll 8
            for (unsigned i = 0; i < nrows; ++i) {
                acc[j] += g1[i * SAC_RS + k];
            }
        }
    }
}

// The owners' sums into the gradient (`g`, a network's layout): W1 and b1.
template <int K>
__device__ __forceinline__ void w1_store(float* g, int off_w1, const float (&acc)[2]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const unsigned e = threadIdx.x + j * SAC_UPDATE_THREADS;
        if (e < (K + 1) * SAC_HIDDEN) {
            g[off_w1 + e] = acc[j];
        }
    }
}

// b2's gradient: thread 192 + n owns b2[n] (the sum of g2[i, n]).
__device__ __forceinline__ void b2_grad(const float* g2, unsigned nrows, float& acc) {
    const unsigned t = threadIdx.x;
    if (t >= 192 && t < 192 + SAC_HIDDEN) {
#pragma unroll 8
        for (unsigned i = 0; i < nrows; ++i) {
            acc += g2[i * SAC_RS + (t - 192)];
        }
    }
}

// Parameter p of an agent's networks (one after another, `per` floats each) in shared
// memory, where each network is padded to SAC_PAD floats.
__device__ __forceinline__ unsigned padded(unsigned p, unsigned per) {
    return (p / per) * SAC_PAD + p % per;
}

// Global to shared: dst[padded(p)] = src[p] for p < n, as asynchronous copies
// (cp.async on compute capability 8.0 and newer) that are all in flight at once: one trip
// to memory instead of one per parameter a thread copies. They land by the next
// copies_landed(); the block reads dst only after that and a barrier.
__device__ __forceinline__ void load_padded(float* dst, const float* __restrict__ src,
                                            unsigned n, unsigned per) {
    for (unsigned p = threadIdx.x; p < n; p += SAC_UPDATE_THREADS) {
        __pipeline_memcpy_async(dst + padded(p, per), src + p, sizeof(float));
    }
    __pipeline_commit();
}

// This thread's copies of load_padded have landed.
__device__ __forceinline__ void copies_landed() { __pipeline_wait_prior(0); }

// Shared to global: dst[p] = src[padded(p)] for p in [lo, hi).
__device__ __forceinline__ void store_padded(float* __restrict__ dst, const float* src, unsigned lo,
                                             unsigned hi, unsigned per) {
    for (unsigned p = lo + threadIdx.x; p < hi; p += SAC_UPDATE_THREADS) {
        dst[p] = src[padded(p, per)];
    }
}

// Parameters a thread takes at once in the reduction: the gradients of all blocks and the
// moments of SLOTS parameters are loaded before any is used.
#define REDUCE_SLOTS 5

// The Adam hyperparameters of a step.
struct AdamStep {
    float lr, b1, c1, b2, c2, eps, clip, bc1, bc2;
};

// This block's share of a network's step: for the parameters p in [lo, hi) (padded in
// shared memory as padded(p, per)), the gradient is the sum of every block's G (rank 0
// first), clipped to [-clip, clip], then optax's Adam (moments m[p], v[p] in global
// memory, bias corrections bc1, bc2 of this step), and the new parameter is written into
// every block's P. Run between two cluster_sync()s: every block's G is complete before,
// and no block reads P until after.
__device__ void reduce_adam(float* P, float* G, float* __restrict__ m, float* __restrict__ v,
                            unsigned lo, unsigned hi, unsigned per, const AdamStep& a) {
    for (unsigned first = lo; first < hi; first += REDUCE_SLOTS * SAC_UPDATE_THREADS) {
        float g[REDUCE_SLOTS], ms[REDUCE_SLOTS], vs[REDUCE_SLOTS];
#pragma unroll
        for (int s = 0; s < REDUCE_SLOTS; ++s) {
            const unsigned p = first + threadIdx.x + s * SAC_UPDATE_THREADS;
            g[s] = 0.0f;
            ms[s] = p < hi ? m[p] : 0.0f;
            vs[s] = p < hi ? v[p] : 0.0f;
            if (p < hi) {
                const unsigned q = padded(p, per);
                for (unsigned r = 0; r < kClusterBlocks; ++r) {
                    g[s] += peer(G, r)[q];
                }
            }
        }
#pragma unroll
        for (int s = 0; s < REDUCE_SLOTS; ++s) {
            const unsigned p = first + threadIdx.x + s * SAC_UPDATE_THREADS;
            if (p >= hi) {
                continue;
            }
            const unsigned q = padded(p, per);
            const float gc = fminf(fmaxf(g[s], -a.clip), a.clip);
            const float mp = __fadd_rn(__fmul_rn(a.c1, gc), __fmul_rn(a.b1, ms[s]));
            const float vp = __fadd_rn(__fmul_rn(a.c2, __fmul_rn(gc, gc)), __fmul_rn(a.b2, vs[s]));
            m[p] = mp;
            v[p] = vp;
            const float mhat = __fdiv_rn(mp, a.bc1);
            const float vhat = __fdiv_rn(vp, a.bc2);
            const float u = __fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), a.eps));
            const float next = __fadd_rn(P[q], -__fmul_rn(a.lr, u));
            for (unsigned r = 0; r < kClusterBlocks; ++r) {
                peer(P, r)[q] = next;
            }
        }
    }
}

// This block's share [lo, hi) of n parameters: the rank-th of kClusterBlocks near-equal
// parts.
__device__ __forceinline__ void share(unsigned n, unsigned rank, unsigned& lo, unsigned& hi) {
    const unsigned part = (n + kClusterBlocks - 1) / kClusterBlocks;
    lo = min(n, rank * part);
    hi = min(n, lo + part);
}

// The sum of x[0 .. n) by warp 0 (lane l adds l, l + 32, ..., then the warp's shuffles);
// valid in warp 0.
__device__ __forceinline__ float warp0_sum(const float* x, unsigned n) {
    float s = 0.0f;
    for (unsigned i = threadIdx.x % 32; i < n; i += 32) {
        s += x[i];
    }
    return warp_sum(s);
}

// B distinct slots uniform in [0, size) (B <= size), rejax's sampling without
// replacement, by Floyd's algorithm as dqn_update computes it (reference::sample_slots
// states it): t_j uniform in [0, base + j] (base = size - B, word j of `key`); slot j is
// t_j unless t_j was chosen before, then base + j. Whether an earlier draw equals t_j
// comes from a hash table of the draws holding the first index of each value (atomicMin:
// the same table whatever the order), instead of comparing with every earlier draw.
__device__ void sample_slots_hashed(unsigned long long key, unsigned size, unsigned B,
                                    unsigned* T, unsigned* dup, unsigned* slot, unsigned* HK,
                                    unsigned* HI) {
    const unsigned base = size - B;
    const unsigned empty = 0xffffffffu;
    for (unsigned j = threadIdx.x; j < B; j += SAC_UPDATE_THREADS) {
        T[j] = below(key_bits(key, j), base + j + 1);
    }
    for (unsigned h = threadIdx.x; h < SAC_HT; h += SAC_UPDATE_THREADS) {
        HK[h] = empty;
        HI[h] = empty;
    }
    __syncthreads();
    // A draw is below size <= 2^32 - 1, so never `empty`.
    for (unsigned j = threadIdx.x; j < B; j += SAC_UPDATE_THREADS) {
        const unsigned t = T[j];
        unsigned h = (t * 2654435761u) >> 23;
        while (true) {
            const unsigned prev = atomicCAS(&HK[h], empty, t);
            if (prev == empty || prev == t) {
                atomicMin(&HI[h], j);
                break;
            }
            h = (h + 1) & (SAC_HT - 1);
        }
    }
    __syncthreads();
    for (unsigned j = threadIdx.x; j < B; j += SAC_UPDATE_THREADS) {
        const unsigned t = T[j];
        unsigned h = (t * 2654435761u) >> 23;
        while (HK[h] != t) {
            h = (h + 1) & (SAC_HT - 1);
        }
        dup[j] = HI[h] < j;
    }
    __syncthreads();
    for (unsigned j = threadIdx.x; j < B; j += SAC_UPDATE_THREADS) {
        unsigned c = j;
        bool chosen = false;
        while (true) {
            if (dup[c]) {
                chosen = true;
                break;
            }
            const unsigned t = T[c];
            if (t < base || t - base >= c) {
                break;
            }
            c = t - base;
        }
        slot[j] = chosen ? base + j : T[j];
    }
    __syncthreads();
}
static_assert(SAC_HT == 512, "the hash keeps the top 9 bits");

// The shared memory's regions.
struct SacSmem {
    float *PA, *PC, *PG, *BUF[4], *XA, *XN, *XP, *Y, *DN, *LP, *LA, *LC, *CS, *RED;
    unsigned *SLOT, *T, *DUP, *HK, *HI;

    __device__ explicit SacSmem(float* base) {
        float* f = base;
        PA = f; f += SAC_PAD;
        PC = f; f += NUM_CRITICS * SAC_PAD;
        PG = f; f += NUM_CRITICS * SAC_PAD;
        for (int b = 0; b < 4; ++b) {
            BUF[b] = f;
            f += CHUNK * SAC_RS;
        }
        XA = f; f += 4 * SAC_MAX_BATCH;
        XN = f; f += 4 * SAC_MAX_BATCH;
        XP = f; f += 4 * CHUNK;
        Y = f; f += SAC_MAX_BATCH;
        DN = f; f += SAC_MAX_BATCH;
        LP = f; f += SAC_MAX_BATCH;
        LA = f; f += SAC_MAX_BATCH;
        LC = f; f += SAC_MAX_BATCH;
        unsigned* u = reinterpret_cast<unsigned*>(f);
        SLOT = u; u += SAC_MAX_BATCH;
        T = u; u += SAC_MAX_BATCH;
        DUP = u; u += SAC_MAX_BATCH;
        HK = u; u += SAC_HT;
        HI = u; u += SAC_HT;
        f = reinterpret_cast<float*>(u);
        CS = f; f += CS_ROWS * CHUNK;
        RED = f;
    }
    __device__ float* cs(int row) const { return CS + row * CHUNK; }
};

// The actor on a chunk's observations x (stride 4): mean and raw log-std into CS, h1 into
// BUF[0], and with L2_Z z2 into BUF[1].
template <L2Mode MODE>
__device__ __forceinline__ void actor_forward(const SacSmem& s, const float* x, unsigned nrows) {
    layer1<SAC_OBS>(x, s.PA, ACTOR_W1, ACTOR_B1, s.BUF[0], nrows);
    __syncthreads();
    const int hw[2] = {ACTOR_WMU, ACTOR_WLS};
    const int hb[2] = {ACTOR_BMU, ACTOR_BLS};
    float* const heads[3] = {s.cs(CS_MU), s.cs(CS_LS), nullptr};
    layer2<2, MODE>(s.BUF[0], s.PA, ACTOR_W2, ACTOR_B2, hw, hb, heads, s.BUF[1], nullptr, nullptr,
                    0, 0.0f, nrows);
    __syncthreads();
}

// Critic `p` (shared) on inputs x (stride 4): Q into q[i]; with DQDA also dQ/da into dqda[i]
// (BUF[2], BUF[3] as scratch).
template <bool DQDA>
__device__ __forceinline__ void critic_forward(const SacSmem& s, const float* p, const float* x,
                                               float* q, float* dqda, unsigned nrows) {
    layer1<SAC_IN>(x, p, CRITIC_W1, CRITIC_B1, s.BUF[2], nrows);
    __syncthreads();
    const int hw[1] = {CRITIC_WQ};
    const int hb[1] = {CRITIC_BQ};
    float* const heads[3] = {q, nullptr, nullptr};
    layer2<1, DQDA ? L2_DQDA : L2_HEADS>(s.BUF[2], p, CRITIC_W2, CRITIC_B2, hw, hb, heads,
                                          s.BUF[3], nullptr, nullptr, 0, 0.0f, nrows);
    __syncthreads();
    if constexpr (DQDA) {
        backward1<SAC_IN, true>(s.BUF[3], x, p, CRITIC_W1, CRITIC_B1, CRITIC_W2, nullptr, dqda,
                                 nrows);
        __syncthreads();
    }
}

// The owners' sums of the actor's heads over a chunk (swish(z2) in BUF[2], d loss / d
// mean and / d raw log-std in CS): thread n < 64 the mean's kernel, 64 + n the log-std's,
// 128 and 129 their biases.
__device__ __forceinline__ void actor_head_grad(const SacSmem& s, unsigned nrows, float& acc) {
    const unsigned t = threadIdx.x;
    const float* gmu = s.cs(CS_GMU);
    const float* gls = s.cs(CS_GLS);
    if (t < 2 * SAC_HIDDEN) {
        const float* g = t < SAC_HIDDEN ? gmu : gls;
        const unsigned n = t % SAC_HIDDEN;
#pragma unroll 4
        for (unsigned i = 0; i < nrows; ++i) {
            acc = fmaf(s.BUF[2][i * SAC_RS + n], g[i], acc);
        }
    } else if (t < 2 * SAC_HIDDEN + 2) {
        const float* g = t == 2 * SAC_HIDDEN ? gmu : gls;
        for (unsigned i = 0; i < nrows; ++i) {
            acc += g[i];
        }
    }
}

// Phase 1 on the rows [row0, row0 + nrows) of the batch: the actor's loss and its
// gradient's sums into the owners' registers.
__device__ void actor_chunk(const SacSmem& s, unsigned row0, unsigned nrows, float alpha,
                            float inv_b, unsigned long long noise_key, float (&tile)[4][4],
                            float& head, float& b2, float (&w1)[2]) {
    const float* x = s.XA + row0 * 4;
    actor_forward<L2_Z>(s, x, nrows);
    for (unsigned i = threadIdx.x; i < nrows; i += SAC_UPDATE_THREADS) {
        const float eps = normal_draw(noise_key, row0 + i);
        const Squashed q = squash(s.cs(CS_MU)[i], s.cs(CS_LS)[i], eps);
        st4(s.XP + i * 4, make_float4(x[i * 4], x[i * 4 + 1], x[i * 4 + 2], q.action));
        s.LP[row0 + i] = q.logp;
        s.cs(CS_T)[i] = q.t;
        s.cs(CS_SE)[i] = q.sigma * eps;
        s.cs(CS_CLIP)[i] = q.clip;
    }
    __syncthreads();
    critic_forward<true>(s, s.PC, s.XP, s.cs(CS_Q0), s.cs(CS_DQ0), nrows);
    critic_forward<true>(s, s.PC + SAC_PAD, s.XP, s.cs(CS_Q1), s.cs(CS_DQ1), nrows);
    // d loss_i / d u = (alpha 2 t - dmin/da ACTION_SCALE (1 - t^2)) / B; the mean gets it
    // directly, the raw log-std through u = mu + sigma eps and logp's -ls:
    // (d/du sigma eps - alpha / B) clip. jnp.min's gradient splits a tie evenly.
    for (unsigned i = threadIdx.x; i < nrows; i += SAC_UPDATE_THREADS) {
        const float q0 = s.cs(CS_Q0)[i], q1 = s.cs(CS_Q1)[i];
        const float dq0 = s.cs(CS_DQ0)[i], dq1 = s.cs(CS_DQ1)[i];
        const float qmin = fminf(q0, q1);
        const float dmin = q0 < q1 ? dq0 : q1 < q0 ? dq1 : 0.5f * (dq0 + dq1);
        const float t = s.cs(CS_T)[i];
        const float gu = (alpha * 2.0f * t - dmin * ACTION_SCALE * (1.0f - t * t)) * inv_b;
        s.cs(CS_GMU)[i] = gu;
        s.cs(CS_GLS)[i] = (gu * s.cs(CS_SE)[i] - alpha * inv_b) * s.cs(CS_CLIP)[i];
        s.LA[row0 + i] = alpha * s.LP[row0 + i] - qmin;
    }
    __syncthreads();
    // d loss / d z2 in place of z2, and swish(z2) into BUF[2] (the critics' scratch, free
    // again) for the heads' gradient: one sigmoid an element, by every thread.
    for (unsigned e = threadIdx.x; e < nrows * SAC_HIDDEN; e += SAC_UPDATE_THREADS) {
        const unsigned i = e / SAC_HIDDEN, n = e % SAC_HIDDEN;
        float* z = s.BUF[1] + i * SAC_RS + n;
        const float zv = *z, sg = sigmoid(zv);
        s.BUF[2][i * SAC_RS + n] = zv * sg;
        const float gh = fmaf(s.PA[ACTOR_WMU + n], s.cs(CS_GMU)[i],
                              s.PA[ACTOR_WLS + n] * s.cs(CS_GLS)[i]);
        *z = gh * swish_grad_of(zv, sg);
    }
    __syncthreads();
    actor_head_grad(s, nrows, head);
    w2_grad(s.BUF[0], s.BUF[1], nrows, tile);
    b2_grad(s.BUF[1], nrows, b2);
    __syncthreads();
    backward1<SAC_OBS, false>(s.BUF[1], x, s.PA, ACTOR_W1, ACTOR_B1, ACTOR_W2, s.BUF[0], nullptr,
                              nrows);
    __syncthreads();
    w1_grad<SAC_OBS>(s.BUF[0], x, nrows, w1);
    __syncthreads();
}

// Phase 2's targets on the rows [row0, row0 + nrows): a' ~ pi_new(s') into XN's fourth
// column, then y = r + gamma (1 - done) (min_k Qtarget_k(s', a') - alpha logp') into Y
// (which held the rewards). The target critics are in PG.
__device__ void target_chunk(const SacSmem& s, unsigned row0, unsigned nrows, float alpha,
                             float gamma, unsigned long long noise_key) {
    float* xn = s.XN + row0 * 4;
    actor_forward<L2_HEADS>(s, xn, nrows);
    for (unsigned i = threadIdx.x; i < nrows; i += SAC_UPDATE_THREADS) {
        const Squashed q =
            squash(s.cs(CS_MU)[i], s.cs(CS_LS)[i], normal_draw(noise_key, row0 + i));
        xn[i * 4 + 3] = q.action;
        s.cs(CS_LOGP)[i] = q.logp;
    }
    __syncthreads();
    critic_forward<false>(s, s.PG, xn, s.cs(CS_Q0), nullptr, nrows);
    critic_forward<false>(s, s.PG + SAC_PAD, xn, s.cs(CS_Q1), nullptr, nrows);
    for (unsigned i = threadIdx.x; i < nrows; i += SAC_UPDATE_THREADS) {
        const float next = fminf(s.cs(CS_Q0)[i], s.cs(CS_Q1)[i]) - alpha * s.cs(CS_LOGP)[i];
        const unsigned j = row0 + i;
        s.Y[j] = s.Y[j] + (gamma * (1.0f - s.DN[j])) * next;
    }
    __syncthreads();
}

// Phase 2's loss for critic `p` on the rows [row0, row0 + nrows): its gradient's sums
// into the owners' registers (thread n < 64: wq[n], 64: bq), 0.5 d^2 added to LC. In the
// second layer's epilogue CS_DQ0 holds d loss / d q and CS_DQ1 the loss terms.
__device__ void critic_chunk(const SacSmem& s, const float* p, unsigned row0, unsigned nrows,
                             float inv_b, float (&tile)[4][4], float& head, float& b2,
                             float (&w1)[2]) {
    const float* x = s.XA + row0 * 4;
    layer1<SAC_IN>(x, p, CRITIC_W1, CRITIC_B1, s.BUF[0], nrows);
    __syncthreads();
    const int hw[1] = {CRITIC_WQ};
    const int hb[1] = {CRITIC_BQ};
    float* const heads[3] = {s.cs(CS_Q0), s.cs(CS_DQ0), s.cs(CS_DQ1)};
    layer2<1, L2_LOSS>(s.BUF[0], p, CRITIC_W2, CRITIC_B2, hw, hb, heads, s.BUF[1], s.BUF[2], s.Y,
                       row0, inv_b, nrows);
    __syncthreads();
    w2_grad(s.BUF[0], s.BUF[1], nrows, tile);
    b2_grad(s.BUF[1], nrows, b2);
    const unsigned t = threadIdx.x;
    if (t < SAC_HIDDEN) {
#pragma unroll 8
        for (unsigned i = 0; i < nrows; ++i) {
            head = fmaf(s.BUF[2][i * SAC_RS + t], s.cs(CS_DQ0)[i], head);
        }
    } else if (t == SAC_HIDDEN) {
        for (unsigned i = 0; i < nrows; ++i) {
            head += s.cs(CS_DQ0)[i];
        }
    }
    for (unsigned i = t; i < nrows; i += SAC_UPDATE_THREADS) {
        s.LC[row0 + i] += s.cs(CS_DQ1)[i];
    }
    __syncthreads();
    backward1<SAC_IN, false>(s.BUF[1], x, p, CRITIC_W1, CRITIC_B1, CRITIC_W2, s.BUF[2], nullptr,
                             nrows);
    __syncthreads();
    w1_grad<SAC_IN>(s.BUF[2], x, nrows, w1);
    __syncthreads();
}

// Dynamic shared memory of a launch.
__device__ __forceinline__ size_t sac_update_smem_bytes() {
    return sizeof(float) * (size_t)SAC_UPDATE_SMEM_FLOATS;
}

// The owners' sums of phase 1 into PG, the actor's layout.
__device__ __forceinline__ void actor_grad_store(const SacSmem& s, const float (&tile)[4][4],
                                                 float head, float b2, const float (&w1)[2]) {
    const unsigned tid = threadIdx.x;
    w2_store(s.PG, ACTOR_W2, tile);
    if (tid < SAC_HIDDEN) {
        s.PG[ACTOR_WMU + tid] = head;
    } else if (tid < 2 * SAC_HIDDEN) {
        s.PG[ACTOR_WLS + tid - SAC_HIDDEN] = head;
    } else if (tid == 2 * SAC_HIDDEN) {
        s.PG[ACTOR_BMU] = head;
    } else if (tid == 2 * SAC_HIDDEN + 1) {
        s.PG[ACTOR_BLS] = head;
    }
    if (tid >= 192 && tid < 192 + SAC_HIDDEN) {
        s.PG[ACTOR_B2 + tid - 192] = b2;
    }
    w1_store<SAC_OBS>(s.PG, ACTOR_W1, w1);
}

// The owners' sums of phase 2 for critic k into PG + k SAC_PAD, a critic's layout.
__device__ __forceinline__ void critic_grad_store(float* g, const float (&tile)[4][4], float head,
                                                  float b2, const float (&w1)[2]) {
    const unsigned tid = threadIdx.x;
    w2_store(g, CRITIC_W2, tile);
    if (tid <= SAC_HIDDEN) {
        g[CRITIC_WQ + tid] = head;  // WQ, then BQ
    }
    if (tid >= 192 && tid < 192 + SAC_HIDDEN) {
        g[CRITIC_B2 + tid - 192] = b2;
    }
    w1_store<SAC_IN>(g, CRITIC_W1, w1);
}

// `epochs` SAC updates of each agent (cluster a, or block a without clusters, = agent a),
// each on B slots drawn from the agent's ring, if counters[COUNTER_STEP] > fill_buffer
// (rejax trains in an iteration whose global_step after the environments' step is past
// fill_buffer) and the ring holds at least B transitions; then, in every launch, the
// Polyak step of the target critics, target = keep target + mix critic, each product and
// the sum rounded once. Update u of agent a (u = adam_t[a] before it) draws its batch
// from agent_key(seed, a, PURPOSE_SAC_SAMPLE, u), its noise from PURPOSE_SAC_ACTOR and
// PURPOSE_SAC_TARGET at u (row j: words 2 j, 2 j + 1), and takes Adam step u + 1 of the
// actor, the critics and log_alpha, each with its own moments; adam_t[a] moves on by
// epochs. losses[3 a ..] gets the last update's actor, critic and temperature losses. Adam
// as dqn_update's (the gradient clipped to [-clip, clip]).
//
// Launch: A SAC_CLUSTER blocks (compute capability 9.0, clusters of SAC_CLUSTER) or A
// blocks (older GPUs) of SAC_UPDATE_THREADS threads with sac_update_smem_bytes() of
// dynamic shared memory (the Rust wrapper's config, which reads the architecture off the
// loaded image). A cluster launched otherwise writes NaN to its losses and returns, and
// clusters past A return, so no grid leaves the buffers.
// stepgraph(unsafe): actor[A * ACTOR_PARAMS], critics[A * NUM_CRITICS * CRITIC_PARAMS],
// stepgraph(unsafe): targets[A * NUM_CRITICS * CRITIC_PARAMS], log_alpha[A],
// stepgraph(unsafe): actor_m[A * ACTOR_PARAMS], actor_v[A * ACTOR_PARAMS],
// stepgraph(unsafe): critic_m[A * NUM_CRITICS * CRITIC_PARAMS],
// stepgraph(unsafe): critic_v[A * NUM_CRITICS * CRITIC_PARAMS], alpha_m[A], alpha_v[A],
// stepgraph(unsafe): adam_t[A], counters[COUNTERS], rms[A * RMS_FLOATS],
// stepgraph(unsafe): r_obs[A * C * SAC_OBS], r_action[A * C], r_reward[A * C],
// stepgraph(unsafe): r_next_obs[A * C * SAC_OBS], r_done[A * C], losses[A * 3],
// stepgraph(unsafe): A > 0, C > 0, B > 0, B <= SAC_MAX_BATCH, B <= C
extern "C" __global__ void __launch_bounds__(SAC_UPDATE_THREADS, 1) SAC_CLUSTER_DIMS
    sac_update(float* __restrict__ actor, float* __restrict__ critics,
               float* __restrict__ targets, float* __restrict__ log_alpha,
               float* __restrict__ actor_m, float* __restrict__ actor_v,
               float* __restrict__ critic_m, float* __restrict__ critic_v,
               float* __restrict__ alpha_m, float* __restrict__ alpha_v,
               unsigned* __restrict__ adam_t, const unsigned* __restrict__ counters,
               const float* __restrict__ rms, const float* __restrict__ r_obs,
               const float* __restrict__ r_action, const float* __restrict__ r_reward,
               const float* __restrict__ r_next_obs, const unsigned char* __restrict__ r_done,
               float* __restrict__ losses, unsigned A, unsigned C, unsigned B, unsigned epochs,
               unsigned long long seed, unsigned fill_buffer, float gamma, float lr, float b1,
               float c1, float b2, float c2, float adam_eps, float clip, float target_entropy,
               float keep, float mix) {
    // Every block of a cluster takes the same branch of each test before a cluster_sync:
    // they share the agent, the launch and the counters.
    const unsigned agent = blockIdx.x / kClusterBlocks;
    const unsigned rank = cluster_rank();
    if (agent >= A) {
        return;
    }
    unsigned dynamic_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_smem));
    if (blockDim.x != SAC_UPDATE_THREADS || blockDim.y != 1 || blockDim.z != 1 ||
        B > SAC_MAX_BATCH || B == 0 || (size_t)dynamic_smem < sac_update_smem_bytes()) {
        if (rank == 0 && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
            for (int l = 0; l < 3; ++l) {
                losses[agent * 3 + l] = __int_as_float(0x7fc00000);
            }
        }
        return;
    }
    const unsigned tid = threadIdx.x;
    const unsigned np = NUM_CRITICS * CRITIC_PARAMS;
    float* ga = actor + (size_t)agent * ACTOR_PARAMS;
    float* gc = critics + (size_t)agent * np;
    float* gt = targets + (size_t)agent * np;
    const unsigned size = min(counters[COUNTER_SIZE], C);
    const bool train = counters[COUNTER_STEP] > fill_buffer && size >= B && epochs > 0;
    // This block's rows of the batch and its shares of the parameters.
    const unsigned rows = (B + kClusterBlocks - 1) / kClusterBlocks;
    const unsigned row_lo = min(B, rank * rows), row_hi = min(B, row_lo + rows);
    unsigned actor_lo, actor_hi, critic_lo, critic_hi;
    share(ACTOR_PARAMS, rank, actor_lo, actor_hi);
    share(np, rank, critic_lo, critic_hi);

    extern __shared__ float4 smem4[];
    const SacSmem s(reinterpret_cast<float*>(smem4));
    if (train) {
        // The networks arrive while the batch is drawn and gathered.
        load_padded(s.PA, ga, ACTOR_PARAMS, ACTOR_PARAMS);
        load_padded(s.PC, gc, np, CRITIC_PARAMS);
        const float* stats = rms + (size_t)agent * RMS_FLOATS;
        float mean[SAC_OBS], var[SAC_OBS];
        for (int c = 0; c < SAC_OBS; ++c) {
            mean[c] = stats[RMS_MEAN + c];
            var[c] = stats[RMS_VAR + c];
        }
        const unsigned t0 = adam_t[agent];
        const float inv_b = 1.0f / (float)B;
        float la = log_alpha[agent], am = alpha_m[agent], av = alpha_v[agent];
        float loss_actor = 0.0f, loss_critic = 0.0f, loss_alpha = 0.0f;

        for (unsigned epoch = 0; epoch < epochs; ++epoch) {
            const unsigned t = t0 + epoch;
            const float alpha = expf(la);
            sample_slots_hashed(agent_key(seed, agent, PURPOSE_SAC_SAMPLE, t), size, B, s.T,
                                s.DUP, s.SLOT, s.HK, s.HI);
            for (unsigned j = row_lo + tid; j < row_hi; j += SAC_UPDATE_THREADS) {
                const size_t row = (size_t)agent * C + s.SLOT[j];
                for (int c = 0; c < SAC_OBS; ++c) {
                    s.XA[j * 4 + c] = normalize(r_obs[row * SAC_OBS + c], mean[c], var[c]);
                    s.XN[j * 4 + c] = normalize(r_next_obs[row * SAC_OBS + c], mean[c], var[c]);
                }
                s.XA[j * 4 + 3] = r_action[row];
                s.XN[j * 4 + 3] = 0.0f;
                s.Y[j] = r_reward[row];
                s.DN[j] = r_done[row] != 0 ? 1.0f : 0.0f;
                s.LC[j] = 0.0f;
            }
            copies_landed();
            __syncthreads();
            AdamStep step;
            step.lr = lr;
            step.b1 = b1;
            step.c1 = c1;
            step.b2 = b2;
            step.c2 = c2;
            step.eps = adam_eps;
            step.clip = clip;
            step.bc1 = (float)(1.0 - pow((double)b1, (double)(t + 1)));
            step.bc2 = (float)(1.0 - pow((double)b2, (double)(t + 1)));

            // 1. The actor: this block's rows, then the cluster's sum and Adam step.
            {
                float tile[4][4] = {}, head = 0.0f, b2g = 0.0f, w1[2] = {};
                const unsigned long long key = agent_key(seed, agent, PURPOSE_SAC_ACTOR, t);
                for (unsigned row0 = row_lo; row0 < row_hi; row0 += CHUNK) {
                    actor_chunk(s, row0, min((unsigned)CHUNK, row_hi - row0), alpha, inv_b, key,
                                tile, head, b2g, w1);
                }
                actor_grad_store(s, tile, head, b2g, w1);
                if (tid < 32) {
                    const float la_sum = warp0_sum(s.LA + row_lo, row_hi - row_lo);
                    const float lp_sum = warp0_sum(s.LP + row_lo, row_hi - row_lo);
                    if (tid == 0) {
                        s.RED[0] = la_sum;
                        s.RED[1] = lp_sum;
                    }
                }
            }
            cluster_sync();
            reduce_adam(s.PA, s.PG, actor_m + (size_t)agent * ACTOR_PARAMS,
                        actor_v + (size_t)agent * ACTOR_PARAMS, actor_lo, actor_hi, ACTOR_PARAMS,
                        step);
            // Every block sums the partial sums in rank order: the same floats everywhere.
            float sum_la = 0.0f, sum_logp = 0.0f;
            for (unsigned r = 0; r < kClusterBlocks; ++r) {
                sum_la += peer(s.RED, r)[0];
                sum_logp += peer(s.RED, r)[1];
            }
            cluster_sync();

            // 2. The critics: targets with the new actor and the target critics (in PG).
            load_padded(s.PG, gt, np, CRITIC_PARAMS);
            copies_landed();
            __syncthreads();
            {
                const unsigned long long key = agent_key(seed, agent, PURPOSE_SAC_TARGET, t);
                for (unsigned row0 = row_lo; row0 < row_hi; row0 += CHUNK) {
                    target_chunk(s, row0, min((unsigned)CHUNK, row_hi - row0), alpha, gamma, key);
                }
            }
            {
                float tile0[4][4] = {}, tile1[4][4] = {};
                float head0 = 0.0f, b20 = 0.0f, head1 = 0.0f, b21 = 0.0f;
                float w10[2] = {}, w11[2] = {};
                for (unsigned row0 = row_lo; row0 < row_hi; row0 += CHUNK) {
                    const unsigned n = min((unsigned)CHUNK, row_hi - row0);
                    critic_chunk(s, s.PC, row0, n, inv_b, tile0, head0, b20, w10);
                    critic_chunk(s, s.PC + SAC_PAD, row0, n, inv_b, tile1, head1, b21, w11);
                }
                critic_grad_store(s.PG, tile0, head0, b20, w10);
                critic_grad_store(s.PG + SAC_PAD, tile1, head1, b21, w11);
                if (tid < 32) {
                    const float lc_sum = warp0_sum(s.LC + row_lo, row_hi - row_lo);
                    if (tid == 0) {
                        s.RED[2] = lc_sum;
                    }
                }
            }
            cluster_sync();
            reduce_adam(s.PC, s.PG, critic_m + (size_t)agent * np, critic_v + (size_t)agent * np,
                        critic_lo, critic_hi, CRITIC_PARAMS, step);
            float sum_lc = 0.0f;
            for (unsigned r = 0; r < kClusterBlocks; ++r) {
                sum_lc += peer(s.RED, r)[2];
            }
            cluster_sync();

            // 3. The temperature, with the actor phase's logp and the alpha before it;
            // every block computes the same step.
            const float mean_term = (sum_logp + (float)B * target_entropy) * inv_b;
            loss_actor = sum_la * inv_b;
            loss_critic = sum_lc * inv_b;
            loss_alpha = -alpha * mean_term;
            const float g = fminf(fmaxf(-alpha * mean_term, -clip), clip);
            am = __fadd_rn(__fmul_rn(c1, g), __fmul_rn(b1, am));
            av = __fadd_rn(__fmul_rn(c2, __fmul_rn(g, g)), __fmul_rn(b2, av));
            const float u = __fdiv_rn(__fdiv_rn(am, step.bc1),
                                      __fadd_rn(__fsqrt_rn(__fdiv_rn(av, step.bc2)), adam_eps));
            la = __fadd_rn(la, -__fmul_rn(lr, u));
        }

        // Every block holds the same networks: each writes its share.
        store_padded(ga, s.PA, actor_lo, actor_hi, ACTOR_PARAMS);
        store_padded(gc, s.PC, critic_lo, critic_hi, CRITIC_PARAMS);
        if (rank == 0 && tid == 0) {
            adam_t[agent] = t0 + epochs;
            log_alpha[agent] = la;
            alpha_m[agent] = am;
            alpha_v[agent] = av;
            losses[agent * 3 + 0] = loss_actor;
            losses[agent * 3 + 1] = loss_critic;
            losses[agent * 3 + 2] = loss_alpha;
        }
    }

    // Polyak of this block's share, with the critics as this launch leaves them; a pass's
    // loads issued before its stores.
    for (unsigned first = critic_lo; first < critic_hi;
         first += REDUCE_SLOTS * SAC_UPDATE_THREADS) {
        float tg[REDUCE_SLOTS], cr[REDUCE_SLOTS];
#pragma unroll
        for (int k = 0; k < REDUCE_SLOTS; ++k) {
            const unsigned p = first + tid + k * SAC_UPDATE_THREADS;
            tg[k] = p < critic_hi ? gt[p] : 0.0f;
            cr[k] = p >= critic_hi ? 0.0f : train ? s.PC[padded(p, CRITIC_PARAMS)] : gc[p];
        }
#pragma unroll
        for (int k = 0; k < REDUCE_SLOTS; ++k) {
            const unsigned p = first + tid + k * SAC_UPDATE_THREADS;
            if (p < critic_hi) {
                gt[p] = __fadd_rn(__fmul_rn(tg[k], keep), __fmul_rn(cr[k], mix));
            }
        }
    }
}
