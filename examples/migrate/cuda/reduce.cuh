// A block-wide sum in a fixed order, shared by the trainer's reductions.
//
// Every kernel that calls block_sum is launched with REDUCE_THREADS threads per block
// (src/kernels.rs launches them so): the tree below pairs thread t with t + s for
// s = REDUCE_THREADS / 2, ..., 1, the same pairs on every run, so a sum gives the same
// bits every time. There are no float atomics anywhere in the trainer, whose order would
// vary from run to run.
#pragma once

#define REDUCE_THREADS 256

// Returns the block's sum of v in every thread; `scratch` is REDUCE_THREADS floats of
// shared memory. Every thread of the block must call it.
static __device__ __forceinline__ float block_sum(float v, float* scratch) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = REDUCE_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            scratch[threadIdx.x] += scratch[threadIdx.x + s];
        }
        __syncthreads();
    }
    const float total = scratch[0];
    // No thread may overwrite scratch[0] (in a later call) before every thread read it.
    __syncthreads();
    return total;
}
