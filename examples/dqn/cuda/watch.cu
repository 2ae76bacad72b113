// The step's watch over its own health, one block per replay, after the gradients' sum of
// squares and before Adam (clip_and_adam): the host reads it back a few replays late, so
// whatever it needs to report a bad replay is latched here, on the device.
//
// It counts replays, keeps the latest replay's seven losses and sum of squares, and at the
// first replay whose losses or sum of squares are not finite it latches that replay's
// number, its losses and, per gradient tensor, how many NaN and Inf elements it holds.
// From that replay on it sets the sum of squares to NaN, which makes adam_clip_update skip
// the update: a bad replay is never applied, and neither is any replay after it, so the
// parameters the host finds when it reads the watch are those before the bad replay.
#include "dqn.cuh"

typedef unsigned long long u64;
// Words per tensor of stepgraph-kernels' parameter table (PARAM_TABLE_WORDS in its optim.cu:
// param, grad, m, v, length, start); a unit test checks the two agree.
#define WATCH_TABLE_WORDS 6

// Words of the watch buffer (u32; losses and sums as float bits). Mirrored by
// `stepgraph_dqn::kernels::Watch`.
#define WATCH_REPLAYS 0
#define WATCH_BAD_REPLAY 1
#define WATCH_LOSSES 2
#define WATCH_SQ_NORM 9
#define WATCH_BAD_LOSSES 10
#define WATCH_BAD_SQ_NORM 17
#define WATCH_TENSORS 18
#define WATCH_LOSS_COUNT 7

// table: the optimizer's parameter table (WATCH_TABLE_WORDS words per tensor: param,
// grad, m, v, length, start), T tensors; losses, iqn_losses, attn_losses: the three loss
// buffers (LOSS_SLOT_COUNT each); sq_norm: grad_sq_norm's output, set to NaN to skip the
// update; watch: WATCH_TENSORS + 2 T words, zeroed at allocation.
// Grid: 1 block of 1024.
extern "C" __global__ void __launch_bounds__(1024)
    watch_step(const u64* __restrict__ table, unsigned T, const float* __restrict__ losses,
               const float* __restrict__ iqn_losses, const float* __restrict__ attn_losses,
               float* __restrict__ sq_norm, unsigned* __restrict__ watch) {
    __shared__ int first_bad;
    if (threadIdx.x == 0) {
        const unsigned replay = watch[WATCH_REPLAYS] + 1;
        watch[WATCH_REPLAYS] = replay;
        // The same seven values the host reports (L, L_td, L_iql, L_iqn, L_attn, L_cql,
        // L_conf): L is added into by a kernel on each of the three loss streams.
        const float l[WATCH_LOSS_COUNT] = {
            losses[LOSS_TOTAL] + iqn_losses[LOSS_TOTAL] + attn_losses[LOSS_TOTAL],
            losses[LOSS_TD],
            losses[LOSS_IQL],
            iqn_losses[LOSS_IQN],
            attn_losses[LOSS_ATTN],
            losses[LOSS_CQL],
            losses[LOSS_CONF],
        };
        const float sq = sq_norm[0];
        bool finite = isfinite(sq);
        for (int i = 0; i < WATCH_LOSS_COUNT; ++i) {
            watch[WATCH_LOSSES + i] = __float_as_uint(l[i]);
            finite = finite && isfinite(l[i]);
        }
        watch[WATCH_SQ_NORM] = __float_as_uint(sq);
        const bool halted = watch[WATCH_BAD_REPLAY] != 0;
        first_bad = !halted && !finite;
        if (first_bad) {
            watch[WATCH_BAD_REPLAY] = replay;
            for (int i = 0; i < WATCH_LOSS_COUNT; ++i) {
                watch[WATCH_BAD_LOSSES + i] = __float_as_uint(l[i]);
            }
            watch[WATCH_BAD_SQ_NORM] = __float_as_uint(sq);
        }
        if (halted || !finite) {
            sq_norm[0] = __int_as_float(0x7fc00000);
        }
    }
    __syncthreads();
    if (!first_bad) {
        return;
    }
    // Once, at the first bad replay: the non-finite elements of every gradient.
    for (unsigned k = 0; k < T; ++k) {
        const u64* ent = table + (size_t)k * WATCH_TABLE_WORDS;
        const float* g = reinterpret_cast<const float*>(ent[1]);
        unsigned nan = 0, inf = 0;
        for (u64 i = threadIdx.x; i < ent[4]; i += blockDim.x) {
            const float x = g[i];
            nan += isnan(x) ? 1u : 0u;
            inf += isinf(x) ? 1u : 0u;
        }
        if (nan) {
            atomicAdd(&watch[WATCH_TENSORS + 2 * k], nan);
        }
        if (inf) {
            atomicAdd(&watch[WATCH_TENSORS + 2 * k + 1], inf);
        }
    }
}
