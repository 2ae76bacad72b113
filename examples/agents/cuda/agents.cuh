// Shared by the agents' kernels: the sizes of rejax's DuelingQNetwork for CartPole, the
// one flat parameter layout of an agent, the counters' layout, the counter-based
// generator's keys, and the network's forward pieces. src/layout.rs, src/rng.rs and
// src/reference.rs mirror every number and function here; a unit test checks that the
// #defines agree with the Rust constants.
#pragma once

#include "stepgraph/common.cuh"
#include "stepgraph/random.cuh"

// The network: obs [OBS] -> Dense(HIDDEN), swish -> Dense(HIDDEN), swish -> value
// Dense(1) and advantage Dense(ACTIONS); Q = V + A - mean(A).
#define OBS 4
#define HIDDEN 64
#define ACTIONS 2

// One agent's parameters, flat, in this order (flax's Dense kernels are [in, out],
// row-major). The builder reads only literal #defines, so each offset is spelled out and
// the static_asserts below tie them to the sizes.
#define OFF_W1 0      // [OBS, HIDDEN]
#define OFF_B1 256    // [HIDDEN]
#define OFF_W2 320    // [HIDDEN, HIDDEN]
#define OFF_B2 4416   // [HIDDEN]
#define OFF_WV 4480   // [HIDDEN, 1]
#define OFF_BV 4544   // [1]
#define OFF_WA 4545   // [HIDDEN, ACTIONS]
#define OFF_BA 4673   // [ACTIONS]
#define PARAMS 4675
static_assert(OFF_B1 == OFF_W1 + OBS * HIDDEN, "layout");
static_assert(OFF_W2 == OFF_B1 + HIDDEN, "layout");
static_assert(OFF_B2 == OFF_W2 + HIDDEN * HIDDEN, "layout");
static_assert(OFF_WV == OFF_B2 + HIDDEN, "layout");
static_assert(OFF_BV == OFF_WV + HIDDEN, "layout");
static_assert(OFF_WA == OFF_BV + 1, "layout");
static_assert(OFF_BA == OFF_WA + HIDDEN * ACTIONS, "layout");
static_assert(PARAMS == OFF_BA + ACTIONS, "layout");
// The float4 loads of the update kernel read W1, B1, W2 and B2 rows from shared memory.
static_assert(OFF_B1 % 4 == 0 && OFF_W2 % 4 == 0 && OFF_B2 % 4 == 0, "float4 rows");

// The counters, one u32 array of COUNTERS shared by all agents (they step in lockstep).
#define COUNTER_STEP 0         // environment steps taken by each agent (rejax's global_step)
#define COUNTER_STEP_BEFORE 1  // its value before the last dqn_count (rejax's old_global_step)
#define COUNTER_POS 2          // the ring slot the next insert writes first
#define COUNTER_SIZE 3         // filled slots of each ring, at most its capacity
#define COUNTERS 4

// What a key is for: draws of different purposes never share a key.
#define PURPOSE_ACT 1
#define PURPOSE_SAMPLE 2
#define PURPOSE_EVAL 3

// The key of one draw: a hash of (seed, agent, purpose, counter).
__device__ __forceinline__ unsigned long long agent_key(unsigned long long seed, unsigned agent,
                                                        unsigned purpose,
                                                        unsigned long long counter) {
    return rng_splitmix(rng_splitmix(rng_splitmix(rng_splitmix(seed) ^ agent) ^ purpose) ^
                        counter);
}

// Word `i` of a key.
__device__ __forceinline__ unsigned long long key_bits(unsigned long long key, unsigned i) {
    return rng_splitmix(key + (unsigned long long)i * RNG_GAMMA);
}

// The top 24 bits as a float in [0, 1), exactly.
__device__ __forceinline__ float unit24(unsigned long long bits) {
    return (float)(bits >> 40) * 0x1.0p-24f;
}

// An integer uniform in [0, n): the high word of bits * n (Lemire), for n >= 1.
__device__ __forceinline__ unsigned below(unsigned long long bits, unsigned n) {
    return (unsigned)__umul64hi(bits, (unsigned long long)n);
}

// flax's swish (silu): z sigmoid(z), sigmoid = 1 / (1 + exp(-z)).
__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }
__device__ __forceinline__ float swish(float z) { return z * sigmoid(z); }
// d swish / dz = s (1 + z (1 - s)).
__device__ __forceinline__ float swish_grad_of(float z, float s) {
    return s * (1.0f + z * (1.0f - s));
}
__device__ __forceinline__ float swish_grad(float z) { return swish_grad_of(z, sigmoid(z)); }

// optax.linear_schedule(eps_start, eps_end, eps_steps) at `step`, in f32 as JAX computes
// it: frac = 1 - min(step, eps_steps) / eps_steps; (start - end) frac + end. Each
// operation rounded once, so the CPU reference computes the same float.
__device__ __forceinline__ float epsilon_at(unsigned step, float eps_start, float eps_end,
                                            unsigned eps_steps) {
    const unsigned count = step < eps_steps ? step : eps_steps;
    const float frac = __fsub_rn(1.0f, __fdiv_rn((float)count, (float)eps_steps));
    return __fadd_rn(__fmul_rn(__fsub_rn(eps_start, eps_end), frac), eps_end);
}

// The epsilon-greedy choice of distrax.EpsilonGreedy: with probability eps an action
// uniform over all ACTIONS, else a greedy one, uniform among exact ties. Word 2 env of the
// key decides exploring (unit24 < eps), word 2 env + 1 which action.
__device__ __forceinline__ int epsilon_greedy(const float* q, float eps, unsigned long long key,
                                              unsigned env) {
    const unsigned long long explore = key_bits(key, 2 * env);
    const unsigned long long pick = key_bits(key, 2 * env + 1);
    if (unit24(explore) < eps) {
        return (int)below(pick, ACTIONS);
    }
    float best = q[0];
    unsigned ties = 1;
    for (int j = 1; j < ACTIONS; ++j) {
        if (q[j] > best) {
            best = q[j];
            ties = 1;
        } else if (q[j] == best) {
            ties += 1;
        }
    }
    unsigned nth = ties > 1 ? below(pick, ties) : 0;
    for (int j = 0; j < ACTIONS; ++j) {
        if (q[j] == best) {
            if (nth == 0) {
                return j;
            }
            nth -= 1;
        }
    }
    return 0;
}

// The dueling head's combination: V + (A_j - mean(A)), the mean as sum / ACTIONS.
__device__ __forceinline__ void dueling_q(float v, const float* adv, float* q) {
    float sum = 0.0f;
    for (int j = 0; j < ACTIONS; ++j) {
        sum += adv[j];
    }
    const float mean = sum / (float)ACTIONS;
    for (int j = 0; j < ACTIONS; ++j) {
        q[j] = v + (adv[j] - mean);
    }
}

// Sum over the 32 lanes of a warp, every lane getting the total.
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
    }
    return x;
}

// Hidden units a lane holds when a warp computes one row: l, l + 32, ...
#define UNITS (HIDDEN / 32)
static_assert(HIDDEN % 32 == 0, "lanes split the hidden units evenly");

// The dueling head of one row, by one warp: h2[u] is unit lane + 32 u of the second hidden
// layer's output; every lane gets the row's Q values.
__device__ __forceinline__ void warp_head(const float* p, const float* h2, float* q) {
    const unsigned lane = threadIdx.x % 32;
    float v = 0.0f, adv[ACTIONS];
    for (int j = 0; j < ACTIONS; ++j) {
        adv[j] = 0.0f;
    }
    for (int u = 0; u < UNITS; ++u) {
        const unsigned n = lane + 32 * u;
        v = fmaf(h2[u], p[OFF_WV + n], v);
        for (int j = 0; j < ACTIONS; ++j) {
            adv[j] = fmaf(h2[u], p[OFF_WA + n * ACTIONS + j], adv[j]);
        }
    }
    v = warp_sum(v) + p[OFF_BV];
    for (int j = 0; j < ACTIONS; ++j) {
        adv[j] = warp_sum(adv[j]) + p[OFF_BA + j];
    }
    dueling_q(v, adv, q);
}
