// The runtime's kernels: what a conditional op's node runs after. `stepgraph_every`
// (an `#[every(k)]` op) counts the step's replays, modulo k, in a counter of the op's own,
// and opens the node at every k-th one; `stepgraph_when` (a `#[when(flag)]` op) opens it
// when the flag is set at that point of the replay. `src/every.ptx` is this file compiled by
//   nvcc -arch=compute_90 -ptx cuda/every.cu -o src/every.ptx
// (committed, so that the runtime builds without nvcc; the driver JIT-compiles it, and
// resolves cudaGraphSetConditional, when it loads it). build/tests/runtime_ptx.rs checks
// that the two agree.
#include <cuda_runtime.h>

extern "C" __global__ void stepgraph_every(cudaGraphConditionalHandle handle, unsigned int* count,
                                           unsigned int k) {
    unsigned int c = *count + 1;
    if (c >= k) {
        c = 0;
    }
    *count = c;
    cudaGraphSetConditional(handle, c == 0 ? 1u : 0u);
}

// One thread reads the flag after the op that set it (the plan orders the op after the
// flag's writer, as for any read), so the node sees this replay's value.
extern "C" __global__ void stepgraph_when(cudaGraphConditionalHandle handle,
                                          const unsigned int* flag) {
    cudaGraphSetConditional(handle, *flag != 0 ? 1u : 0u);
}

// A step's device loop (`Step::replay_loop`): a WHILE node whose body is the step. The
// counters are `[limit, remaining]`; the host sets `limit` (a memset, ordered before the
// launch on the launching stream). `stepgraph_loop_start` runs before the node and opens
// it unless the limit is 0; `stepgraph_loop_next` is the body's last node, after every op,
// and keeps the node open until the limit's iterations have run.
extern "C" __global__ void stepgraph_loop_start(cudaGraphConditionalHandle handle,
                                                unsigned int* counters) {
    unsigned int limit = counters[0];
    counters[1] = limit;
    cudaGraphSetConditional(handle, limit != 0 ? 1u : 0u);
}

extern "C" __global__ void stepgraph_loop_next(cudaGraphConditionalHandle handle,
                                               unsigned int* counters) {
    unsigned int remaining = counters[1] - 1;
    counters[1] = remaining;
    cudaGraphSetConditional(handle, remaining != 0 ? 1u : 0u);
}
