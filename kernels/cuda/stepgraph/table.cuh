// Tables of tensors that one launch covers (the optimizer's parameter table, the pair
// table of the multi-tensor ops): entries of `words` u64 each, one of which, at
// `start_word`, is the entry's start in the concatenation of all the entries' elements.
// Exported to kernel crates that depend on this one (`#include "stepgraph/table.cuh"`).
#pragma once

// The last entry whose start is <= i (the entry that holds element i, or a zero-length
// entry just before it, which the caller's loop skips). Entries are sorted by start and
// the first starts at 0. Inlined with constant `words` and `start_word`, it costs what a
// search written for one layout costs.
__device__ __forceinline__ unsigned table_entry_at(const unsigned long long* __restrict__ table,
                                                   unsigned T, unsigned words,
                                                   unsigned start_word, unsigned long long i) {
    unsigned lo = 0, hi = T;
    while (hi - lo > 1) {
        const unsigned mid = lo + (hi - lo) / 2;
        if (table[(size_t)mid * words + start_word] <= i) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}
