// SAC's side of an environment step: the transitions into each agent's replay ring, the
// observation statistics' update, and the next observations into the acted-on buffer.
// Rings [A, C, ...] row-major: obs [SAC_OBS], action, reward, next_obs [SAC_OBS], done;
// statistics [A, RMS_FLOATS]; the counters of agents.cuh (moved on by dqn_count after).

#include "sac.cuh"

#define SAC_STORE_THREADS 32

// One block per agent. Environment e of agent a (row i = a E + e) is stored at ring slot
// (pos + e) % C, pos = counters[COUNTER_POS] (read modulo C): obs[i] (the observation
// acted on), actions[i], reward[i], final_obs[i] (the observation reached, before any
// auto-reset) and done = terminated, or truncated too where truncation_is_terminal. Then
// obs[i] = next_obs[i] (after any auto-reset: what the next act sees).
//
// The statistics take rejax's update_rms with the batch next_obs[a E .. (a + 1) E] (rejax
// updates them with the step's returned observations, which are the reset ones where an
// episode ended), in f32 with each operation rounded once:
//   bm = sum_e x_e / E, bv = sum_e (x_e - bm)^2 / E, delta = bm - mean, tot = count + E,
//   mean += delta E / tot, var = (var count + bv E + delta^2 count E / tot) / tot,
//   count = tot.
// stepgraph(unsafe): obs[A * E * SAC_OBS], next_obs[A * E * SAC_OBS],
// stepgraph(unsafe): final_obs[A * E * SAC_OBS], actions[A * E], reward[A * E],
// stepgraph(unsafe): terminated[A * E], truncated[A * E], counters[COUNTERS],
// stepgraph(unsafe): rms[A * RMS_FLOATS], r_obs[A * C * SAC_OBS], r_action[A * C],
// stepgraph(unsafe): r_reward[A * C], r_next_obs[A * C * SAC_OBS], r_done[A * C],
// stepgraph(unsafe): C > 0, E > 0, E <= C, grid = blocks(A, SAC_STORE_THREADS)
extern "C" __global__ void __launch_bounds__(SAC_STORE_THREADS)
    sac_store(float* __restrict__ obs, const float* __restrict__ next_obs,
              const float* __restrict__ final_obs, const float* __restrict__ actions,
              const float* __restrict__ reward, const unsigned char* __restrict__ terminated,
              const unsigned char* __restrict__ truncated, const unsigned* __restrict__ counters,
              float* __restrict__ rms, float* __restrict__ r_obs, float* __restrict__ r_action,
              float* __restrict__ r_reward, float* __restrict__ r_next_obs,
              unsigned char* __restrict__ r_done, unsigned A, unsigned E, unsigned C,
              unsigned truncation_is_terminal) {
    const unsigned agent = blockIdx.x;
    if (agent >= A) {
        return;
    }
    const unsigned pos = (unsigned)((unsigned long long)counters[COUNTER_POS] % C);
    if (threadIdx.x < SAC_OBS) {
        const unsigned c = threadIdx.x;
        const float* x = next_obs + (size_t)agent * E * SAC_OBS + c;
        const float count_e = (float)E;
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
    // Every thread has read the count before thread 0 writes it.
    __syncthreads();
    if (threadIdx.x == 0) {
        float* s = rms + (size_t)agent * RMS_FLOATS;
        s[RMS_COUNT] = __fadd_rn(s[RMS_COUNT], (float)E);
    }
    for (unsigned e = threadIdx.x; e < E; e += SAC_STORE_THREADS) {
        const size_t i = (size_t)agent * E + e;
        const size_t row = (size_t)agent * C + (pos + e) % C;
        for (int c = 0; c < SAC_OBS; ++c) {
            r_obs[row * SAC_OBS + c] = obs[i * SAC_OBS + c];
            r_next_obs[row * SAC_OBS + c] = final_obs[i * SAC_OBS + c];
            obs[i * SAC_OBS + c] = next_obs[i * SAC_OBS + c];
        }
        r_action[row] = actions[i];
        r_reward[row] = reward[i];
        r_done[row] = terminated[i] != 0 || (truncation_is_terminal != 0 && truncated[i] != 0);
    }
}
