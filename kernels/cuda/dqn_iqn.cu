// The DQN step's IQN head (examples/dqn/MODEL.md): the cosine quantile features, and the
// quantile Huber loss fused with every gradient of the head that is not a GEMM.
//
// Between the two a cuBLASLt GEMM computes phi = relu(cosf wphi^T + bphi), [B N, H]; after
// them GEMMs compute dwphi = dphi_pre^T cosf (dbphi comes out of iqn_forward_backward,
// or from a bias-gradient epilogue). The [B N, H] tensors are the largest of the step
// (134M elements at the default sizes), so the fused kernel reads phi once and writes
// dphi_pre once, and never materialises h * phi.

#include "dqn_common.cuh"

// cosf[r, i] = cos(pi (i + 1) tau[r]) for r < rows (= B N), i < C; tau is [B, N] read as
// [rows], cosf is [rows, C], n = rows * C. Grid: one thread per 4 consecutive elements,
// ceil(n / 1024) blocks of 256; with C % 4 == 0 the 4 share a row and are stored as one
// 16-byte write.
extern "C" __global__ void __launch_bounds__(256)
    iqn_cos_features(const float* __restrict__ tau, float* __restrict__ cosf, unsigned rows,
                     unsigned C) {
    const size_t n = (size_t)rows * C;
    const size_t i0 = (size_t)global_index() * 4;
    if (i0 >= n) {
        return;
    }
    if ((C & 3) == 0) {
        const unsigned r = (unsigned)(i0 / C), k = (unsigned)(i0 - (size_t)r * C);
        const float t = tau[r];
        float4 o;
        o.x = cospif((float)(k + 1) * t);
        o.y = cospif((float)(k + 2) * t);
        o.z = cospif((float)(k + 3) * t);
        o.w = cospif((float)(k + 4) * t);
        st4(cosf + i0, o);
    } else {
        for (unsigned e = 0; e < 4; ++e) {
            const size_t i = i0 + e;
            if (i >= n) {
                break;
            }
            const unsigned r = (unsigned)(i / C), k = (unsigned)(i - (size_t)r * C);
            cosf[i] = cospif((float)(k + 1) * tau[r]);
        }
    }
}

// The fused IQN head, forward and backward. For sample b, quantile j, hidden unit h
// (rows of phi and dphi_pre are b N + j):
//   zq[b, j]  = sum_h h[b, h] phi[b, j, h] wq[h] + bq
//   u         = ybar[b] - zq[b, j],  w = |tau[b, j] - 1(u < 0)|
//   L_iqn     = mean_{b,j} w huber(u)
//   dzq[b, j] = coef dL_iqn/dzq = -coef w huber'(u) / (B N)
//   dphi_pre[b, j, h] = dzq wq[h] h[b, h] (phi[b, j, h] > 0)   (the ReLU's backward: the
//                       gradient of phi's pre-activation, for dwphi and dbphi)
//   dh[b, h]  = wq[h] S[b, h],   S[b, h] = sum_j dzq[b, j] phi[b, j, h]   (written)
//   dwq[h]    = sum_b h[b, h] S[b, h],   dbphi[h] = sum_{b,j} dphi_pre[b, j, h],
//   dbq       = sum_{b,j} dzq[b, j]
// The three sums over the batch are two-pass and deterministic: this kernel writes one
// partial row per block, partials[blockIdx.x, 2H + 2] = [dwq (H) | dbphi (H) | dbq | sum of
// w huber(u)], each a fixed-order sum; iqn_finish adds the rows in order.

// Warps per block of the vector kernels; each warp owns whole samples.
#define IQN_WARPS 8

// Vector kernel: H % 4 == 0 and H <= 128 * VPL. Lane l owns columns 4 (32 k + l) .. + 3 for
// k < VPL, so a warp reads a row of phi as VPL coalesced 512-byte loads. A warp takes the
// samples b = warp_id, warp_id + all warps, ...; for each it loads R rows of phi (R * VPL
// independent 16-byte loads per lane in flight), reduces each row's dot product across the
// warp (every lane gets the same bits), and writes dphi_pre straight from the registers that
// hold phi. S and the sample's dbphi accumulate in registers; after each sample the warp
// adds h S and dbphi into its own slice of shared memory. At the end the block adds its 8
// warps' slices in warp order into its partial row.
template <int VPL, int R>
__device__ __forceinline__ void iqn_forward_backward_vec(
    const float* __restrict__ h, const float* __restrict__ phi, const float* __restrict__ wq,
    const float* __restrict__ bq, const float* __restrict__ ybar, const float* __restrict__ tau,
    float* __restrict__ dphi_pre, float* __restrict__ dh, float* __restrict__ partials,
    unsigned B, unsigned N, unsigned H, float coef) {
    // Per warp: [0] dwq, [1] dbphi, as float4 (32 k + lane) = columns col[k] .. col[k] + 3.
    __shared__ float4 acc[IQN_WARPS][2][32 * VPL];
    __shared__ float acc_dbq[IQN_WARPS], acc_loss[IQN_WARPS];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float scale = coef / ((float)B * (float)N);
    const float bq0 = bq[0];
    unsigned col[VPL];
    bool on[VPL];
    float4 wq4[VPL];
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
        col[k] = 4 * (32 * k + lane);
        on[k] = col[k] < H;
        wq4[k] = on[k] ? ld4(wq + col[k]) : zero4();
        acc[warp][0][32 * k + lane] = zero4();
        acc[warp][1][32 * k + lane] = zero4();
    }
    float dbq = 0.0f, loss = 0.0f;

    for (unsigned b = blockIdx.x * IQN_WARPS + warp; b < B; b += gridDim.x * IQN_WARPS) {
        float4 hw4[VPL], s4[VPL], g4[VPL];
        const float* hb = h + (size_t)b * H;
#pragma unroll
        for (int k = 0; k < VPL; ++k) {
            const float4 h4 = on[k] ? ld4(hb + col[k]) : zero4();
            hw4[k] = make_float4(h4.x * wq4[k].x, h4.y * wq4[k].y, h4.z * wq4[k].z,
                                 h4.w * wq4[k].w);
            s4[k] = zero4();
            g4[k] = zero4();
        }
        const float yb = ybar[b];
        const float* phib = phi + (size_t)b * N * H;
        float* dpb = dphi_pre + (size_t)b * N * H;
        const float* taub = tau + (size_t)b * N;

        for (unsigned j0 = 0; j0 < N; j0 += R) {
            float4 p[R][VPL];
            float t[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const bool row_on = j0 + r < N;
                t[r] = row_on ? taub[j0 + r] : 0.0f;
#pragma unroll
                for (int k = 0; k < VPL; ++k) {
                    p[r][k] = row_on && on[k] ? ld4_stream(phib + (size_t)(j0 + r) * H + col[k])
                                              : zero4();
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float dot = 0.0f;
#pragma unroll
                for (int k = 0; k < VPL; ++k) {
                    dot = fmaf(p[r][k].x, hw4[k].x, dot);
                    dot = fmaf(p[r][k].y, hw4[k].y, dot);
                    dot = fmaf(p[r][k].z, hw4[k].z, dot);
                    dot = fmaf(p[r][k].w, hw4[k].w, dot);
                }
                dot = warp_sum(dot);
                if (j0 + r < N) {  // uniform across the warp
                    const float u = yb - (dot + bq0);
                    const float w = fabsf(t[r] - (u < 0.0f ? 1.0f : 0.0f));
                    loss += w * huber(u);
                    const float dz = -scale * w * huber_grad(u);
                    dbq += dz;
                    float* drow = dpb + (size_t)(j0 + r) * H;
#pragma unroll
                    for (int k = 0; k < VPL; ++k) {
                        if (on[k]) {
                            const float4 q = p[r][k];
                            float4 g;
                            g.x = q.x > 0.0f ? dz * hw4[k].x : 0.0f;
                            g.y = q.y > 0.0f ? dz * hw4[k].y : 0.0f;
                            g.z = q.z > 0.0f ? dz * hw4[k].z : 0.0f;
                            g.w = q.w > 0.0f ? dz * hw4[k].w : 0.0f;
                            st4(drow + col[k], g);
                            g4[k].x += g.x;
                            g4[k].y += g.y;
                            g4[k].z += g.z;
                            g4[k].w += g.w;
                            s4[k].x = fmaf(dz, q.x, s4[k].x);
                            s4[k].y = fmaf(dz, q.y, s4[k].y);
                            s4[k].z = fmaf(dz, q.z, s4[k].z);
                            s4[k].w = fmaf(dz, q.w, s4[k].w);
                        }
                    }
                }
            }
        }
        float* dhb = dh + (size_t)b * H;
#pragma unroll
        for (int k = 0; k < VPL; ++k) {
            if (on[k]) {
                st4(dhb + col[k], make_float4(wq4[k].x * s4[k].x, wq4[k].y * s4[k].y,
                                              wq4[k].z * s4[k].z, wq4[k].w * s4[k].w));
                const float4 h4 = ld4(hb + col[k]);  // in L1 since the top of the sample
                float4& aw = acc[warp][0][32 * k + lane];
                float4& ab = acc[warp][1][32 * k + lane];
                aw.x = fmaf(h4.x, s4[k].x, aw.x);
                aw.y = fmaf(h4.y, s4[k].y, aw.y);
                aw.z = fmaf(h4.z, s4[k].z, aw.z);
                aw.w = fmaf(h4.w, s4[k].w, aw.w);
                ab.x += g4[k].x;
                ab.y += g4[k].y;
                ab.z += g4[k].z;
                ab.w += g4[k].w;
            }
        }
    }
    if (lane == 0) {
        acc_dbq[warp] = dbq;
        acc_loss[warp] = loss;
    }
    __syncthreads();

    // The block's partial row: each entry the sum of the 8 warps' values in warp order.
    float* row = partials + (size_t)blockIdx.x * (2 * H + 2);
    for (unsigned c = threadIdx.x; c < 2 * H + 2; c += blockDim.x) {
        float s = 0.0f;
        if (c < 2 * H) {
            const unsigned part = c < H ? 0 : 1, hc = c - part * H;
#pragma unroll
            for (int w = 0; w < IQN_WARPS; ++w) {
                s += reinterpret_cast<const float*>(acc[w][part])[hc];
            }
        } else {
            const float* src = c == 2 * H ? acc_dbq : acc_loss;
#pragma unroll
            for (int w = 0; w < IQN_WARPS; ++w) {
                s += src[w];
            }
        }
        row[c] = s;
    }
}

// Grid: min(ceil(B / 8), IQN_BLOCKS) blocks of 256 (8 warps; IQN_BLOCKS is in lib.rs);
// partials holds gridDim.x rows. H % 4 == 0, H <= 256. Two blocks fit on an SM (registers).
extern "C" __global__ void __launch_bounds__(256, 2)
    iqn_forward_backward_v2(const float* __restrict__ h, const float* __restrict__ phi,
                            const float* __restrict__ wq, const float* __restrict__ bq,
                            const float* __restrict__ ybar, const float* __restrict__ tau,
                            float* __restrict__ dphi_pre, float* __restrict__ dh,
                            float* __restrict__ partials, unsigned B, unsigned N, unsigned H,
                            float coef) {
    iqn_forward_backward_vec<2, 4>(h, phi, wq, bq, ybar, tau, dphi_pre, dh, partials, B, N, H,
                                   coef);
}

// As iqn_forward_backward_v2, for H % 4 == 0, 256 < H <= 512.
extern "C" __global__ void __launch_bounds__(256, 2)
    iqn_forward_backward_v4(const float* __restrict__ h, const float* __restrict__ phi,
                            const float* __restrict__ wq, const float* __restrict__ bq,
                            const float* __restrict__ ybar, const float* __restrict__ tau,
                            float* __restrict__ dphi_pre, float* __restrict__ dh,
                            float* __restrict__ partials, unsigned B, unsigned N, unsigned H,
                            float coef) {
    iqn_forward_backward_vec<4, 2>(h, phi, wq, bq, ybar, tau, dphi_pre, dh, partials, B, N, H,
                                   coef);
}

// Any H (the fallback when H % 4 != 0 or H > 512; slower). One warp per block; the block
// takes samples b = blockIdx.x, + gridDim.x, ... Per sample: pass 1 computes dzq for every
// row into shared memory (N floats, dynamic); pass 2 walks 32-column strips, each lane one
// column, over all rows, re-reading phi (from cache). The lane that owns column c owns
// entries c and H + c of the block's partial row and accumulates them in place.
// Grid: min(B, IQN_BLOCKS) blocks of 32, N * 4 bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(32)
    iqn_forward_backward_generic(const float* __restrict__ h, const float* __restrict__ phi,
                                 const float* __restrict__ wq, const float* __restrict__ bq,
                                 const float* __restrict__ ybar, const float* __restrict__ tau,
                                 float* __restrict__ dphi_pre, float* __restrict__ dh,
                                 float* __restrict__ partials, unsigned B, unsigned N, unsigned H,
                                 float coef) {
    extern __shared__ float dz_row[];
    const unsigned lane = threadIdx.x;
    const float scale = coef / ((float)B * (float)N);
    const float bq0 = bq[0];
    float* row = partials + (size_t)blockIdx.x * (2 * H + 2);
    for (unsigned c = lane; c < H; c += 32) {
        row[c] = 0.0f;
        row[H + c] = 0.0f;
    }
    float dbq = 0.0f, loss = 0.0f;
    for (unsigned b = blockIdx.x; b < B; b += gridDim.x) {
        const float* hb = h + (size_t)b * H;
        const float* phib = phi + (size_t)b * N * H;
        float* dpb = dphi_pre + (size_t)b * N * H;
        const float yb = ybar[b];
        for (unsigned j = 0; j < N; ++j) {
            const float* pr = phib + (size_t)j * H;
            float dot = 0.0f;
            for (unsigned c = lane; c < H; c += 32) {
                dot = fmaf(pr[c], hb[c] * wq[c], dot);
            }
            dot = warp_sum(dot);
            const float u = yb - (dot + bq0);
            const float w = fabsf(tau[(size_t)b * N + j] - (u < 0.0f ? 1.0f : 0.0f));
            loss += w * huber(u);
            const float dz = -scale * w * huber_grad(u);
            dbq += dz;
            if (lane == 0) {
                dz_row[j] = dz;
            }
        }
        __syncwarp();
        for (unsigned c = lane; c < H; c += 32) {
            const float hc = hb[c], hwc = hc * wq[c];
            float s = 0.0f, gsum = 0.0f;
            for (unsigned j = 0; j < N; ++j) {
                const float q = phib[(size_t)j * H + c];
                const float dz = dz_row[j];
                const float g = q > 0.0f ? dz * hwc : 0.0f;
                dpb[(size_t)j * H + c] = g;
                gsum += g;
                s = fmaf(dz, q, s);
            }
            dh[(size_t)b * H + c] = wq[c] * s;
            row[c] = fmaf(hc, s, row[c]);
            row[H + c] += gsum;
        }
        __syncwarp();  // dz_row is rewritten by the next sample
    }
    if (lane == 0) {
        row[2 * H] = dbq;
        row[2 * H + 1] = loss;
    }
}

// Finishes iqn_forward_backward: adds the `rows` partial rows of [rows, 2H + 2] in order and
// writes dwq[H], dbphi[H], dbq[0]; adds L_iqn = (loss sum) / (B N) into losses[LOSS_IQN]
// and coef * L_iqn into losses[LOSS_TOTAL] (one atomicAdd each: the slot's value is
// deterministic as long as nothing else writes it).
// Grid: ceil((2H + 2) / 32) blocks of (32, 32) threads.
extern "C" __global__ void __launch_bounds__(1024)
    iqn_finish(const float* __restrict__ partials, unsigned rows, unsigned H,
               float* __restrict__ dwq, float* __restrict__ dbphi, float* __restrict__ dbq,
               float* __restrict__ losses, unsigned B, unsigned N, float coef) {
    const unsigned cols = 2 * H + 2;
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const float s = column_block_sum(partials, 0, rows, cols, c);
    if (threadIdx.y != 0 || c >= cols) {
        return;
    }
    if (c < H) {
        dwq[c] = s;
    } else if (c < 2 * H) {
        dbphi[c - H] = s;
    } else if (c == 2 * H) {
        dbq[0] = s;
    } else {
        const float l = s / ((float)B * (float)N);
        atomicAdd(&losses[LOSS_IQN], l);
        atomicAdd(&losses[LOSS_TOTAL], coef * l);
    }
}
