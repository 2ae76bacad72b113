// The DQN step's IQN head (examples/dqn/MODEL.md): the cosine quantile features, and the
// quantile Huber loss fused with every gradient of the head that is not a GEMM.
//
// Between the two a cuBLASLt GEMM computes phi = relu(cosf wphi^T + bphi), [B N, H]; after
// them GEMMs compute dwphi = dphi_pre^T cosf (dbphi comes out of iqn_forward_backward,
// or from a bias-gradient epilogue). The [B N, H] tensors are the largest of the step
// (134M elements at the default sizes), so the fused kernel reads phi once and writes
// dphi_pre once, and never materialises h * phi. Below them, the whole head in one kernel
// twice over: iqn_fused (mma.sync, any size) and iqn_wgmma (Hopper's wgmma, the step's
// sizes), which keep phi and dphi_pre on chip.

#include "dqn.cuh"

// cosf[r, i] = cos(pi (i + 1) tau[r]) for r < rows (= B N), i < C; tau is [B, N] read as
// [rows], cosf is [rows, C], n = rows * C. Grid: one thread per 4 consecutive elements,
// ceil(n / 1024) blocks of 256; with C % 4 == 0 the 4 share a row and are stored as one
// 16-byte write.
// stepgraph(unsafe): tau[rows], cosf[rows * C], C > 0, grid = elementwise(cdiv(rows * C, 4))
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
                    const float w = asymmetric_weight(t[r], u);
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
            const float w = asymmetric_weight(tau[(size_t)b * N + j], u);
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

// Column c of the IQN head's summed partial row [dwq (H) | dbphi (H) | dbq | loss sum]:
// writes dwq[c], dbphi[c - H] or dbq[0]; for the loss, adds L_iqn = (loss sum) / (B N)
// into losses[LOSS_IQN] and coef * L_iqn into losses[LOSS_TOTAL] (one atomicAdd each: the
// slot's value is deterministic as long as nothing else writes it).
__device__ __forceinline__ void iqn_finish_column(unsigned c, float s, unsigned H,
                                                  float* __restrict__ dwq,
                                                  float* __restrict__ dbphi,
                                                  float* __restrict__ dbq,
                                                  float* __restrict__ losses, unsigned B,
                                                  unsigned N, float coef) {
    if (c < H) {
        dwq[c] = s;
    } else if (c < 2 * H) {
        dbphi[c - H] = s;
    } else if (c == 2 * H) {
        dbq[0] = s;
    } else {
        const float l = s / ((float)B * (float)N);
        add_loss_term(losses, LOSS_IQN, l, coef);
    }
}

// Finishes iqn_forward_backward: adds the `rows` partial rows of [rows, 2H + 2] in order and
// writes them out as iqn_finish_column says.
// Grid: ceil((2H + 2) / 32) blocks of (32, 32) threads.
// stepgraph(unsafe): partials[>= rows * (2 * H + 2)], dwq[H], dbphi[H], dbq[1],
// stepgraph(unsafe): losses[LOSS_SLOT_COUNT],
// stepgraph(unsafe): grid = tiles(cdiv(2 * H + 2, 32), 1)
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
    iqn_finish_column(c, s, H, dwq, dbphi, dbq, losses, B, N, coef);
}

// ---- The whole head in one kernel: phi, dphi_pre and cosf never reach memory ----
//
// iqn_fused computes what iqn_cos_features, the phi GEMM, iqn_forward_backward and the dwphi
// GEMM compute together: cosf, phi = relu(cosf wphi^T + bphi), the loss and every gradient
// above, and dwphi = dphi_pre^T cosf. The [B N, H] tensors were 2.1 GB of traffic at the
// default sizes; here they live in registers for one tile of 32 quantiles. Both products
// run on the tensor cores in TF32 (mma.sync m16n8k8, operands rounded by cvt.rna), the
// precision of the cuBLASLt path it replaces.
//
// Sizes: 1 <= H <= 256 (IQN_FUSED_MAX_WARPS warps of 16 hidden units), 1 <= C <= 64
// (IQN_FUSED_C; features past C are zeros), any N (tiles of 32 quantiles, the last one
// masked), any B.
//
// Work split. A block has ceil(H / 16) warps; warp w owns hidden units 16w .. 16w + 15 for
// the whole launch and keeps in registers its rows of wphi (GEMM 1's A fragments, loaded
// once) and its rows of the dwphi sum (GEMM 2's accumulators, written once at the end).
// The block walks samples b = blockIdx.x, + gridDim.x, ..., each in tiles of 32 quantiles:
//   1. the block computes cosf for the tile (4 values a thread at H = 256) and stores it
//      TF32-rounded twice in shared memory: quantile-major for GEMM 1 (cos_q[j][c]) and
//      feature-major for GEMM 2 (cos_t[c][j]). Barrier.
//   2. GEMM 1, per warp: phi^T [16 units, 32 quantiles] = wphi_w [16, 64] cosf^T [64, 32],
//      bphi as the accumulators' initial value, then the ReLU. The warp's 16-unit part of
//      each zq is reduced over the lanes into zq_part[warp]. Barrier.
//   3. every warp adds the parts of zq for quantile j = lane (in warp order: the same bits
//      in every warp) and computes u, the weight and dz itself, which costs less than
//      another barrier; shuffles hand each lane the dz of its quantiles. dphi_pre is formed
//      in registers, S and dbphi accumulate, and GEMM 2 adds
//      dwphi_w [16, 64] += dphi_pre^T [16 units, 32 quantiles] cosf [32, 64].
// The feature buffers are double-buffered, so the next tile's features may be written
// while slower warps still read this tile's in GEMM 2; zq_part is single: the next write
// to it comes after the next tile's first barrier, which every reader of it has passed.
//
// Fragments of mma.m16n8k8 .tf32 (PTX ISA; g = lane / 4, t = lane % 4, (row, column)):
//   A (16 x 8): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
//   B (8 x 8):  b0 (t, g), b1 (t + 4, g)       (b0, b1 must be a register pair)
//   C (16 x 8): c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1)
// A product may visit its k in any order as long as A and B agree, and may number its
// output columns in any order as long as they are read back the same way. Both freedoms
// are used so that every B pair is half of one conflict-free 16-byte shared load (no
// register moves) and GEMM 1's accumulators are GEMM 2's A fragments with no exchange
// between lanes:
//   GEMM 1, k-chunk kc = 2 kk + s: k = t is feature 16 kk + 4t + 2s, k = t + 4 the next
//           one; n-tile nt: column n is quantile 4n + nt. A lane thus holds phi for units
//           g and g + 8 of its warp and quantiles 8t + nt (c0, c2), 8t + 4 + nt (c1, c3):
//           all of 8t .. 8t + 7 over the four n-tiles. Its B pairs for (kk, nt) are one
//           16-byte load, cos_q[4g + nt][16 kk + 4t ..].
//   GEMM 2, k-chunk kc2: k = t is quantile 8t + 2 kc2, k = t + 4 the next one, both held
//           by the lane; n-tile nt2: column n is feature 8 nt2 + n. Its B pairs for nt2
//           are two 16-byte loads, cos_t[8 nt2 + g][8t ..] and [8t + 4 ..].
// Row strides: 68 floats for cos_q and 36 for cos_t (both 4 mod 32 banks), so each quarter
// warp's 16-byte loads cover the 32 banks once.
//
// Output: dh[B, H] directly; per block one partial row of
// [dwq (H) | dbphi (H) | dbq | loss sum | dwphi (H C)], each entry a fixed-order sum, which
// iqn_fused_finish adds in block order. Deterministic for given sizes.

// Most warps per block (H <= 16 * IQN_FUSED_MAX_WARPS); mirrored in lib.rs.
#define IQN_FUSED_MAX_WARPS 16
// Cosine features the kernel computes with (C <= IQN_FUSED_C, zero-padded); in lib.rs.
#define IQN_FUSED_C 64
// Quantiles per tile.
#define IQN_FUSED_Q 32
// Row strides of cos_q and cos_t, in floats.
#define IQN_FUSED_LDQ 68
#define IQN_FUSED_LDT 36

__device__ __forceinline__ uint4 lds4(const float* p) {
    return *reinterpret_cast<const uint4*>(p);
}

// Grid: min(B, sms x blocks per SM) blocks of 32 ceil(H / 16) threads (kernels.rs);
// partials holds gridDim.x rows of 2H + 2 + H C. One block of 16 warps per SM at H = 256
// (registers: 128 a thread).
extern "C" __global__ void __launch_bounds__(32 * IQN_FUSED_MAX_WARPS, 1)
    iqn_fused(const float* __restrict__ h, const float* __restrict__ tau,
              const float* __restrict__ ybar, const float* __restrict__ wphi,
              const float* __restrict__ bphi, const float* __restrict__ wq,
              const float* __restrict__ bq, float* __restrict__ dh,
              float* __restrict__ partials, unsigned B, unsigned N, unsigned H, unsigned C,
              float coef) {
    __shared__ __align__(16) float cos_q[2][IQN_FUSED_Q][IQN_FUSED_LDQ];
    __shared__ __align__(16) float cos_t[2][IQN_FUSED_C][IQN_FUSED_LDT];
    __shared__ float zq_part[IQN_FUSED_MAX_WARPS][IQN_FUSED_Q];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const unsigned g = lane >> 2, t = lane & 3;
    // The lane's two hidden units (rows g and g + 8 of its warp's tiles).
    const unsigned u0 = 16 * warp + g, u1 = u0 + 8;
    const bool on0 = u0 < H, on1 = u1 < H;
    const float scale = coef / ((float)B * (float)N);
    const float bq0 = bq[0];
    const float wq0 = on0 ? wq[u0] : 0.0f, wq1 = on1 ? wq[u1] : 0.0f;
    const float bphi0 = on0 ? bphi[u0] : 0.0f, bphi1 = on1 ? bphi[u1] : 0.0f;

    // GEMM 1's A fragments: the warp's rows of wphi, zero past H and past C.
    unsigned wa[IQN_FUSED_C / 8][4];
#pragma unroll
    for (int kc = 0; kc < IQN_FUSED_C / 8; ++kc) {
        const unsigned c = 16 * (kc >> 1) + 4 * t + 2 * (kc & 1);
        const float* r0 = wphi + (size_t)u0 * C;
        const float* r1 = wphi + (size_t)u1 * C;
        wa[kc][0] = tf32_bits(on0 && c < C ? r0[c] : 0.0f);
        wa[kc][1] = tf32_bits(on1 && c < C ? r1[c] : 0.0f);
        wa[kc][2] = tf32_bits(on0 && c + 1 < C ? r0[c + 1] : 0.0f);
        wa[kc][3] = tf32_bits(on1 && c + 1 < C ? r1[c + 1] : 0.0f);
    }
    // GEMM 2's accumulators: dwphi[u0 or u1][8 nt2 + 2t (+ 1)] for n-tile nt2.
    float dw[IQN_FUSED_C / 8][4];
#pragma unroll
    for (int nt = 0; nt < IQN_FUSED_C / 8; ++nt) {
        dw[nt][0] = dw[nt][1] = dw[nt][2] = dw[nt][3] = 0.0f;
    }
    // Lane partials: S of the current sample, dbphi and dwq over the block's samples (for
    // units u0, u1, over the lane's quantiles); loss and dbq for quantile lane (warp 0).
    float s0 = 0.0f, s1 = 0.0f, db0 = 0.0f, db1 = 0.0f, dwq0 = 0.0f, dwq1 = 0.0f;
    float loss = 0.0f, dbq = 0.0f;

    const unsigned tiles = (N + IQN_FUSED_Q - 1) / IQN_FUSED_Q;  // per sample
    // tau is loaded one tile ahead: cosf needs it right away, and the load's latency would
    // stall the whole block before its first barrier. h and ybar are needed only after
    // GEMM 1, which hides their latency.
    float tau_next = 0.0f;
    unsigned b = blockIdx.x, tile = 0, buf = 0;
    if (b < B) {
        tau_next = lane < N ? tau[(size_t)b * N + lane] : 0.0f;
    }
    while (b < B) {  // uniform across the block: the barriers inside are safe
        const float tau_j = tau_next;
        const float yb = ybar[b];
        const float h0 = on0 ? h[(size_t)b * H + u0] : 0.0f;
        const float h1 = on1 ? h[(size_t)b * H + u1] : 0.0f;
        const unsigned rows = min(N - IQN_FUSED_Q * tile, (unsigned)IQN_FUSED_Q);
        unsigned next_b = b, next_tile = tile + 1;
        if (next_tile == tiles) {
            next_tile = 0;
            next_b = b + gridDim.x;
        }
        if (next_b < B) {
            const unsigned j = IQN_FUSED_Q * next_tile + lane;
            tau_next = j < N ? tau[(size_t)next_b * N + j] : 0.0f;
        }

        // 1. cosf, exactly as iqn_cos_features computes it, then rounded for the GEMMs. A
        // warp fills 8 x 8 blocks (quantiles j0 .. j0 + 7, features c0 .. c0 + 7) half a block
        // per store: lane (m = lane / 4, a = lane % 4) takes quantile j0 + m and feature
        // c0 + (2a + m + half) % 8, which puts the 32 lanes on 32 distinct banks in both
        // layouts (a warp storing one feature for 32 quantiles would hit 8 banks of cos_q).
        float(*cq)[IQN_FUSED_LDQ] = cos_q[buf];
        float(*ct)[IQN_FUSED_LDT] = cos_t[buf];
        for (unsigned blk = warp; blk < (IQN_FUSED_Q / 8) * (IQN_FUSED_C / 8); blk += warps) {
            const unsigned j = 8 * (blk % (IQN_FUSED_Q / 8)) + (lane >> 2);
            const float tj = __shfl_sync(FULL_MASK, tau_j, j);  // lane j holds tau of j
#pragma unroll
            for (unsigned half = 0; half < 2; ++half) {
                const unsigned c =
                    8 * (blk / (IQN_FUSED_Q / 8)) + ((2 * (lane & 3) + (lane >> 2) + half) & 7);
                const float v = j < rows && c < C ? cospif((float)(c + 1) * tj) : 0.0f;
                const float r = __uint_as_float(tf32_bits(v));
                cq[j][c] = r;
                ct[c][j] = r;
            }
        }
        __syncthreads();

        // 2. phi^T for the warp's 16 units and the tile's 32 quantiles.
        float acc[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            acc[nt][0] = acc[nt][1] = bphi0;
            acc[nt][2] = acc[nt][3] = bphi1;
        }
#pragma unroll
        for (int kk = 0; kk < IQN_FUSED_C / 16; ++kk) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const uint4 q = lds4(&cq[4 * g + nt][16 * kk + 4 * t]);
                mma_tf32(acc[nt], wa[2 * kk], q.x, q.y);
                mma_tf32(acc[nt], wa[2 * kk + 1], q.z, q.w);
            }
        }
        // phi of unit u0 (p0) and u1 (p1) for quantile 8t + i.
        float p0[8], p1[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            p0[i] = fmaxf(acc[i & 3][i >> 2], 0.0f);
            p1[i] = fmaxf(acc[i & 3][2 + (i >> 2)], 0.0f);
        }
        const float hw0 = h0 * wq0, hw1 = h1 * wq1;
        // The warp's part of zq, reduced over the 8 lanes that share t and scattered as it
        // goes (halving exchanges): lane (g, t) ends with quantile 8t + g.
        float zp[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            zp[i] = fmaf(hw1, p1[i], hw0 * p0[i]);
        }
        reduce_scatter8(zp, lane);  // over g's three bits
        zq_part[warp][8 * t + g] = zp[0];
        __syncthreads();

        // 3. dz for quantile IQN_FUSED_Q tile + lane; 0 past N, which masks the padding.
        float zq = 0.0f;
        for (unsigned w = 0; w < warps; ++w) {
            zq += zq_part[w][lane];
        }
        const float u = yb - (zq + bq0);
        const float wgt = asymmetric_weight(tau_j, u);
        const bool live = lane < rows;
        const float dz = live ? -scale * wgt * huber_grad(u) : 0.0f;
        if (warp == 0 && live) {
            loss += wgt * huber(u);
            dbq += dz;
        }
        // dphi_pre = dz wq h (phi > 0) for quantile 8t + i, as GEMM 2's A fragments.
        unsigned pa[4][4];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float d = __shfl_sync(FULL_MASK, dz, 8 * t + i);
            const float g0 = p0[i] > 0.0f ? d * hw0 : 0.0f;
            const float g1 = p1[i] > 0.0f ? d * hw1 : 0.0f;
            s0 = fmaf(d, p0[i], s0);
            s1 = fmaf(d, p1[i], s1);
            db0 += g0;
            db1 += g1;
            pa[i >> 1][2 * (i & 1)] = tf32_bits(g0);
            pa[i >> 1][2 * (i & 1) + 1] = tf32_bits(g1);
        }
#pragma unroll
        for (int nt2 = 0; nt2 < IQN_FUSED_C / 8; ++nt2) {
            const uint4 lo = lds4(&ct[8 * nt2 + g][8 * t]);
            const uint4 hi = lds4(&ct[8 * nt2 + g][8 * t + 4]);
            mma_tf32(dw[nt2], pa[0], lo.x, lo.y);
            mma_tf32(dw[nt2], pa[1], lo.z, lo.w);
            mma_tf32(dw[nt2], pa[2], hi.x, hi.y);
            mma_tf32(dw[nt2], pa[3], hi.z, hi.w);
        }

        if (next_tile == 0) {  // the sample's last tile: S is complete
            s0 += __shfl_xor_sync(FULL_MASK, s0, 1);
            s0 += __shfl_xor_sync(FULL_MASK, s0, 2);
            s1 += __shfl_xor_sync(FULL_MASK, s1, 1);
            s1 += __shfl_xor_sync(FULL_MASK, s1, 2);
            if (t == 0) {
                if (on0) {
                    dh[(size_t)b * H + u0] = wq0 * s0;
                }
                if (on1) {
                    dh[(size_t)b * H + u1] = wq1 * s1;
                }
            }
            dwq0 = fmaf(h0, s0, dwq0);
            dwq1 = fmaf(h1, s1, dwq1);
            s0 = 0.0f;
            s1 = 0.0f;
        }
        b = next_b;
        tile = next_tile;
        buf ^= 1;
    }

    // The block's partial row. dwq is the same in the 4 lanes of a unit (S was reduced
    // before it); dbphi is reduced over them here.
    db0 += __shfl_xor_sync(FULL_MASK, db0, 1);
    db0 += __shfl_xor_sync(FULL_MASK, db0, 2);
    db1 += __shfl_xor_sync(FULL_MASK, db1, 1);
    db1 += __shfl_xor_sync(FULL_MASK, db1, 2);
    float* row = partials + (size_t)blockIdx.x * (2 * H + 2 + (size_t)H * C);
    if (t == 0) {
        if (on0) {
            row[u0] = dwq0;
            row[H + u0] = db0;
        }
        if (on1) {
            row[u1] = dwq1;
            row[H + u1] = db1;
        }
    }
    if (warp == 0) {
        loss = warp_sum(loss);
        dbq = warp_sum(dbq);
        if (lane == 0) {
            row[2 * H] = dbq;
            row[2 * H + 1] = loss;
        }
    }
    float* dwr = row + 2 * H + 2;
#pragma unroll
    for (int nt2 = 0; nt2 < IQN_FUSED_C / 8; ++nt2) {
        const unsigned c = 8 * nt2 + 2 * t;
        if (on0 && c < C) {
            dwr[(size_t)u0 * C + c] = dw[nt2][0];
        }
        if (on0 && c + 1 < C) {
            dwr[(size_t)u0 * C + c + 1] = dw[nt2][1];
        }
        if (on1 && c < C) {
            dwr[(size_t)u1 * C + c] = dw[nt2][2];
        }
        if (on1 && c + 1 < C) {
            dwr[(size_t)u1 * C + c + 1] = dw[nt2][3];
        }
    }
}

// Finishes iqn_fused: adds the `rows` partial rows of [rows, 2H + 2 + H C] in order; the
// first 2H + 2 columns go out as in iqn_finish, the rest is dwphi[H, C] (written).
// Grid: ceil((2H + 2 + H C) / 32) blocks of (32, 32) threads.
// stepgraph(unsafe): partials[>= rows * (2 * H + 2 + H * C)], dwphi[H * C], dwq[H], dbphi[H],
// stepgraph(unsafe): dbq[1], losses[LOSS_SLOT_COUNT], grid = tiles(cdiv(2 * H + 2 + H * C, 32), 1)
extern "C" __global__ void __launch_bounds__(1024)
    iqn_fused_finish(const float* __restrict__ partials, unsigned rows, unsigned H, unsigned C,
                     float* __restrict__ dwphi, float* __restrict__ dwq,
                     float* __restrict__ dbphi, float* __restrict__ dbq,
                     float* __restrict__ losses, unsigned B, unsigned N, float coef) {
    const unsigned head = 2 * H + 2, cols = head + H * C;
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const float s = column_block_sum(partials, 0, rows, cols, c);
    if (threadIdx.y != 0 || c >= cols) {
        return;
    }
    if (c < head) {
        iqn_finish_column(c, s, H, dwq, dbphi, dbq, losses, B, N, coef);
    } else {
        dwphi[c - head] = s;
    }
}

// ---- The whole head on Hopper's warpgroup MMA (wgmma), for the step's sizes ----
//
// iqn_wgmma computes what iqn_fused computes, into the same partial rows (iqn_fused_finish
// adds them), at N = 32 quantiles, C = 64 features and H = 256 hidden units (any B); other
// sizes, and GPUs that did not load this module's sm_90a cubin, take iqn_fused. Both
// products run as TF32 wgmma m64n64k8; operands are rounded to nearest first, as
// iqn_fused rounds them.
//
// A persistent block of two warpgroups walks tiles of 64 rows (b, j): two samples of 32
// quantiles. Warpgroup wg owns hidden units 128 wg .. 128 wg + 127 for the whole launch, as
// two blocks of 64 (mb), and computes the products transposed, units as M:
//   GEMM 1  phi_pre^T[64 units, 64 rows] = wphi[64 units, 64] cosf^T     (SS, acc1[mb])
//   GEMM 2  dwphi[64 units, 64 features] += dphi_pre^T cosf              (RS, acc2[mb])
// so that a thread's accumulators of GEMM 1, once turned into dphi_pre, are GEMM 2's A
// operand in place: register i of the m64n64 fragment is (unit 16 w + g + 8 ((i >> 1) & 1),
// row 8 (i >> 2) + 2 q + (i & 1)), and the A fragment of K-step ks wants (unit, slot q) and
// (unit, slot q + 4) of rows 8 ks ..: slot q + 4 e is taken to be row 8 ks + 2 q + e, and
// cosf^T (GEMM 2's B) is stored with its rows in that order (a GEMM may visit its K in any
// order if both operands agree). dphi_pre never reaches memory, and a thread's four units
// make bphi, h wq and wq registers, S a sum over the thread's rows and the 4 lanes of a quad.
// zq needs all 256 units: each warp's part of each row goes through shared memory, and 64
// threads add the 8 parts in order and compute dz.
//
// Shared memory (dynamic, 1024-byte aligned for the swizzle atoms):
//   W       wphi [256 units][64 features], TF32, K-major: GEMM 1's A           64 KB
//   CQ[2]   cosf [64 rows][64 features], K-major: GEMM 1's B                   2 x 16 KB
//   CT[2]   cosf^T [64 features][64 slots], K-major: GEMM 2's B                2 x 16 KB
// The tile buffers are double: the next tile's features are written while GEMM 2 reads
// this tile's.
//
// One tile, in order:
//   19 threads: the next tile's h, tau and ybar asked into L2 (prefetch, no registers)
//   wait for GEMM 1; bias, ReLU, each row's part of zq over the thread's units
//   each row's zq over the warp's 32 units (a reduce-scatter over the 8 lanes of a unit
//   column) -> s_zq                                                            barrier
//   64 threads: zq, u, the weight, dz -> s_dz                                 barrier
//   dphi_pre, S (-> dh, dwq) and dbphi from registers; issue GEMM 2 (both blocks);
//   stage the next tile's cosf (both layouts), h, tau, ybar                   barrier
//   wait for GEMM 2 (its A registers are free again); issue GEMM 1 of the next tile
// Barriers order every reuse: CT[b] and CQ[b] are rewritten only after every thread has
// waited for the wgmmas that read them, and a buffer's writes are fenced
// (fence.proxy.async) before the barrier that precedes the wgmma that reads them.

#include "wgmma.cuh"

#define IQN_WG_N 32
#define IQN_WG_C 64
#define IQN_WG_H 256
// Rows (b, j) per tile: two samples.
#define IQN_WG_ROWS 64
#define IQN_WG_THREADS 256
#define IQN_WG_W_BYTES (IQN_WG_H * IQN_WG_C * 4)
#define IQN_WG_TILE_BYTES (IQN_WG_ROWS * IQN_WG_C * 4)
// Dynamic shared memory: the alignment slack, W, CQ[2], CT[2] (IQN_WGMMA_SHARED_BYTES in
// kernels.rs, whose test reads this line).
#define IQN_WG_SMEM 132096
static_assert(IQN_WG_SMEM == 1024 + IQN_WG_W_BYTES + 4 * IQN_WG_TILE_BYTES,
              "IQN_WG_SMEM is the sum of the buffers");

#if defined(DQN_HAS_WGMMA)
// cos(pi x) for |x| < 2^22 in five instructions where cospif takes about thirteen: x less
// the nearest even integer is r in [-1, 1], exactly (Sterbenz), and the special-function
// unit's cosine of pi r is within 2^-21.4 of it, far below the TF32 rounding (2^-11) that
// follows. It differs from cospif, and from iqn_cos_features, in the last bits: a TF32
// operand moves by one unit in about one case in a few hundred.
__device__ __forceinline__ float cos_pi_fast(float x) {
    const float r = fmaf(-2.0f, rintf(0.5f * x), x);
    return __cosf(3.14159265358979f * r);
}

// v summed over the 4 lanes of a quad (lanes 4 g .. 4 g + 3), in every one of them.
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v + __shfl_xor_sync(FULL_MASK, v, 2);
}

// A descriptor moved by `bytes` (a multiple of 16) within shared memory: the start address
// is the low field, in units of 16 bytes, and every address here is below 256 KB, so the
// add cannot carry out of it. Moving a base descriptor costs one add per wgmma where
// building each from its address costs four (CUTLASS's descriptor iterators do the same).
__device__ __forceinline__ uint64_t desc_at(uint64_t desc, uint32_t bytes) {
    return desc + (bytes >> 4);
}

// GEMM 1 of one unit block: d = A B^T over K = 64 features, A the block's 64 rows of W
// (descriptor dA), B the tile's 64 rows of CQ (dB).
__device__ __forceinline__ void iqn_wg_gemm1(float (&d)[32], uint64_t dA, uint64_t dB) {
    reg_fence_all(d);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        wgmma_ss_n64(d, desc_at(dA, sw128_off(0, 8 * ks, IQN_WG_H)),
                     desc_at(dB, sw128_off(0, 8 * ks, IQN_WG_ROWS)), ks > 0 ? 1 : 0);
    }
    wgmma_commit();
    reg_fence_all(d);
}

// GEMM 2 of one unit block: d += A B^T over K = the tile's 64 rows (in CT's slot order), A
// the thread's dphi_pre fragment a (K-step ks: registers 4 ks, 4 ks + 2, 4 ks + 1, 4 ks + 3),
// B the 64 features of CT (descriptor dB).
__device__ __forceinline__ void iqn_wg_gemm2(float (&d)[32], uint32_t (&a)[32], uint64_t dB) {
    reg_fence_all(d);
    reg_fence_all(a);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        const uint32_t frag[4] = {a[4 * ks], a[4 * ks + 2], a[4 * ks + 1], a[4 * ks + 3]};
        wgmma_rs_n64(d, frag, desc_at(dB, sw128_off(0, 8 * ks, IQN_WG_C)), 1);
    }
    wgmma_commit();
    reg_fence_all(d);
    reg_fence_all(a);
}
#endif

// Grid: min(ceil(B / 2), sms) blocks of IQN_WG_THREADS threads with IQN_WG_SMEM
// bytes of dynamic shared memory; partials holds gridDim.x rows of 2H + 2 + H C. Traps if
// this image was not compiled for sm_90a (the host does not launch it then).
extern "C" __global__ void __launch_bounds__(IQN_WG_THREADS, 1)
    iqn_wgmma(const float* __restrict__ h, const float* __restrict__ tau,
              const float* __restrict__ ybar, const float* __restrict__ wphi,
              const float* __restrict__ bphi, const float* __restrict__ wq,
              const float* __restrict__ bq, float* __restrict__ dh,
              float* __restrict__ partials, unsigned B, float coef) {
#if defined(DQN_HAS_WGMMA)
    extern __shared__ __align__(1024) uint8_t iqn_wg_smem[];
    __shared__ __align__(16) float s_h[2][2][IQN_WG_H];  // [buf][sample] h
    __shared__ float s_tau[2][IQN_WG_ROWS];
    __shared__ float s_ybar[2][2];
    // [warp][row + row / 32]: the warp's 32 units' part of zq; the pad puts the two halves
    // of the rows a warp stores at once (rows 8 g + 2 q + k, g < 4 and g >= 4) on odd and
    // even banks.
    __shared__ float s_zq[8][IQN_WG_ROWS + 2];
    __shared__ __align__(16) float s_dz[IQN_WG_ROWS];
    __shared__ float s_red[2][2];

    const uint32_t base = (smem_u32(iqn_wg_smem) + 1023u) & ~1023u;
    const uint32_t sW = base, sCQ = sW + IQN_WG_W_BYTES, sCT = sCQ + 2 * IQN_WG_TILE_BYTES;
    const unsigned tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
    const unsigned lane = tid & 31, w = t >> 5, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const unsigned tiles = (B + 1) / 2;
    const size_t rows_all = (size_t)B * IQN_WG_N;
    const float scale = coef / ((float)B * (float)IQN_WG_N);
    const float bq0 = bq[0];

    // The thread's four units: block mb, half rh of the fragment's rows.
    unsigned unit[2][2];
    float b_u[2][2], wq_u[2][2];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb) {
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
            unit[mb][rh] = 128 * wg + 64 * mb + 16 * w + g + 8 * rh;
            b_u[mb][rh] = bphi[unit[mb][rh]];
            wq_u[mb][rh] = wq[unit[mb][rh]];
        }
    }

    for (unsigned c = tid; c < IQN_WG_H * (IQN_WG_C / 4); c += IQN_WG_THREADS) {
        const unsigned n = c / (IQN_WG_C / 4), k = 4 * (c % (IQN_WG_C / 4));
        const float4 v = ld4(wphi + (size_t)n * IQN_WG_C + k);
        st_shared_v4(sW + sw128_off(n, k, IQN_WG_H), tf32_bits(v.x), tf32_bits(v.y),
                     tf32_bits(v.z), tf32_bits(v.w));
    }

    // A tile's inputs into buffer `buf`: cosf (cos_pi_fast), rounded to TF32. Thread
    // (a, p, fb) takes features 4 fb .. + 3 of rows 8 a + 2 x + p (x < 4): one 16-byte
    // chunk per row of CQ, and per feature of CT, where those rows are slots
    // 8 a + 4 p + x. Rows past B N get tau = 0 (masked later). The 8 lanes of a quarter warp
    // (bits l2 l1 l0 of tid) store to 8 different chunk positions in both layouts, so
    // neither store has a bank conflict: p = l0, a = 4 t7 + 2 l2 + l1 and fb = 8 t6 +
    // 4 (l2 ^ t4) + 2 (l1 ^ t3) + t5 (t_i: bit i of tid). CQ's chunk position is then
    // (fb % 8) ^ (row % 8) = (l2 ^ t4, l1 ^ t3, t5 ^ l0) and CT's ((slot % 32) / 4) ^ (feature
    // % 8) = (l2 ^ t5, l1, l0), each eight values over the quarter warp.
    auto stage = [&](unsigned tl, unsigned buf) {
        const unsigned l0 = tid & 1, l1 = (tid >> 1) & 1, l2 = (tid >> 2) & 1;
        const unsigned p = l0, a = 4 * ((tid >> 7) & 1) + 2 * l2 + l1;
        const unsigned fb = 8 * ((tid >> 6) & 1) + 4 * (l2 ^ ((tid >> 4) & 1)) +
                            2 * (l1 ^ ((tid >> 3) & 1)) + ((tid >> 5) & 1);
        uint32_t v[4][4];
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const size_t row = (size_t)tl * IQN_WG_ROWS + 8 * a + 2 * x + p;
            const float tr = row < rows_all ? tau[row] : 0.0f;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                v[x][e] = tf32_operand(cos_pi_fast((float)(4 * fb + e + 1) * tr));
            }
        }
        const uint32_t cq = sCQ + buf * IQN_WG_TILE_BYTES, ct = sCT + buf * IQN_WG_TILE_BYTES;
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            st_shared_v4(cq + sw128_off(8 * a + 2 * x + p, 4 * fb, IQN_WG_ROWS), v[x][0],
                         v[x][1], v[x][2], v[x][3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            st_shared_v4(ct + sw128_off(4 * fb + e, 8 * a + 4 * p, IQN_WG_C), v[0][e], v[1][e],
                         v[2][e], v[3][e]);
        }
#pragma unroll
        for (unsigned s = 0; s < 2; ++s) {
            const unsigned b = 2 * tl + s;
            s_h[buf][s][tid] = b < B ? h[(size_t)b * IQN_WG_H + tid] : 0.0f;
        }
        if (tid < IQN_WG_ROWS) {
            const size_t r = (size_t)tl * IQN_WG_ROWS + tid;
            s_tau[buf][tid] = r < rows_all ? tau[r] : 0.0f;
        }
        if (tid < 2) {
            s_ybar[buf][tid] = 2 * tl + tid < B ? ybar[2 * tl + tid] : 0.0f;
        }
    };

    float acc1[2][32], acc2[2][32];
    uint32_t dp[2][32];  // dphi_pre^T as GEMM 2's A fragments
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        acc1[0][i] = acc1[1][i] = 0.0f;  // defined, so that no move lands inside a wgmma
        acc2[0][i] = acc2[1][i] = 0.0f;
        dp[0][i] = dp[1][i] = 0u;
    }
    float db[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, dwq_acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    float loss = 0.0f, dbq = 0.0f;
    // Base descriptors: each unit block's rows of W, and buffer 0 of CQ and CT (buffer 1 is
    // one tile further).
    const uint64_t dW[2] = {desc_sw128(sW + sw128_off(128 * wg, 0, IQN_WG_H)),
                            desc_sw128(sW + sw128_off(128 * wg + 64, 0, IQN_WG_H))};
    const uint64_t dCQ = desc_sw128(sCQ), dCT = desc_sw128(sCT);

    unsigned tl = blockIdx.x, buf = 0;  // the grid is at most `tiles` blocks
    stage(tl, 0);
    // CQ[1] zeroed once: the GEMM 1 issued after a block's last tile reads the other buffer,
    // which a block with one tile never writes (the loop below does not test for it).
    for (unsigned c = tid; c < IQN_WG_TILE_BYTES / 16; c += IQN_WG_THREADS) {
        st_shared_v4(sCQ + IQN_WG_TILE_BYTES + 16 * c, 0u, 0u, 0u, 0u);
    }
    fence_proxy_async_smem();
    __syncthreads();
    iqn_wg_gemm1(acc1[0], dW[0], dCQ);
    iqn_wg_gemm1(acc1[1], dW[1], dCQ);
    // Waited for here, before the loop (whose top waits anyway): the compiler moves the
    // loop's incoming values into place on entry, and a move of an accumulator that a
    // wgmma still owns would serialize every wgmma of the kernel.
    wgmma_wait<0>();
    reg_fence_all(acc1[0]);
    reg_fence_all(acc1[1]);

    // A do-while, uniform across the block: every block has a tile, and a loop that might
    // not run would join the accumulators' zeros with its results by moves, and a move of
    // an accumulator a wgmma still owns serializes every wgmma of the kernel.
    do {
        const unsigned next = tl + gridDim.x;
        // The next tile's inputs pulled into L2 now, so that its stage (after GEMM 2's
        // issue, before the barrier that GEMM 1 waits behind) reads them from L2 instead of
        // waiting for DRAM: h (two samples, 16 lines of 128 bytes), tau (64 rows, 2 lines)
        // and ybar (1). No registers; a line past the end of its input is not asked for.
        // (Two tiles ahead measured the same: PERF.md, "The IQN head".)
        if (next < tiles && tid < 19) {
            const float* line = nullptr;
            if (tid < 16) {
                const size_t off = (size_t)next * 2 * IQN_WG_H + 32 * tid;
                line = off < (size_t)B * IQN_WG_H ? h + off : nullptr;
            } else if (tid < 18) {
                const size_t off = (size_t)next * IQN_WG_ROWS + 32 * (tid - 16);
                line = off < rows_all ? tau + off : nullptr;
            } else {
                line = ybar + 2 * (size_t)next;  // next < tiles: sample 2 next exists
            }
            if (line != nullptr) {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
            }
        }
        // h wq of the thread's units in the tile's two samples.
        float hw[2][2][2];
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int mb = 0; mb < 2; ++mb) {
#pragma unroll
                for (int rh = 0; rh < 2; ++rh) {
                    hw[s][mb][rh] = s_h[buf][s][unit[mb][rh]] * wq_u[mb][rh];
                }
            }
        }
        // phi = relu(phi_pre + bphi) in place; zp[2 j + e]: row 8 j + 2 q + e's part of zq
        // over the thread's units (rows 0-31 are sample 0: j < 4).
        float zp[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            zp[i] = 0.0f;
        }
        // Both blocks waited for at once: reading block 0 while block 1's group is in
        // flight (wait_group 1) made ptxas serialize every wgmma (C7514).
        wgmma_wait<0>();
#pragma unroll
        for (int mb = 0; mb < 2; ++mb) {
            reg_fence_all(acc1[mb]);
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const int j = i >> 2, rh = (i >> 1) & 1, e = i & 1;
                acc1[mb][i] = fmaxf(acc1[mb][i] + b_u[mb][rh], 0.0f);
                zp[2 * j + e] = fmaf(acc1[mb][i], hw[j >> 2][mb][rh], zp[2 * j + e]);
            }
        }
        // Over the warp's 8 lanes of each q: lane (g, q) ends with rows 8 g + 2 q + k.
        reduce_scatter_step<8>(zp, lane, 16);
        reduce_scatter_step<4>(zp, lane, 8);
        reduce_scatter_step<2>(zp, lane, 4);
        s_zq[warp][8 * g + 2 * q + (g >> 2)] = zp[0];
        s_zq[warp][8 * g + 2 * q + 1 + (g >> 2)] = zp[1];
        __syncthreads();

        if (tid < IQN_WG_ROWS) {  // warps 0 and 1: one row each, the parts in warp order
            float zq = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                zq += s_zq[k][tid + (tid >> 5)];
            }
            const unsigned s = tid >> 5;
            const bool live = 2 * tl + s < B;
            const float u = s_ybar[buf][s] - (zq + bq0);
            const float wt = asymmetric_weight(s_tau[buf][tid], u);
            const float dz = live ? -scale * wt * huber_grad(u) : 0.0f;
            s_dz[tid] = dz;
            if (live) {
                loss += wt * huber(u);
                dbq += dz;
            }
        }
        __syncthreads();

        // dphi_pre = dz h wq (phi > 0), rounded into GEMM 2's A fragments; S of each unit and
        // sample over the thread's rows, dbphi over all of them.
        float2 dz2[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            dz2[j] = *reinterpret_cast<const float2*>(&s_dz[8 * j + 2 * q]);
        }
        float S[2][2][2] = {{{0.0f, 0.0f}, {0.0f, 0.0f}}, {{0.0f, 0.0f}, {0.0f, 0.0f}}};
#pragma unroll
        for (int mb = 0; mb < 2; ++mb) {
#pragma unroll
            for (int i = 0; i < 32; ++i) {
                const int j = i >> 2, rh = (i >> 1) & 1, e = i & 1;
                const float d = e ? dz2[j].y : dz2[j].x;
                const float phi = acc1[mb][i];
                const float gr = phi > 0.0f ? d * hw[j >> 2][mb][rh] : 0.0f;
                S[j >> 2][mb][rh] = fmaf(d, phi, S[j >> 2][mb][rh]);
                db[mb][rh] += gr;
                dp[mb][i] = tf32_operand(gr);
            }
        }
        iqn_wg_gemm2(acc2[0], dp[0], desc_at(dCT, buf * IQN_WG_TILE_BYTES));
        iqn_wg_gemm2(acc2[1], dp[1], desc_at(dCT, buf * IQN_WG_TILE_BYTES));

        // S over the quad (its lanes hold the other rows of the same units); every lane ends
        // with the sums, lane q stores dh for its two of the eight (sample, unit) pairs.
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int mb = 0; mb < 2; ++mb) {
#pragma unroll
                for (int rh = 0; rh < 2; ++rh) {
                    const float v = quad_sum(S[s][mb][rh]);
                    const unsigned b = 2 * tl + s;
                    if (b < B) {
                        if ((unsigned)(2 * s + mb) == q) {
                            dh[(size_t)b * IQN_WG_H + unit[mb][rh]] = wq_u[mb][rh] * v;
                        }
                        dwq_acc[mb][rh] = fmaf(s_h[buf][s][unit[mb][rh]], v, dwq_acc[mb][rh]);
                    }
                }
            }
        }

        if (next < tiles) {
            stage(next, buf ^ 1);
        }
        fence_proxy_async_smem();
        __syncthreads();
        wgmma_wait<0>();  // GEMM 2 is done with dp before GEMM 1 may take its registers
        reg_fence_all(acc2[0]);
        reg_fence_all(acc2[1]);
        reg_fence_all(dp[0]);
        reg_fence_all(dp[1]);
        // Issued after the last tile too, on stale features (CQ[1] is zeroed at the start
        // for a block with one tile), its result unused: a conditional wgmma would join
        // acc1's definitions by moves, which serialize the kernel's wgmmas.
        iqn_wg_gemm1(acc1[0], dW[0], desc_at(dCQ, (buf ^ 1) * IQN_WG_TILE_BYTES));
        iqn_wg_gemm1(acc1[1], dW[1], desc_at(dCQ, (buf ^ 1) * IQN_WG_TILE_BYTES));
        tl = next;
        buf ^= 1;
    } while (tl < tiles);
    wgmma_wait<0>();
    reg_fence_all(acc1[0]);
    reg_fence_all(acc1[1]);

    // The block's partial row, [dwq (H) | dbphi (H) | dbq | loss sum | dwphi (H C)].
    float* row = partials + (size_t)blockIdx.x * (2 * IQN_WG_H + 2 + IQN_WG_H * IQN_WG_C);
    float* dwr = row + 2 * IQN_WG_H + 2;
#pragma unroll
    for (int mb = 0; mb < 2; ++mb) {
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
            const unsigned u = unit[mb][(i >> 1) & 1], feat = 8 * (i >> 2) + 2 * q;
            *reinterpret_cast<float2*>(dwr + u * IQN_WG_C + feat) =
                make_float2(acc2[mb][i], acc2[mb][i + 1]);
        }
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
            const float v = quad_sum(db[mb][rh]);
            if (q == 0) {
                row[unit[mb][rh]] = dwq_acc[mb][rh];
                row[IQN_WG_H + unit[mb][rh]] = v;
            }
        }
    }
    if (warp < 2) {
        loss = warp_sum(loss);
        dbq = warp_sum(dbq);
        if (lane == 0) {
            s_red[0][warp] = dbq;
            s_red[1][warp] = loss;
        }
    }
    __syncthreads();
    if (tid < 2) {
        row[2 * IQN_WG_H + tid] = s_red[tid][0] + s_red[tid][1];
    }
#else
    __trap();
#endif
}
