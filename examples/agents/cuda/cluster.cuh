// Thread-block clusters where the GPU has them (compute capability 9.0): the blocks of one
// agent share their shared memory, so an update can split its batch over several SMs and
// sum its gradients without a trip through global memory. Elsewhere an agent is one block
// and its "peers" are itself, so the same kernel code runs unchanged.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#define AGENTS_HAVE_CLUSTERS 1
__device__ __forceinline__ unsigned cluster_rank() {
    return cooperative_groups::this_cluster().block_rank();
}
// Every thread of every block of the cluster has arrived, and sees what the others wrote.
__device__ __forceinline__ void cluster_sync() { cooperative_groups::this_cluster().sync(); }
// `p` (this block's shared memory) in block `rank`'s shared memory.
template <typename T>
__device__ __forceinline__ T* peer(T* p, unsigned rank) {
    return cooperative_groups::this_cluster().map_shared_rank(p, rank);
}
#else
#define AGENTS_HAVE_CLUSTERS 0
__device__ __forceinline__ unsigned cluster_rank() { return 0; }
__device__ __forceinline__ void cluster_sync() { __syncthreads(); }
template <typename T>
__device__ __forceinline__ T* peer(T* p, unsigned) {
    return p;
}
#endif
