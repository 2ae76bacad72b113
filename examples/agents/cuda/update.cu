// rejax's DQN update, `epochs` of them in a row, fused: all of an agent's state in shared
// memory for the whole launch. On compute capability 9.0 an agent is a thread-block
// cluster of DQN_CLUSTER = 4 blocks (cluster.cuh), each on its own SM: every block draws
// the whole batch's slots, puts its quarter of the rows through the networks, and sums
// the gradients over its rows; after a cluster barrier every block adds the four partial
// sums, read from the others' shared memory in rank order, and takes the same Adam step,
// so the blocks' parameters stay equal without another exchange. Elsewhere an agent is
// one block that takes every row (DQN_CLUSTER = 1). A batch of rejax's 100 rows is too
// little work to fill one SM's warps; four SMs each see a quarter of the latency.
//
// Per epoch: draw B distinct ring slots (Floyd's sampling, below), gather them, run the
// online and target networks on the next observations for the double-DQN targets, the
// online network on the observations, the l2 loss, the backward pass through the dueling
// network, an element-wise clip of the gradients and an Adam step of the parameters.
//
// Shared memory (floats; dynamic, sized by B, update_smem_bytes):
//   P0 [PARAMS_PAD]           online parameters, updated in place by Adam
//   P1 [PARAMS_PAD]           the target parameters while the targets are formed, then
//                             the gradients (same layout), which the clip and Adam read
//   X, XN [B, OBS]            the batch's observations and next observations
//   H1 [B, ROW_STRIDE]        first hidden layer's output; in the backward, its gradient
//   Z2 [B, ROW_STRIDE]        second hidden layer (pre-activation for the online pass on
//                             X, so the backward has z2); in the backward, its gradient
//   9 per-row arrays [B]      draws, flags, slots, actions, rewards then targets, done,
//                             argmax actions, dL/dq, loss terms
// Rows of H1 and Z2 are padded to ROW_STRIDE = HIDDEN + 4 floats: float4 loads stay aligned
// and two rows a warp reads at once start in different banks.
//
// Threads: UPDATE_THREADS = 256 per block, one block per SM, so a block has the SM to
// itself and its rows' matrices are split to give every thread work:
// - dense layers: thread (rg, cg) computes 4 adjacent outputs (cg) of rows rg, rg + 16,
//   ... (ROWS_PER_THREAD of them), from float4 loads of 4 weights rows and 4 inputs;
// - the dueling head: a warp per row, lanes over hidden units, shuffles for the sums;
// - weight gradients: a 4 x 4 tile of W2's gradient per thread summed over the batch;
// - Adam: parameter p belongs to thread p % 256, whose ADAM_SLOTS moments stay in
//   registers for the whole launch (read once, written once).
// The sums are plain sequential fmaf chains in a fixed order (within a block over its rows,
// then over the blocks in rank order), so a launch is bit-for-bit reproducible (no
// atomics).

#include "agents.cuh"
#include "cluster.cuh"

#define UPDATE_THREADS 256
#define MAX_BATCH 128
#define ROW_STRIDE 68
#define COL_GROUPS 16
#define ROW_GROUPS 16
// Blocks of an agent where the GPU has clusters (compute capability 9.0).
#define DQN_CLUSTER 4
#if AGENTS_HAVE_CLUSTERS
#define DQN_CLUSTER_DIMS __cluster_dims__(DQN_CLUSTER, 1, 1)
#define DQN_BLOCKS DQN_CLUSTER
#else
#define DQN_CLUSTER_DIMS
#define DQN_BLOCKS 1
#endif
// Rows of a block's share of the largest batch, over the row groups.
#define ROWS_PER_THREAD (MAX_BATCH / (ROW_GROUPS * DQN_BLOCKS))
#define ADAM_SLOTS 19
#define PARAMS_PAD 4676
#define UPDATE_ROW_FLOATS 153
static_assert(COL_GROUPS * 4 == HIDDEN, "a column group is 4 outputs");
static_assert((HIDDEN & (HIDDEN - 1)) == 0, "the backward's skew wraps with a mask");
static_assert(COL_GROUPS * ROW_GROUPS == UPDATE_THREADS, "tile threads");
static_assert(ROWS_PER_THREAD * ROW_GROUPS * DQN_BLOCKS == MAX_BATCH, "rows of a thread");
static_assert(ADAM_SLOTS * UPDATE_THREADS >= PARAMS, "Adam slots cover the parameters");
static_assert(PARAMS_PAD >= PARAMS + 1 && PARAMS_PAD % 4 == 0, "aligned regions, a loss slot");
static_assert(ROW_STRIDE >= HIDDEN && ROW_STRIDE % 4 == 0, "aligned rows");
static_assert(UPDATE_ROW_FLOATS == 2 * OBS + 2 * ROW_STRIDE + 9, "per-row floats");
static_assert(4 * HIDDEN == UPDATE_THREADS, "head gradients: 4 row groups per unit");
static_assert(OBS == 4, "observation rows are one float4");

#define WARPS (UPDATE_THREADS / 32)

__device__ __forceinline__ float4 ld4(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float comp(const float4& v, int c) {
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// out[i, n] = f(b[n] + sum_k in[i, k] w[k, n]) for i < B, n < HIDDEN, f swish or identity.
// The sum starts at the bias and adds k = 0, 1, ... with fmaf.
template <int K, int IN_STRIDE, bool SWISH>
__device__ __forceinline__ void dense(const float* in, const float* w, const float* b, float* out,
                                      unsigned B) {
    if (B == 0) {
        return;  // a block with no rows (uniform over the block)
    }
    const unsigned n0 = (threadIdx.x % COL_GROUPS) * 4;
    const unsigned rg = threadIdx.x / COL_GROUPS;
    const float4 bias = ld4(b + n0);
    float acc[ROWS_PER_THREAD][4];
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        acc[r][0] = bias.x;
        acc[r][1] = bias.y;
        acc[r][2] = bias.z;
        acc[r][3] = bias.w;
    }
#pragma unroll 2
    for (int k = 0; k < K; k += 4) {
        float4 wk[4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            wk[kk] = ld4(w + (k + kk) * HIDDEN + n0);
        }
#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r) {
            // Rows past B compute row B - 1 again and are not stored.
            const unsigned i = min(rg + ROW_GROUPS * r, B - 1);
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
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        const unsigned i = rg + ROW_GROUPS * r;
        if (i < B) {
            float4 o = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
            if (SWISH) {
                o = make_float4(swish(o.x), swish(o.y), swish(o.z), swish(o.w));
            }
            st4(out + i * ROW_STRIDE + n0, o);
        }
    }
}

// The Q values of row i from the second hidden layer's row `h` (its swish taken here when
// PRE, h being pre-activation), by one warp.
template <bool PRE>
__device__ __forceinline__ void head_row(const float* p, const float* h, float* q) {
    const unsigned lane = threadIdx.x % 32;
    float h2[UNITS];
    for (int u = 0; u < UNITS; ++u) {
        const float z = h[lane + 32 * u];
        h2[u] = PRE ? swish(z) : z;
    }
    warp_head(p, h2, q);
}

// The first of the largest Q values (jnp.argmax).
__device__ __forceinline__ int argmax_first(const float* q) {
    int best = 0;
    for (int j = 1; j < ACTIONS; ++j) {
        if (q[j] > q[best]) {
            best = j;
        }
    }
    return best;
}

// dQ_a / dA_j of the dueling head, times g: g (delta_ja - 1 / ACTIONS).
__device__ __forceinline__ float adv_grad(float g, int j, int a) {
    return g * ((j == a ? 1.0f : 0.0f) - 1.0f / (float)ACTIONS);
}

// B distinct slots uniform in [0, size) (B <= size), rejax's sampling without replacement,
// by Floyd's algorithm: for j < B, t_j uniform in [0, base + j] (base = size - B, word j
// of `key`); slot j is t_j unless t_j was already chosen, then base + j. Computed in
// parallel: t_j was chosen before iff it equals an earlier t_k (dup), or it equals
// base + k for an earlier k whose own draw was chosen before; that chain of k's strictly
// decreases, so each thread follows it to its end.
__device__ void sample_slots(unsigned long long key, unsigned size, unsigned B, unsigned* T,
                             unsigned* dup, unsigned* slot) {
    const unsigned base = size - B;
    for (unsigned j = threadIdx.x; j < B; j += UPDATE_THREADS) {
        T[j] = below(key_bits(key, j), base + j + 1);
    }
    __syncthreads();
    for (unsigned j = threadIdx.x; j < B; j += UPDATE_THREADS) {
        unsigned d = 0;
        for (unsigned k = 0; k < j; ++k) {
            d |= T[k] == T[j];
        }
        dup[j] = d;
    }
    __syncthreads();
    for (unsigned j = threadIdx.x; j < B; j += UPDATE_THREADS) {
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

// Dynamic shared memory of a launch with batch B.
__device__ __forceinline__ size_t update_smem_bytes(unsigned B) {
    return sizeof(float) * (2 * (size_t)PARAMS_PAD + (size_t)B * UPDATE_ROW_FLOATS);
}

// `epochs` DQN updates of each agent (cluster a, or block a without clusters, = agent a),
// each on B slots drawn from the
// agent's ring, if counters[COUNTER_STEP_BEFORE] > fill_buffer (rejax trains in an
// iteration whose starting global_step is past fill_buffer) and the ring holds at least B
// transitions; otherwise nothing. Update u of agent a (u = adam_t[a] before it) draws
// from agent_key(seed, a, PURPOSE_SAMPLE, u) and takes Adam step u + 1; adam_t[a] moves on
// by epochs. loss[a] gets the last update's loss (before its step). Adam: m = c1 g + b1 m,
// v = c2 g^2 + b2 v (c1 = 1 - b1 and c2 = 1 - b2 as the caller rounds them), bias-corrected,
// p += -lr mhat / (sqrt(vhat) + eps), g the gradient clipped to [-clip, clip].
// Actions in the ring outside [0, ACTIONS) are read as the nearest valid action.
//
// Launch: A DQN_BLOCKS blocks of UPDATE_THREADS threads (DQN_BLOCKS = DQN_CLUSTER on
// compute capability 9.0, in clusters of DQN_CLUSTER, else 1: the Rust wrapper reads it
// from the loaded image) with update_smem_bytes(B) of dynamic shared memory. A cluster
// launched otherwise writes NaN to its loss and returns, and clusters past A return, so
// no grid leaves the buffers. Every block of a cluster takes the same branch of each test
// before a cluster barrier: the tests read only the launch shape and the counters.
// stepgraph(unsafe): params[A * PARAMS], target[A * PARAMS], adam_m[A * PARAMS],
// stepgraph(unsafe): adam_v[A * PARAMS], adam_t[A], counters[COUNTERS],
// stepgraph(unsafe): r_obs[A * C * OBS], r_action[A * C], r_reward[A * C],
// stepgraph(unsafe): r_next_obs[A * C * OBS], r_done[A * C], loss[A],
// stepgraph(unsafe): A > 0, C > 0, B > 0, B <= MAX_BATCH, B <= C
extern "C" __global__ void __launch_bounds__(UPDATE_THREADS, 1) DQN_CLUSTER_DIMS
    dqn_update(float* __restrict__ params, const float* __restrict__ target,
               float* __restrict__ adam_m, float* __restrict__ adam_v,
               unsigned* __restrict__ adam_t, const unsigned* __restrict__ counters,
               const float* __restrict__ r_obs, const int* __restrict__ r_action,
               const float* __restrict__ r_reward, const float* __restrict__ r_next_obs,
               const unsigned char* __restrict__ r_done, float* __restrict__ loss, unsigned A,
               unsigned C, unsigned B, unsigned epochs, unsigned long long seed,
               unsigned fill_buffer, float gamma, float lr, float b1, float c1, float b2,
               float c2, float adam_eps, float clip) {
    const unsigned agent = blockIdx.x / DQN_BLOCKS;
    const unsigned rank = cluster_rank();
    if (agent >= A) {
        return;
    }
    unsigned dynamic_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_smem));
    if (blockDim.x != UPDATE_THREADS || blockDim.y != 1 || blockDim.z != 1 ||
        B > MAX_BATCH || (size_t)dynamic_smem < update_smem_bytes(B)) {
        if (rank == 0 && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
            loss[agent] = __int_as_float(0x7fc00000);
        }
        return;
    }
    const unsigned size = min(counters[COUNTER_SIZE], C);
    if (counters[COUNTER_STEP_BEFORE] <= fill_buffer || size < B || epochs == 0) {
        return;
    }

    extern __shared__ float4 smem4[];
    float* P0 = reinterpret_cast<float*>(smem4);
    float* P1 = P0 + PARAMS_PAD;
    float* X = P1 + PARAMS_PAD;
    float* XN = X + B * OBS;
    float* H1 = XN + B * OBS;
    float* Z2 = H1 + B * ROW_STRIDE;
    unsigned* T = reinterpret_cast<unsigned*>(Z2 + B * ROW_STRIDE);
    unsigned* DUP = T + B;
    unsigned* SLOT = DUP + B;
    int* ACT = reinterpret_cast<int*>(SLOT + B);
    float* Y = reinterpret_cast<float*>(ACT + B);
    float* DONE = Y + B;
    int* ASTAR = reinterpret_cast<int*>(DONE + B);
    float* GQ = reinterpret_cast<float*>(ASTAR + B);
    float* LROW = GQ + B;

    const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    float* gp = params + (size_t)agent * PARAMS;
    const float* gt = target + (size_t)agent * PARAMS;
    float* gm = adam_m + (size_t)agent * PARAMS;
    float* gv = adam_v + (size_t)agent * PARAMS;
    for (unsigned p = tid; p < PARAMS; p += UPDATE_THREADS) {
        P0[p] = gp[p];
    }
    float m[ADAM_SLOTS], v[ADAM_SLOTS];
#pragma unroll
    for (int s = 0; s < ADAM_SLOTS; ++s) {
        const unsigned p = tid + s * UPDATE_THREADS;
        m[s] = p < PARAMS ? gm[p] : 0.0f;
        v[s] = p < PARAMS ? gv[p] : 0.0f;
    }
    const unsigned t0 = adam_t[agent];
    const float inv_b = 1.0f / (float)B;
    float last_loss = 0.0f;
    // This block's rows of the batch: [r0, r0 + nb), a near-equal share (none for a
    // batch smaller than the cluster).
    const unsigned share = (B + DQN_BLOCKS - 1) / DQN_BLOCKS;
    const unsigned r0 = min(rank * share, B);
    const unsigned nb = min(B, r0 + share) - r0;
    float* const Xr = X + r0 * OBS;
    float* const XNr = XN + r0 * OBS;
    float* const H1r = H1 + r0 * ROW_STRIDE;
    float* const Z2r = Z2 + r0 * ROW_STRIDE;

    for (unsigned epoch = 0; epoch < epochs; ++epoch) {
        const unsigned t = t0 + epoch;
        sample_slots(agent_key(seed, agent, PURPOSE_SAMPLE, t), size, B, T, DUP, SLOT);

        // Gather this block's rows; the target parameters into P1.
        for (unsigned j = r0 + tid; j < r0 + nb; j += UPDATE_THREADS) {
            const size_t row = (size_t)agent * C + SLOT[j];
            st4(X + j * OBS, ld4(r_obs + row * OBS));
            st4(XN + j * OBS, ld4(r_next_obs + row * OBS));
            ACT[j] = min(max(r_action[row], 0), ACTIONS - 1);
            Y[j] = r_reward[row];
            DONE[j] = r_done[row] != 0 ? 1.0f : 0.0f;
        }
        for (unsigned p = tid; p < PARAMS; p += UPDATE_THREADS) {
            P1[p] = gt[p];
        }
        __syncthreads();

        // Double DQN: the online network picks the next action, the target rates it.
        dense<OBS, OBS, true>(XNr, P0 + OFF_W1, P0 + OFF_B1, H1r, nb);
        __syncthreads();
        dense<HIDDEN, ROW_STRIDE, true>(H1r, P0 + OFF_W2, P0 + OFF_B2, Z2r, nb);
        __syncthreads();
        for (unsigned i = r0 + warp; i < r0 + nb; i += WARPS) {
            float q[ACTIONS];
            head_row<false>(P0, Z2 + i * ROW_STRIDE, q);
            if (lane == 0) {
                ASTAR[i] = argmax_first(q);
            }
        }
        __syncthreads();
        dense<OBS, OBS, true>(XNr, P1 + OFF_W1, P1 + OFF_B1, H1r, nb);
        __syncthreads();
        dense<HIDDEN, ROW_STRIDE, true>(H1r, P1 + OFF_W2, P1 + OFF_B2, Z2r, nb);
        __syncthreads();
        for (unsigned i = r0 + warp; i < r0 + nb; i += WARPS) {
            float q[ACTIONS];
            head_row<false>(P1, Z2 + i * ROW_STRIDE, q);
            if (lane == 0) {
                // rejax: rewards + mask_done * gamma * next_q.
                Y[i] = Y[i] + ((1.0f - DONE[i]) * gamma) * q[ASTAR[i]];
            }
        }
        __syncthreads();

        // The online network on the observations, z2 kept for the backward.
        dense<OBS, OBS, true>(Xr, P0 + OFF_W1, P0 + OFF_B1, H1r, nb);
        __syncthreads();
        dense<HIDDEN, ROW_STRIDE, false>(H1r, P0 + OFF_W2, P0 + OFF_B2, Z2r, nb);
        __syncthreads();
        for (unsigned i = r0 + warp; i < r0 + nb; i += WARPS) {
            float q[ACTIONS];
            head_row<true>(P0, Z2 + i * ROW_STRIDE, q);
            if (lane == 0) {
                const float d = q[ACT[i]] - Y[i];
                GQ[i] = d * inv_b;  // d(mean 0.5 d^2) / dq
                LROW[i] = 0.5f * d * d;
            }
        }
        __syncthreads();

        // Head gradients into P1 (the target parameters are no longer needed): unit
        // tid / 4 over rows tid % 4, tid % 4 + 4, ..., the four partial sums joined by
        // shuffles; the biases by warp 0.
        {
            const unsigned n = tid / 4, rg = tid % 4;
            float gwv = 0.0f, gwa[ACTIONS];
            for (int j = 0; j < ACTIONS; ++j) {
                gwa[j] = 0.0f;
            }
            for (unsigned i = r0 + rg; i < r0 + nb; i += 4) {
                const float h = swish(Z2[i * ROW_STRIDE + n]);
                const float g = GQ[i];
                gwv = fmaf(h, g, gwv);
                for (int j = 0; j < ACTIONS; ++j) {
                    gwa[j] = fmaf(h, adv_grad(g, j, ACT[i]), gwa[j]);
                }
            }
            for (int o = 1; o < 4; o <<= 1) {
                gwv += __shfl_xor_sync(0xffffffffu, gwv, o);
                for (int j = 0; j < ACTIONS; ++j) {
                    gwa[j] += __shfl_xor_sync(0xffffffffu, gwa[j], o);
                }
            }
            if (rg == 0) {
                P1[OFF_WV + n] = gwv;
                for (int j = 0; j < ACTIONS; ++j) {
                    P1[OFF_WA + n * ACTIONS + j] = gwa[j];
                }
            }
            if (warp == 0) {
                float gbv = 0.0f, gba[ACTIONS], l = 0.0f;
                for (int j = 0; j < ACTIONS; ++j) {
                    gba[j] = 0.0f;
                }
                for (unsigned i = r0 + lane; i < r0 + nb; i += 32) {
                    gbv += GQ[i];
                    l += LROW[i];
                    for (int j = 0; j < ACTIONS; ++j) {
                        gba[j] += adv_grad(GQ[i], j, ACT[i]);
                    }
                }
                gbv = warp_sum(gbv);
                l = warp_sum(l);
                for (int j = 0; j < ACTIONS; ++j) {
                    gba[j] = warp_sum(gba[j]);
                }
                if (lane == 0) {
                    P1[OFF_BV] = gbv;
                    for (int j = 0; j < ACTIONS; ++j) {
                        P1[OFF_BA + j] = gba[j];
                    }
                    P1[PARAMS] = l;  // this block's share of the loss, summed below
                }
            }
        }
        __syncthreads();

        // dL/dz2 into Z2, in place.
        for (unsigned e = tid; e < nb * HIDDEN; e += UPDATE_THREADS) {
            const unsigned i = r0 + e / HIDDEN, n = e % HIDDEN;
            const float g = GQ[i];
            float gh = P0[OFF_WV + n] * g;
            for (int j = 0; j < ACTIONS; ++j) {
                gh = fmaf(P0[OFF_WA + n * ACTIONS + j], adv_grad(g, j, ACT[i]), gh);
            }
            Z2[i * ROW_STRIDE + n] = gh * swish_grad(Z2[i * ROW_STRIDE + n]);
        }
        __syncthreads();

        // W2's and b2's gradients: a 4 x 4 tile of W2 per thread, summed over the batch.
        {
            const unsigned k0 = (tid / COL_GROUPS) * 4, n0 = (tid % COL_GROUPS) * 4;
            float acc[4][4] = {}, bacc[4] = {};
            for (unsigned i = r0; i < r0 + nb; ++i) {
                const float4 h = ld4(H1 + i * ROW_STRIDE + k0);
                const float4 g = ld4(Z2 + i * ROW_STRIDE + n0);
#pragma unroll
                for (int a = 0; a < 4; ++a) {
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        acc[a][c] = fmaf(comp(h, a), comp(g, c), acc[a][c]);
                    }
                }
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    bacc[c] += comp(g, c);
                }
            }
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                st4(P1 + OFF_W2 + (k0 + a) * HIDDEN + n0,
                    make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]));
            }
            if (k0 == 0) {
                st4(P1 + OFF_B2 + n0, make_float4(bacc[0], bacc[1], bacc[2], bacc[3]));
            }
        }
        __syncthreads();

        // dL/dz1 = (dL/dz2 W2^T) swish'(z1) into H1 (the sum over n from 4 (k / 4) on,
        // wrapping), z1 recomputed from X as the forward computed it (bias, then fmaf over
        // the observation).
        if (nb > 0) {
            const unsigned k0 = (tid % COL_GROUPS) * 4, rg = tid / COL_GROUPS;
            float acc[ROWS_PER_THREAD][4] = {};
            // Skewed: thread k0 walks the columns from k0 on, wrapping. W2's rows are 64
            // floats apart, a whole number of bank rows, so the 16 column groups reading
            // rows k0 at one column would hit the same banks; skewed, each phase of a
            // float4 load touches distinct ones (and so does a row group's read of Z2).
#pragma unroll 2
            for (int step = 0; step < HIDDEN; step += 4) {
                const int n = (step + (int)k0) & (HIDDEN - 1);
                float4 w[4];
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    w[c] = ld4(P0 + OFF_W2 + (k0 + c) * HIDDEN + n);
                }
#pragma unroll
                for (int r = 0; r < ROWS_PER_THREAD; ++r) {
                    const unsigned i = r0 + min(rg + ROW_GROUPS * r, nb - 1);
                    const float4 g = ld4(Z2 + i * ROW_STRIDE + n);
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
            const float4 bias = ld4(P0 + OFF_B1 + k0);
            float4 w1[OBS];
#pragma unroll
            for (int c = 0; c < OBS; ++c) {
                w1[c] = ld4(P0 + OFF_W1 + c * HIDDEN + k0);
            }
#pragma unroll
            for (int r = 0; r < ROWS_PER_THREAD; ++r) {
                const unsigned i = r0 + rg + ROW_GROUPS * r;
                if (i < r0 + nb) {
                    const float4 x = ld4(X + i * OBS);
                    float out[4];
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        float z = comp(bias, c);
                        z = fmaf(x.x, comp(w1[0], c), z);
                        z = fmaf(x.y, comp(w1[1], c), z);
                        z = fmaf(x.z, comp(w1[2], c), z);
                        z = fmaf(x.w, comp(w1[3], c), z);
                        out[c] = acc[r][c] * swish_grad(z);
                    }
                    st4(H1 + i * ROW_STRIDE + k0, make_float4(out[0], out[1], out[2], out[3]));
                }
            }
        }
        __syncthreads();

        // W1's and b1's gradients.
        for (unsigned e = tid; e < OBS * HIDDEN; e += UPDATE_THREADS) {
            const unsigned c = e / HIDDEN, k = e % HIDDEN;
            float acc = 0.0f, bacc = 0.0f;
            for (unsigned i = r0; i < r0 + nb; ++i) {
                const float g = H1[i * ROW_STRIDE + k];
                acc = fmaf(X[i * OBS + c], g, acc);
                bacc += g;
            }
            P1[OFF_W1 + c * HIDDEN + k] = acc;
            if (c == 0) {
                P1[OFF_B1 + k] = bacc;
            }
        }
        __syncthreads();

        // The cluster's gradient and loss: every block adds the blocks' partial sums in
        // rank order (0 + g is g: one block's sums are its own), then waits until every
        // block has read before the next epoch overwrites P1.
        cluster_sync();
        float grad[ADAM_SLOTS];
#pragma unroll
        for (int s = 0; s < ADAM_SLOTS; ++s) {
            const unsigned p = tid + s * UPDATE_THREADS;
            float acc = 0.0f;
            if (p < PARAMS) {
#pragma unroll
                for (unsigned r = 0; r < DQN_BLOCKS; ++r) {
                    acc += peer(P1, r)[p];
                }
            }
            grad[s] = acc;
        }
        if (tid == 0) {
            float l = 0.0f;
            for (unsigned r = 0; r < DQN_BLOCKS; ++r) {
                l += peer(P1, r)[PARAMS];
            }
            last_loss = l * inv_b;
        }
        cluster_sync();

        // optax.chain(clip(clip), adam(lr)): step t + 1.
        const float bc1 = (float)(1.0 - pow((double)b1, (double)(t + 1)));
        const float bc2 = (float)(1.0 - pow((double)b2, (double)(t + 1)));
#pragma unroll
        for (int s = 0; s < ADAM_SLOTS; ++s) {
            const unsigned p = tid + s * UPDATE_THREADS;
            if (p < PARAMS) {
                const float g = fminf(fmaxf(grad[s], -clip), clip);
                m[s] = __fadd_rn(__fmul_rn(c1, g), __fmul_rn(b1, m[s]));
                v[s] = __fadd_rn(__fmul_rn(c2, __fmul_rn(g, g)), __fmul_rn(b2, v[s]));
                const float mhat = __fdiv_rn(m[s], bc1);
                const float vhat = __fdiv_rn(v[s], bc2);
                const float u = __fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), adam_eps));
                P0[p] = __fadd_rn(P0[p], -__fmul_rn(lr, u));
            }
        }
        __syncthreads();
    }

    // Every block of the cluster holds the same parameters and moments: the first writes.
    if (rank != 0) {
        return;
    }
    for (unsigned p = tid; p < PARAMS; p += UPDATE_THREADS) {
        gp[p] = P0[p];
    }
#pragma unroll
    for (int s = 0; s < ADAM_SLOTS; ++s) {
        const unsigned p = tid + s * UPDATE_THREADS;
        if (p < PARAMS) {
            gm[p] = m[s];
            gv[p] = v[s];
        }
    }
    if (tid == 0) {
        adam_t[agent] = t0 + epochs;
        loss[agent] = last_loss;
    }
}
