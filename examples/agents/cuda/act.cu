// Acting: the epsilon-greedy actions of A agents for their E environments each, one warp
// per environment, from each agent's online parameters (global memory: one agent's 18.7 KB
// stays in L1 across its warps). Observations [A, E, OBS] and actions [A, E], row-major.

#include "agents.cuh"

#define ACT_WARPS 8
#define ACT_THREADS 256
static_assert(ACT_THREADS == 32 * ACT_WARPS, "one warp per environment");

// The Q values of one observation, computed by one warp: lane l holds hidden units
// l, l + 32, ...; the first layer's outputs go through the warp's `h1` in shared memory.
__device__ void warp_q(const float* __restrict__ p, const float* __restrict__ x, float* h1,
                       float* q) {
    const unsigned lane = threadIdx.x % 32;
    float xs[OBS];
    for (int c = 0; c < OBS; ++c) {
        xs[c] = x[c];
    }
    for (int u = 0; u < UNITS; ++u) {
        const unsigned n = lane + 32 * u;
        float z = p[OFF_B1 + n];
        for (int c = 0; c < OBS; ++c) {
            z = fmaf(xs[c], p[OFF_W1 + c * HIDDEN + n], z);
        }
        h1[n] = swish(z);
    }
    __syncwarp();
    float h2[UNITS];
    for (int u = 0; u < UNITS; ++u) {
        const unsigned n = lane + 32 * u;
        float z = p[OFF_B2 + n];
        for (int k = 0; k < HIDDEN; ++k) {
            z = fmaf(h1[k], p[OFF_W2 + k * HIDDEN + n], z);
        }
        h2[u] = swish(z);
    }
    warp_head(p, h2, q);
}

// One environment per warp: env = blockIdx.x ACT_WARPS + warp, agent = env / E. The key
// is agent_key(seed, agent, purpose, clock) and the environment's words 2 e, 2 e + 1 of it.
// `uniform` makes every action uniform (rejax before training starts).
__device__ void act_one(const float* __restrict__ params, const float* __restrict__ obs,
                        int* __restrict__ actions, unsigned A, unsigned E,
                        unsigned long long seed, unsigned purpose, unsigned clock, float eps,
                        bool uniform) {
    __shared__ float h1[ACT_WARPS][HIDDEN];
    const unsigned warp = threadIdx.x / 32;
    const unsigned i = blockIdx.x * ACT_WARPS + warp;
    if (i >= A * E) {
        return;
    }
    const unsigned agent = i / E, env = i % E;
    float q[ACTIONS];
    warp_q(params + (size_t)agent * PARAMS, obs + (size_t)i * OBS, h1[warp], q);
    const unsigned long long key = agent_key(seed, agent, purpose, clock);
    const int a = epsilon_greedy(q, uniform ? 2.0f : eps, key, env);
    if (threadIdx.x % 32 == 0) {
        actions[i] = a;
    }
}

// rejax's training act at the step counters[COUNTER_STEP]: uniform while that step is at
// most fill_buffer, else epsilon-greedy with epsilon from the linear schedule
// (eps_start to eps_end over eps_steps steps). Draws from PURPOSE_ACT at that step.
// stepgraph(unsafe): params[A * PARAMS], obs[A * E * OBS], counters[COUNTERS], actions[A * E],
// stepgraph(unsafe): A > 0, E > 0, eps_steps > 0,
// stepgraph(unsafe): grid = blocks(cdiv(A * E, ACT_WARPS), ACT_THREADS)
extern "C" __global__ void __launch_bounds__(ACT_THREADS)
    dqn_act(const float* __restrict__ params, const float* __restrict__ obs,
            const unsigned* __restrict__ counters, int* __restrict__ actions, unsigned A,
            unsigned E, unsigned long long seed, unsigned fill_buffer, float eps_start,
            float eps_end, unsigned eps_steps) {
    const unsigned step = counters[COUNTER_STEP];
    act_one(params, obs, actions, A, E, seed, PURPOSE_ACT, step,
            epsilon_at(step, eps_start, eps_end, eps_steps), step <= fill_buffer);
}

// Evaluation's act (rejax's make_act: epsilon 0.005): epsilon-greedy with a fixed
// `epsilon`, drawing from PURPOSE_EVAL at clock[0], which eval_tick moves on.
// stepgraph(unsafe): params[A * PARAMS], obs[A * E * OBS], clock[1], actions[A * E],
// stepgraph(unsafe): A > 0, E > 0, grid = blocks(cdiv(A * E, ACT_WARPS), ACT_THREADS)
extern "C" __global__ void __launch_bounds__(ACT_THREADS)
    dqn_act_eval(const float* __restrict__ params, const float* __restrict__ obs,
                 const unsigned* __restrict__ clock, int* __restrict__ actions, unsigned A,
                 unsigned E, unsigned long long seed, float epsilon) {
    act_one(params, obs, actions, A, E, seed, PURPOSE_EVAL, clock[0], epsilon, false);
}

// clock[0] += 1, by one thread: the next evaluation step draws new values.
// stepgraph(unsafe): clock[1], grid = blocks(1, 32)
extern "C" __global__ void eval_tick(unsigned* clock) {
    if (threadIdx.x == 0) {
        clock[0] += 1;
    }
}
