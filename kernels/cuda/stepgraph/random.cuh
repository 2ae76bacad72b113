// The counter-based generator's mixing function, exported to kernel crates that depend on
// this crate (`#include "stepgraph/random.cuh"`): random.cu builds its draws on it, and a
// crate that hashes its own keys (an environment's reset, a replay's draw) uses the same
// function that `stepgraph_kernels::random::splitmix` computes on the CPU.
#pragma once

// splitmix64's increment, the golden ratio in 64 bits.
#define RNG_GAMMA 0x9E3779B97F4A7C15ull

// splitmix64's output function of z + RNG_GAMMA: a bijection of 64-bit words.
__device__ __forceinline__ unsigned long long rng_splitmix(unsigned long long z) {
    z += RNG_GAMMA;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
