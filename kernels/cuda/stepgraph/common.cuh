// Shared by the kernels of this crate, and exported to kernel crates that depend on it
// (`#include "stepgraph/common.cuh"`).
#pragma once

// This thread's index in a 1-D grid. The Rust wrappers launch at most ceil(n / 256)
// blocks of 256 threads for n < 2^32, so the index fits in 32 bits without wrapping;
// every kernel still checks it against n, because the last block overhangs the end.
__device__ __forceinline__ unsigned global_index() {
    return blockIdx.x * blockDim.x + threadIdx.x;
}
