// SAC's acting: the squashed-Gaussian actions of A agents for their E environments each,
// one block per environment, from each agent's actor on observations normalised with the
// agent's statistics. Observations [A, E, SAC_OBS], actions [A, E] (the torques
// Pendulum's step takes).
//
// With one environment per agent (rejax's Pendulum configuration) acting is a matter of
// latency: every thread issues all its loads (the observation, the statistics, its
// weights) before it computes anything, so the actor's 18 KB come in one trip to memory.
// Thread t holds unit n = t % 64 and half t / 64 of W2's rows.

#include "sac.cuh"

#define SAC_ACT_THREADS 128
#define SAC_ACT_HALF 32
static_assert(SAC_ACT_THREADS == 2 * SAC_HIDDEN && 2 * SAC_ACT_HALF == SAC_HIDDEN, "halves");

// Environment i = blockIdx.x (agent i / E): the action for its observation, drawing
// normal_draw(agent_key(seed, agent, purpose, clock), env).
__device__ void sac_act_one(const float* __restrict__ actor, const float* __restrict__ rms,
                            const float* __restrict__ obs, float* __restrict__ actions,
                            unsigned E, unsigned long long seed, unsigned purpose,
                            unsigned clock) {
    __shared__ float h1[SAC_HIDDEN];
    __shared__ float part[2][SAC_HIDDEN];
    __shared__ float heads[2][2];
    const unsigned i = blockIdx.x;
    const unsigned agent = i / E, env = i % E;
    const unsigned t = threadIdx.x, n = t % SAC_HIDDEN, half = t / SAC_HIDDEN;
    const float* p = actor + (size_t)agent * ACTOR_PARAMS;
    const float* stats = rms + (size_t)agent * RMS_FLOATS;

    // Every load first.
    float x[SAC_OBS], w1[SAC_OBS], w2[SAC_ACT_HALF];
    for (int c = 0; c < SAC_OBS; ++c) {
        x[c] = obs[(size_t)i * SAC_OBS + c];
        w1[c] = p[ACTOR_W1 + c * SAC_HIDDEN + n];
    }
    float mean[SAC_OBS], var[SAC_OBS];
    for (int c = 0; c < SAC_OBS; ++c) {
        mean[c] = stats[RMS_MEAN + c];
        var[c] = stats[RMS_VAR + c];
    }
    const float b1 = p[ACTOR_B1 + n], b2 = p[ACTOR_B2 + n];
    const float wmu = p[ACTOR_WMU + n], wls = p[ACTOR_WLS + n];
#pragma unroll
    for (int k = 0; k < SAC_ACT_HALF; ++k) {
        w2[k] = p[ACTOR_W2 + (half * SAC_ACT_HALF + k) * SAC_HIDDEN + n];
    }

    if (half == 0) {
        float z = b1;
        for (int c = 0; c < SAC_OBS; ++c) {
            z = fmaf(normalize(x[c], mean[c], var[c]), w1[c], z);
        }
        h1[n] = swish(z);
    }
    __syncthreads();
    float z = 0.0f;
#pragma unroll
    for (int k = 0; k < SAC_ACT_HALF; ++k) {
        z = fmaf(h1[half * SAC_ACT_HALF + k], w2[k], z);
    }
    part[half][n] = z;
    __syncthreads();
    if (half == 0) {
        const float h = swish(b2 + part[0][n] + part[1][n]);
        const float m = warp_sum(h * wmu), l = warp_sum(h * wls);
        if (t % 32 == 0) {
            heads[t / 32][0] = m;
            heads[t / 32][1] = l;
        }
    }
    __syncthreads();
    if (t == 0) {
        const float mu = heads[0][0] + heads[1][0] + p[ACTOR_BMU];
        const float ls_raw = heads[0][1] + heads[1][1] + p[ACTOR_BLS];
        const float eps = normal_draw(agent_key(seed, agent, purpose, clock), env);
        actions[i] = squash(mu, ls_raw, eps).action;
    }
}

// rejax's training act (collect_transitions) at the step counters[COUNTER_STEP]: a sample
// of the policy on the observation normalised with the statistics before this step's
// update, drawing from PURPOSE_SAC_ACT at that step. rejax's SAC acts with its policy from
// the first step (no uniform filling).
// stepgraph(unsafe): actor[A * ACTOR_PARAMS], rms[A * RMS_FLOATS], obs[A * E * SAC_OBS],
// stepgraph(unsafe): counters[COUNTERS], actions[A * E], A > 0, E > 0,
// stepgraph(unsafe): grid = blocks(A * E, SAC_ACT_THREADS)
extern "C" __global__ void __launch_bounds__(SAC_ACT_THREADS)
    sac_act(const float* __restrict__ actor, const float* __restrict__ rms,
            const float* __restrict__ obs, const unsigned* __restrict__ counters,
            float* __restrict__ actions, unsigned A, unsigned E, unsigned long long seed) {
    if (blockIdx.x >= A * E || blockDim.x != SAC_ACT_THREADS) {
        return;
    }
    sac_act_one(actor, rms, obs, actions, E, seed, PURPOSE_SAC_ACT, counters[COUNTER_STEP]);
}

// Evaluation's act (rejax's make_act: a sample of the policy, as in training), drawing
// from PURPOSE_SAC_EVAL at clock[0], which eval_tick moves on.
// stepgraph(unsafe): actor[A * ACTOR_PARAMS], rms[A * RMS_FLOATS], obs[A * E * SAC_OBS],
// stepgraph(unsafe): clock[1], actions[A * E], A > 0, E > 0,
// stepgraph(unsafe): grid = blocks(A * E, SAC_ACT_THREADS)
extern "C" __global__ void __launch_bounds__(SAC_ACT_THREADS)
    sac_act_eval(const float* __restrict__ actor, const float* __restrict__ rms,
                 const float* __restrict__ obs, const unsigned* __restrict__ clock,
                 float* __restrict__ actions, unsigned A, unsigned E, unsigned long long seed) {
    if (blockIdx.x >= A * E || blockDim.x != SAC_ACT_THREADS) {
        return;
    }
    sac_act_one(actor, rms, obs, actions, E, seed, PURPOSE_SAC_EVAL, clock[0]);
}
