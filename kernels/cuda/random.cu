// A counter-based random generator whose only state is a counter in device memory
// (`stepgraph_kernels::DeviceRng`): every draw is a pure function of (seed, counter,
// substream, element), so a captured graph draws fresh values at each replay (an
// `rng_advance` node moves the counter on) with nothing from the host, and the CPU
// references (reference.rs) compute the same bits.
//
//   key(seed, counter)    = splitmix(splitmix(seed) ^ counter)
//   bits(key, sub, e)     = splitmix(key + ((sub << 32) | e) * RNG_GAMMA)
//
// splitmix is splitmix64's output function, a bijection of 64-bit words. Within one key,
// the words hashed for distinct (substream, element) pairs are distinct: (sub << 32) | e
// is, for 32-bit sub and e, and multiplying by an odd constant is a bijection. Substream 0
// gives the draws of the DQN and SAC examples' generators.
//
// Also the gather of drawn rows: of one array, one thread per element, blocks of 256; and
// of several arrays at the same indices in one launch, over a gather table.

#include "stepgraph/common.cuh"
#include "stepgraph/random.cuh"
#include "stepgraph/table.cuh"

#define GATHER_TABLE_WORDS 5
#define GATHER_CHUNK 512

typedef unsigned long long u64;

__device__ __forceinline__ u64 rng_bits(u64 seed, u64 counter, unsigned substream, unsigned e) {
    const u64 key = rng_splitmix(rng_splitmix(seed) ^ counter);
    return rng_splitmix(key + ((((u64)substream) << 32) | e) * RNG_GAMMA);
}

// The top 24 bits as a float in [0, 1), exactly (24 bits fit a float's significand).
__device__ __forceinline__ float rng_unit24(u64 bits) {
    return (float)(unsigned)(bits >> 40) * 5.9604644775390625e-8f;
}

// out[e] <- a standard normal: Box-Muller on u1 = ((bits >> 40) + 1) 2^-24 in (0, 1] (no
// log of 0) and u2 = ((bits >> 16) & 0xFFFFFF) 2^-24 in [0, 1), z = sqrt(-2 log u1)
// cos(2 pi u2). cospif takes 2 u2 exactly: no rounded pi enters the argument, so the
// error stays relative to the result near the cosine's zeros too.
extern "C" __global__ void rng_normal(const u64* __restrict__ counter, u64 seed,
                                      unsigned substream, float* __restrict__ out, unsigned n) {
    const unsigned e = global_index();
    if (e >= n) {
        return;
    }
    const u64 bits = rng_bits(seed, *counter, substream, e);
    const float u1 = (float)((unsigned)(bits >> 40) + 1u) * 5.9604644775390625e-8f;
    const float u2 = (float)((unsigned)(bits >> 16) & 0xFFFFFFu) * 5.9604644775390625e-8f;
    out[e] = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// out[e] <- uniform in [lo, hi): fmaf(hi - lo, u, lo) with u of 24 bits in [0, 1). The
// fused operation can round up to hi itself (1 + (1 - 2^-24) rounds to 2), which is then
// replaced by the float just below it. The wrapper checks lo < hi, both finite, and hi - lo
// finite.
extern "C" __global__ void rng_uniform(const u64* __restrict__ counter, u64 seed,
                                       unsigned substream, float lo, float hi,
                                       float* __restrict__ out, unsigned n) {
    const unsigned e = global_index();
    if (e >= n) {
        return;
    }
    const float u = rng_unit24(rng_bits(seed, *counter, substream, e));
    const float v = fmaf(hi - lo, u, lo);
    out[e] = v < hi ? v : nextafterf(hi, lo);
}

// idx[e] <- uniform in [0, rows): the high word of bits * rows, always below rows (the
// wrapper checks rows >= 1).
extern "C" __global__ void rng_indices(const u64* __restrict__ counter, u64 seed,
                                       unsigned substream, unsigned rows,
                                       unsigned* __restrict__ idx, unsigned n) {
    const unsigned e = global_index();
    if (e >= n) {
        return;
    }
    idx[e] = (unsigned)__umul64hi(rng_bits(seed, *counter, substream, e), (u64)rows);
}

// counter += 1, after the draws that read it (one thread): the next replay's draws.
extern "C" __global__ void rng_advance(u64* __restrict__ counter) {
    if (global_index() == 0) {
        *counter += 1;
    }
}

// dst[i, :] <- src[idx[i], :] for rows of row_len floats, src holding `rows` of them. An
// index out of range (a caller's own: rng_indices draws below rows) gathers a row of NaN
// rather than reading past src. One thread per element of dst, count = dst's length.
extern "C" __global__ void gather_rows(const float* __restrict__ src, unsigned rows,
                                       const unsigned* __restrict__ idx,
                                       float* __restrict__ dst, unsigned row_len,
                                       unsigned count) {
    const unsigned i = global_index();
    if (i >= count) {
        return;
    }
    const unsigned r = i / row_len, c = i - r * row_len;
    const unsigned row = idx[r];
    dst[i] = row < rows ? src[(size_t)row * row_len + c] : __int_as_float(0x7fc00000);
}

// The gather table (built once on the host by `stepgraph_kernels::GatherTable`): T entries
// of GATHER_TABLE_WORDS u64 each, entry k at words [5k, 5k + 5):
//   0: src (const float*, `rows` rows), 1: dst (float*, `batch` rows), 2: row_len,
//   3: width (floats per unit: 4 where row_len is a multiple of 4 and both addresses are
//   16-byte aligned, else 1), 4: start (units of the entries 0..k).
// An entry's units are its dst's elements in groups of `width`: batch row_len / width of
// them. The units of all entries are concatenated into one index space [0, units); block b
// takes units [b GATHER_CHUNK, (b + 1) GATHER_CHUNK) of it, whichever entries they fall in,
// so the grid follows the size of the destinations, not their number. Consecutive threads
// take consecutive units of a row: the reads along a row are coalesced, as the writes are.

// dst_k[i, :] <- src_k[idx[i], :] for every entry k, as gather_rows does one (a row of NaN
// for an index out of range), idx holding `batch` indices. Grid: ceil(units /
// GATHER_CHUNK) blocks of 256.
extern "C" __global__ void __launch_bounds__(256)
    gather_rows_table(const u64* __restrict__ table, unsigned T, u64 units,
                      const unsigned* __restrict__ idx, unsigned rows, unsigned batch) {
    const u64 c0 = (u64)blockIdx.x * GATHER_CHUNK;
    const u64 c1 = min(c0 + GATHER_CHUNK, units);
    const float nan = __int_as_float(0x7fc00000);
    for (unsigned k = table_entry_at(table, T, GATHER_TABLE_WORDS, 4, c0); k < T; ++k) {
        const u64* ent = table + (size_t)k * GATHER_TABLE_WORDS;
        const u64 start = ent[4];
        if (start >= c1) {
            break;
        }
        const unsigned row_len = (unsigned)ent[2], width = (unsigned)ent[3];
        const unsigned per_row = row_len / width;
        // The entry's units fit 32 bits: its dst's length does (checked on the host).
        const unsigned lo = (unsigned)(max(c0, start) - start);
        const unsigned hi = (unsigned)(min(c1, start + (u64)batch * per_row) - start);
        if (width == 4) {
            const float4* src = reinterpret_cast<const float4*>(ent[0]);
            float4* dst = reinterpret_cast<float4*>(ent[1]);
            for (unsigned j = lo + threadIdx.x; j < hi; j += blockDim.x) {
                const unsigned r = j / per_row, c = j - r * per_row;
                const unsigned row = idx[r];
                dst[j] = row < rows ? src[(size_t)row * per_row + c]
                                    : make_float4(nan, nan, nan, nan);
            }
        } else {
            const float* src = reinterpret_cast<const float*>(ent[0]);
            float* dst = reinterpret_cast<float*>(ent[1]);
            for (unsigned j = lo + threadIdx.x; j < hi; j += blockDim.x) {
                const unsigned r = j / row_len, c = j - r * row_len;
                const unsigned row = idx[r];
                dst[j] = row < rows ? src[(size_t)row * row_len + c] : nan;
            }
        }
    }
}
