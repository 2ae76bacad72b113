// The DQN step's head kernels (examples/dqn/MODEL.md): the branches' GLU, and their head
// (GLU and advantage layer) forward and backward in one pass each, the double-DQN target,
// the dueling losses (TD, CQL, branch agreement) fused with their gradients, the IQL
// expectile loss and a whole IQL head in one pass, and the trunk's gradient join.
//
// Layouts are row-major: [B, X] puts row b at offset b * X; the D branches' tensors are
// packed as [D, B, X]. Every kernel takes its sizes as arguments and is launched by a
// wrapper in lib.rs that checks buffer lengths against them first.

#include "dqn.cuh"

__device__ __forceinline__ float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

// The partial row of a block of 8 warps: row[c] = part[0][c] + ... + part[7][c] for c < cols,
// added in warp order (deterministic). After a barrier that follows the warps' writes.
template <int WIDTH>
__device__ __forceinline__ void add_warp_rows(const float (&part)[8][WIDTH], unsigned cols,
                                              float* __restrict__ row) {
    for (unsigned c = threadIdx.x; c < cols; c += blockDim.x) {
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            t += part[k][c];
        }
        row[c] = t;
    }
}

// GLU, forward: g[r, k] = u[r, k] * sigmoid(u[r, G + k]) for r < rows, k < G; u is
// [rows, 2G], g is [rows, G], n = rows * G. The D branches packed as [D, B, 2G] are
// rows = D * B. Grid: one thread per element of g, ceil(n / 256) blocks of 256.
// stepgraph(unsafe): u[2 * n], g[n], G > 0, grid = elementwise(n)
extern "C" __global__ void glu_forward(const float* __restrict__ u, float* __restrict__ g,
                                       unsigned n, unsigned G) {
    const unsigned i = global_index();
    if (i >= n) {
        return;
    }
    const unsigned r = i / G, k = i - r * G;
    const float* ur = u + (size_t)r * 2 * G;
    g[i] = ur[k] * sigmoid(ur[G + k]);
}

// GLU, backward: with a = u[r, k], s = sigmoid(u[r, G + k]),
//   du[r, k] = dg[r, k] * s,   du[r, G + k] = dg[r, k] * a * s * (1 - s).
// Shapes as glu_forward (du like u). Grid: one thread per element of dg, which writes both
// halves, ceil(n / 256) blocks of 256.
// stepgraph(unsafe): u[2 * n], dg[n], du[2 * n], G > 0, grid = elementwise(n)
extern "C" __global__ void glu_backward(const float* __restrict__ u, const float* __restrict__ dg,
                                        float* __restrict__ du, unsigned n, unsigned G) {
    const unsigned i = global_index();
    if (i >= n) {
        return;
    }
    const unsigned r = i / G, k = i - r * G;
    const size_t row = (size_t)r * 2 * G;
    const float a = u[row + k];
    const float s = sigmoid(u[row + G + k]);
    const float d = dg[i];
    du[row + k] = d * s;
    du[row + G + k] = d * a * s * (1.0f - s);
}

// The branch head kernels' limits (lib.rs mirrors them): A actions <= BRANCH_HEAD_MAX_A,
// a GLU of width G <= 32 BRANCH_HEAD_MAX_UNITS (units a lane).
#define BRANCH_HEAD_MAX_A 8
#define BRANCH_HEAD_MAX_UNITS 2
// Rows a block of branch_head_forward takes (8 warps, 8 rows each).
#define BRANCH_HEAD_FORWARD_ROWS 64

// The lane's advantage weights in registers: w[i][a] = wa[a, lane + 32 i], zero past G and A.
__device__ __forceinline__ void load_advantage_weights(
    const float* __restrict__ wa, unsigned G, unsigned A, unsigned lane,
    float (&w)[BRANCH_HEAD_MAX_UNITS][BRANCH_HEAD_MAX_A]) {
#pragma unroll
    for (int i = 0; i < BRANCH_HEAD_MAX_UNITS; ++i) {
        const unsigned j = lane + 32 * i;
#pragma unroll
        for (int a = 0; a < BRANCH_HEAD_MAX_A; ++a) {
            w[i][a] = j < G && a < A ? wa[a * G + j] : 0.0f;
        }
    }
}

// A branch's head forward: the GLU and the advantage layer in one pass over the rows,
//   g[r, j] = u[r, j] sigmoid(u[r, G + j])                 (glu_forward's formula)
//   adv[r, a] = ba[a] + sum_j g[r, j] wa[a, j]
// g is written only where the backward needs it (write_g != 0). u: [B, 2G]; g: [B, G];
// wa: [A, G]; ba, adv: [B, A]. Replaces glu_forward and the advantage layer's GEMM, a
// K = G, N = A product that cuBLASLt ran as its own kernel on the chain to the target.
// Sizes as branch_head_backward_partial. Grid: ceil(B / 64) blocks of 256 threads; warp w
// of block y takes rows 64 y + w + 8k, lane l units l + 32 i. The A sums over the lanes are
// a reduce-scatter (reduce_scatter8, then two adds): 9 shuffles a row, not 5 A.
extern "C" __global__ void __launch_bounds__(256)
    branch_head_forward(const float* __restrict__ u, const float* __restrict__ wa,
                        const float* __restrict__ ba, float* __restrict__ g,
                        float* __restrict__ adv, unsigned B, unsigned G, unsigned A,
                        unsigned write_g) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float w[BRANCH_HEAD_MAX_UNITS][BRANCH_HEAD_MAX_A];
    load_advantage_weights(wa, G, A, lane, w);
    // The action this lane's sum ends up as: bits 4, 3, 2 of the lane.
    const unsigned my_a = ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
    const float my_b = my_a < A ? ba[my_a] : 0.0f;
    const unsigned r1 = min(B, BRANCH_HEAD_FORWARD_ROWS * (blockIdx.x + 1));
    for (unsigned r = BRANCH_HEAD_FORWARD_ROWS * blockIdx.x + warp; r < r1; r += 8) {
        float v[BRANCH_HEAD_MAX_A];
#pragma unroll
        for (int a = 0; a < BRANCH_HEAD_MAX_A; ++a) {
            v[a] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < BRANCH_HEAD_MAX_UNITS; ++i) {
            const unsigned j = lane + 32 * i;
            if (j < G) {
                const size_t ur = (size_t)r * 2 * G;
                const float gv = u[ur + j] * sigmoid(u[ur + G + j]);
                if (write_g) {
                    g[(size_t)r * G + j] = gv;
                }
#pragma unroll
                for (int a = 0; a < BRANCH_HEAD_MAX_A; ++a) {
                    v[a] = fmaf(gv, w[i][a], v[a]);
                }
            }
        }
        reduce_scatter8(v, lane);  // then over lane bits 1, 0
        float t = v[0] + __shfl_xor_sync(FULL_MASK, v[0], 2);
        t += __shfl_xor_sync(FULL_MASK, t, 1);
        if ((lane & 3) == 0 && my_a < A) {
            adv[(size_t)r * A + my_a] = my_b + t;
        }
    }
}

// A branch's head backward, first pass: the advantage layer and the GLU in one pass over
// the rows, with the sums that read the same rows. For row r of the chunk:
//   dg[j]      = sum_a dadv[r, a] wa[a, j]                     (the advantage layer's input grad)
//   du[r, j]   = dg[j] s,  du[r, G + j] = dg[j] u[r, j] s (1 - s),  s = sigmoid(u[r, G + j])
// (glu_backward's formula), and into partials[chunk, 0 .. A G + A + 2G):
//   [0, A G):         sum_r dadv[r, a] g[r, j] at a G + j   (dwa, the advantage weight grad)
//   [A G, A G + A):   sum_r dadv[r, a]                     (dba)
//   [A G + A, + 2G):  sum_r du[r, k]                       (dbg, the GLU layer's bias grad)
// branch_head_backward_finish adds the chunks. dadv: [B, A]; u, du: [B, 2G]; g: [B, G];
// wa: [A, G]. This replaces five kernels of the branch's backward (cuBLASLt's split-K GEMM
// for dwa with its reduction and one-block bias-gradient epilogue, the dg GEMM and
// glu_backward) and the 8-block bias-gradient epilogue of the gate layer's weight gradient:
// one-block kernels that ran long on the branch's critical path.
// Sizes: 1 <= A <= BRANCH_HEAD_MAX_A, 1 <= G <= 32 BRANCH_HEAD_MAX_UNITS (lib.rs mirrors both).
// Grid: chunks blocks of 256 threads (8 warps); block y takes rows [y R, min(B, (y + 1) R)),
// R = rows_per_chunk, warp w the rows r0 + w + 8k; lane l owns units j = l + 32 i. Each lane
// adds its rows in order, then the warps are added in order: deterministic.
#define BRANCH_HEAD_MAX_COLS                                                                    \
    (BRANCH_HEAD_MAX_A * 32 * BRANCH_HEAD_MAX_UNITS + BRANCH_HEAD_MAX_A +                       \
     2 * 32 * BRANCH_HEAD_MAX_UNITS)
// stepgraph(unsafe): dadv[B * A], u[2 * B * G], g[B * G], wa[A * G], du[2 * B * G],
// stepgraph(unsafe): partials[>= cdiv(B, rows_per_chunk) * (A * G + A + 2 * G)], B > 0,
// stepgraph(unsafe): rows_per_chunk > 0, A > 0, G > 0, A <= BRANCH_HEAD_MAX_A,
// stepgraph(unsafe): G <= 32 * BRANCH_HEAD_MAX_UNITS, grid = blocks(cdiv(B, rows_per_chunk), 256)
extern "C" __global__ void __launch_bounds__(256)
    branch_head_backward_partial(const float* __restrict__ dadv, const float* __restrict__ u,
                                 const float* __restrict__ g, const float* __restrict__ wa,
                                 float* __restrict__ du, float* __restrict__ partials,
                                 unsigned B, unsigned G, unsigned A, unsigned rows_per_chunk) {
    __shared__ float part[8][BRANCH_HEAD_MAX_COLS];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned cols = A * G + A + 2 * G;
    const unsigned r0 = blockIdx.x * rows_per_chunk;
    const unsigned r1 = B - r0 <= rows_per_chunk ? B : r0 + rows_per_chunk;
    float w[BRANCH_HEAD_MAX_UNITS][BRANCH_HEAD_MAX_A];
    load_advantage_weights(wa, G, A, lane, w);
    float dwa[BRANCH_HEAD_MAX_UNITS][BRANCH_HEAD_MAX_A] = {};
    float dbg[BRANCH_HEAD_MAX_UNITS][2] = {};
    float dba = 0.0f;  // lane a < A: sum of dadv[., a]
#pragma unroll 2
    for (unsigned r = r0 + warp; r < r1; r += 8) {
        // Lane a holds dadv[r, a]; the shuffles hand it to every lane.
        const float da_lane = lane < A ? dadv[(size_t)r * A + lane] : 0.0f;
        dba += da_lane;
        float da[BRANCH_HEAD_MAX_A];
#pragma unroll
        for (int a = 0; a < BRANCH_HEAD_MAX_A; ++a) {
            da[a] = __shfl_sync(FULL_MASK, da_lane, a);
        }
#pragma unroll
        for (int i = 0; i < BRANCH_HEAD_MAX_UNITS; ++i) {
            const unsigned j = lane + 32 * i;
            if (j < G) {
                const size_t ur = (size_t)r * 2 * G;
                const float ua = u[ur + j];
                const float s = sigmoid(u[ur + G + j]);
                const float gv = g[(size_t)r * G + j];
                float dg = 0.0f;
#pragma unroll
                for (int a = 0; a < BRANCH_HEAD_MAX_A; ++a) {
                    if (a < A) {
                        dg = fmaf(da[a], w[i][a], dg);
                        dwa[i][a] = fmaf(da[a], gv, dwa[i][a]);
                    }
                }
                const float du_a = dg * s;
                const float du_b = dg * ua * s * (1.0f - s);
                du[ur + j] = du_a;
                du[ur + G + j] = du_b;
                dbg[i][0] += du_a;
                dbg[i][1] += du_b;
            }
        }
    }
    float* p = part[warp];
#pragma unroll
    for (int i = 0; i < BRANCH_HEAD_MAX_UNITS; ++i) {
        const unsigned j = lane + 32 * i;
        if (j < G) {
#pragma unroll
            for (int a = 0; a < BRANCH_HEAD_MAX_A; ++a) {
                if (a < A) {
                    p[a * G + j] = dwa[i][a];
                }
            }
            p[A * G + A + j] = dbg[i][0];
            p[A * G + A + G + j] = dbg[i][1];
        }
    }
    if (lane < A) {
        p[A * G + lane] = dba;
    }
    __syncthreads();
    add_warp_rows(part, cols, partials + (size_t)blockIdx.x * cols);
}

// Second pass: adds the chunks' partials [chunks, A G + A + 2G] column by column, in order,
// and writes dwa[A, G], dba[A] and dbg[2G]. Grid: ceil((A G + A + 2G) / 32) blocks of (32, 32).
// stepgraph(unsafe): partials[>= chunks * (A * G + A + 2 * G)], dwa[A * G], dba[A], dbg[2 * G],
// stepgraph(unsafe): grid = tiles(cdiv(A * G + A + 2 * G, 32), 1)
extern "C" __global__ void __launch_bounds__(1024)
    branch_head_backward_finish(const float* __restrict__ partials, unsigned chunks, unsigned G,
                                unsigned A, float* __restrict__ dwa, float* __restrict__ dba,
                                float* __restrict__ dbg) {
    const unsigned cols = A * G + A + 2 * G;
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const float s = column_block_sum(partials, 0, chunks, cols, c);
    if (threadIdx.y == 0 && c < cols) {
        if (c < A * G) {
            dwa[c] = s;
        } else if (c < A * G + A) {
            dba[c - A * G] = s;
        } else {
            dbg[c - A * G - A] = s;
        }
    }
}

// Double-DQN target. For each sample b and branch d, with the dueling head
//   q'[a] = (v2[b] + adv2[d, b, a]) - mean_a adv2[d, b, .]     (online net on s2)
//   q-[a] = (vt[b] + advt[d, b, a]) - mean_a advt[d, b, .]     (target net on s2)
//   a*    = the first a with the largest q'[a]
//   y[b, d] = r[b] + gamma * (1 - done[b]) * q-[a*],    ybar[b] = mean_d y[b, d].
// v2, vt, r, done, ybar: [B]; adv2, advt: D arrays [B, A], one per branch; y: [B, D].
// No gradient flows here.
// Grid: one thread per sample, ceil(B / 256) blocks of 256.
// stepgraph(unsafe): v2[B], adv2[D][B * A], vt[B], advt[D][B * A], r[B], done[B], y[B * D],
// stepgraph(unsafe): ybar[B], B > 0, D > 0, A > 0, grid = elementwise(B)
extern "C" __global__ void ddqn_target(const float* __restrict__ v2, const BranchIn adv2,
                                       const float* __restrict__ vt, const BranchIn advt,
                                       const float* __restrict__ r, const float* __restrict__ done,
                                       float* __restrict__ y, float* __restrict__ ybar, unsigned B,
                                       unsigned D, unsigned A, float gamma) {
    const unsigned b = global_index();
    if (b >= B) {
        return;
    }
    const float fa = (float)A;
    const float v2b = v2[b], vtb = vt[b], rb = r[b];
    const float boot = gamma * (1.0f - done[b]);
    float ysum = 0.0f;
    for (unsigned d = 0; d < D; ++d) {
        const float* a2 = adv2.p[d] + (size_t)b * A;
        const float* at = advt.p[d] + (size_t)b * A;
        float s2 = 0.0f, st = 0.0f;
        for (unsigned a = 0; a < A; ++a) {
            s2 += a2[a];
            st += at[a];
        }
        const float m2 = s2 / fa, mt = st / fa;
        float best = -INFINITY;
        unsigned best_a = 0;
        for (unsigned a = 0; a < A; ++a) {
            const float q = (v2b + a2[a]) - m2;
            if (q > best) {  // strict: the first maximum wins ties
                best = q;
                best_a = a;
            }
        }
        const float qt = (vtb + at[best_a]) - mt;
        const float yd = rb + boot * qt;
        y[(size_t)b * D + d] = yd;
        ysum += yd;
    }
    ybar[b] = ysum / (float)D;
}

// The dueling losses, forward and backward in one pass. For each sample b and branch d:
//   q[d, a]  = (v[b] + adv[d, b, a]) - mean_a adv[d, b, .]
//   qa[d]    = q[d, act[b, d]],  delta = qa[d] - y[b, d],  qm = mean_d qa[d]
//   L_td     = mean_{b,d} huber(delta)
//   L_cql    = mean_{b,d} (logsumexp_a q[d, .] - qa[d])
//   L_conf   = mean_b mean_d (qa[d] - qm)^2          (population variance over branches)
//   L        = c_td L_td + c_cql L_cql + c_conf L_conf
// Outputs: dv[b] = dL/dv[b], dadv[d, b, a] = dL/dadv[d, b, a], qbar[b] = qm (for IQL),
// and losses[LOSS_TD, LOSS_CQL, LOSS_CONF] += the three terms, losses[LOSS_TOTAL] += L.
//
// Gradient, derived by hand (p = softmax_a q[d, .], o = onehot(act[b, d])):
//   dL/dq[d, a] = c_cql (p[a] - o[a]) / (B D) + K[d] o[a],
//   K[d] = c_td huber'(delta) / (B D) + c_conf (2 / D) (qa[d] - qm) / B.
// sum_a dL/dq[d, a] = K[d] (p sums to 1), so through the dueling mean
//   dadv[d, b, a] = dL/dq[d, a] - K[d] / A = c_cql (p[a] - o[a]) / (B D) + K[d] (o[a] - 1/A),
//   dv[b] = sum_d K[d].
// An action outside 0..A makes that sample's outputs NaN instead of reading out of bounds.
//
// v, dv, qbar: [B]; adv, dadv: D arrays [B, A], one per branch; act, y: [B, D]; losses:
// LOSS_SLOT_COUNT floats.
// Grid: one thread per sample, ceil(B / 256) blocks of 256. The loss terms are summed per
// block in a fixed order, then added with one atomicAdd per block and slot: the sum over
// blocks is in no fixed order, so the loss values (not the gradients) can differ in the
// last bits between runs.
// stepgraph(unsafe): v[B], adv[D][B * A], act[B * D], y[B * D], dv[B], dadv[D][B * A], qbar[B],
// stepgraph(unsafe): losses[LOSS_SLOT_COUNT], B > 0, D > 0, A > 0, grid = elementwise(B)
extern "C" __global__ void __launch_bounds__(256)
    dueling_losses(const float* __restrict__ v, const BranchIn adv,
                   const int* __restrict__ act, const float* __restrict__ y, float* __restrict__ dv,
                   const BranchOut dadv, float* __restrict__ qbar, float* __restrict__ losses,
                   unsigned B, unsigned D, unsigned A, float c_td, float c_cql, float c_conf) {
    const unsigned b = global_index();
    const float fd = (float)D;
    const float inv_a = 1.0f / (float)A, inv_d = 1.0f / fd;
    const float inv_bd = 1.0f / ((float)B * fd), inv_b = 1.0f / (float)B;
    float td = 0.0f, cql = 0.0f, conf = 0.0f;
    if (b < B) {
        const float vb = v[b];
        // Pass 1: the taken Q values and their mean over branches.
        float qsum = 0.0f;
        for (unsigned d = 0; d < D; ++d) {
            const float* row = adv.p[d] + (size_t)b * A;
            float s = 0.0f;
            for (unsigned a = 0; a < A; ++a) {
                s += row[a];
            }
            const unsigned at = (unsigned)act[(size_t)b * D + d];
            qsum += at < A ? (vb + row[at]) - s * inv_a : NAN;
        }
        const float qm = qsum * inv_d;
        qbar[b] = qm;
        // Pass 2: losses and gradients (the rows are in L1 from pass 1).
        float dvb = 0.0f;
        for (unsigned d = 0; d < D; ++d) {
            const float* row = adv.p[d] + (size_t)b * A;
            float* drow = dadv.p[d] + (size_t)b * A;
            float s = 0.0f;
            for (unsigned a = 0; a < A; ++a) {
                s += row[a];
            }
            const float mean = s * inv_a;
            const unsigned at = (unsigned)act[(size_t)b * D + d];
            const float qa = at < A ? (vb + row[at]) - mean : NAN;
            float mx = -INFINITY;
            for (unsigned a = 0; a < A; ++a) {
                mx = fmaxf(mx, (vb + row[a]) - mean);
            }
            float se = 0.0f;
            for (unsigned a = 0; a < A; ++a) {
                se += expf(((vb + row[a]) - mean) - mx);
            }
            const float delta = qa - y[(size_t)b * D + d];
            td += huber(delta);
            cql += (mx + logf(se)) - qa;
            conf += (qa - qm) * (qa - qm);
            const float kd =
                c_td * huber_grad(delta) * inv_bd + c_conf * (2.0f * inv_d) * (qa - qm) * inv_b;
            const float kc = c_cql * inv_bd;
            const float inv_se = 1.0f / se;
            for (unsigned a = 0; a < A; ++a) {
                const float p = expf(((vb + row[a]) - mean) - mx) * inv_se;
                const float o = a == at ? 1.0f : 0.0f;
                drow[a] = kc * (p - o) + kd * (o - inv_a);
            }
            dvb += kd;
        }
        dv[b] = dvb;
        conf *= inv_d;
    }
    td = block_sum(td);
    cql = block_sum(cql);
    conf = block_sum(conf);
    if (threadIdx.x == 0) {
        const float l_td = td * inv_bd, l_cql = cql * inv_bd, l_conf = conf * inv_b;
        atomicAdd(&losses[LOSS_TD], l_td);
        atomicAdd(&losses[LOSS_CQL], l_cql);
        atomicAdd(&losses[LOSS_CONF], l_conf);
        atomicAdd(&losses[LOSS_TOTAL], c_td * l_td + c_cql * l_cql + c_conf * l_conf);
    }
}

// IQL expectile loss of one value head, forward and backward:
//   u = qbar[b] - e[b],  w = |tau - 1(u < 0)|,  L = mean_b w u^2,
//   de[b] = coef * dL/de[b] = -2 coef w u / B,
//   losses[LOSS_IQL] += L,  losses[LOSS_TOTAL] += coef * L.
// Called once per head (tau = 0.7 for e_hi, 0.3 for e_lo); L_iql is the sum of both.
// e, qbar, de: [B]. Grid: one thread per sample, ceil(B / 256) blocks of 256; the loss is
// summed per block in a fixed order and added with one atomicAdd per block and slot.
// stepgraph(unsafe): e[B], qbar[B], de[B], losses[LOSS_SLOT_COUNT], B > 0, grid = elementwise(B)
extern "C" __global__ void __launch_bounds__(256)
    expectile_loss(const float* __restrict__ e, const float* __restrict__ qbar,
                   float* __restrict__ de, float* __restrict__ losses, unsigned B, float tau,
                   float coef) {
    const unsigned b = global_index();
    const float inv_b = 1.0f / (float)B;
    float loss = 0.0f;
    if (b < B) {
        const float u = qbar[b] - e[b];
        const float w = asymmetric_weight(tau, u);
        loss = w * u * u;
        de[b] = -2.0f * coef * w * u * inv_b;
    }
    loss = block_sum(loss);
    if (threadIdx.x == 0) {
        const float l = loss * inv_b;
        add_loss_term(losses, LOSS_IQL, l, coef);
    }
}

// One IQL expectile head in one pass over the rows of h, first pass: for row b,
//   e[b] = h[b, .] . we + be,  u = qbar[b] - e[b],  w = |tau - 1(u < 0)|,
//   de[b] = -2 coef w u / B   (expectile_loss's formula),
// and into partials[chunk, 0 .. H + 2): sum_b de[b] h[b, j] at j (dwe), sum_b de[b] at H
// (dbe), sum_b w u^2 at H + 1 (the loss, before the mean). expectile_head_finish adds the
// chunks and the loss. This replaces six kernels (cuBLASLt's gemv for e, expectile_loss,
// the gemv and split-K reduction for dwe, the column sums for dbe), each reading h or
// running a few blocks, on the serial chain after IQN.
// Sizes: 1 <= H <= 32 EXPECTILE_HEAD_MAX_UNITS (lib.rs mirrors it). Grid: chunks blocks of
// 256 threads (8 warps); block y takes rows [y R, min(B, (y + 1) R)), R = rows_per_chunk,
// warp w the rows r0 + w + 8k; lane l owns units l + 32 i. Each lane adds its rows in
// order, then the warps are added in order: deterministic.
#define EXPECTILE_HEAD_MAX_UNITS 8
// stepgraph(unsafe): h[B * H], we[H], be[1], qbar[B], e[B], de[B],
// stepgraph(unsafe): partials[>= cdiv(B, rows_per_chunk) * (H + 2)], B > 0, H > 0,
// stepgraph(unsafe): rows_per_chunk > 0, H <= 32 * EXPECTILE_HEAD_MAX_UNITS,
// stepgraph(unsafe): grid = blocks(cdiv(B, rows_per_chunk), 256)
extern "C" __global__ void __launch_bounds__(256)
    expectile_head_partial(const float* __restrict__ h, const float* __restrict__ we,
                           const float* __restrict__ be, const float* __restrict__ qbar,
                           float* __restrict__ e, float* __restrict__ de,
                           float* __restrict__ partials, unsigned B, unsigned H, float tau,
                           float coef, unsigned rows_per_chunk) {
    __shared__ float part[8][32 * EXPECTILE_HEAD_MAX_UNITS + 2];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned r0 = blockIdx.x * rows_per_chunk;
    const unsigned r1 = B - r0 <= rows_per_chunk ? B : r0 + rows_per_chunk;
    const float inv_b = 1.0f / (float)B;
    const float bias = be[0];
    float w[EXPECTILE_HEAD_MAX_UNITS], dw[EXPECTILE_HEAD_MAX_UNITS];
#pragma unroll
    for (int i = 0; i < EXPECTILE_HEAD_MAX_UNITS; ++i) {
        const unsigned j = lane + 32 * i;
        w[i] = j < H ? we[j] : 0.0f;
        dw[i] = 0.0f;
    }
    float db = 0.0f, loss = 0.0f;  // the same in every lane
#pragma unroll 2
    for (unsigned r = r0 + warp; r < r1; r += 8) {
        float hv[EXPECTILE_HEAD_MAX_UNITS];
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < EXPECTILE_HEAD_MAX_UNITS; ++i) {
            const unsigned j = lane + 32 * i;
            hv[i] = j < H ? h[(size_t)r * H + j] : 0.0f;
            dot = fmaf(hv[i], w[i], dot);
        }
        const float ev = warp_sum(dot) + bias;
        const float u = qbar[r] - ev;
        const float wt = asymmetric_weight(tau, u);
        const float d = -2.0f * coef * wt * u * inv_b;
        if (lane == 0) {
            e[r] = ev;
            de[r] = d;
        }
        loss += wt * u * u;
        db += d;
#pragma unroll
        for (int i = 0; i < EXPECTILE_HEAD_MAX_UNITS; ++i) {
            dw[i] = fmaf(d, hv[i], dw[i]);
        }
    }
    float* p = part[warp];
#pragma unroll
    for (int i = 0; i < EXPECTILE_HEAD_MAX_UNITS; ++i) {
        const unsigned j = lane + 32 * i;
        if (j < H) {
            p[j] = dw[i];
        }
    }
    if (lane == 0) {
        p[H] = db;
        p[H + 1] = loss;
    }
    __syncthreads();
    add_warp_rows(part, H + 2, partials + (size_t)blockIdx.x * (H + 2));
}

// Second pass: adds the chunks' partials [chunks, H + 2] column by column, in order; writes
// dwe[H] and dbe[1], and adds the loss L = (sum w u^2) / B into losses[LOSS_IQL] and
// coef L into losses[LOSS_TOTAL] (one thread, once). Grid: ceil((H + 2) / 32) blocks of
// (32, 32).
// stepgraph(unsafe): partials[>= chunks * (H + 2)], dwe[H], dbe[1], losses[LOSS_SLOT_COUNT], B > 0,
// stepgraph(unsafe): grid = tiles(cdiv(H + 2, 32), 1)
extern "C" __global__ void __launch_bounds__(1024)
    expectile_head_finish(const float* __restrict__ partials, unsigned chunks, unsigned H,
                          float* __restrict__ dwe, float* __restrict__ dbe,
                          float* __restrict__ losses, unsigned B, float coef) {
    const unsigned cols = H + 2;
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const float s = column_block_sum(partials, 0, chunks, cols, c);
    if (threadIdx.y != 0 || c >= cols) {
        return;
    }
    if (c < H) {
        dwe[c] = s;
    } else if (c == H) {
        dbe[0] = s;
    } else {
        add_loss_term(losses, LOSS_IQL, s * (1.0f / (float)B), coef);
    }
}

// The trunk's gradient join through its last ReLU, with the reductions that read the same
// rows, first pass:
//   dz2[b, h] = (dv[b] wv[h] + sum_d dh_branch[d, b, h] + de_hi[b] we_hi[h]
//                + de_lo[b] we_lo[h] + dh_iqn[b, h])  if h_out[b, h] > 0, else 0,
// and, over the rows of chunk y, into partials[y, 0 .. 2H + 1):
//   [0, H):    sum_b dz2[b, h]            (layer 2's bias gradient, db2)
//   [H, 2H):   sum_b dv[b] h_out[b, h]    (the value head's weight gradient, dwv)
//   2H:        sum_b dv[b]                (its bias gradient, dbv)
// trunk_grad_join_finish adds the chunks. The value and expectile heads' contributions to
// dz2 are rank-one, so they come in as their factors instead of [B, H] buffers. h_out,
// dh_iqn, dz2: [B, H]; dh_branch: D arrays [B, H], one per branch; dv, de_hi, de_lo: [B];
// wv, we_hi, we_lo: [H].
// Folding the sums in here takes four small kernels (cuBLASLt's gemv, split-K reduction
// and bias-gradient epilogues of one and 32 blocks) off the step's serial tail, where
// nothing runs beside them; they cost no extra read.
// Grid: (ceil(H / 32), chunks) blocks of (32, 8): column h = 32 blockIdx.x + threadIdx.x,
// rows [y R, min(B, (y + 1) R)) with R = rows_per_chunk, thread rows r0 + threadIdx.y + 8k
// (a warp reads 32 consecutive floats of a row). Each thread adds its rows in order, then
// the 8 row groups are added in order: deterministic.
// stepgraph(unsafe): h_out[B * H], dv[B], wv[H], dh_branch[D][B * H], de_hi[B], we_hi[H],
// stepgraph(unsafe): de_lo[B], we_lo[H], dh_iqn[B * H], dz2[B * H],
// stepgraph(unsafe): partials[>= cdiv(B, rows_per_chunk) * (2 * H + 1)], B > 0, H > 0,
// stepgraph(unsafe): rows_per_chunk > 0,
// stepgraph(unsafe): grid = launch((cdiv(H, 32), cdiv(B, rows_per_chunk)), (32, 8))
extern "C" __global__ void __launch_bounds__(256)
    trunk_grad_join_partial(const float* __restrict__ h_out, const float* __restrict__ dv,
                            const float* __restrict__ wv, const BranchIn dh_branch,
                            const float* __restrict__ de_hi, const float* __restrict__ we_hi,
                            const float* __restrict__ de_lo, const float* __restrict__ we_lo,
                            const float* __restrict__ dh_iqn, float* __restrict__ dz2,
                            float* __restrict__ partials, unsigned B, unsigned H, unsigned D,
                            unsigned rows_per_chunk) {
    __shared__ float part[3][8][33];
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const unsigned r0 = blockIdx.y * rows_per_chunk;
    const unsigned r1 = B - r0 <= rows_per_chunk ? B : r0 + rows_per_chunk;
    float s_db2 = 0.0f, s_dwv = 0.0f, s_dbv = 0.0f;
    if (c < H) {
        const float w = wv[c], wh = we_hi[c], wl = we_lo[c];
#pragma unroll 2
        for (unsigned r = r0 + threadIdx.y; r < r1; r += 8) {
            const size_t i = (size_t)r * H + c;
            const float d = dv[r];
            const float hv = h_out[i];
            float acc = dh_iqn[i];
            // Unrolled over the fixed bound so that the pointers stay in registers
            // (a loop to D indexes the parameter struct and copies it to local memory).
#pragma unroll
            for (unsigned k = 0; k < MAX_BRANCHES; ++k) {
                if (k < D) {
                    acc += dh_branch.p[k][i];
                }
            }
            const float z = hv > 0.0f ? acc + d * w + de_hi[r] * wh + de_lo[r] * wl : 0.0f;
            dz2[i] = z;
            s_db2 += z;
            s_dwv = fmaf(d, hv, s_dwv);
            s_dbv += d;
        }
    }
    part[0][threadIdx.y][threadIdx.x] = s_db2;
    part[1][threadIdx.y][threadIdx.x] = s_dwv;
    part[2][threadIdx.y][threadIdx.x] = s_dbv;
    __syncthreads();
    if (threadIdx.y == 0 && c < H) {
        float t_db2 = 0.0f, t_dwv = 0.0f, t_dbv = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            t_db2 += part[0][k][threadIdx.x];
            t_dwv += part[1][k][threadIdx.x];
            t_dbv += part[2][k][threadIdx.x];
        }
        float* row = partials + (size_t)blockIdx.y * (2 * H + 1);
        row[c] = t_db2;
        row[H + c] = t_dwv;
        if (c == 0) {
            row[2 * H] = t_dbv;
        }
    }
}

// Second pass: adds the chunks' partials [chunks, 2H + 1] column by column, in order, and
// writes db2[H], dwv[H] and dbv[1]. Grid: ceil((2H + 1) / 32) blocks of (32, 32).
// stepgraph(unsafe): partials[>= chunks * (2 * H + 1)], db2[H], dwv[H], dbv[1],
// stepgraph(unsafe): grid = tiles(cdiv(2 * H + 1, 32), 1)
extern "C" __global__ void __launch_bounds__(1024)
    trunk_grad_join_finish(const float* __restrict__ partials, unsigned chunks, unsigned H,
                           float* __restrict__ db2, float* __restrict__ dwv,
                           float* __restrict__ dbv) {
    const unsigned cols = 2 * H + 1;
    const unsigned j = blockIdx.x * 32 + threadIdx.x;
    const float s = column_block_sum(partials, 0, chunks, cols, j);
    if (threadIdx.y == 0 && j < cols) {
        if (j < H) {
            db2[j] = s;
        } else if (j < 2 * H) {
            dwv[j - H] = s;
        } else {
            dbv[0] = s;
        }
    }
}

// The trunk's first layer, backward, from dh1 = dz2 w2 (a plain GEMM's output), first pass:
//   dz1[b, h] = dh1[b, h] if h1[b, h] > 0, else 0      (the ReLU; never written)
//   dw1[h, c] = sum_b dz1[b, h] s[b, c],   db1[h] = sum_b dz1[b, h]
// over the rows of chunk x, into partials[x, 0 .. H S + H): [0, H S) dw1 row-major, then
// db1. trunk_l1_grad_finish adds the chunks. It replaces what followed the dz1 GEMM:
// cuBLASLt's ReLU-mask epilogue kernel (which also wrote dz1, 16 MB at the step's
// sizes), the dw1 GEMM and its split-K reduction, three kernels of the step's serial tail.
// The product runs on the tensor cores in TF32 (operands rounded by cvt.rna), the
// precision of the cuBLASLt GEMM it replaces; db1 adds the f32 values.
//
// Sizes: H <= TL1_MAX_H and S <= TL1_MAX_S, both multiples of 4 (16-byte loads); any B.
// Work split: block (x, y) takes chunk x of the rows and hidden units TL1_UNITS y ..
// TL1_UNITS (y + 1) - 1; two blocks of 8 warps fit on an SM, so one SM's loads of one
// block overlap another's multiply. Warp w owns 16 of the block's units (one m-tile) and
// all S columns (up to 8 n-tiles of 8), accumulators in registers for the whole chunk.
// The block walks its rows in steps of TL1_ROWS: the 256 threads stage dz1 (masked,
// TF32-rounded) as As[row][unit] and s as Bs[row][c] in shared memory, each thread 4
// consecutive columns, and the next step's rows are loaded into registers while the
// warps multiply this step's. mma k = rows, m = units (m0 = 16 w):
//   A (16 units x 8 rows): a0 = As[k0 + t][m0 + g], a1 = As[k0 + t][m0 + g + 8],
//                          a2 = As[k0 + t + 4][m0 + g], a3 = As[k0 + t + 4][m0 + g + 8]
//   B (8 rows x 8 cols):   b0 = Bs[k0 + t][n + g], b1 = Bs[k0 + t + 4][n + g]
// Row strides of 136 and 72 floats (8 mod 32 banks) put the 32 lanes' loads on 32 banks.
// db1: each thread sums its 4 columns over its rows in order; the 8 row groups are added
// in order at the end. Deterministic for given sizes.
// Grid: (chunks, ceil(H / TL1_UNITS)) blocks of 256 (lib.rs's plan: rows_per_chunk a
// multiple of TL1_ROWS).
#define TL1_MAX_H 256
#define TL1_MAX_S 64
#define TL1_UNITS 128
#define TL1_ROWS 32
#define TL1_LDA 136
#define TL1_LDB 72

// The four values rounded to TF32, as floats.
__device__ __forceinline__ float4 tf32_4(float4 v) {
    return make_float4(__uint_as_float(tf32_bits(v.x)), __uint_as_float(tf32_bits(v.y)),
                       __uint_as_float(tf32_bits(v.z)), __uint_as_float(tf32_bits(v.w)));
}

// One step's rows of the block's dz1 columns (4 float4 of dh1 and of h1 a thread: 32
// threads across a row's 128 units, 8 rows apart) and of s (2 float4 a thread: 16 threads
// across a row's 64 columns, 16 rows apart).
struct Tl1Stage {
    float4 dh[4], hv[4], sv[2];
};

__device__ __forceinline__ void tl1_load(Tl1Stage& st, const float* __restrict__ dh1,
                                         const float* __restrict__ h1,
                                         const float* __restrict__ s, unsigned row0,
                                         unsigned r1, unsigned u_base, unsigned H,
                                         unsigned S) {
    const unsigned cz = u_base + 4 * (threadIdx.x & 31), rz = threadIdx.x >> 5;
    const unsigned cs = 4 * (threadIdx.x & 15), rs = threadIdx.x >> 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const unsigned r = row0 + rz + 8 * k;
        const bool on = r < r1 && cz < H;
        st.dh[k] = on ? ld4(dh1 + (size_t)r * H + cz) : zero4();
        st.hv[k] = on ? ld4(h1 + (size_t)r * H + cz) : zero4();
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const unsigned r = row0 + rs + 16 * k;
        st.sv[k] = r < r1 && cs < S ? ld4(s + (size_t)r * S + cs) : zero4();
    }
}

// stepgraph(unsafe): dh1[B * H], h1[B * H], s[B * S],
// stepgraph(unsafe): partials[>= cdiv(B, rows_per_chunk) * (H * S + H)], B > 0, H > 0, S > 0,
// stepgraph(unsafe): H <= TL1_MAX_H, S <= TL1_MAX_S, H % 4 == 0, S % 4 == 0,
// stepgraph(unsafe): rows_per_chunk > 0, rows_per_chunk % TL1_ROWS == 0,
// stepgraph(unsafe): grid = launch((cdiv(B, rows_per_chunk), cdiv(H, TL1_UNITS)), 256)
extern "C" __global__ void __launch_bounds__(256, 2)
    trunk_l1_grad_partial(const float* __restrict__ dh1, const float* __restrict__ h1,
                          const float* __restrict__ s, float* __restrict__ partials,
                          unsigned B, unsigned H, unsigned S, unsigned rows_per_chunk) {
    __shared__ __align__(16) float As[TL1_ROWS][TL1_LDA];
    __shared__ __align__(16) float Bs[TL1_ROWS][TL1_LDB];
    __shared__ float col_part[8][TL1_UNITS];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned g = lane >> 2, t = lane & 3;
    const unsigned r0 = blockIdx.x * rows_per_chunk;
    const unsigned r1 = B - r0 <= rows_per_chunk ? B : r0 + rows_per_chunk;
    const unsigned u_base = TL1_UNITS * blockIdx.y;
    const unsigned cl = 4 * (threadIdx.x & 31), rz = threadIdx.x >> 5;  // local column
    const unsigned cs = 4 * (threadIdx.x & 15), rs = threadIdx.x >> 4;
    const unsigned m0 = 16 * warp;  // the warp's units, local to the block
    const bool warp_on = u_base + m0 < H;
    const unsigned n_tiles = (S + 7) / 8;

    float acc[TL1_MAX_S / 8][4];
#pragma unroll
    for (int nt = 0; nt < TL1_MAX_S / 8; ++nt) {
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    }
    float4 db = zero4();

    Tl1Stage st;
    tl1_load(st, dh1, h1, s, r0, r1, u_base, H, S);
    for (unsigned row0 = r0; row0 < r1; row0 += TL1_ROWS) {
        // Stage this step's rows: the ReLU, db1's sums, TF32 rounding. One 16-byte store
        // a thread: a quarter warp covers the 32 banks.
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float4 d = st.dh[k], hv = st.hv[k];
            const float4 z = make_float4(hv.x > 0.0f ? d.x : 0.0f, hv.y > 0.0f ? d.y : 0.0f,
                                         hv.z > 0.0f ? d.z : 0.0f, hv.w > 0.0f ? d.w : 0.0f);
            db.x += z.x;
            db.y += z.y;
            db.z += z.z;
            db.w += z.w;
            st4(&As[rz + 8 * k][cl], tf32_4(z));
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            if (cs < S) {
                st4(&Bs[rs + 16 * k][cs], tf32_4(st.sv[k]));
            }
        }
        __syncthreads();
        // The next step's rows, in flight while the tensor cores work on these.
        if (row0 + TL1_ROWS < r1) {
            tl1_load(st, dh1, h1, s, row0 + TL1_ROWS, r1, u_base, H, S);
        }
        if (warp_on) {
#pragma unroll
            for (int k0 = 0; k0 < TL1_ROWS; k0 += 8) {
                unsigned a[4];
                a[0] = __float_as_uint(As[k0 + t][m0 + g]);
                a[1] = __float_as_uint(As[k0 + t][m0 + g + 8]);
                a[2] = __float_as_uint(As[k0 + t + 4][m0 + g]);
                a[3] = __float_as_uint(As[k0 + t + 4][m0 + g + 8]);
#pragma unroll
                for (int nt = 0; nt < TL1_MAX_S / 8; ++nt) {
                    if (nt < n_tiles) {
                        const unsigned b0 = __float_as_uint(Bs[k0 + t][8 * nt + g]);
                        const unsigned b1 = __float_as_uint(Bs[k0 + t + 4][8 * nt + g]);
                        mma_tf32(acc[nt], a, b0, b1);
                    }
                }
            }
        }
        __syncthreads();
    }

    float* row = partials + (size_t)blockIdx.x * ((size_t)H * S + H);
    if (warp_on) {
        const unsigned u0 = u_base + m0 + g, u1 = u0 + 8;
#pragma unroll
        for (int nt = 0; nt < TL1_MAX_S / 8; ++nt) {
            const unsigned c = 8 * nt + 2 * t;
            if (u0 < H && c < S) {
                row[(size_t)u0 * S + c] = acc[nt][0];
                row[(size_t)u0 * S + c + 1] = acc[nt][1];
            }
            if (u1 < H && c < S) {
                row[(size_t)u1 * S + c] = acc[nt][2];
                row[(size_t)u1 * S + c + 1] = acc[nt][3];
            }
        }
    }
    st4(&col_part[rz][cl], db);
    __syncthreads();
    if (threadIdx.x < TL1_UNITS && u_base + threadIdx.x < H) {
        const unsigned c = threadIdx.x;
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            v += col_part[k][c];
        }
        row[(size_t)H * S + u_base + c] = v;
    }
}

// Second pass: adds the chunks' partials [chunks, H S + H] column by column, in order, and
// writes dw1[H, S] and db1[H]. Grid: ceil((H S + H) / 32) blocks of (32, 32).
// stepgraph(unsafe): partials[>= chunks * (H * S + H)], dw1[H * S], db1[H],
// stepgraph(unsafe): grid = tiles(cdiv(H * S + H, 32), 1)
extern "C" __global__ void __launch_bounds__(1024)
    trunk_l1_grad_finish(const float* __restrict__ partials, unsigned chunks, unsigned H,
                         unsigned S, float* __restrict__ dw1, float* __restrict__ db1) {
    const unsigned hs = H * S, cols = hs + H;
    const unsigned j = blockIdx.x * 32 + threadIdx.x;
    const float v = column_block_sum(partials, 0, chunks, cols, j);
    if (threadIdx.y == 0 && j < cols) {
        if (j < hs) {
            dw1[j] = v;
        } else {
            db1[j - hs] = v;
        }
    }
}
