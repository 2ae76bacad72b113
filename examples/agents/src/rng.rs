//! The counter-based generator of the agents' kernels (`cuda/agents.cuh`), on the CPU: a
//! draw is a pure function of the seed, the agent, its purpose and a counter (the step,
//! the update), so the references compute the very integers the kernels do and a seed
//! gives the same run on any GPU.
//!
//! ```text
//! key(seed, agent, purpose, counter) = mix(mix(mix(mix(seed) ^ agent) ^ purpose) ^ counter)
//! word(key, i)                       = mix(key + i · 0x9E3779B97F4A7C15)
//! ```
//!
//! with `mix` stepgraph-kernels' [`splitmix`].

use stepgraph_kernels::{RNG_GAMMA, splitmix};

/// Acting in training: counter = the step (`Counter::Step`), words `2 env`, `2 env + 1`.
pub const PURPOSE_ACT: u32 = 1;
/// The update's batch: counter = the agent's update count, word `j` for draw `j`.
pub const PURPOSE_SAMPLE: u32 = 2;
/// Acting in evaluation: counter = the evaluation clock.
pub const PURPOSE_EVAL: u32 = 3;
/// The initial parameters (host only): counter = the parameter's index.
pub const PURPOSE_INIT: u32 = 4;
/// SAC's training act: counter = the step, words `2 env`, `2 env + 1` (a normal).
pub const PURPOSE_SAC_ACT: u32 = 5;
/// SAC's evaluation act: counter = the evaluation clock.
pub const PURPOSE_SAC_EVAL: u32 = 6;
/// SAC's batch: counter = the agent's update count, word `j` for draw `j`.
pub const PURPOSE_SAC_SAMPLE: u32 = 7;
/// The noise of SAC's actor loss: counter = the update count, words `2 i`, `2 i + 1` for
/// row `i` of the batch.
pub const PURPOSE_SAC_ACTOR: u32 = 8;
/// The noise of SAC's critic targets: the same.
pub const PURPOSE_SAC_TARGET: u32 = 9;
/// SAC's initial parameters (host only): counter = `network << 32 | index`, network 0 the
/// actor and `1 + k` critic `k`.
pub const PURPOSE_SAC_INIT: u32 = 10;

/// The key of (seed, agent, purpose, counter).
pub fn agent_key(seed: u64, agent: u32, purpose: u32, counter: u64) -> u64 {
    splitmix(splitmix(splitmix(splitmix(seed) ^ u64::from(agent)) ^ u64::from(purpose)) ^ counter)
}

/// Word `i` of `key`.
pub fn key_bits(key: u64, i: u32) -> u64 {
    splitmix(key.wrapping_add(u64::from(i).wrapping_mul(RNG_GAMMA)))
}

/// The top 24 bits as a float in `[0, 1)`, exactly.
pub fn unit24(bits: u64) -> f32 {
    (bits >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// An integer uniform in `[0, n)`: the high word of `bits · n` (Lemire), `n ≥ 1`.
pub fn below(bits: u64, n: u32) -> u32 {
    ((u128::from(bits) * u128::from(n)) >> 64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_spreads() {
        let mut counts = [0u32; 3];
        for i in 0..30_000 {
            let b = below(key_bits(agent_key(1, 0, PURPOSE_ACT, 0), i), 3);
            counts[b as usize] += 1;
        }
        // Each about 10000; 5 standard deviations (about 82) either way.
        assert!(
            counts.iter().all(|&c| c.abs_diff(10_000) < 410),
            "{counts:?}"
        );
        assert_eq!(below(u64::MAX, 7), 6);
        assert_eq!(below(0, 7), 0);
    }

    #[test]
    fn keys_differ_in_every_input() {
        let k = agent_key(1, 2, 3, 4);
        assert_ne!(k, agent_key(0, 2, 3, 4));
        assert_ne!(k, agent_key(1, 0, 3, 4));
        assert_ne!(k, agent_key(1, 2, 0, 4));
        assert_ne!(k, agent_key(1, 2, 3, 0));
        assert_eq!(unit24(u64::MAX), 1.0 - 1.0 / 16_777_216.0);
    }
}
