// Pendulum-v1 as gymnasium 1.2.3 computes it (gymnasium/envs/classic_control/pendulum.py
// under the TimeLimit of 200 steps that `gymnasium.make` adds), one thread per
// environment. The state is double, as gymnasium keeps it; the observation is
// [cos theta, sin theta, theta_dot] rounded to float. Layouts (row-major): state [n, 2]
// doubles (theta, theta_dot), observations [n, 3] floats, the per-environment arrays
// [n]. src/reference.rs computes the same bits on the CPU.

#include "envs.cuh"

#define PENDULUM_STATE 2
#define PENDULUM_OBS 3

// gymnasium's constants (g = 10, m = l = 1).
#define MAX_SPEED 8.0
#define MAX_TORQUE 2.0f
#define DT 0.05
#define PI 3.141592653589793
// 3 g / (2 l) and 3 / (m l^2), folded as pendulum.py folds them (Python floats).
#define GRAVITY_TERM 15.0
#define TORQUE_TERM 3.0f

__device__ __forceinline__ void pendulum_reset_state(double* s, unsigned long long seed,
                                                     unsigned env, unsigned episode) {
    const unsigned long long key = episode_key(seed, env, episode);
    s[0] = episode_uniform(key, 0, -PI, PI);
    s[1] = episode_uniform(key, 1, -1.0, 1.0);
}

__device__ __forceinline__ void pendulum_observe(const double* s, float* obs) {
    obs[0] = (float)cos(s[0]);
    obs[1] = (float)sin(s[0]);
    obs[2] = (float)s[1];
}

// numpy's float64 `%` (Python's modulo: the sign of the divisor) in angle_normalize,
// ((x + pi) % (2 pi)) - pi.
__device__ __forceinline__ double angle_normalize(double x) {
    const double b = 2 * PI;
    double m = fmod(add(x, PI), b);
    if (m < 0.0) {
        m = add(m, b);
    }
    return sub(m, PI);
}

// pendulum.py's `step`, operation for operation, in numpy's types: the clipped torque
// is float32, as are 3.0 u and 0.001 u^2 (a Python float beside a float32 stays
// float32), widened where they meet the doubles. A NaN torque passes the clip, as
// np.clip lets it, and the state stays NaN until the time limit resets it. Returns the
// reward, -cost of the state the step started from.
__device__ __forceinline__ double pendulum_dynamics(double* s, float action) {
    const double th = s[0], thdot = s[1];
    const float u =
        action < -MAX_TORQUE ? -MAX_TORQUE : (action > MAX_TORQUE ? MAX_TORQUE : action);
    const double an = angle_normalize(th);
    const float torque_cost = __fmul_rn(0.001f, __fmul_rn(u, u));
    const double costs = add(add(mul(an, an), mul(0.1, mul(thdot, thdot))), (double)torque_cost);
    const double accel = add(mul(GRAVITY_TERM, sin(th)), (double)__fmul_rn(TORQUE_TERM, u));
    double newthdot = add(thdot, mul(accel, DT));
    newthdot = newthdot < -MAX_SPEED ? -MAX_SPEED : (newthdot > MAX_SPEED ? MAX_SPEED : newthdot);
    s[0] = add(th, mul(newthdot, DT));
    s[1] = newthdot;
    return -costs;
}

// Every environment starts episode 0 of `seed`: theta uniform in [-pi, pi), theta_dot in
// [-1, 1), its observation written, the episode statistics zeroed.
// stepgraph(unsafe): state[n * 2], length[n], ret[n], episodes[n], last_return[n],
// stepgraph(unsafe): last_length[n], obs[n * 3], grid = elementwise(n)
extern "C" __global__ void pendulum_reset(double* __restrict__ state, unsigned* __restrict__ length,
                                          float* __restrict__ ret, unsigned* __restrict__ episodes,
                                          float* __restrict__ last_return,
                                          unsigned* __restrict__ last_length,
                                          float* __restrict__ obs, unsigned n,
                                          unsigned long long seed) {
    const unsigned i = global_index();
    if (i >= n) {
        return;
    }
    double s[PENDULUM_STATE];
    pendulum_reset_state(s, seed, i, 0);
    state[(size_t)i * PENDULUM_STATE] = s[0];
    state[(size_t)i * PENDULUM_STATE + 1] = s[1];
    pendulum_observe(s, obs + (size_t)i * PENDULUM_OBS);
    length[i] = 0;
    ret[i] = 0.0f;
    episodes[i] = 0;
    last_return[i] = 0.0f;
    last_length[i] = 0;
}

// One step of every environment with same-step auto-reset, as `cartpole_step`: the
// pendulum never terminates (terminated is always 0) and is truncated at
// length >= max_steps.
// stepgraph(unsafe): action[n], state[n * 2], length[n], ret[n], episodes[n],
// stepgraph(unsafe): last_return[n], last_length[n], obs[n * 3], final_obs[n * 3],
// stepgraph(unsafe): reward[n], terminated[n], truncated[n], grid = elementwise(n)
extern "C" __global__ void pendulum_step(const float* __restrict__ action,
                                         double* __restrict__ state,
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
    double s[PENDULUM_STATE];
    s[0] = state[(size_t)i * PENDULUM_STATE];
    s[1] = state[(size_t)i * PENDULUM_STATE + 1];
    const float r = (float)pendulum_dynamics(s, action[i]);
    const bool trunc = length[i] + 1 >= max_steps;
    pendulum_observe(s, final_obs + (size_t)i * PENDULUM_OBS);
    if (end_of_step(r, false, trunc, length + i, ret + i, episodes + i, last_return + i,
                    last_length + i)) {
        pendulum_reset_state(s, seed, i, episodes[i]);
    }
    state[(size_t)i * PENDULUM_STATE] = s[0];
    state[(size_t)i * PENDULUM_STATE + 1] = s[1];
    pendulum_observe(s, obs + (size_t)i * PENDULUM_OBS);
    reward[i] = r;
    terminated[i] = 0;
    truncated[i] = trunc;
}
