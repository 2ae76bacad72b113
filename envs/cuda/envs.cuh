// Shared by the environments' kernels (cartpole.cu, pendulum.cu), one thread per
// environment (stepgraph-kernels' `global_index`): IEEE double arithmetic without
// contraction, the reset generator and the episode bookkeeping of the same-step
// auto-reset. src/reference.rs mirrors every
// function here; the GPU tests compare the two.
#pragma once

#include "stepgraph/common.cuh"
#include "stepgraph/random.cuh"

// Double arithmetic rounded once per operation, as numpy computes it: nvcc would
// otherwise contract a * b + c into one fused multiply-add, whose single rounding moves
// the state off gymnasium's (and the CPU reference's) by an ulp that unstable dynamics
// then grow.
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double dvd(double a, double b) { return __ddiv_rn(a, b); }

// The reset generator: a hash of (seed, environment, episode, draw), stepgraph-kernels'
// mixing function chained over the words. No state but the episode counter the
// environment keeps, so an auto-reset inside a graph needs nothing from the host, and a
// seed gives the same episodes on any GPU and on the CPU.
// The key of one episode of one environment.
__device__ __forceinline__ unsigned long long episode_key(unsigned long long seed,
                                                          unsigned long long env,
                                                          unsigned long long episode) {
    return rng_splitmix(rng_splitmix(rng_splitmix(seed) ^ env) ^ episode);
}

// Draw `d` of an episode as a double uniform in [low, high): the top 53 bits as
// u in [0, 1), then low + (high - low) u, numpy's `Generator.uniform` formula.
__device__ __forceinline__ double episode_uniform(unsigned long long key, unsigned d,
                                                  double low, double high) {
    const unsigned long long bits = rng_splitmix(key + (unsigned long long)d * RNG_GAMMA);
    const double u = (double)(bits >> 11) * 0x1.0p-53;
    return add(low, mul(sub(high, low), u));
}

// The bookkeeping of one step: the running return and length move on, and when the
// episode ends they become the last episode's figures, the count of finished episodes
// moves on and the running ones start again. Returns whether the episode ended, so the
// caller resets the state (the new episode's number is *episodes).
__device__ __forceinline__ bool end_of_step(float reward, bool terminated, bool truncated,
                                            unsigned* length, float* ret, unsigned* episodes,
                                            float* last_return, unsigned* last_length) {
    const unsigned len = *length + 1;
    const float r = *ret + reward;
    if (terminated || truncated) {
        *last_return = r;
        *last_length = len;
        *episodes += 1;
        *length = 0;
        *ret = 0.0f;
        return true;
    }
    *length = len;
    *ret = r;
    return false;
}
