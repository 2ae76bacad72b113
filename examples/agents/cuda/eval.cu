// Evaluation: rejax's evaluate.py plays one episode in each of its evaluation environments
// and averages their returns. The environments auto-reset, so a short episode is followed
// by another; `first_returns` keeps the first episode's return of each environment and
// ignores the rest. Not yet recorded is NaN, which `first_returns_clear` sets.

#include "agents.cuh"

// first[i] = last_return[i] at the step that ends environment i's first episode after the
// clear (episodes[i] reaches 1; a step ends at most one episode), once.
// stepgraph(unsafe): episodes[n], last_return[n], first[n], grid = elementwise(n)
extern "C" __global__ void first_returns(const unsigned* __restrict__ episodes,
                                         const float* __restrict__ last_return,
                                         float* __restrict__ first, unsigned n) {
    const unsigned i = global_index();
    if (i >= n) {
        return;
    }
    if (isnan(first[i]) && episodes[i] >= 1u) {
        first[i] = last_return[i];
    }
}

// first[i] = NaN: nothing recorded yet.
// stepgraph(unsafe): first[n], grid = elementwise(n)
extern "C" __global__ void first_returns_clear(float* __restrict__ first, unsigned n) {
    const unsigned i = global_index();
    if (i < n) {
        first[i] = __int_as_float(0x7fc00000);
    }
}
