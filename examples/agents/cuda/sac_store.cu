// SAC's side of an environment step: the transitions into each agent's replay ring, the
// observation statistics' update, the next observations into the acted-on buffer, and the
// counters moved on. Rings [A, C, ...] row-major: obs [SAC_OBS], action, reward, next_obs
// [SAC_OBS], done; statistics [A, RMS_FLOATS]; the counters of agents.cuh.
//
// One block does it all: every thread reads the ring position before one thread moves
// the counters, with a block barrier between, so the step needs no separate counting
// kernel (one graph node fewer an iteration). The work is a few floats per environment;
// rejax's Pendulum configuration has one environment per agent.

#include "sac.cuh"

#define SAC_STORE_THREADS 256

// Environment e of agent a (row i = a E + e) is stored at ring slot (pos + e) % C,
// pos = counters[COUNTER_POS] (read modulo C): obs[i] (the observation acted on),
// actions[i], reward[i], final_obs[i] (the observation reached, before any auto-reset)
// and done = terminated, or truncated too where truncation_is_terminal. Then
// obs[i] = next_obs[i] (after any auto-reset: what the next act sees).
//
// The statistics take rejax's update_rms with the batch next_obs[a E .. (a + 1) E] (rejax
// updates them with the step's returned observations, which are the reset ones where an
// episode ended), in f32 with each operation rounded once:
//   bm = sum_e x_e / E, bv = sum_e (x_e - bm)^2 / E, delta = bm - mean, tot = count + E,
//   mean += delta E / tot, var = (var count + bv E + delta^2 count E / tot) / tot,
//   count = tot.
//
// Then, as dqn_count: step_before = step, step += E, pos = (pos + E) % C,
// size = min(size + E, C).
// stepgraph(unsafe): obs[A * E * SAC_OBS], next_obs[A * E * SAC_OBS],
// stepgraph(unsafe): final_obs[A * E * SAC_OBS], actions[A * E], reward[A * E],
// stepgraph(unsafe): terminated[A * E], truncated[A * E], counters[COUNTERS],
// stepgraph(unsafe): rms[A * RMS_FLOATS], r_obs[A * C * SAC_OBS], r_action[A * C],
// stepgraph(unsafe): r_reward[A * C], r_next_obs[A * C * SAC_OBS], r_done[A * C],
// stepgraph(unsafe): A > 0, C > 0, E > 0, E <= C, grid = blocks(1, SAC_STORE_THREADS)
extern "C" __global__ void __launch_bounds__(SAC_STORE_THREADS)
    sac_store(float* __restrict__ obs, const float* __restrict__ next_obs,
              const float* __restrict__ final_obs, const float* __restrict__ actions,
              const float* __restrict__ reward, const unsigned char* __restrict__ terminated,
              const unsigned char* __restrict__ truncated, unsigned* __restrict__ counters,
              float* __restrict__ rms, float* __restrict__ r_obs, float* __restrict__ r_action,
              float* __restrict__ r_reward, float* __restrict__ r_next_obs,
              unsigned char* __restrict__ r_done, unsigned A, unsigned E, unsigned C,
              unsigned truncation_is_terminal) {
    if (blockIdx.x != 0) {
        return;
    }
    const unsigned pos = (unsigned)((unsigned long long)counters[COUNTER_POS] % C);
    const float count_e = (float)E;
    // The statistics: one thread per (agent, observation float).
    for (unsigned j = threadIdx.x; j < A * SAC_OBS; j += blockDim.x) {
        const unsigned agent = j / SAC_OBS, c = j % SAC_OBS;
        const float* x = next_obs + (size_t)agent * E * SAC_OBS + c;
        float sum = 0.0f;
        for (unsigned e = 0; e < E; ++e) {
            sum = __fadd_rn(sum, x[(size_t)e * SAC_OBS]);
        }
        const float bm = __fdiv_rn(sum, count_e);
        float sq = 0.0f;
        for (unsigned e = 0; e < E; ++e) {
            const float d = __fsub_rn(x[(size_t)e * SAC_OBS], bm);
            sq = __fadd_rn(sq, __fmul_rn(d, d));
        }
        const float bv = __fdiv_rn(sq, count_e);
        float* s = rms + (size_t)agent * RMS_FLOATS;
        const float mean = s[RMS_MEAN + c], var = s[RMS_VAR + c], count = s[RMS_COUNT];
        const float delta = __fsub_rn(bm, mean);
        const float tot = __fadd_rn(count, count_e);
        const float m_a = __fmul_rn(var, count);
        const float m_b = __fmul_rn(bv, count_e);
        const float cross =
            __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(delta, delta), count), count_e), tot);
        s[RMS_MEAN + c] = __fadd_rn(mean, __fdiv_rn(__fmul_rn(delta, count_e), tot));
        s[RMS_VAR + c] = __fdiv_rn(__fadd_rn(__fadd_rn(m_a, m_b), cross), tot);
    }
    // The transitions: one thread per environment.
    for (unsigned i = threadIdx.x; i < A * E; i += blockDim.x) {
        const unsigned agent = i / E, e = i % E;
        const size_t row = (size_t)agent * C + ((unsigned long long)pos + e) % C;
        for (int c = 0; c < SAC_OBS; ++c) {
            r_obs[row * SAC_OBS + c] = obs[(size_t)i * SAC_OBS + c];
            r_next_obs[row * SAC_OBS + c] = final_obs[(size_t)i * SAC_OBS + c];
            obs[(size_t)i * SAC_OBS + c] = next_obs[(size_t)i * SAC_OBS + c];
        }
        r_action[row] = actions[i];
        r_reward[row] = reward[i];
        r_done[row] = terminated[i] != 0 || (truncation_is_terminal != 0 && truncated[i] != 0);
    }
    // Every thread has read the counts and the position before they move.
    __syncthreads();
    for (unsigned agent = threadIdx.x; agent < A; agent += blockDim.x) {
        float* s = rms + (size_t)agent * RMS_FLOATS;
        s[RMS_COUNT] = __fadd_rn(s[RMS_COUNT], count_e);
    }
    if (threadIdx.x == 0) {
        const unsigned step = counters[COUNTER_STEP];
        counters[COUNTER_STEP_BEFORE] = step;
        counters[COUNTER_STEP] = step + E;
        counters[COUNTER_POS] = (unsigned)(((unsigned long long)pos + E) % C);
        const unsigned long long size = (unsigned long long)counters[COUNTER_SIZE] + E;
        counters[COUNTER_SIZE] = (unsigned)(size < C ? size : C);
    }
}
