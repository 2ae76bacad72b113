// The trainer's layer kernels: bias and activation after a GEMM, column sums (a bias
// gradient), a scaled sum (a mean loss) and the SGD step. Shapes are row-major: [R, C]
// puts row r at offset r C.

#include "reduce.cuh"

// y[r, c] = act(y[r, c] + bias[c]) in place, act = max(., 0) when relu != 0, else the
// identity; y is [rows, cols], n = rows cols < 2^32. One thread per element.
extern "C" __global__ void add_bias(float* y, const float* bias, unsigned rows, unsigned cols,
                                    int relu) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) {
        return;
    }
    const float v = y[i] + bias[i % cols];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
}

// out[c] = sum_r x[r, c]; x is [rows, cols]. One block of REDUCE_THREADS per column.
extern "C" __global__ void col_sum(const float* x, float* out, unsigned rows, unsigned cols) {
    __shared__ float scratch[REDUCE_THREADS];
    const unsigned c = blockIdx.x;
    float acc = 0.0f;
    for (unsigned r = threadIdx.x; r < rows; r += REDUCE_THREADS) {
        acc += x[(size_t)r * cols + c];
    }
    const float total = block_sum(acc, scratch);
    if (threadIdx.x == 0) {
        out[c] = total;
    }
}

// out[0] = scale sum_i x[i], i < n. One block of REDUCE_THREADS.
extern "C" __global__ void sum_scaled(const float* x, float* out, unsigned n, float scale) {
    __shared__ float scratch[REDUCE_THREADS];
    float acc = 0.0f;
    for (unsigned i = threadIdx.x; i < n; i += REDUCE_THREADS) {
        acc += x[i];
    }
    const float total = block_sum(acc, scratch);
    if (threadIdx.x == 0) {
        out[0] = scale * total;
    }
}

// w[i] -= lr g[i], i < n. One thread per element.
extern "C" __global__ void sgd(float* w, const float* g, unsigned n, float lr) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        w[i] -= lr * g[i];
    }
}
