//! The model's values on the host: the seeded initial weights and data the trainer
//! uploads, and the parameters it downloads.

use crate::model::Dims;
use stepgraph_testkit::Rng;

/// A linear layer's `w [out, in]` and `b [out]`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostLinear {
    /// `[out, in]`, row-major.
    pub w: Vec<f32>,
    /// `[out]`.
    pub b: Vec<f32>,
}

impl HostLinear {
    /// PyTorch's `nn.Linear` initialisation: `w` and `b` uniform in `±1/√in`.
    pub fn init(rng: &mut Rng, out: usize, input: usize) -> HostLinear {
        let bound = 1.0 / (input as f32).sqrt();
        HostLinear {
            w: rng.fill(out * input, bound),
            b: rng.fill(out, bound),
        }
    }
}

/// Every parameter of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct HostParams {
    /// The trunk's first layer, `[H, S]`.
    pub trunk1: HostLinear,
    /// The trunk's second layer, `[H, H]`.
    pub trunk2: HostLinear,
    /// IQN's quantile embedding, `[H, C]`.
    pub iqn_embed: HostLinear,
    /// IQN's output layer, `[A, H]`.
    pub iqn_out: HostLinear,
    /// Attention's token layer, `[T E, H]`.
    pub attn_tokens: HostLinear,
    /// Attention's query, key and value layer, `[3E, E]`.
    pub attn_qkv: HostLinear,
    /// Attention's output layer, `[R, E]`.
    pub attn_out: HostLinear,
}

impl HostParams {
    /// Random parameters, drawn from `rng` in field order.
    pub fn init(d: &Dims, rng: &mut Rng) -> HostParams {
        HostParams {
            trunk1: HostLinear::init(rng, d.hidden, d.input),
            trunk2: HostLinear::init(rng, d.hidden, d.hidden),
            iqn_embed: HostLinear::init(rng, d.hidden, d.cos_dim),
            iqn_out: HostLinear::init(rng, d.actions, d.hidden),
            attn_tokens: HostLinear::init(rng, d.tokens * d.width, d.hidden),
            attn_qkv: HostLinear::init(rng, 3 * d.width, d.width),
            attn_out: HostLinear::init(rng, d.outputs, d.width),
        }
    }
}

/// The step's data: a fixed batch, the same at every step.
#[derive(Clone, Debug, PartialEq)]
pub struct HostData {
    /// Inputs `[B, S]`, uniform in (−1, 1).
    pub x: Vec<f32>,
    /// IQN's quantile fractions `[B, N]`, uniform in (0, 1).
    pub tau: Vec<f32>,
    /// IQN's targets `[B, A]`, uniform in (−1, 1).
    pub iqn_target: Vec<f32>,
    /// Attention's targets `[B, R]`, uniform in (−1, 1).
    pub attn_target: Vec<f32>,
}

impl HostData {
    /// Random data, drawn from `rng` in field order.
    pub fn init(d: &Dims, rng: &mut Rng) -> HostData {
        HostData {
            x: rng.fill(d.batch * d.input, 1.0),
            tau: (0..d.batch * d.quantiles).map(|_| rng.open01()).collect(),
            iqn_target: rng.fill(d.batch * d.actions, 1.0),
            attn_target: rng.fill(d.batch * d.outputs, 1.0),
        }
    }
}

/// The initial parameters and data of a trainer with `seed`: parameters first, then
/// data, from one generator.
pub fn init(d: &Dims, seed: u64) -> (HostParams, HostData) {
    let mut rng = Rng::new(seed);
    let params = HostParams::init(d, &mut rng);
    let data = HostData::init(d, &mut rng);
    (params, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_initial_state_and_nothing_is_zero() {
        let d = Dims::small();
        let (p, x) = init(&d, 11);
        assert_eq!((p.clone(), x.clone()), init(&d, 11));
        assert_ne!(p, init(&d, 12).0);
        assert_eq!(p.attn_tokens.w.len(), d.tokens * d.width * d.hidden);
        assert_eq!(x.tau.len(), d.batch * d.quantiles);
        assert!(x.tau.iter().all(|&t| t > 0.0 && t < 1.0));
        let all = [
            &p.trunk1.w,
            &p.iqn_out.b,
            &p.attn_out.w,
            &x.x,
            &x.iqn_target,
        ];
        assert!(all.iter().all(|v| v.iter().all(|&e| e != 0.0)));
    }
}
