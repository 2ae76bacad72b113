// Reductions that add in a fixed order, so that the same inputs give the same bits on every
// run: over a warp, over a block, and down a column of a row-major matrix. Used by this
// crate's optimizer kernels and exported to kernel crates that depend on it
// (`#include "stepgraph/reduce.cuh"`).
#pragma once

#define FULL_MASK 0xffffffffu

// Sum over the 32 lanes of a warp; every lane must call it. The xor butterfly adds the
// same pairs on every lane (a + b == b + a exactly), so all lanes get the same bits.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, m);
    }
    return v;
}

// Sum over a block of blockDim.x threads (1-D, a multiple of 32, at most 1024); every thread
// must call it. The result is valid in thread 0. Fixed order: deterministic. It ends with a
// barrier, so it can be called again right away.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float warp_partial[32];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) {
        warp_partial[warp] = v;
    }
    __syncthreads();
    float t = 0.0f;
    if (warp == 0) {
        t = lane < (blockDim.x >> 5) ? warp_partial[lane] : 0.0f;
        t = warp_sum(t);
    }
    __syncthreads();
    return t;
}

// The block's half of column_block_sum: each thread's own sum s of its rows in, the sum of
// the block's 32 row groups out, added in order by the threads with threadIdx.y == 0 (the
// result is valid there). A kernel that forms the values it sums (a first pass of
// stepgraph_kernels::Kernels::column_sums fused with the op that writes the tensor) adds
// its rows row_begin + threadIdx.y + 32k in that order, then calls this: the same bits as
// column_block_sum over the tensor written. Every thread of the block must call it.
__device__ __forceinline__ float column_tile_sum(float s) {
    __shared__ float tile[32][33];
    tile[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    float t = 0.0f;
    if (threadIdx.y == 0) {
#pragma unroll 8
        for (int k = 0; k < 32; ++k) {
            t += tile[k][threadIdx.x];
        }
    }
    return t;
}

// Column c of rows [row_begin, row_end) of a row-major matrix x[., cols], summed by a block
// of (32, 32) threads: threadIdx.x picks the column (c = 32 * blockIdx.x + threadIdx.x is
// the caller's choice), threadIdx.y the rows row_begin + threadIdx.y + 32k. Each thread
// adds its rows in order, then the threads with threadIdx.y == 0 add the 32 row groups in
// order: deterministic. Every thread of the block must call it; the result is valid where
// threadIdx.y == 0 (0 for columns c >= cols). A warp reads 32 consecutive floats of a row.
__device__ __forceinline__ float column_block_sum(const float* __restrict__ x, unsigned row_begin,
                                                  unsigned row_end, unsigned cols, unsigned c) {
    float s = 0.0f;
    if (c < cols) {
#pragma unroll 4
        for (unsigned r = row_begin + threadIdx.y; r < row_end; r += 32) {
            s += x[(size_t)r * cols + c];
        }
    }
    return column_tile_sum(s);
}
