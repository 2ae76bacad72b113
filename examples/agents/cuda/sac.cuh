// Shared by the SAC kernels (sac_*.cu): the sizes of rejax's SquashedGaussianPolicy and
// QNetwork for Pendulum-v1, the flat parameter layouts of an agent's actor and critics,
// the observation statistics' layout, the generator's SAC purposes, and the policy's
// squashed Gaussian. src/sac/layout.rs, src/sac/rng.rs and src/sac/reference.rs mirror
// every number and function here; a unit test checks that the #defines agree with the
// Rust constants.
#pragma once

// agent_key, key_bits, unit24, below, swish, swish_grad, warp_sum.
#include "agents.cuh"

// Pendulum-v1: observation [cos theta, sin theta, theta_dot], one torque in [-2, 2].
#define SAC_OBS 3
#define SAC_HIDDEN 64
// A critic's input: the observation, then the action.
#define SAC_IN 4
// tanh(u) ACTION_SCALE + 0, rejax's action_loc and action_scale of the range [-2, 2].
#define ACTION_SCALE 2.0f
// rejax's log_std_range.
#define LOG_STD_MIN (-10.0f)
#define LOG_STD_MAX 2.0f
static_assert(SAC_HIDDEN == HIDDEN, "the warp helpers of agents.cuh split HIDDEN units");
static_assert(SAC_IN == SAC_OBS + 1, "one action");

// The actor, flat: MLP_0 (Dense_0, Dense_1), action_mean, action_log_std, each Dense's
// kernel [in, out] row-major then its bias. Offsets spelled out for the builder; the
// static_asserts tie them to the sizes.
#define ACTOR_W1 0       // [SAC_OBS, SAC_HIDDEN]
#define ACTOR_B1 192     // [SAC_HIDDEN]
#define ACTOR_W2 256     // [SAC_HIDDEN, SAC_HIDDEN]
#define ACTOR_B2 4352    // [SAC_HIDDEN]
#define ACTOR_WMU 4416   // [SAC_HIDDEN, 1]
#define ACTOR_BMU 4480   // [1]
#define ACTOR_WLS 4481   // [SAC_HIDDEN, 1]
#define ACTOR_BLS 4545   // [1]
#define ACTOR_PARAMS 4546
static_assert(ACTOR_B1 == ACTOR_W1 + SAC_OBS * SAC_HIDDEN, "layout");
static_assert(ACTOR_W2 == ACTOR_B1 + SAC_HIDDEN, "layout");
static_assert(ACTOR_B2 == ACTOR_W2 + SAC_HIDDEN * SAC_HIDDEN, "layout");
static_assert(ACTOR_WMU == ACTOR_B2 + SAC_HIDDEN, "layout");
static_assert(ACTOR_BMU == ACTOR_WMU + SAC_HIDDEN, "layout");
static_assert(ACTOR_WLS == ACTOR_BMU + 1, "layout");
static_assert(ACTOR_BLS == ACTOR_WLS + SAC_HIDDEN, "layout");
static_assert(ACTOR_PARAMS == ACTOR_BLS + 1, "layout");

// One critic, flat: MLP (Dense_0 on [obs, action], Dense_1), then Dense_2 to Q. An
// agent's NUM_CRITICS critics follow each other ([A, NUM_CRITICS, CRITIC_PARAMS]), and
// so do its target critics.
#define CRITIC_W1 0      // [SAC_IN, SAC_HIDDEN]
#define CRITIC_B1 256    // [SAC_HIDDEN]
#define CRITIC_W2 320    // [SAC_HIDDEN, SAC_HIDDEN]
#define CRITIC_B2 4416   // [SAC_HIDDEN]
#define CRITIC_WQ 4480   // [SAC_HIDDEN, 1]
#define CRITIC_BQ 4544   // [1]
#define CRITIC_PARAMS 4545
#define NUM_CRITICS 2
static_assert(CRITIC_B1 == CRITIC_W1 + SAC_IN * SAC_HIDDEN, "layout");
static_assert(CRITIC_W2 == CRITIC_B1 + SAC_HIDDEN, "layout");
static_assert(CRITIC_B2 == CRITIC_W2 + SAC_HIDDEN * SAC_HIDDEN, "layout");
static_assert(CRITIC_WQ == CRITIC_B2 + SAC_HIDDEN, "layout");
static_assert(CRITIC_BQ == CRITIC_WQ + SAC_HIDDEN, "layout");
static_assert(CRITIC_PARAMS == CRITIC_BQ + 1, "layout");
// The float4 loads of the update read W1, B1, W2 and B2 rows from shared memory.
static_assert(ACTOR_B1 % 4 == 0 && ACTOR_W2 % 4 == 0 && ACTOR_B2 % 4 == 0, "float4 rows");
static_assert(CRITIC_B1 % 4 == 0 && CRITIC_W2 % 4 == 0 && CRITIC_B2 % 4 == 0, "float4 rows");

// The observation statistics of an agent (rejax's RMSState), RMS_FLOATS f32 each: the
// running mean [SAC_OBS], the running variance [SAC_OBS], the count; one float of padding.
#define RMS_MEAN 0
#define RMS_VAR 3
#define RMS_COUNT 6
#define RMS_FLOATS 8

// What a key is for (agents.cuh's PURPOSE_* are DQN's; the initial parameters are 4).
#define PURPOSE_SAC_ACT 5     // training act: counter = the step, words 2 e, 2 e + 1
#define PURPOSE_SAC_EVAL 6    // evaluation act: counter = the evaluation clock
#define PURPOSE_SAC_SAMPLE 7  // the update's batch: counter = the update, word j for draw j
#define PURPOSE_SAC_ACTOR 8   // the actor loss's noise: counter = the update, words 2 i, 2 i + 1
#define PURPOSE_SAC_TARGET 9  // the critic targets' noise: the same

// log(2 pi) / 2 and log(2), in f32.
#define HALF_LOG_2PI 0.9189385332046727f
#define LOG_2 0.6931471805599453f

// A standard normal from words 2 i and 2 i + 1 of `key` (Box-Muller's cosine branch):
// u1 = 1 - unit24 in (0, 1], u2 = unit24 in [0, 1), sqrt(-2 log u1) cos(2 pi u2).
__device__ __forceinline__ float normal_draw(unsigned long long key, unsigned i) {
    const float u1 = 1.0f - unit24(key_bits(key, 2 * i));
    const float u2 = unit24(key_bits(key, 2 * i + 1));
    return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// jax.nn.softplus(x) = log(1 + exp(x)), as logaddexp(x, 0): max(x, 0) + log1p(exp(-|x|)).
__device__ __forceinline__ float softplus(float x) {
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}

// The squashed Gaussian of rejax's SquashedGaussianPolicy.__call__ for one action: the
// mean `mu`, the raw log-std `ls_raw` (clipped to [LOG_STD_MIN, LOG_STD_MAX]) and a
// standard normal `eps`: u = mu + exp(ls) eps; the action tanh(u) ACTION_SCALE; its log
// probability N(u; mu, exp(ls)) minus distrax Tanh's forward log-det,
// 2 (log 2 - u - softplus(-2 u)) (rejax subtracts no log ACTION_SCALE). The Gaussian's
// log density takes (u - mu) / exp(ls) as eps, which it is up to rounding.
struct Squashed {
    float action;
    float logp;
    float t;      // tanh(u)
    float sigma;  // exp(ls)
    float clip;   // d ls / d ls_raw: 1 inside the range, 0 outside, 1/2 at its ends
                  // (lax's min and max split a tie)
};

__device__ __forceinline__ Squashed squash(float mu, float ls_raw, float eps) {
    Squashed s;
    const float ls = fminf(fmaxf(ls_raw, LOG_STD_MIN), LOG_STD_MAX);
    s.clip = (ls_raw > LOG_STD_MIN && ls_raw < LOG_STD_MAX)      ? 1.0f
             : (ls_raw == LOG_STD_MIN || ls_raw == LOG_STD_MAX) ? 0.5f
                                                                 : 0.0f;
    s.sigma = expf(ls);
    const float u = fmaf(s.sigma, eps, mu);
    s.t = tanhf(u);
    s.action = s.t * ACTION_SCALE;
    const float log_det = 2.0f * (LOG_2 - u - softplus(-2.0f * u));
    s.logp = -0.5f * eps * eps - ls - HALF_LOG_2PI - log_det;
    return s;
}

// rejax's normalize_obs: (x - mean) / sqrt(var + 1e-8), each operation rounded once.
__device__ __forceinline__ float normalize(float x, float mean, float var) {
    return __fdiv_rn(__fsub_rn(x, mean), __fsqrt_rn(__fadd_rn(var, 1e-8f)));
}
