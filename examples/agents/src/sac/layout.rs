//! Where everything of a SAC agent lives: the actor's flat parameters ([`ActorLayout`]),
//! a critic's ([`CriticLayout`]), the observation statistics ([`RMS_FLOATS`]) and flax's
//! initialisation of both networks ([`init_actor`], [`init_critics`]).
//!
//! The same numbers are `#define`d in `cuda/sac.cuh`; a unit test checks that the two
//! agree.

use crate::layout::{HIDDEN, Tensor, init_tensors};
use crate::rng::{PURPOSE_SAC_INIT, agent_key};

/// Floats in a Pendulum-v1 observation (`[cos theta, sin theta, theta_dot]`).
pub const SAC_OBS: usize = 3;
/// A critic's inputs: the observation, then the action.
pub const SAC_IN: usize = SAC_OBS + 1;
/// Critics per agent (rejax's `num_critics`), and as many target critics.
pub const NUM_CRITICS: usize = 2;
/// The policy's actions are `tanh(u) ACTION_SCALE`: Pendulum's torque range `[-2, 2]`.
pub const ACTION_SCALE: f32 = 2.0;
/// rejax's `log_std_range`.
pub const LOG_STD_RANGE: (f32, f32) = (-10.0, 2.0);

const fn kernel(name: &'static str, offset: usize, rows: usize, cols: usize) -> Tensor {
    Tensor {
        name,
        offset,
        shape: [rows, cols],
        is_kernel: true,
    }
}

const fn bias(name: &'static str, offset: usize, n: usize) -> Tensor {
    Tensor {
        name,
        offset,
        shape: [1, n],
        is_kernel: false,
    }
}

const fn after(t: Tensor) -> usize {
    t.offset + t.len()
}

/// rejax's `SquashedGaussianPolicy` with `hidden_layer_sizes = (64, 64)` for Pendulum: one
/// agent's actor is [`ActorLayout::PARAMS`] floats in the order of
/// [`ActorLayout::TENSORS`], agents one after another (`[A, PARAMS]`); Adam's moments
/// share the layout.
///
/// ```text
/// h1 = swish(obs W1 + b1)          W1 [SAC_OBS, HIDDEN]
/// h2 = swish(h1 W2 + b2)           W2 [HIDDEN, HIDDEN]
/// mu = h2 Wmu + bmu                Wmu [HIDDEN, 1]
/// ls = clip(h2 Wls + bls, -10, 2)  Wls [HIDDEN, 1]
/// u  = mu + exp(ls) eps,  action = 2 tanh(u)
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ActorLayout;

impl ActorLayout {
    /// `features/Dense_0/kernel`.
    pub const W1: Tensor = kernel("features/Dense_0/kernel", 0, SAC_OBS, HIDDEN);
    /// `features/Dense_0/bias`.
    pub const B1: Tensor = bias("features/Dense_0/bias", after(Self::W1), HIDDEN);
    /// `features/Dense_1/kernel`.
    pub const W2: Tensor = kernel("features/Dense_1/kernel", after(Self::B1), HIDDEN, HIDDEN);
    /// `features/Dense_1/bias`.
    pub const B2: Tensor = bias("features/Dense_1/bias", after(Self::W2), HIDDEN);
    /// `action_mean/kernel`.
    pub const WMU: Tensor = kernel("action_mean/kernel", after(Self::B2), HIDDEN, 1);
    /// `action_mean/bias`.
    pub const BMU: Tensor = bias("action_mean/bias", after(Self::WMU), 1);
    /// `action_log_std/kernel`.
    pub const WLS: Tensor = kernel("action_log_std/kernel", after(Self::BMU), HIDDEN, 1);
    /// `action_log_std/bias`.
    pub const BLS: Tensor = bias("action_log_std/bias", after(Self::WLS), 1);
    /// Every tensor, in layout order.
    pub const TENSORS: [Tensor; 8] = [
        Self::W1,
        Self::B1,
        Self::W2,
        Self::B2,
        Self::WMU,
        Self::BMU,
        Self::WLS,
        Self::BLS,
    ];
    /// Floats of one agent's actor (4546).
    pub const PARAMS: usize = after(Self::BLS);
}

/// rejax's `QNetwork` with `hidden_layer_sizes = (64, 64)`: one critic is
/// [`CriticLayout::PARAMS`] floats in the order of [`CriticLayout::TENSORS`]; an agent's
/// [`NUM_CRITICS`] critics follow each other (`[A, NUM_CRITICS, PARAMS]`), and so do its
/// target critics and the critics' Adam moments.
///
/// ```text
/// h1 = swish([obs, action] W1 + b1)   W1 [SAC_IN, HIDDEN]
/// h2 = swish(h1 W2 + b2)              W2 [HIDDEN, HIDDEN]
/// Q  = h2 Wq + bq                     Wq [HIDDEN, 1]
/// ```
#[derive(Clone, Copy, Debug)]
pub struct CriticLayout;

impl CriticLayout {
    /// `Dense_0/kernel`.
    pub const W1: Tensor = kernel("Dense_0/kernel", 0, SAC_IN, HIDDEN);
    /// `Dense_0/bias`.
    pub const B1: Tensor = bias("Dense_0/bias", after(Self::W1), HIDDEN);
    /// `Dense_1/kernel`.
    pub const W2: Tensor = kernel("Dense_1/kernel", after(Self::B1), HIDDEN, HIDDEN);
    /// `Dense_1/bias`.
    pub const B2: Tensor = bias("Dense_1/bias", after(Self::W2), HIDDEN);
    /// `Dense_2/kernel`: the Q head.
    pub const WQ: Tensor = kernel("Dense_2/kernel", after(Self::B2), HIDDEN, 1);
    /// `Dense_2/bias`.
    pub const BQ: Tensor = bias("Dense_2/bias", after(Self::WQ), 1);
    /// Every tensor, in layout order.
    pub const TENSORS: [Tensor; 6] = [Self::W1, Self::B1, Self::W2, Self::B2, Self::WQ, Self::BQ];
    /// Floats of one critic (4545).
    pub const PARAMS: usize = after(Self::BQ);
}

/// The observation statistics of an agent (rejax's `RMSState`), [`RMS_FLOATS`] f32 each:
/// the running mean at [`RMS_MEAN`], the running variance at [`RMS_VAR`], the count at
/// [`RMS_COUNT`].
pub const RMS_FLOATS: usize = 8;
/// The running mean's first float.
pub const RMS_MEAN: usize = 0;
/// The running variance's first float.
pub const RMS_VAR: usize = 3;
/// The count.
pub const RMS_COUNT: usize = 6;

/// rejax's initial statistics of one agent: mean 0, variance 1, count 1e-4.
pub fn initial_rms() -> [f32; RMS_FLOATS] {
    let mut s = [0.0; RMS_FLOATS];
    s[RMS_VAR..RMS_VAR + SAC_OBS].fill(1.0);
    s[RMS_COUNT] = 1e-4;
    s
}

/// The initial actor of `agent` under `seed`, as flax initialises it (see
/// [`crate::init_params`]).
pub fn init_actor(seed: u64, agent: u32) -> Vec<f32> {
    init_network(&ActorLayout::TENSORS, ActorLayout::PARAMS, seed, agent, 0)
}

/// The initial critics of `agent` under `seed`, `[NUM_CRITICS, CriticLayout::PARAMS]`
/// (each of its own draws, as rejax splits a key per critic). The target critics start
/// equal to them.
pub fn init_critics(seed: u64, agent: u32) -> Vec<f32> {
    (0..NUM_CRITICS)
        .flat_map(|k| {
            init_network(
                &CriticLayout::TENSORS,
                CriticLayout::PARAMS,
                seed,
                agent,
                1 + k as u64,
            )
        })
        .collect()
}

fn init_network(tensors: &[Tensor], len: usize, seed: u64, agent: u32, network: u64) -> Vec<f32> {
    init_tensors(tensors, len, |p| {
        agent_key(seed, agent, PURPOSE_SAC_INIT, network << 32 | p as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::TRUNCATED_NORMAL_STD;

    fn covers_once(tensors: &[Tensor], len: usize) {
        let mut owner = vec![None; len];
        for (t, tensor) in tensors.iter().enumerate() {
            for p in tensor.range() {
                assert_eq!(owner[p], None, "{} overlaps at {p}", tensor.name);
                owner[p] = Some(t);
            }
        }
        assert!(owner.iter().all(Option::is_some));
    }

    #[test]
    fn the_layouts_cover_every_parameter_once() {
        covers_once(&ActorLayout::TENSORS, ActorLayout::PARAMS);
        covers_once(&CriticLayout::TENSORS, CriticLayout::PARAMS);
        assert_eq!(ActorLayout::PARAMS, 4546);
        assert_eq!(CriticLayout::PARAMS, 4545);
    }

    #[test]
    fn the_cuda_header_defines_the_same_layouts() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda/sac.cuh");
        let defines = stepgraph_testkit::cuda_defines(path).expect("sac.cuh reads");
        let get = |name: &str| -> usize {
            defines
                .get(name)
                .unwrap_or_else(|| panic!("sac.cuh defines {name}"))
                .parse()
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        assert_eq!(get("SAC_OBS"), SAC_OBS);
        assert_eq!(get("SAC_IN"), SAC_IN);
        assert_eq!(get("SAC_HIDDEN"), HIDDEN);
        assert_eq!(get("NUM_CRITICS"), NUM_CRITICS);
        assert_eq!(get("ACTOR_PARAMS"), ActorLayout::PARAMS);
        assert_eq!(get("CRITIC_PARAMS"), CriticLayout::PARAMS);
        for (name, t) in [
            ("ACTOR_W1", ActorLayout::W1),
            ("ACTOR_B1", ActorLayout::B1),
            ("ACTOR_W2", ActorLayout::W2),
            ("ACTOR_B2", ActorLayout::B2),
            ("ACTOR_WMU", ActorLayout::WMU),
            ("ACTOR_BMU", ActorLayout::BMU),
            ("ACTOR_WLS", ActorLayout::WLS),
            ("ACTOR_BLS", ActorLayout::BLS),
            ("CRITIC_W1", CriticLayout::W1),
            ("CRITIC_B1", CriticLayout::B1),
            ("CRITIC_W2", CriticLayout::W2),
            ("CRITIC_B2", CriticLayout::B2),
            ("CRITIC_WQ", CriticLayout::WQ),
            ("CRITIC_BQ", CriticLayout::BQ),
        ] {
            assert_eq!(get(name), t.offset, "{name}");
        }
        for (name, v) in [
            ("RMS_MEAN", RMS_MEAN),
            ("RMS_VAR", RMS_VAR),
            ("RMS_COUNT", RMS_COUNT),
            ("RMS_FLOATS", RMS_FLOATS),
        ] {
            assert_eq!(get(name), v, "{name}");
        }
        use crate::rng::*;
        for (name, v) in [
            ("PURPOSE_SAC_ACT", PURPOSE_SAC_ACT),
            ("PURPOSE_SAC_EVAL", PURPOSE_SAC_EVAL),
            ("PURPOSE_SAC_SAMPLE", PURPOSE_SAC_SAMPLE),
            ("PURPOSE_SAC_ACTOR", PURPOSE_SAC_ACTOR),
            ("PURPOSE_SAC_TARGET", PURPOSE_SAC_TARGET),
        ] {
            assert_eq!(get(name), v as usize, "{name}");
        }
        // The float #defines, read as text.
        let float = |name: &str| -> f32 {
            defines[name]
                .trim_matches(['(', ')'])
                .trim_end_matches('f')
                .parse()
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        assert_eq!(float("ACTION_SCALE"), ACTION_SCALE);
        assert_eq!((float("LOG_STD_MIN"), float("LOG_STD_MAX")), LOG_STD_RANGE);
    }

    #[test]
    fn init_is_lecun_normal_with_zero_biases_and_distinct_networks() {
        let a = init_actor(3, 1);
        let c = init_critics(3, 1);
        assert_eq!(a, init_actor(3, 1));
        assert_ne!(a, init_actor(3, 2));
        assert_eq!(c.len(), NUM_CRITICS * CriticLayout::PARAMS);
        let (c0, c1) = c.split_at(CriticLayout::PARAMS);
        assert_ne!(c0, c1, "the two critics draw their own weights");
        for (params, tensors) in [
            (&a[..], &ActorLayout::TENSORS[..]),
            (c0, &CriticLayout::TENSORS[..]),
            (c1, &CriticLayout::TENSORS[..]),
        ] {
            for t in tensors {
                let v = &params[t.range()];
                if !t.is_kernel {
                    assert!(v.iter().all(|&x| x == 0.0), "{}", t.name);
                    continue;
                }
                let std = (1.0 / t.shape[0] as f64).sqrt() / TRUNCATED_NORMAL_STD;
                assert!(
                    v.iter()
                        .all(|&x| f64::from(x).abs() <= 2.0 * std * (1.0 + 1e-6)),
                    "{}",
                    t.name
                );
                assert!(v.iter().any(|&x| x != 0.0), "{}", t.name);
            }
        }
        let rms = initial_rms();
        assert_eq!(&rms[RMS_MEAN..RMS_MEAN + SAC_OBS], &[0.0; 3]);
        assert_eq!(&rms[RMS_VAR..RMS_VAR + SAC_OBS], &[1.0; 3]);
        assert_eq!(rms[RMS_COUNT], 1e-4);
    }
}
