//! The hyperparameters the SAC kernels take, with rejax's published Pendulum values.

/// What the SAC kernels need to know of a run: plain data, so a step may hold it in its
/// config. [`SacConfig::rejax_pendulum`] is rejax 0.1.3's `configs/gymnax/pendulum.yaml`
/// (key `sac`) with the defaults of its `SAC` class.
///
/// Where rejax computes a float from a Python float (Adam's `1 - b1`), the methods here
/// round as JAX does: in f64, then to f32.
#[derive(Clone, Copy, Debug, PartialEq, stepgraph::ConfigValue)]
pub struct SacConfig {
    /// The run's seed: acting, sampling, the update's noise and evaluation draw from keys
    /// of it.
    pub seed: u64,
    /// Environments per agent (`num_envs`): `E`.
    pub num_envs: usize,
    /// Capacity of each agent's replay ring (`buffer_size`): `C`.
    pub buffer_size: usize,
    /// An iteration trains when its step, after the environments' step, is above it
    /// (`fill_buffer`; rejax's SAC acts with its policy from the first step).
    pub fill_buffer: u32,
    /// Transitions per update (`batch_size`): `B`, at most [`crate::sac::SAC_MAX_BATCH`].
    pub batch_size: usize,
    /// Updates per iteration (`num_epochs`).
    pub epochs: u32,
    /// The discount.
    pub gamma: f32,
    /// Adam's learning rate, the same for the actor, the critics and `log_alpha`, each with
    /// its own moments.
    pub learning_rate: f32,
    /// Adam's `b1`.
    pub beta1: f64,
    /// Adam's `b2`.
    pub beta2: f64,
    /// Adam's `eps` (`eps_root` is 0).
    pub adam_eps: f32,
    /// Each gradient element is clipped to `[-max_grad, max_grad]` before Adam
    /// (`optax.clip(max_grad_norm)`; rejax's default is infinite: no clip).
    pub max_grad: f32,
    /// Target critics: `target = polyak target + (1 - polyak) critic`, every iteration.
    pub polyak: f32,
    /// The temperature's target entropy: `-action_dim` for a continuous action.
    pub target_entropy: f32,
    /// The initial `log_alpha`.
    pub init_log_alpha: f32,
    /// Whether a truncated episode's transition is stored as done (no bootstrap). gymnax's
    /// `done` includes the time limit, so rejax treats truncation as terminal: `true`.
    pub truncation_is_terminal: bool,
}

impl SacConfig {
    /// rejax 0.1.3's SAC on Pendulum-v1: an actor and two critics of (64, 64) swish
    /// units, 1 environment, a ring of 10 000, training from step 257, batches of 256, 1
    /// update an iteration, Adam at 0.01 without a clip, Polyak 0.98, gamma 0.99, target
    /// entropy -1, `log_alpha` from 0, observations normalised.
    pub fn rejax_pendulum(seed: u64) -> SacConfig {
        SacConfig {
            seed,
            num_envs: 1,
            buffer_size: 10_000,
            fill_buffer: 256,
            batch_size: 256,
            epochs: 1,
            gamma: 0.99,
            learning_rate: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            adam_eps: 1e-8,
            max_grad: f32::INFINITY,
            polyak: 0.98,
            target_entropy: -1.0,
            init_log_alpha: 0.0,
            truncation_is_terminal: true,
        }
    }

    /// Adam's `b1` as the kernels take it.
    pub fn b1(&self) -> f32 {
        self.beta1 as f32
    }

    /// `1 - b1`, computed in f64 and rounded (optax computes it from Python floats).
    pub fn c1(&self) -> f32 {
        (1.0 - self.beta1) as f32
    }

    /// Adam's `b2` as the kernels take it.
    pub fn b2(&self) -> f32 {
        self.beta2 as f32
    }

    /// `1 - b2`, computed in f64 and rounded.
    pub fn c2(&self) -> f32 {
        (1.0 - self.beta2) as f32
    }

    /// The Polyak step's `(keep, mix)`: `polyak` and `1 - polyak` in f32.
    pub fn polyak_coefficients(&self) -> (f32, f32) {
        (self.polyak, 1.0 - self.polyak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pendulum_config_is_rejaxs() {
        let c = SacConfig::rejax_pendulum(3);
        assert_eq!(c.seed, 3);
        assert_eq!(
            (
                c.num_envs,
                c.buffer_size,
                c.fill_buffer,
                c.batch_size,
                c.epochs
            ),
            (1, 10_000, 256, 256, 1)
        );
        assert_eq!((c.gamma, c.learning_rate, c.polyak), (0.99, 0.01, 0.98));
        assert_eq!((c.beta1, c.beta2, c.adam_eps), (0.9, 0.999, 1e-8));
        assert!(c.max_grad.is_infinite() && c.max_grad > 0.0);
        // -action_dim for Pendulum's one torque; log_alpha starts at 0 (alpha 1).
        assert_eq!((c.target_entropy, c.init_log_alpha), (-1.0, 0.0));
        assert!(c.truncation_is_terminal);
        assert_eq!(c.polyak_coefficients(), (0.98, 1.0 - 0.98f32));
        assert_eq!(c.c1(), 0.1f64 as f32);
    }
}
