//! The hyperparameters the kernels take, with rejax's published CartPole values.

/// What the DQN kernels need to know of a run: plain data, so a step may hold it in its
/// config. [`DqnConfig::rejax_cartpole`] is rejax 0.1.3's `configs/gymnax/cartpole.yaml`.
///
/// Where rejax computes a float from a Python float (Adam's `1 - b1`), the methods here
/// round as JAX does: in f64, then to f32.
#[derive(Clone, Copy, Debug, PartialEq, stepgraph::ConfigValue)]
pub struct DqnConfig {
    /// The run's seed: acting, sampling and evaluation draw from keys of it.
    pub seed: u64,
    /// Environments per agent (`num_envs`): `E`.
    pub num_envs: usize,
    /// Capacity of each agent's replay ring (`buffer_size`): `C`.
    pub buffer_size: usize,
    /// Steps of uniform actions and no updates (`fill_buffer`): an iteration trains when
    /// its starting step is above it, and acts uniformly while its step is at most it.
    pub fill_buffer: u32,
    /// Transitions per update (`batch_size`): `B`, at most [`crate::MAX_BATCH`].
    pub batch_size: usize,
    /// Updates per iteration (`num_epochs`).
    pub epochs: u32,
    /// The discount.
    pub gamma: f32,
    /// Adam's learning rate.
    pub learning_rate: f32,
    /// Adam's `b1`.
    pub beta1: f64,
    /// Adam's `b2`.
    pub beta2: f64,
    /// Adam's `eps` (`eps_root` is 0).
    pub adam_eps: f32,
    /// Each gradient element is clipped to `[-max_grad, max_grad]` before Adam
    /// (`optax.clip(max_grad_norm)`: element-wise, not a norm).
    pub max_grad: f32,
    /// Target network update: `target = polyak target + (1 - polyak) online`, every
    /// iteration.
    pub polyak: f32,
    /// The epsilon schedule: `eps_start` to `eps_end`, linear over
    /// `exploration_steps` steps (`exploration_fraction * total_timesteps`).
    pub eps_start: f32,
    /// The schedule's end.
    pub eps_end: f32,
    /// The schedule's length in steps, at least 1.
    pub exploration_steps: u32,
    /// Evaluation's epsilon (rejax's `make_act`: 0.005).
    pub eval_epsilon: f32,
    /// Whether a truncated episode's transition is stored as done (no bootstrap). gymnax's
    /// `done` includes the time limit, so rejax treats truncation as terminal: `true`.
    /// `false` bootstraps a truncated transition from its final observation.
    pub truncation_is_terminal: bool,
}

impl DqnConfig {
    /// rejax 0.1.3's DQN on CartPole-v1: a dueling network of (64, 64) swish units,
    /// 10 environments, a ring of 50 000, 5 000 steps of filling, batches of 100, 5 updates
    /// an iteration, Adam at 0.001 after an element-wise clip at 10, Polyak 0.98, epsilon
    /// from 1 to 0.05 over half of 100 000 steps, gamma 0.99, double DQN.
    pub fn rejax_cartpole(seed: u64) -> DqnConfig {
        DqnConfig {
            seed,
            num_envs: 10,
            buffer_size: 50_000,
            fill_buffer: 5_000,
            batch_size: 100,
            epochs: 5,
            gamma: 0.99,
            learning_rate: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            adam_eps: 1e-8,
            max_grad: 10.0,
            polyak: 0.98,
            eps_start: 1.0,
            eps_end: 0.05,
            exploration_steps: 50_000,
            eval_epsilon: 0.005,
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

    /// The Polyak kernel's `(keep, mix)`: `polyak` and `1 - polyak` in f32 (the config is
    /// a traced f32 leaf in rejax, so JAX computes `1 - polyak` in f32).
    pub fn polyak_coefficients(&self) -> (f32, f32) {
        (self.polyak, 1.0 - self.polyak)
    }
}
