// overlap.cu -- a compile-only probe: does ptxas (CUDA 13.0) keep a warpgroup's wgmmas
// asynchronous when the warpgroup reads the accumulators of a finished wgmma while another
// of its wgmmas is in flight? That is the overlap iqn_wgmma would need to run its epilogue
// on tile i beside GEMM 1 of tile i + 1 (examples/dqn/PERF.md, "The IQN head").
//
// k<0>: two accumulator sets, alternating tiles: issue the next tile's product into one,
//       wait_group 1 (the other's product is done), read the other.
// k<1>: the same with wait_group 0 (no overlap).
// k<2>: k<0> without the compiler-only register fences after the wait.
// k<3>: both products of a turn issued, wait_group 1, the first set read while the second
//       product runs, wait_group 0 before the loop's back edge: nothing in flight there.
// overlap.sh builds it and prints which kernels ptxas serialized (C7514/C7515). On the
// 13.0 ptxas k<0> and k<2> are serialized, k<1> and k<3> are not: what ptxas refuses is a
// product still in flight across the loop's back edge (k<0> leaves one there), not reading
// a finished set beside a running product. iqn_wgmma's overlapped variant had k<3>'s shape
// and stayed asynchronous (examples/dqn/PERF.md, "Tried and dropped").
#include "wgmma.cuh"

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ void product(float (&d)[32], uint64_t dA, uint64_t dB) {
    reg_fence_all(d);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        wgmma_ss_n64(d, dA + 2 * ks, dB + 2 * ks, ks > 0);
    }
    wgmma_commit();
    reg_fence_all(d);
}

template <int VARIANT>
__global__ void __launch_bounds__(128, 1) k(float* out, int n, uint64_t dA, uint64_t dB) {
    constexpr bool overlap = VARIANT != 1, fences = VARIANT != 2;
    float a0[32], a1[32];
    for (int i = 0; i < 32; ++i) {
        a0[i] = 0.f;
        a1[i] = 0.f;
    }
    float s = 0.f;
    product(a0, dA, dB);
    wgmma_wait<0>();
    reg_fence_all(a0);
    int t = 0;
    do {
        product(a1, dA, dB + 64);  // the next tile, into a1
        if (overlap) {
            wgmma_wait<1>();
        } else {
            wgmma_wait<0>();
        }
        if (fences) reg_fence_all(a0);
        for (int i = 0; i < 32; ++i) s += a0[i] * a0[i];
        s += __shfl_xor_sync(FULL_MASK, s, 1);
        if (++t >= n) break;
        product(a0, dA, dB + 128);  // the next tile, into a0
        if (overlap) {
            wgmma_wait<1>();
        } else {
            wgmma_wait<0>();
        }
        if (fences) reg_fence_all(a1);
        for (int i = 0; i < 32; ++i) s += a1[i] * 2.f;
        s += __shfl_xor_sync(FULL_MASK, s, 1);
        ++t;
    } while (t < n);
    wgmma_wait<0>();
    reg_fence_all(a0);
    reg_fence_all(a1);
    out[threadIdx.x] = s + a0[threadIdx.x & 31] + a1[(threadIdx.x + 1) & 31];
}

template <>
__global__ void __launch_bounds__(128, 1) k<3>(float* out, int n, uint64_t dA, uint64_t dB) {
    float a0[32], a1[32];
    for (int i = 0; i < 32; ++i) {
        a0[i] = 0.f;
        a1[i] = 0.f;
    }
    float s = 0.f;
    int t = 0;
    do {
        product(a0, dA, dB + 64 * t);  // this tile, into a0
        product(a1, dA, dB + 64 * t + 32);  // the next, into a1
        wgmma_wait<1>();
        reg_fence_all(a0);
        for (int i = 0; i < 32; ++i) s += a0[i] * a0[i];  // beside a1's product
        s += __shfl_xor_sync(FULL_MASK, s, 1);
        wgmma_wait<0>();
        reg_fence_all(a1);
        for (int i = 0; i < 32; ++i) s += a1[i] * 2.f;
        t += 2;
    } while (t < n);
    out[threadIdx.x] = s + a0[threadIdx.x & 31] + a1[(threadIdx.x + 1) & 31];
}

template __global__ void k<0>(float*, int, uint64_t, uint64_t);
template __global__ void k<1>(float*, int, uint64_t, uint64_t);
template __global__ void k<2>(float*, int, uint64_t, uint64_t);
