// CartPole-v1 as gymnasium 1.2.3 computes it (gymnasium/envs/classic_control/cartpole.py
// under the TimeLimit of 500 steps that `gymnasium.make` adds), one thread per
// environment. The state is double, as gymnasium keeps it; the observation is its float
// rounding. Layouts (row-major): state [n, 4] doubles (x, x_dot, theta, theta_dot),
// observations [n, 4] floats, the per-environment arrays [n]. src/reference.rs computes
// the same bits on the CPU.

#include "envs.cuh"

#define CARTPOLE_STATE 4

// gymnasium's constants, each computed the way cartpole.py computes it.
#define GRAVITY 9.8
#define MASSCART 1.0
#define MASSPOLE 0.1
#define TOTAL_MASS (MASSPOLE + MASSCART)
#define LENGTH 0.5
#define POLEMASS_LENGTH (MASSPOLE * LENGTH)
#define FORCE_MAG 10.0
#define TAU 0.02
#define THETA_THRESHOLD (12 * 2 * 3.141592653589793 / 360)
#define X_THRESHOLD 2.4
#define RESET_BOUND 0.05

__device__ __forceinline__ void cartpole_reset_state(double* s, unsigned long long seed,
                                                     unsigned env, unsigned episode) {
    const unsigned long long key = episode_key(seed, env, episode);
    for (unsigned d = 0; d < CARTPOLE_STATE; ++d) {
        s[d] = episode_uniform(key, d, -RESET_BOUND, RESET_BOUND);
    }
}

__device__ __forceinline__ void cartpole_observe(const double* s, float* obs) {
    for (unsigned d = 0; d < CARTPOLE_STATE; ++d) {
        obs[d] = (float)s[d];
    }
}

// One Euler step of cartpole.py's `step`, operation for operation. Returns `terminated`.
// An action other than 0 or 1 (gymnasium asserts) makes the state NaN and ends the
// episode, so the NaN reaches the reward, the final observation and the episode's
// return, where a finite check sees it, and the environment starts afresh.
__device__ __forceinline__ bool cartpole_dynamics(double* s, int action) {
    if (action != 0 && action != 1) {
        const double nan = __longlong_as_double(0x7ff8000000000000ll);
        for (unsigned d = 0; d < CARTPOLE_STATE; ++d) {
            s[d] = nan;
        }
        return true;
    }
    const double x = s[0], x_dot = s[1], theta = s[2], theta_dot = s[3];
    const double force = action == 1 ? FORCE_MAG : -FORCE_MAG;
    const double costheta = cos(theta);
    const double sintheta = sin(theta);
    const double temp =
        dvd(add(force, mul(mul(POLEMASS_LENGTH, mul(theta_dot, theta_dot)), sintheta)),
            TOTAL_MASS);
    const double thetaacc =
        dvd(sub(mul(GRAVITY, sintheta), mul(costheta, temp)),
            mul(LENGTH, sub(4.0 / 3.0, dvd(mul(MASSPOLE, mul(costheta, costheta)), TOTAL_MASS))));
    const double xacc = sub(temp, dvd(mul(mul(POLEMASS_LENGTH, thetaacc), costheta), TOTAL_MASS));
    s[0] = add(x, mul(TAU, x_dot));
    s[1] = add(x_dot, mul(TAU, xacc));
    s[2] = add(theta, mul(TAU, theta_dot));
    s[3] = add(theta_dot, mul(TAU, thetaacc));
    return s[0] < -X_THRESHOLD || s[0] > X_THRESHOLD || s[2] < -THETA_THRESHOLD ||
           s[2] > THETA_THRESHOLD;
}

// Every environment starts episode 0 of `seed`: state drawn uniform in [-0.05, 0.05),
// its observation written, the episode statistics zeroed.
// stepgraph(unsafe): state[n * 4], length[n], ret[n], episodes[n], last_return[n],
// stepgraph(unsafe): last_length[n], obs[n * 4], grid = elementwise(n)
extern "C" __global__ void cartpole_reset(double* __restrict__ state, unsigned* __restrict__ length,
                                          float* __restrict__ ret, unsigned* __restrict__ episodes,
                                          float* __restrict__ last_return,
                                          unsigned* __restrict__ last_length,
                                          float* __restrict__ obs, unsigned n,
                                          unsigned long long seed) {
    const unsigned i = global_index();
    if (i >= n) {
        return;
    }
    double s[CARTPOLE_STATE];
    cartpole_reset_state(s, seed, i, 0);
    for (unsigned d = 0; d < CARTPOLE_STATE; ++d) {
        state[(size_t)i * CARTPOLE_STATE + d] = s[d];
    }
    cartpole_observe(s, obs + (size_t)i * CARTPOLE_STATE);
    length[i] = 0;
    ret[i] = 0.0f;
    episodes[i] = 0;
    last_return[i] = 0.0f;
    last_length[i] = 0;
}

// One step of every environment with same-step auto-reset: reward, terminated and
// truncated (length >= max_steps, gymnasium's TimeLimit) describe the transition taken;
// final_obs is the observation it reached; obs is the next observation to act on, the
// reset one where the episode ended (episode `episodes` of `seed`).
// stepgraph(unsafe): action[n], state[n * 4], length[n], ret[n], episodes[n],
// stepgraph(unsafe): last_return[n], last_length[n], obs[n * 4], final_obs[n * 4],
// stepgraph(unsafe): reward[n], terminated[n], truncated[n], grid = elementwise(n)
extern "C" __global__ void cartpole_step(const int* __restrict__ action, double* __restrict__ state,
                                         unsigned* __restrict__ length, float* __restrict__ ret,
                                         unsigned* __restrict__ episodes,
                                         float* __restrict__ last_return,
                                         unsigned* __restrict__ last_length,
                                         float* __restrict__ obs, float* __restrict__ final_obs,
                                         float* __restrict__ reward,
                                         unsigned char* __restrict__ terminated,
                                         unsigned char* __restrict__ truncated, unsigned n,
                                         unsigned max_steps, unsigned long long seed) {
    const unsigned i = global_index();
    if (i >= n) {
        return;
    }
    double s[CARTPOLE_STATE];
    for (unsigned d = 0; d < CARTPOLE_STATE; ++d) {
        s[d] = state[(size_t)i * CARTPOLE_STATE + d];
    }
    const bool term = cartpole_dynamics(s, action[i]);
    // 1 every step, the terminating one included; NaN for an invalid action.
    const float r = isnan(s[0]) ? __int_as_float(0x7fc00000) : 1.0f;
    const bool trunc = length[i] + 1 >= max_steps;
    cartpole_observe(s, final_obs + (size_t)i * CARTPOLE_STATE);
    if (end_of_step(r, term, trunc, length + i, ret + i, episodes + i, last_return + i,
                    last_length + i)) {
        cartpole_reset_state(s, seed, i, episodes[i]);
    }
    for (unsigned d = 0; d < CARTPOLE_STATE; ++d) {
        state[(size_t)i * CARTPOLE_STATE + d] = s[d];
    }
    cartpole_observe(s, obs + (size_t)i * CARTPOLE_STATE);
    reward[i] = r;
    terminated[i] = term;
    truncated[i] = trunc;
}
