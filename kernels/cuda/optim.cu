// An optimizer step over every parameter of a model and the reductions it needs: the global
// gradient norm, Adam with global-norm clipping over a table of parameters in one launch
// (the DQN example's update, examples/dqn/MODEL.md "Update"), Adam's step count on the
// device, and deterministic column sums (bias gradients).
//
// Every reduction here is two-pass: a first kernel writes one partial per block, each a
// fixed-order sum; a finishing kernel adds the partials in order. The grid depends only on
// the sizes, so the same inputs give the same bits on every run and every GPU.

#include "stepgraph/common.cuh"
#include "stepgraph/reduce.cuh"
#include "stepgraph/table.cuh"

// The parameter table (built once on the host by `stepgraph_kernels::ParamTable`): T
// entries of PARAM_TABLE_WORDS u64 each, entry k at words [6k, 6k + 6):
//   0: param (float*), 1: grad (const float*), 2: Adam m (float*), 3: Adam v (float*),
//   4: len (elements of each of the four), 5: start (sum of len over entries 0..k).
// The entries are concatenated into one index space [0, total); block x takes elements
// [x OPTIM_CHUNK, (x + 1) OPTIM_CHUNK) of it, whichever tensors they fall in.
#define PARAM_TABLE_WORDS 6
#define OPTIM_CHUNK 512

// Indices into the device scalars (an AdamClock's, or a DeviceScalars<f32>) that
// adam_clip_update reads and adam_tick writes.
#define ADAM_LR 0
#define ADAM_BIAS1 1  // 1 - beta1^t
#define ADAM_BIAS2 2  // 1 - beta2^t

typedef unsigned long long u64;

// The entry that holds element i (see stepgraph/table.cuh); start is word 5.
__device__ __forceinline__ unsigned entry_at(const u64* __restrict__ table, unsigned T, u64 i) {
    return table_entry_at(table, T, PARAM_TABLE_WORDS, 5, i);
}

// Per-block sums of g^2 over the table's gradients: partials[x] = sum of g^2 over block x's
// chunk. Grid: ceil(total / OPTIM_CHUNK) blocks of 256.
extern "C" __global__ void __launch_bounds__(256)
    grad_sq_norm_partial(const u64* __restrict__ table, unsigned T, u64 total,
                         float* __restrict__ partials) {
    const u64 c0 = (u64)blockIdx.x * OPTIM_CHUNK;
    const u64 c1 = min(c0 + OPTIM_CHUNK, total);
    float s = 0.0f;
    for (unsigned k = entry_at(table, T, c0); k < T; ++k) {
        const u64* ent = table + (size_t)k * PARAM_TABLE_WORDS;
        const u64 start = ent[5];
        if (start >= c1) {
            break;
        }
        const float* g = reinterpret_cast<const float*>(ent[1]);
        const u64 lo = max(c0, start), hi = min(c1, start + ent[4]);
        for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const float x = g[i - start];
            s = fmaf(x, x, s);
        }
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = s;
    }
}

// The sum of partials[0..n) in one fixed order, whatever the block's size (a multiple of
// 32, at most 1024): that of a block of 1024 threads, each adding the partials at its
// index and 1024 apart in turn, each warp's lanes added by warp_sum, then the 32 warps'
// sums by warp_sum. A smaller block takes the 32 warps' parts in turn, so every block
// that calls it gets the same bits. Every thread must call it; the result is valid in
// every thread. It ends with a barrier.
__device__ __forceinline__ float grad_sq_norm_sum(const float* __restrict__ partials,
                                                  unsigned n) {
    __shared__ float warp_part[32];
    __shared__ float total;
    const unsigned lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (unsigned w = threadIdx.x >> 5; w < 32; w += warps) {
        float s = 0.0f;
        for (unsigned i = w * 32 + lane; i < n; i += 1024) {
            s += partials[i];
        }
        s = warp_sum(s);
        if (lane == 0) {
            warp_part[w] = s;
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const float t = warp_sum(warp_part[lane]);
        if (lane == 0) {
            total = t;
        }
    }
    __syncthreads();
    return total;
}

// out[0] = sum of partials[0..n), in grad_sq_norm_sum's order. Grid: 1 block of 1024.
extern "C" __global__ void __launch_bounds__(1024)
    grad_sq_norm_finish(const float* __restrict__ partials, unsigned n, float* __restrict__ out) {
    const float s = grad_sq_norm_sum(partials, n);
    if (threadIdx.x == 0) {
        out[0] = s;
    }
}

// Adam with global-norm clipping, in place, over every tensor of the table, given sq, the
// gradients' global squared norm (the two kernels below: grad_sq_norm's output, or its
// partials finished in each block):
//   clip = min(1, max_norm / (sqrt(sq) + 1e-6)),  g = clip * grad
//   m <- beta1 m + (1 - beta1) g,  v <- beta2 v + (1 - beta2) g^2
// (1 - beta1 and 1 - beta2 come as arguments, computed on the host in double: 1 - 0.999f
// in float is 1.3e-5 off 0.001)
//   param <- param - lr (m / bias1) / (sqrt(v / bias2) + eps)
// with lr = scalars[ADAM_LR], bias1 = scalars[ADAM_BIAS1] (1 - beta1^t), bias2 =
// scalars[ADAM_BIAS2] (1 - beta2^t), read from device memory at run time so that a replay
// sees the values refreshed before it.
// A non-finite sq (a NaN or infinite gradient, or a sum of squares that overflows) skips
// the update: clipping would turn one bad element into NaN everywhere, so parameters and
// moments keep the last finite step's values for the host to report.
// Block x updates elements [x OPTIM_CHUNK, (x + 1) OPTIM_CHUNK) of blocks of 256 threads.
__device__ __forceinline__ void adam_apply(const u64* __restrict__ table, unsigned T, u64 total,
                                           float sq, const float* __restrict__ scalars,
                                           float max_norm, float beta1, float beta2,
                                           float one_minus_beta1, float one_minus_beta2,
                                           float eps) {
    if (!isfinite(sq)) {
        return;
    }
    const float clip = fminf(1.0f, max_norm / (sqrtf(sq) + 1e-6f));
    const float lr = scalars[ADAM_LR], bias1 = scalars[ADAM_BIAS1], bias2 = scalars[ADAM_BIAS2];
    const u64 c0 = (u64)blockIdx.x * OPTIM_CHUNK;
    const u64 c1 = min(c0 + OPTIM_CHUNK, total);
    for (unsigned k = entry_at(table, T, c0); k < T; ++k) {
        const u64* ent = table + (size_t)k * PARAM_TABLE_WORDS;
        const u64 start = ent[5];
        if (start >= c1) {
            break;
        }
        float* param = reinterpret_cast<float*>(ent[0]);
        const float* grad = reinterpret_cast<const float*>(ent[1]);
        float* m = reinterpret_cast<float*>(ent[2]);
        float* v = reinterpret_cast<float*>(ent[3]);
        const u64 lo = max(c0, start), hi = min(c1, start + ent[4]);
        for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const u64 j = i - start;
            const float g = clip * grad[j];
            const float mj = beta1 * m[j] + one_minus_beta1 * g;
            const float vj = beta2 * v[j] + one_minus_beta2 * g * g;
            m[j] = mj;
            v[j] = vj;
            param[j] -= lr * (mj / bias1) / (sqrtf(vj / bias2) + eps);
        }
    }
}

// The update from grad_sq_norm's output, sq_norm[0]. Grid: ceil(total / OPTIM_CHUNK)
// blocks of 256.
extern "C" __global__ void __launch_bounds__(256)
    adam_clip_update(const u64* __restrict__ table, unsigned T, u64 total,
                     const float* __restrict__ sq_norm, const float* __restrict__ scalars,
                     float max_norm, float beta1, float beta2, float one_minus_beta1,
                     float one_minus_beta2, float eps) {
    adam_apply(table, T, total, sq_norm[0], scalars, max_norm, beta1, beta2, one_minus_beta1,
               one_minus_beta2, eps);
}

// adam_clip_update with the global norm finished in every block from grad_sq_norm's n
// partials (grad_sq_norm_sum: the bits grad_sq_norm_finish writes), block 0 also writing
// it to sq_norm[0] for the host: the finish's launch, one block on the optimizer's chain,
// is gone. Nothing in the launch reads sq_norm. Grid: ceil(total / OPTIM_CHUNK) blocks of
// 256.
extern "C" __global__ void __launch_bounds__(256)
    adam_clip_update_partials(const u64* __restrict__ table, unsigned T, u64 total,
                              const float* __restrict__ partials, unsigned n,
                              float* __restrict__ sq_norm, const float* __restrict__ scalars,
                              float max_norm, float beta1, float beta2,
                              float one_minus_beta1, float one_minus_beta2, float eps) {
    const float sq = grad_sq_norm_sum(partials, n);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        sq_norm[0] = sq;
    }
    adam_apply(table, T, total, sq, scalars, max_norm, beta1, beta2, one_minus_beta1,
               one_minus_beta2, eps);
}

// beta^t by repeated squaring, in double, the multiplications in the order of
// `stepgraph_kernels::AdamScalars::at_step`'s (optim.rs, `pow_by_squaring`). __dmul_rn and
// __dsub_rn are never merged into a multiply-add (nvcc contracts plain * and - when it
// can), so the host and the device round the same operations and get the same bits.
__device__ __forceinline__ double adam_pow(double base, unsigned exp) {
    double r = 1.0;
    while (true) {
        if (exp & 1u) {
            r = __dmul_rn(r, base);
        }
        exp >>= 1;
        if (exp == 0u) {
            break;
        }
        base = __dmul_rn(base, base);
    }
    return r;
}

// Adam's clock (`stepgraph_kernels::AdamClock`): t[0] += 1, then scalars <- [lr,
// 1 - beta1^t, 1 - beta2^t] for the new t, the bias corrections in double and rounded
// once, as AdamScalars::at_step computes them (t past 2^31 - 1 counts as 2^31 - 1 there;
// beta^t is 0 long before). One thread, before the update that reads the scalars.
extern "C" __global__ void adam_tick(u64* __restrict__ t, float* __restrict__ scalars, float lr,
                                     double beta1, double beta2) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    const u64 now = t[0] + 1;
    t[0] = now;
    const unsigned exp = now > 0x7fffffffull ? 0x7fffffffu : (unsigned)now;
    scalars[ADAM_LR] = lr;
    scalars[ADAM_BIAS1] = __double2float_rn(__dsub_rn(1.0, adam_pow(beta1, exp)));
    scalars[ADAM_BIAS2] = __double2float_rn(__dsub_rn(1.0, adam_pow(beta2, exp)));
}

// Column sums, first pass: partials[y, c] = sum of x[r, c] over rows r of chunk y,
// [y rows_per_chunk, min(rows, (y + 1) rows_per_chunk)). x is [rows, cols].
// Grid: (ceil(cols / 32), ceil(rows / rows_per_chunk)) blocks of (32, 32) threads.
extern "C" __global__ void __launch_bounds__(1024)
    column_sums_partial(const float* __restrict__ x, unsigned rows, unsigned cols,
                        unsigned rows_per_chunk, float* __restrict__ partials) {
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const unsigned r0 = blockIdx.y * rows_per_chunk;
    const unsigned r1 = rows - r0 <= rows_per_chunk ? rows : r0 + rows_per_chunk;
    const float s = column_block_sum(x, r0, r1, cols, c);
    if (threadIdx.y == 0 && c < cols) {
        partials[(size_t)blockIdx.y * cols + c] = s;
    }
}

// Column sums, second pass: out[c] = sum over the chunks of partials[., c], in order.
// Grid: ceil(cols / 32) blocks of (32, 32) threads.
extern "C" __global__ void __launch_bounds__(1024)
    column_sums_finish(const float* __restrict__ partials, unsigned chunks, unsigned cols,
                       float* __restrict__ out) {
    const unsigned c = blockIdx.x * 32 + threadIdx.x;
    const float s = column_block_sum(partials, 0, chunks, cols, c);
    if (threadIdx.y == 0 && c < cols) {
        out[c] = s;
    }
}
