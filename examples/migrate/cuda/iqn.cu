// The IQN head's kernels: the cosine embedding of the quantile fractions, the product of
// the embedding with the trunk's features, and the quantile Huber loss with its gradient.

#include "reduce.cuh"

// cosf[r, i] = cos(pi (i + 1) tau[r]); tau is [rows] (the [B, N] fractions read as B N
// rows), cosf [rows, dim], n = rows dim < 2^32. One thread per element.
extern "C" __global__ void cos_embed(const float* tau, float* cosf, unsigned rows, unsigned dim) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * dim) {
        return;
    }
    const unsigned r = i / dim, k = i % dim;
    cosf[i] = cospif((float)(k + 1) * tau[r]);
}

// out[r, c] = x[r, c] h[r / group, c]: each row of h serves `group` consecutive rows of x
// (the N quantiles of one sample). x and out are [rows, cols], h [rows / group, cols].
// One thread per element.
extern "C" __global__ void broadcast_mul(const float* x, const float* h, float* out,
                                         unsigned rows, unsigned cols, unsigned group) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) {
        return;
    }
    const unsigned r = i / cols, c = i % cols;
    out[i] = x[i] * h[(size_t)(r / group) * cols + c];
}

// The quantile Huber loss of sample b = blockIdx.x (one block of REDUCE_THREADS each):
// for quantile j < quantiles and output a < outputs, with z [B, quantiles, outputs],
// target [B, outputs] and tau [B, quantiles],
//   u = target[b, a] - z[b, j, a],   w = |tau[b, j] - 1(u < 0)|,
//   huber(u) = u^2 / 2 for |u| <= kappa, else kappa (|u| - kappa / 2),
//   row_loss[b] = sum_{j, a} w huber(u),
//   dz[b, j, a] = -grad_scale w clamp(u, -kappa, kappa)   (d(grad_scale sum_b row_loss)/dz).
extern "C" __global__ void quantile_huber(const float* z, const float* target, const float* tau,
                                          float* dz, float* row_loss, unsigned quantiles,
                                          unsigned outputs, float kappa, float grad_scale) {
    __shared__ float scratch[REDUCE_THREADS];
    const unsigned b = blockIdx.x, per = quantiles * outputs;
    float acc = 0.0f;
    for (unsigned e = threadIdx.x; e < per; e += REDUCE_THREADS) {
        const unsigned j = e / outputs, a = e % outputs;
        const size_t idx = (size_t)b * per + e;
        const float u = target[(size_t)b * outputs + a] - z[idx];
        const float w = fabsf(tau[(size_t)b * quantiles + j] - (u < 0.0f ? 1.0f : 0.0f));
        const float au = fabsf(u);
        const float huber = au <= kappa ? 0.5f * u * u : kappa * (au - 0.5f * kappa);
        acc += w * huber;
        dz[idx] = -grad_scale * w * fminf(fmaxf(u, -kappa), kappa);
    }
    const float total = block_sum(acc, scratch);
    if (threadIdx.x == 0) {
        row_loss[b] = total;
    }
}
