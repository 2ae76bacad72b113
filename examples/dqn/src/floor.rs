//! The step's floors, counted from MODEL.md's math (`stepgraph::stats::Floor` says what
//! a floor counts): for the IQN head, for attention (the head and its weight gradients),
//! and for the whole step. `dqn`'s benchmark prints each beside its time alone and its
//! share of the work bound, at the ceilings it measures on the GPU.
//!
//! Matrix products are counted as MODEL.md writes them, forward and backward, whatever
//! the kernels fuse: IQN's `phi = relu(cosf wphiᵀ + bphi)` and `dwphi = dphi_preᵀ cosf`,
//! attention's projections, its scores and values per head, and their gradients; but
//! where an algebraic identity removes a product (attention's output projection, see
//! [`attention`]), it is left out, so that the count stays a floor. The dot
//! products of one output (the value head, IQL's heads, IQN's `zq`) are counted too; the
//! elementwise work (activations, losses, softmax, Adam's arithmetic) is not. Bytes are
//! each part's inputs read once and its outputs written once: for a head, what it reads
//! from the trunk and the batch and its parameters, and its gradients; for the step, the
//! batch's rows read from the replay buffer, the target network read once, and Adam's
//! read and write of the parameters and both moments. Every activation is taken to stay
//! on chip, so the floor is below what any kernels can reach.

use stepgraph::stats::Floor;

use crate::layers::{D, Sizes};

/// The IQN head: the quantile embedding `phi` and its weight gradient, `zq` and the
/// sum `S` that gives `dh`, reading `h`, `tau`, `ȳ` and its parameters, writing `dh` and
/// its gradients.
pub fn iqn(s: &Sizes) -> Floor {
    let rows = s.batch * s.quantiles;
    let (h, c) = (s.hidden, s.cosines);
    let products = Floor::matmul(rows, h, c) // phi
        + Floor::matmul(h, c, rows) // dwphi
        + Floor::matmul(rows, 1, h) // zq = (h ⊙ phi) wqᵀ
        + Floor::matmul(s.batch, h, s.quantiles); // S = Σ_j dzq phi
    let params = h * c + h + h + 1;
    let reads = Floor::f32s(s.batch * h + rows + s.batch + params);
    let writes = Floor::f32s(s.batch * h + params);
    products + reads + writes
}

/// Attention over the window: the embedding, the fused QKV projection, the scores and
/// values of every head, the reward prediction, and every gradient but the window's own,
/// reading the window, the rewards and its parameters, writing its gradients.
///
/// The output projection is counted as the fused kernel computes it, the least work
/// known: `pred` depends on `att` only through its mean over the window, so
/// `pred = mean_w(att) · v + bp` with `v = wpᵀ wo`, and `o = att woᵀ` (a `[B W, E]` by
/// `[E, E]` product) is never needed. Its backward is then the same `(g_b / W) v` for
/// every row of a sample (no `datt = d_o wo` product), `dwo = wp ⊗ Sum` and
/// `dwp = Sum woᵀ` with `Sum = Σ_b g_b mean_w(att_b)`; and with the same `datt` for every
/// query row, a head's `dP[i, k] = datt_i · V_k` is one dot product per key and `dV` one
/// scaled copy per key.
///
/// The embedding is counted the cheaper of two ways. The long way stores `emb` and takes
/// `emb`, `qkv`, `demb = dqkv wqkv`, `dwqkv = dqkvᵀ emb` and `dwemb = dembᵀ win` over every
/// row. Folded, as the fused kernel computes it, `W' = wqkv wemb` makes `qkv = win W'ᵀ + b'`,
/// and one product over the rows, `G = dqkvᵀ win`, gives `dwqkv = G wembᵀ + csum bembᵀ` and
/// `dwemb = wqkvᵀ G` (products of the weights' sizes, not the rows'). Folded is the cheaper
/// where `S` is not much larger than `E` (at the step's `S = E`, 5 products of the rows'
/// size become 2).
pub fn attention(s: &Sizes) -> Floor {
    let (b, w, e, st) = (s.batch, s.window, s.width, s.state);
    let rows = b * w;
    let head = e / s.heads.max(1);
    // One head of one sample: a [W, W] by [W, E/Hh] product (scores Q Kᵀ, P V, dQ, dK),
    // and W dot products of E/Hh (dP, dV).
    let per_head = Floor::matmul(w, w, head);
    let heads = per_head.times(b * s.heads);
    let per_key = Floor::matmul(w, 1, head).times(b * s.heads);
    let long = Floor::matmul(rows, e, st) // emb
        + Floor::matmul(rows, 3 * e, e) // qkv
        + Floor::matmul(rows, e, 3 * e) // demb = dqkv wqkv
        + Floor::matmul(3 * e, e, rows) // dwqkv
        + Floor::matmul(e, st, rows); // dwemb
    let folded = Floor::matmul(3 * e, st, e) // W' = wqkv wemb
        + Floor::matmul(rows, 3 * e, st) // qkv = win W'ᵀ + b'
        + Floor::matmul(3 * e, st, rows) // G = dqkvᵀ win
        + Floor::matmul(3 * e, e, st) // dwqkv = G wembᵀ + csum bembᵀ
        + Floor::matmul(e, st, 3 * e); // dwemb = wqkvᵀ G
    let embedding = if folded.tensor_flop <= long.tensor_flop {
        folded
    } else {
        long
    };
    let forward = embedding
        + heads.times(2) // scores, P V
        + Floor::matmul(1, e, e) // v = wpᵀ wo
        + Floor::matmul(b, 1, e); // pred = mean_w(att) · v
    let backward = Floor::matmul(1, e, b) // Sum = Σ_b g_b mean_w(att_b)
        + Floor::matmul(e, e, 1) // dwo = wp ⊗ Sum
        + Floor::matmul(1, e, e) // dwp = Sum woᵀ
        + per_key.times(2) // dP, dV
        + heads.times(2); // dQ, dK
    let params = e * st + e + 3 * e * e + e * e + e + 1;
    let reads = Floor::f32s(rows * st + b + params);
    let writes = Floor::f32s(params);
    forward + backward + reads + writes
}

/// The trunk's and branches' parameters (online or target): layers 1 and 2, the value
/// head, and each branch's gate and advantage layers.
fn q_network_params(s: &Sizes) -> usize {
    let (st, h, g, a) = (s.state, s.hidden, s.glu, s.actions);
    (h * st + h) + (h * h + h) + (h + 1) + D * ((2 * g * h + 2 * g) + (a * g + a))
}

/// Every online parameter: the Q network's, IQL's two heads, IQN's and attention's.
pub fn params(s: &Sizes) -> usize {
    let (h, c, e, st) = (s.hidden, s.cosines, s.width, s.state);
    q_network_params(s)
        + 2 * (h + 1)
        + (h * c + h + h + 1)
        + (e * st + e + 3 * e * e + e * e + e + 1)
}

/// The Q network's forward on one batch of states: the trunk, the value head and every
/// branch.
fn q_forward(s: &Sizes) -> Floor {
    let (b, st, h, g, a) = (s.batch, s.state, s.hidden, s.glu, s.actions);
    Floor::matmul(b, h, st)
        + Floor::matmul(b, h, h)
        + Floor::matmul(b, 1, h)
        + (Floor::matmul(b, 2 * g, h) + Floor::matmul(b, a, g)).times(D)
}

/// The whole step: the Q network on `s` (online) and on `s2` (online and target), IQL's
/// heads, IQN, attention, and the backward of the trunk, the value head and the
/// branches; the batch's rows, the target network, and Adam's traffic.
pub fn step(s: &Sizes) -> Floor {
    let (b, st, h, g, a) = (s.batch, s.state, s.hidden, s.glu, s.actions);
    let iql = (Floor::matmul(b, 1, h) + Floor::matmul(1, h, b) + Floor::matmul(b, h, 1)).times(2);
    let branches_back = (Floor::matmul(a, g, b) // dwa
        + Floor::matmul(b, g, a) // dg
        + Floor::matmul(2 * g, h, b) // dwg
        + Floor::matmul(b, h, 2 * g)) // dh
    .times(D);
    let value_back = Floor::matmul(1, h, b) + Floor::matmul(b, h, 1);
    let trunk_back = Floor::matmul(h, h, b) + Floor::matmul(b, h, h) + Floor::matmul(h, st, b);
    // The batch: s, s2, the window, the actions (i32), r, done; tau is drawn on the device.
    let batch = Floor::f32s(b * (2 * st + s.window * st + D + 2));
    let target = Floor::f32s(q_network_params(s));
    // Adam reads θ, g, m and v and writes θ, m and v.
    let adam = Floor::f32s(7 * params(s));
    let (iqn, attention) = (iqn(s), attention(s));
    // The heads' own bytes are inside the step's: count only their arithmetic here.
    let heads = Floor::new(iqn.tensor_flop + attention.tensor_flop, 0.0);
    q_forward(s).times(3)
        + iql
        + heads
        + branches_back
        + value_back
        + trunk_back
        + batch
        + target
        + adam
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PERF.md's counts at MODEL.md's sizes, by hand: IQN `4 B N H C`, attention with its
    /// embedding folded `2 · 2 B W 3E S` for `qkv` and `G` and `3 · 2 3E E S` for `W'`,
    /// `dwqkv` and `dwemb`, plus `8 B W² E` for the heads' scores, values, `dQ` and `dK`,
    /// `4 B W E` for `dP` and `dV`, and the pool's products of `E` and `E²`.
    #[test]
    fn the_default_sizes_count_what_perf_md_counts() {
        let s = Sizes::default();
        let (b, n, h, c) = (16384.0, 32.0, 256.0, 64.0);
        let f = iqn(&s);
        let phi_and_dwphi = 4.0 * b * n * h * c;
        assert_eq!(phi_and_dwphi, 34_359_738_368.0);
        assert_eq!(f.tensor_flop, phi_and_dwphi + 4.0 * b * n * h);
        // h and dh (16 MiB each), tau, ȳ, the parameters twice.
        assert_eq!(
            f.bytes,
            4.0 * (2.0 * b * h + b * n + b + 2.0 * (h * c + 2.0 * h + 1.0))
        );

        let (w, e, st) = (8.0, 64.0, 64.0);
        let bw = b * w;
        // The embedding folded (W' = wqkv wemb): qkv and G over the rows, and three
        // products of the weights' sizes (W', dwqkv, dwemb).
        let over_rows = 2.0 * 2.0 * bw * 3.0 * e * st;
        let weights = 3.0 * 2.0 * 3.0 * e * e * st;
        let heads = 2.0 * b * w * w * e;
        let a = attention(&s);
        assert_eq!(
            a.tensor_flop,
            // the embedding and the projections, forward and backward
            over_rows + weights
            // forward: scores and values, v and the prediction
            + 2.0 * heads + 2.0 * e * e + 2.0 * b * e
            // backward: Sum, dwo, dwp; dP, dV; dQ, dK
            + 2.0 * b * e + 2.0 * e * e + 2.0 * e * e + 4.0 * bw * e + 2.0 * heads
        );
        // The long way (emb, qkv, demb, dwqkv, dwemb over the rows) is larger: 11.8 GFLOP of
        // products where the folded takes 6.4.
        let long = 2.0 * bw * e * (st + 3.0 * e) * 2.0 + 2.0 * bw * 3.0 * e * e;
        assert!((11.7e9..11.9e9).contains(&long), "{long}");
        assert!(over_rows + weights < long);
        // PERF.md: about 7 GFLOP (12.4 the long way, 15.8 with the output projection), 66
        // GFLOP for the step.
        assert!((6.5e9..7.5e9).contains(&a.tensor_flop), "{a}");
        let total = step(&s);
        assert!((64.0e9..68.0e9).contains(&total.tensor_flop), "{total}");
        // Well under 1 GB: the window dominates.
        assert!((0.04e9..0.1e9).contains(&total.bytes), "{total}");
    }

    #[test]
    fn the_step_counts_every_part_once() {
        let ragged = Sizes {
            batch: 1000,
            hidden: 200,
            glu: 24,
            quantiles: 7,
            cosines: 48,
            ..Sizes::default()
        };
        for s in [Sizes::default(), ragged] {
            let parts = iqn(&s).tensor_flop + attention(&s).tensor_flop;
            let total = step(&s);
            assert!(total.tensor_flop > parts, "{s:?}");
            // The batch, the target and Adam's traffic: the window, at least, and seven
            // copies of the parameters.
            let window = 4.0 * (s.batch * s.window * s.state) as f64;
            assert!(total.bytes > window + 28.0 * params(&s) as f64, "{s:?}");
        }
    }

    #[test]
    fn the_counts_scale_with_the_batch() {
        let s = Sizes::default();
        let half = Sizes {
            batch: s.batch / 2,
            ..s
        };
        // Every product scales with the batch (the weight gradients' k is the batch too)
        // but attention's of weights alone: v = wpᵀ wo, dwo and dwp (2 E² FLOP each), and
        // the folded embedding's W', dwqkv and dwemb (2 3E E S each): the rest halves
        // exactly.
        let (e, st) = (s.width as f64, s.state as f64);
        let fixed = 3.0 * 2.0 * e * e + 3.0 * 2.0 * 3.0 * e * e * st;
        assert_eq!(iqn(&half).tensor_flop * 2.0, iqn(&s).tensor_flop);
        assert_eq!(
            (attention(&half).tensor_flop - fixed) * 2.0,
            attention(&s).tensor_flop - fixed
        );
        assert_eq!(
            (step(&half).tensor_flop - fixed) * 2.0,
            step(&s).tensor_flop - fixed
        );
    }
}
