// The replay rings, the counters and the target networks: A rings of capacity C, one per
// agent, each slot a transition (obs [OBS], action, reward, next_obs [OBS], done), laid
// out [A, C, ...] row-major; the counters of agents.cuh; targets [A, PARAMS].

#include "agents.cuh"

// Writes the E transitions of each agent at ring slots (pos + e) % C, pos =
// counters[COUNTER_POS] (read modulo C, so any counter value stays inside the ring).
// next_obs is the environment's final observation (before an auto-reset); done is
// terminated, or truncated too where truncation_is_terminal is nonzero (gymnax's and so
// rejax's done; 0 bootstraps a truncated episode from its final observation instead).
// Run dqn_count after it: the kernel does not move the counters, since every thread
// reads them.
// stepgraph(unsafe): obs[A * E * OBS], final_obs[A * E * OBS], actions[A * E], reward[A * E],
// stepgraph(unsafe): terminated[A * E], truncated[A * E], counters[COUNTERS],
// stepgraph(unsafe): r_obs[A * C * OBS], r_action[A * C], r_reward[A * C],
// stepgraph(unsafe): r_next_obs[A * C * OBS], r_done[A * C], C > 0, E <= C,
// stepgraph(unsafe): grid = elementwise(A * E)
extern "C" __global__ void replay_insert(
    const float* __restrict__ obs, const float* __restrict__ final_obs,
    const int* __restrict__ actions, const float* __restrict__ reward,
    const unsigned char* __restrict__ terminated, const unsigned char* __restrict__ truncated,
    const unsigned* __restrict__ counters, float* __restrict__ r_obs, int* __restrict__ r_action,
    float* __restrict__ r_reward, float* __restrict__ r_next_obs,
    unsigned char* __restrict__ r_done, unsigned A, unsigned E, unsigned C,
    unsigned truncation_is_terminal) {
    const unsigned i = global_index();
    if (i >= A * E) {
        return;
    }
    const unsigned agent = i / E, env = i % E;
    const unsigned slot = (unsigned)(((unsigned long long)counters[COUNTER_POS] % C + env) % C);
    const size_t row = (size_t)agent * C + slot;
    for (int c = 0; c < OBS; ++c) {
        r_obs[row * OBS + c] = obs[(size_t)i * OBS + c];
        r_next_obs[row * OBS + c] = final_obs[(size_t)i * OBS + c];
    }
    r_action[row] = actions[i];
    r_reward[row] = reward[i];
    r_done[row] = terminated[i] != 0 || (truncation_is_terminal != 0 && truncated[i] != 0);
}

// After a step of E environments per agent and its insert: step_before = step,
// step += E, pos = (pos + E) % C, size = min(size + E, C). One thread.
// stepgraph(unsafe): counters[COUNTERS], C > 0, E <= C, grid = blocks(1, 32)
extern "C" __global__ void dqn_count(unsigned* counters, unsigned E, unsigned C) {
    if (threadIdx.x != 0) {
        return;
    }
    const unsigned step = counters[COUNTER_STEP];
    counters[COUNTER_STEP_BEFORE] = step;
    counters[COUNTER_STEP] = step + E;
    counters[COUNTER_POS] = (unsigned)(((unsigned long long)counters[COUNTER_POS] % C + E) % C);
    const unsigned long long size = (unsigned long long)counters[COUNTER_SIZE] + E;
    counters[COUNTER_SIZE] = (unsigned)(size < C ? size : C);
}

// target = target keep + online mix elementwise (rejax: tp polyak + p (1 - polyak); the
// caller passes keep = polyak and mix = 1 - polyak, both f32), each product and the sum
// rounded once.
// stepgraph(unsafe): online[n], target[n], grid = elementwise(n)
extern "C" __global__ void polyak(const float* __restrict__ online, float* __restrict__ target,
                                  unsigned n, float keep, float mix) {
    const unsigned i = global_index();
    if (i >= n) {
        return;
    }
    target[i] = __fadd_rn(__fmul_rn(target[i], keep), __fmul_rn(online[i], mix));
}
