// The DQN step's head kernels (examples/dqn/MODEL.md): the branches' GLU, the double-DQN
// target, the dueling losses (TD, CQL, branch agreement) fused with their gradients, the
// IQL expectile loss, and the trunk's gradient join.
//
// Layouts are row-major: [B, X] puts row b at offset b * X; the D branches' tensors are
// packed as [D, B, X]. Every kernel takes its sizes as arguments and is launched by a
// wrapper in lib.rs that checks buffer lengths against them first.

#include "dqn_common.cuh"

__device__ __forceinline__ float sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

// GLU, forward: g[r, k] = u[r, k] * sigmoid(u[r, G + k]) for r < rows, k < G; u is
// [rows, 2G], g is [rows, G], n = rows * G. The D branches packed as [D, B, 2G] are
// rows = D * B. Grid: one thread per element of g, ceil(n / 256) blocks of 256.
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

// Double-DQN target. For each sample b and branch d, with the dueling head
//   q'[a] = (v2[b] + adv2[d, b, a]) - mean_a adv2[d, b, .]     (online net on s2)
//   q-[a] = (vt[b] + advt[d, b, a]) - mean_a advt[d, b, .]     (target net on s2)
//   a*    = the first a with the largest q'[a]
//   y[b, d] = r[b] + gamma * (1 - done[b]) * q-[a*],    ybar[b] = mean_d y[b, d].
// v2, vt, r, done, ybar: [B]; adv2, advt: D arrays [B, A], one per branch; y: [B, D].
// No gradient flows here.
// Grid: one thread per sample, ceil(B / 256) blocks of 256.
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
