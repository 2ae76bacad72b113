// Multi-tensor ops: one launch over every pair of a table of (x, y) tensors, where a
// launch per tensor would cost a kernel node each (a Polyak update of a target network,
// target <- tau online + (1 - tau) target, touches every tensor of the network).
//
// The pair table (built once on the host by `stepgraph_kernels::PairTable`): T entries of
// PAIR_TABLE_WORDS u64 each, entry k at words [4k, 4k + 4):
//   0: x (const float*), 1: y (float*), 2: len (elements of each), 3: start (sum of len
//   over entries 0..k).
// The entries are concatenated into one index space [0, total); block b takes elements
// [b PAIR_CHUNK, (b + 1) PAIR_CHUNK) of it, whichever tensors they fall in. Each element's
// result depends on that element only, so the grid does not change any bits.

#include "stepgraph/common.cuh"
#include "stepgraph/table.cuh"

#define PAIR_TABLE_WORDS 4
#define PAIR_CHUNK 512

typedef unsigned long long u64;

// y <- a x + b y over every pair, fmaf(a, x, b * y) as elementwise.cu's axpby computes it.
// Grid: ceil(total / PAIR_CHUNK) blocks of 256.
extern "C" __global__ void __launch_bounds__(256)
    axpby_table(const u64* __restrict__ table, unsigned T, u64 total, float a, float b) {
    const u64 c0 = (u64)blockIdx.x * PAIR_CHUNK;
    const u64 c1 = min(c0 + PAIR_CHUNK, total);
    for (unsigned k = table_entry_at(table, T, PAIR_TABLE_WORDS, 3, c0); k < T; ++k) {
        const u64* ent = table + (size_t)k * PAIR_TABLE_WORDS;
        const u64 start = ent[3];
        if (start >= c1) {
            break;
        }
        const float* x = reinterpret_cast<const float*>(ent[0]);
        float* y = reinterpret_cast<float*>(ent[1]);
        const u64 lo = max(c0, start), hi = min(c1, start + ent[2]);
        for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            const u64 j = i - start;
            y[j] = fmaf(a, x[j], b * y[j]);
        }
    }
}
