//! Where everything lives: one agent's flat parameter vector ([`DuelingLayout`]), the
//! counters ([`Counter`]), and flax's initialisation of the parameters ([`init_params`]).
//!
//! The same numbers are `#define`d in `cuda/agents.cuh`; a unit test checks that the two
//! agree.

use crate::rng::{PURPOSE_INIT, agent_key, key_bits};

/// Floats in an observation (CartPole's `[x, x_dot, theta, theta_dot]`).
pub const OBS: usize = 4;
/// Units of each of the two hidden layers (rejax's `hidden_layer_sizes = (64, 64)`).
pub const HIDDEN: usize = 64;
/// CartPole's actions.
pub const ACTIONS: usize = 2;

/// One tensor of the network: where it starts in an agent's parameters and its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// flax's name of it, `Dense_0/kernel` style, for messages.
    pub name: &'static str,
    /// Its first float in the agent's flat parameters.
    pub offset: usize,
    /// `[rows, cols]`, row-major; a bias is `[1, n]`. A kernel is flax's `[in, out]`.
    pub shape: [usize; 2],
    /// Whether it is a Dense kernel (lecun_normal) rather than a bias (zeros).
    pub is_kernel: bool,
}

impl Tensor {
    /// Its number of floats.
    pub const fn len(&self) -> usize {
        self.shape[0] * self.shape[1]
    }

    /// Whether it holds no floats (never, for the network's tensors).
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its floats' range in the agent's parameters.
    pub const fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// rejax's `DuelingQNetwork` with `hidden_layer_sizes = (64, 64)` for CartPole: one
/// agent's parameters are [`DuelingLayout::PARAMS`] floats in the order of
/// [`DuelingLayout::TENSORS`], agents one after another (`[A, PARAMS]`); the online and
/// target parameters and both Adam moments share the layout.
///
/// ```text
/// h1 = swish(obs W1 + b1)          W1 [OBS, HIDDEN]
/// h2 = swish(h1 W2 + b2)           W2 [HIDDEN, HIDDEN]
/// V  = h2 Wv + bv                  Wv [HIDDEN, 1]
/// A  = h2 Wa + ba                  Wa [HIDDEN, ACTIONS]
/// Q  = V + A - mean(A)
/// ```
#[derive(Clone, Copy, Debug)]
pub struct DuelingLayout;

impl DuelingLayout {
    /// `Dense_0/kernel`: `[OBS, HIDDEN]`.
    pub const W1: Tensor = Tensor {
        name: "MLP_0/Dense_0/kernel",
        offset: 0,
        shape: [OBS, HIDDEN],
        is_kernel: true,
    };
    /// `Dense_0/bias`: `[HIDDEN]`.
    pub const B1: Tensor = Tensor {
        name: "MLP_0/Dense_0/bias",
        offset: Self::W1.offset + Self::W1.len(),
        shape: [1, HIDDEN],
        is_kernel: false,
    };
    /// `Dense_1/kernel`: `[HIDDEN, HIDDEN]`.
    pub const W2: Tensor = Tensor {
        name: "MLP_0/Dense_1/kernel",
        offset: Self::B1.offset + Self::B1.len(),
        shape: [HIDDEN, HIDDEN],
        is_kernel: true,
    };
    /// `Dense_1/bias`: `[HIDDEN]`.
    pub const B2: Tensor = Tensor {
        name: "MLP_0/Dense_1/bias",
        offset: Self::W2.offset + Self::W2.len(),
        shape: [1, HIDDEN],
        is_kernel: false,
    };
    /// The value head's kernel: `[HIDDEN, 1]`.
    pub const WV: Tensor = Tensor {
        name: "Dense_0/kernel",
        offset: Self::B2.offset + Self::B2.len(),
        shape: [HIDDEN, 1],
        is_kernel: true,
    };
    /// The value head's bias: `[1]`.
    pub const BV: Tensor = Tensor {
        name: "Dense_0/bias",
        offset: Self::WV.offset + Self::WV.len(),
        shape: [1, 1],
        is_kernel: false,
    };
    /// The advantage head's kernel: `[HIDDEN, ACTIONS]`.
    pub const WA: Tensor = Tensor {
        name: "Dense_1/kernel",
        offset: Self::BV.offset + Self::BV.len(),
        shape: [HIDDEN, ACTIONS],
        is_kernel: true,
    };
    /// The advantage head's bias: `[ACTIONS]`.
    pub const BA: Tensor = Tensor {
        name: "Dense_1/bias",
        offset: Self::WA.offset + Self::WA.len(),
        shape: [1, ACTIONS],
        is_kernel: false,
    };
    /// Every tensor, in layout order.
    pub const TENSORS: [Tensor; 8] = [
        Self::W1,
        Self::B1,
        Self::W2,
        Self::B2,
        Self::WV,
        Self::BV,
        Self::WA,
        Self::BA,
    ];
    /// Floats of one agent's parameters (4675).
    pub const PARAMS: usize = Self::BA.offset + Self::BA.len();
}

/// The counters: one `u32` buffer of [`COUNTERS`] shared by all agents, which step their
/// environments in lockstep. `replay_insert` and `dqn_act` read them, `dqn_count` moves
/// them on after each step of the environments, `dqn_update` reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Environment steps each agent has taken: rejax's `global_step` (`+= E` a step).
    Step = 0,
    /// [`Counter::Step`] before the last `dqn_count`: rejax's `old_global_step`, which
    /// decides whether the iteration trains (`> fill_buffer`).
    StepBefore = 1,
    /// The ring slot the next insert writes first.
    Pos = 2,
    /// Filled slots of each ring (at most its capacity).
    Size = 3,
}

impl Counter {
    /// Every counter, by index.
    pub const ALL: [Counter; COUNTERS] = [
        Counter::Step,
        Counter::StepBefore,
        Counter::Pos,
        Counter::Size,
    ];

    /// Its index in the counters buffer.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its `#define` in `cuda/agents.cuh`.
    pub const fn macro_name(self) -> &'static str {
        match self {
            Counter::Step => "COUNTER_STEP",
            Counter::StepBefore => "COUNTER_STEP_BEFORE",
            Counter::Pos => "COUNTER_POS",
            Counter::Size => "COUNTER_SIZE",
        }
    }
}

/// Length of the counters buffer.
pub const COUNTERS: usize = 4;

/// flax's `variance_scaling` divides a standard normal truncated to `[-2, 2]` by this, its
/// standard deviation, so the truncated draw has the variance asked for.
pub const TRUNCATED_NORMAL_STD: f64 = 0.879_625_661_034_239_8;

/// The initial parameters of `agent` under `seed`, as flax initialises rejax's network:
/// every Dense kernel `lecun_normal` (a standard normal truncated to `[-2, 2]`, times
/// `sqrt(1 / fan_in) / 0.87962566103423978`, fan_in = the kernel's rows), every bias 0.
///
/// The draws are this crate's counter-based generator, not JAX's threefry: the same
/// distribution, not the same numbers as a JAX run with the same seed. Parameter `p`
/// takes normals from the key of (seed, agent, init, p), Box-Muller on 53-bit uniforms in
/// f64, rejecting those outside `[-2, 2]`, then rounds to f32.
pub fn init_params(seed: u64, agent: u32) -> Vec<f32> {
    init_tensors(&DuelingLayout::TENSORS, DuelingLayout::PARAMS, |p| {
        agent_key(seed, agent, PURPOSE_INIT, p as u64)
    })
}

/// flax's initialisation of any network whose `tensors` lie in `len` floats: every Dense
/// kernel `lecun_normal` (truncated as [`init_params`] says), parameter `p` from the
/// words of `key(p)`; every bias and any float no tensor covers, 0.
pub fn init_tensors(tensors: &[Tensor], len: usize, key: impl Fn(usize) -> u64) -> Vec<f32> {
    let mut params = vec![0.0f32; len];
    for tensor in tensors.iter().filter(|t| t.is_kernel) {
        let std = (1.0 / tensor.shape[0] as f64).sqrt() / TRUNCATED_NORMAL_STD;
        for p in tensor.range().filter(|&p| p < len) {
            params[p] = (truncated_normal(key(p)) * std) as f32;
        }
    }
    params
}

/// A standard normal truncated to `[-2, 2]` from the words of `key`.
fn truncated_normal(key: u64) -> f64 {
    let unit = |bits: u64| (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    let mut word = 0u32;
    loop {
        // u1 in (0, 1], so the log is finite.
        let u1 = 1.0 - unit(key_bits(key, word));
        let u2 = unit(key_bits(key, word + 1));
        word += 2;
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        if z.abs() <= 2.0 {
            return z;
        }
        // Each try is accepted with probability 0.95: the loop ends after about one.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_covers_every_parameter_once() {
        let mut owner = vec![None; DuelingLayout::PARAMS];
        for (t, tensor) in DuelingLayout::TENSORS.iter().enumerate() {
            for p in tensor.range() {
                assert_eq!(owner[p], None, "{} overlaps at {p}", tensor.name);
                owner[p] = Some(t);
            }
        }
        assert!(owner.iter().all(Option::is_some));
        let expected = OBS * HIDDEN
            + HIDDEN
            + HIDDEN * HIDDEN
            + HIDDEN
            + HIDDEN
            + 1
            + HIDDEN * ACTIONS
            + ACTIONS;
        assert_eq!(DuelingLayout::PARAMS, expected);
        assert_eq!(DuelingLayout::PARAMS, 4675);
    }

    #[test]
    fn the_cuda_header_defines_the_same_layout_and_counters() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda/agents.cuh");
        let defines = stepgraph_testkit::cuda_defines(path).expect("agents.cuh reads");
        let get = |name: &str| -> usize {
            defines
                .get(name)
                .unwrap_or_else(|| panic!("agents.cuh defines {name}"))
                .parse()
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        assert_eq!(get("OBS"), OBS);
        assert_eq!(get("HIDDEN"), HIDDEN);
        assert_eq!(get("ACTIONS"), ACTIONS);
        assert_eq!(get("PARAMS"), DuelingLayout::PARAMS);
        assert_eq!(get("COUNTERS"), COUNTERS);
        for (name, t) in [
            ("OFF_W1", DuelingLayout::W1),
            ("OFF_B1", DuelingLayout::B1),
            ("OFF_W2", DuelingLayout::W2),
            ("OFF_B2", DuelingLayout::B2),
            ("OFF_WV", DuelingLayout::WV),
            ("OFF_BV", DuelingLayout::BV),
            ("OFF_WA", DuelingLayout::WA),
            ("OFF_BA", DuelingLayout::BA),
        ] {
            assert_eq!(get(name), t.offset, "{name}");
        }
        for c in Counter::ALL {
            assert_eq!(get(c.macro_name()), c.index(), "{}", c.macro_name());
        }
        assert_eq!(get("PURPOSE_ACT"), crate::rng::PURPOSE_ACT as usize);
        assert_eq!(get("PURPOSE_SAMPLE"), crate::rng::PURPOSE_SAMPLE as usize);
        assert_eq!(get("PURPOSE_EVAL"), crate::rng::PURPOSE_EVAL as usize);
    }

    #[test]
    fn init_is_lecun_normal_truncated_with_zero_biases() {
        let p = init_params(3, 1);
        assert_eq!(p, init_params(3, 1));
        assert_ne!(p, init_params(3, 2));
        assert_ne!(p, init_params(4, 1));
        for t in DuelingLayout::TENSORS {
            let v = &p[t.range()];
            if !t.is_kernel {
                assert!(v.iter().all(|&x| x == 0.0), "{}", t.name);
                continue;
            }
            let std = (1.0 / t.shape[0] as f64).sqrt() / TRUNCATED_NORMAL_STD;
            assert!(
                v.iter()
                    .all(|&x| f64::from(x).abs() <= 2.0 * std * (1.0 + 1e-6)),
                "{}: a draw outside the truncation",
                t.name
            );
        }
        // W2 has 4096 draws: their variance is 1 / fan_in within sampling error (the
        // variance of a sample variance of n draws is about 2 sigma^4 / n; 5 of those).
        let w2 = &p[DuelingLayout::W2.range()];
        let n = w2.len() as f64;
        let var = w2.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / n;
        let want = 1.0 / HIDDEN as f64;
        assert!(
            (var - want).abs() < 5.0 * want * (2.0 / n).sqrt(),
            "variance {var}, expected {want}"
        );
        let mean = w2.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        assert!(mean.abs() < 5.0 * (want / n).sqrt(), "mean {mean}");
    }
}
