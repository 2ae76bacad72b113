// SAC's acting: the squashed-Gaussian actions of A agents for their E environments each,
// one warp per environment, from each agent's actor (global memory: one agent's 18 KB
// stays in L1 across its warps) on observations normalised with the agent's statistics.
// Observations [A, E, SAC_OBS], actions [A, E] (the torques Pendulum's step takes).

#include "sac.cuh"

#define SAC_ACT_WARPS 8
#define SAC_ACT_THREADS 256
static_assert(SAC_ACT_THREADS == 32 * SAC_ACT_WARPS, "one warp per environment");

// The actor's mean and raw log-std for one normalised observation `x`, by one warp: lane
// l holds hidden units l, l + 32; the first layer's outputs go through the warp's `h1`.
__device__ void warp_actor(const float* __restrict__ p, const float* x, float* h1, float* mu,
                           float* ls_raw) {
    const unsigned lane = threadIdx.x % 32;
    for (int u = 0; u < UNITS; ++u) {
        const unsigned n = lane + 32 * u;
        float z = p[ACTOR_B1 + n];
        for (int c = 0; c < SAC_OBS; ++c) {
            z = fmaf(x[c], p[ACTOR_W1 + c * SAC_HIDDEN + n], z);
        }
        h1[n] = swish(z);
    }
    __syncwarp();
    float m = 0.0f, l = 0.0f;
    for (int u = 0; u < UNITS; ++u) {
        const unsigned n = lane + 32 * u;
        float z = p[ACTOR_B2 + n];
#pragma unroll 16
        for (int k = 0; k < SAC_HIDDEN; ++k) {
            z = fmaf(h1[k], p[ACTOR_W2 + k * SAC_HIDDEN + n], z);
        }
        const float h = swish(z);
        m = fmaf(h, p[ACTOR_WMU + n], m);
        l = fmaf(h, p[ACTOR_WLS + n], l);
    }
    *mu = warp_sum(m) + p[ACTOR_BMU];
    *ls_raw = warp_sum(l) + p[ACTOR_BLS];
}

// One environment per warp: i = blockIdx.x SAC_ACT_WARPS + warp, agent = i / E. The noise
// is normal_draw(agent_key(seed, agent, purpose, clock), env).
__device__ void sac_act_one(const float* __restrict__ actor, const float* __restrict__ rms,
                            const float* __restrict__ obs, float* __restrict__ actions,
                            unsigned A, unsigned E, unsigned long long seed, unsigned purpose,
                            unsigned clock) {
    __shared__ float h1[SAC_ACT_WARPS][SAC_HIDDEN];
    const unsigned warp = threadIdx.x / 32;
    const unsigned i = blockIdx.x * SAC_ACT_WARPS + warp;
    if (i >= A * E) {
        return;
    }
    const unsigned agent = i / E, env = i % E;
    const float* stats = rms + (size_t)agent * RMS_FLOATS;
    float x[SAC_OBS];
    for (int c = 0; c < SAC_OBS; ++c) {
        x[c] = normalize(obs[(size_t)i * SAC_OBS + c], stats[RMS_MEAN + c], stats[RMS_VAR + c]);
    }
    float mu, ls_raw;
    warp_actor(actor + (size_t)agent * ACTOR_PARAMS, x, h1[warp], &mu, &ls_raw);
    const float eps = normal_draw(agent_key(seed, agent, purpose, clock), env);
    if (threadIdx.x % 32 == 0) {
        actions[i] = squash(mu, ls_raw, eps).action;
    }
}

// rejax's training act (collect_transitions) at the step counters[COUNTER_STEP]: a sample
// of the policy on the observation normalised with the statistics before this step's
// update, drawing from PURPOSE_SAC_ACT at that step. rejax's SAC acts with its policy from
// the first step (no uniform filling).
// stepgraph(unsafe): actor[A * ACTOR_PARAMS], rms[A * RMS_FLOATS], obs[A * E * SAC_OBS],
// stepgraph(unsafe): counters[COUNTERS], actions[A * E], A > 0, E > 0,
// stepgraph(unsafe): grid = blocks(cdiv(A * E, SAC_ACT_WARPS), SAC_ACT_THREADS)
extern "C" __global__ void __launch_bounds__(SAC_ACT_THREADS)
    sac_act(const float* __restrict__ actor, const float* __restrict__ rms,
            const float* __restrict__ obs, const unsigned* __restrict__ counters,
            float* __restrict__ actions, unsigned A, unsigned E, unsigned long long seed) {
    sac_act_one(actor, rms, obs, actions, A, E, seed, PURPOSE_SAC_ACT, counters[COUNTER_STEP]);
}

// Evaluation's act (rejax's make_act: a sample of the policy, as in training), drawing
// from PURPOSE_SAC_EVAL at clock[0], which eval_tick moves on.
// stepgraph(unsafe): actor[A * ACTOR_PARAMS], rms[A * RMS_FLOATS], obs[A * E * SAC_OBS],
// stepgraph(unsafe): clock[1], actions[A * E], A > 0, E > 0,
// stepgraph(unsafe): grid = blocks(cdiv(A * E, SAC_ACT_WARPS), SAC_ACT_THREADS)
extern "C" __global__ void __launch_bounds__(SAC_ACT_THREADS)
    sac_act_eval(const float* __restrict__ actor, const float* __restrict__ rms,
                 const float* __restrict__ obs, const unsigned* __restrict__ clock,
                 float* __restrict__ actions, unsigned A, unsigned E, unsigned long long seed) {
    sac_act_one(actor, rms, obs, actions, A, E, seed, PURPOSE_SAC_EVAL, clock[0]);
}
