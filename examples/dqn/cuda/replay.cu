// The on-device replay buffer (examples/dqn/src/replay.rs): the seeded fill at startup,
// and inside the step the draw of a batch (row indices and IQN's fractions) from a
// counter-based generator whose counter lives in device memory, and the gathers of the
// drawn rows.
//
// The generator is a hash of (seed, counter, element): key = splitmix(splitmix(seed) ^
// counter), bits(key, e) = splitmix(key + e * GAMMA), splitmix64's output function. No
// state but the counter, so a replay needs nothing from the host, and the CPU reference
// (reference.rs, `replay_draw_reference`) computes the same integers bit for bit.

#include "dqn.cuh"

#define REPLAY_GAMMA 0x9E3779B97F4A7C15ull

__device__ __forceinline__ unsigned long long splitmix(unsigned long long z) {
    z += REPLAY_GAMMA;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned long long replay_key(unsigned long long seed,
                                                         unsigned long long counter) {
    return splitmix(splitmix(seed) ^ counter);
}

__device__ __forceinline__ unsigned long long replay_bits(unsigned long long key,
                                                          unsigned long long e) {
    return splitmix(key + e * REPLAY_GAMMA);
}

// The top 24 bits as a float in [0, 1), exactly.
__device__ __forceinline__ float uniform24(unsigned long long bits) {
    return (float)(unsigned)(bits >> 40) * 5.9604644775390625e-8f;
}

// Uniform in [0, n): the high word of bits * n.
__device__ __forceinline__ unsigned below(unsigned long long bits, unsigned n) {
    return (unsigned)__umul64hi(bits, (unsigned long long)n);
}

// The draw of one replay: idx[b] uniform in [0, capacity) for b < batch (element b),
// tau[j] = 0.02 + 0.96 u uniform in [0.02, 0.98] for j < taus (element batch + j), from
// key(seed, *counter). Grid: one thread per element, ceil((batch + taus) / 256) blocks of
// 256. `replay_advance` moves the counter on after it.
// stepgraph(unsafe): counter[1], idx[batch], tau[taus], capacity > 0,
// stepgraph(unsafe): grid = elementwise(batch + taus)
extern "C" __global__ void replay_draw(const unsigned long long* __restrict__ counter,
                                       unsigned* __restrict__ idx, float* __restrict__ tau,
                                       unsigned long long seed, unsigned capacity,
                                       unsigned batch, unsigned taus) {
    const unsigned e = global_index();
    if (e >= batch + taus) {
        return;
    }
    const unsigned long long bits = replay_bits(replay_key(seed, *counter), e);
    if (e < batch) {
        idx[e] = below(bits, capacity);
    } else {
        tau[e - batch] = __fmaf_rn(0.96f, uniform24(bits), 0.02f);
    }
}

// counter += 1, after the draw that read it (one thread).
// stepgraph(unsafe): counter[1], grid = elementwise(1)
extern "C" __global__ void replay_advance(unsigned long long* __restrict__ counter) {
    if (global_index() == 0) {
        *counter += 1;
    }
}

// The batch's per-row tensors gathered from the buffer's rows idx[b]: s, s2 [B, S],
// act [B, D], r, done [B]. One thread per element of a row of 2S + D + 2 columns,
// ceil(B (2S + D + 2) / 256) blocks of 256. An index out of range (a caller's own indices,
// never the draw's) gathers NaN and action 0, which the step's finite check stops at.
// stepgraph(unsafe): idx[batch], src_s[capacity * state], src_s2[capacity * state],
// stepgraph(unsafe): src_act[capacity * branches], src_r[capacity], src_done[capacity],
// stepgraph(unsafe): s[batch * state], s2[batch * state], act[batch * branches], r[batch],
// stepgraph(unsafe): done[batch], capacity > 0, state > 0, branches > 0,
// stepgraph(unsafe): grid = elementwise(batch * (2 * state + branches + 2))
extern "C" __global__ void replay_gather(const unsigned* __restrict__ idx,
                                         const float* __restrict__ src_s,
                                         const float* __restrict__ src_s2,
                                         const int* __restrict__ src_act,
                                         const float* __restrict__ src_r,
                                         const float* __restrict__ src_done,
                                         float* __restrict__ s, float* __restrict__ s2,
                                         int* __restrict__ act, float* __restrict__ r,
                                         float* __restrict__ done, unsigned capacity,
                                         unsigned batch, unsigned state, unsigned branches) {
    const unsigned width = 2 * state + branches + 2;
    const unsigned i = global_index();
    if (i >= batch * width) {
        return;
    }
    const unsigned b = i / width, c = i - b * width;
    const unsigned row = idx[b];
    const bool ok = row < capacity;
    const float nan = __int_as_float(0x7fc00000);
    if (c < state) {
        s[(size_t)b * state + c] = ok ? src_s[(size_t)row * state + c] : nan;
    } else if (c < 2 * state) {
        const unsigned k = c - state;
        s2[(size_t)b * state + k] = ok ? src_s2[(size_t)row * state + k] : nan;
    } else if (c < 2 * state + branches) {
        const unsigned k = c - 2 * state;
        act[(size_t)b * branches + k] = ok ? src_act[(size_t)row * branches + k] : 0;
    } else if (c == 2 * state + branches) {
        r[b] = ok ? src_r[row] : nan;
    } else {
        done[b] = ok ? src_done[row] : nan;
    }
}

// dst[b, :] = src[idx[b], :] for rows of `width` floats, width a multiple of 4 (float4
// accesses; rows are 16-byte aligned in whole allocations). One thread per float4,
// ceil(B width / 4 / 256) blocks of 256. An index out of range gathers NaN.
// stepgraph(unsafe): idx[batch], src[capacity * width], dst[batch * width], capacity > 0,
// stepgraph(unsafe): width > 0, width % 4 == 0, grid = elementwise(cdiv(batch * width, 4))
extern "C" __global__ void replay_gather_rows4(const unsigned* __restrict__ idx,
                                               const float* __restrict__ src,
                                               float* __restrict__ dst, unsigned capacity,
                                               unsigned batch, unsigned width) {
    const unsigned quads = width / 4;
    const unsigned i = global_index();
    if (i >= batch * quads) {
        return;
    }
    const unsigned b = i / quads, q = i - b * quads;
    const unsigned row = idx[b];
    const float nan = __int_as_float(0x7fc00000);
    const float4 v = row < capacity ? ld4(src + (size_t)row * width + 4 * (size_t)q)
                                    : make_float4(nan, nan, nan, nan);
    st4(dst + (size_t)b * width + 4 * (size_t)q, v);
}

// The same for any width, one thread per float.
// stepgraph(unsafe): idx[batch], src[capacity * width], dst[batch * width], capacity > 0,
// stepgraph(unsafe): width > 0, grid = elementwise(batch * width)
extern "C" __global__ void replay_gather_rows(const unsigned* __restrict__ idx,
                                              const float* __restrict__ src,
                                              float* __restrict__ dst, unsigned capacity,
                                              unsigned batch, unsigned width) {
    const unsigned i = global_index();
    if (i >= batch * width) {
        return;
    }
    const unsigned b = i / width, c = i - b * width;
    const unsigned row = idx[b];
    dst[i] = row < capacity ? src[(size_t)row * width + c] : __int_as_float(0x7fc00000);
}

// The fill at startup, grid-stride over n elements (a fixed grid), from the key of
// (~seed, tensor): distributions of the host's generated transitions.

// Standard normals: Box-Muller on two 24-bit uniforms of one draw.
// stepgraph(unsafe): x[>= n], grid = blocks(1024, 256)
extern "C" __global__ void replay_fill_normal(float* __restrict__ x, unsigned long long n,
                                              unsigned long long seed,
                                              unsigned long long tensor) {
    const unsigned long long key = replay_key(~seed, tensor);
    for (unsigned long long i = global_index(); i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long bits = replay_bits(key, i);
        const float u1 = fmaxf(uniform24(bits), 1e-7f);
        const float u2 = uniform24(bits << 24);
        x[i] = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864769f * u2);
    }
}

// Actions uniform in [0, actions).
// stepgraph(unsafe): x[>= n], actions > 0, grid = blocks(1024, 256)
extern "C" __global__ void replay_fill_actions(int* __restrict__ x, unsigned long long n,
                                               unsigned actions, unsigned long long seed,
                                               unsigned long long tensor) {
    const unsigned long long key = replay_key(~seed, tensor);
    for (unsigned long long i = global_index(); i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        x[i] = (int)below(replay_bits(key, i), actions);
    }
}

// 1 with probability p, else 0.
// stepgraph(unsafe): x[>= n], grid = blocks(1024, 256)
extern "C" __global__ void replay_fill_bernoulli(float* __restrict__ x, unsigned long long n,
                                                 float p, unsigned long long seed,
                                                 unsigned long long tensor) {
    const unsigned long long key = replay_key(~seed, tensor);
    for (unsigned long long i = global_index(); i < n; i += (unsigned long long)gridDim.x * blockDim.x) {
        x[i] = uniform24(replay_bits(key, i)) < p ? 1.0f : 0.0f;
    }
}
