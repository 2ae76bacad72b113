// The attention head's kernels: scores, a softmax over rows, the weighted sum of values,
// and the squared-error loss with its gradient. The projections come packed as
// qkv [B T, 3E]: row b T + t holds the query, key and value of token t of sample b, each
// E wide, in that order.

// scores[b, i, j] = scale q[b, i] . k[b, j] for tokens i, j < tokens; scores is
// [B tokens, tokens]. One thread per score; the dot product runs in order.
extern "C" __global__ void attn_scores(const float* qkv, float* scores, unsigned batch,
                                       unsigned tokens, unsigned width, float scale) {
    const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * tokens * tokens) {
        return;
    }
    const unsigned j = idx % tokens, bi = idx / tokens, b = bi / tokens;
    const float* q = qkv + (size_t)bi * 3 * width;
    const float* k = qkv + ((size_t)b * tokens + j) * 3 * width + width;
    float dot = 0.0f;
    for (unsigned e = 0; e < width; ++e) {
        dot += q[e] * k[e];
    }
    scores[idx] = scale * dot;
}

// Each row of x [rows, cols] becomes its softmax, in place. One warp per row (launched
// with whole warps): the lanes stride the row, and xor-butterfly shuffles combine them, so
// every lane holds the same bits of the maximum and of the sum.
extern "C" __global__ void softmax_rows(float* x, unsigned rows, unsigned cols) {
    const unsigned row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= rows) {
        return;  // the whole warp: row is the same for its 32 lanes
    }
    float* r = x + (size_t)row * cols;
    float m = -INFINITY;
    for (unsigned c = lane; c < cols; c += 32) {
        m = fmaxf(m, r[c]);
    }
    for (unsigned s = 16; s > 0; s >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, s));
    }
    float sum = 0.0f;
    for (unsigned c = lane; c < cols; c += 32) {
        sum += expf(r[c] - m);
    }
    for (unsigned s = 16; s > 0; s >>= 1) {
        sum += __shfl_xor_sync(0xffffffffu, sum, s);
    }
    const float inv = 1.0f / sum;
    for (unsigned c = lane; c < cols; c += 32) {
        r[c] = expf(r[c] - m) * inv;
    }
}

// ctx[b, i, e] = sum_j p[b, i, j] v[b, j, e]; p is [B tokens, tokens] (the softmax of the
// scores), ctx [B tokens, width]. One thread per element; the sum runs in order.
extern "C" __global__ void attn_context(const float* p, const float* qkv, float* ctx,
                                        unsigned batch, unsigned tokens, unsigned width) {
    const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * tokens * width) {
        return;
    }
    const unsigned e = idx % width, bi = idx / width, b = bi / tokens;
    const float* pr = p + (size_t)bi * tokens;
    const float* v = qkv + (size_t)b * tokens * 3 * width + 2 * width + e;
    float acc = 0.0f;
    for (unsigned j = 0; j < tokens; ++j) {
        acc += pr[j] * v[(size_t)j * 3 * width];
    }
    ctx[idx] = acc;
}

// For row r < rows of pred and target [rows, cols]: row_loss[r] = sum_c (pred - target)^2
// and dpred[r, c] = grad_scale (pred - target). One thread per row.
extern "C" __global__ void mse_rows(const float* pred, const float* target, float* dpred,
                                    float* row_loss, unsigned rows, unsigned cols,
                                    float grad_scale) {
    const unsigned r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) {
        return;
    }
    float acc = 0.0f;
    for (unsigned c = 0; c < cols; ++c) {
        const size_t i = (size_t)r * cols + c;
        const float d = pred[i] - target[i];
        acc += d * d;
        dpred[i] = grad_scale * d;
    }
    row_loss[r] = acc;
}
