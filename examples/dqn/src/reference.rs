//! CPU references of the DQN step's kernels (`cuda/*.cu`): straightforward loops in f64
//! over f32 inputs, returning f32 (the optimizer's are in `stepgraph-kernels`). The GPU tests and the example compare the kernels with these; the unit tests
//! below check every hand-derived gradient against central finite differences of the
//! forward computation in f64.
//!
//! The gradients here are computed the long way (the full chain rule, with no algebraic
//! shortcut), so that a kernel that uses a shortcut is checked against an independent
//! derivation. The fused attention head is the exception: its reference computes in the
//! kernel's order (the embedding folded into `W' = wqkv wemb`, `csum`'s K and V parts from
//! their identities), so that it rounds where the kernel does; its tests check that order
//! against finite differences and against the long way.

use crate::kernels::{
    AttentionDims, AttnFusedDims, AttnPoolDims, BranchHeadDims, DuelingCoefficients, DuelingDims,
    Expectile, ExpectileHeadDims, IqnDims, IqnFusedDims, LOSS_SLOTS, LossSlot, TrunkDims,
    TrunkL1Dims,
};

/// What a loss kernel adds into each slot of the loss buffer (see [`LossSlot`]), in f64.
pub type LossContributions = [f64; LOSS_SLOTS];

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

fn narrow(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn huber(x: f64) -> f64 {
    if x.abs() <= 1.0 {
        0.5 * x * x
    } else {
        x.abs() - 0.5
    }
}

fn huber_grad(x: f64) -> f64 {
    x.clamp(-1.0, 1.0)
}

/// `|τ − 1(u < 0)|`, the quantile and expectile weight.
fn asymmetric_weight(tau: f64, u: f64) -> f64 {
    (tau - if u < 0.0 { 1.0 } else { 0.0 }).abs()
}

fn check(what: &str, found: usize, expected: usize) {
    assert_eq!(found, expected, "{what}: wrong length");
}

// ---- heads ----

/// What [`Kernels::glu_forward`](crate::kernels::Kernels::glu_forward) computes: `g[rows, width]`
/// from `u[rows, 2 width]`.
pub fn glu_forward_reference(u: &[f32], rows: usize, width: usize) -> Vec<f32> {
    narrow(&glu_forward64(&widen(u), rows, width))
}

fn glu_forward64(u: &[f64], rows: usize, g: usize) -> Vec<f64> {
    check("glu_forward_reference: u", u.len(), rows * 2 * g);
    let mut out = vec![0.0; rows * g];
    for r in 0..rows {
        for k in 0..g {
            out[r * g + k] = u[r * 2 * g + k] * sigmoid(u[r * 2 * g + g + k]);
        }
    }
    out
}

/// What [`Kernels::glu_backward`](crate::kernels::Kernels::glu_backward) computes: `du[rows, 2
/// width]`.
pub fn glu_backward_reference(u: &[f32], dg: &[f32], rows: usize, width: usize) -> Vec<f32> {
    narrow(&glu_backward64(&widen(u), &widen(dg), rows, width))
}

fn glu_backward64(u: &[f64], dg: &[f64], rows: usize, g: usize) -> Vec<f64> {
    check("glu_backward_reference: u", u.len(), rows * 2 * g);
    check("glu_backward_reference: dg", dg.len(), rows * g);
    let mut du = vec![0.0; rows * 2 * g];
    for r in 0..rows {
        for k in 0..g {
            let a = u[r * 2 * g + k];
            let s = sigmoid(u[r * 2 * g + g + k]);
            let d = dg[r * g + k];
            du[r * 2 * g + k] = d * s;
            du[r * 2 * g + g + k] = d * a * s * (1.0 - s);
        }
    }
    du
}

/// What [`Kernels::branch_head_forward`](crate::kernels::Kernels::branch_head_forward) computes:
/// `(g[B, G], adv[B, A])` with `g = glu(u)` and `adv = g waᵀ + ba`.
pub fn branch_head_forward_reference(
    dims: BranchHeadDims,
    u: &[f32],
    wa: &[f32],
    ba: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let BranchHeadDims {
        batch: bn,
        glu: gn,
        actions: an,
    } = dims;
    check("branch_head_forward_reference: wa", wa.len(), an * gn);
    check("branch_head_forward_reference: ba", ba.len(), an);
    let g = glu_forward64(&widen(u), bn, gn);
    let mut adv = vec![0.0f64; bn * an];
    for b in 0..bn {
        for a in 0..an {
            adv[b * an + a] = f64::from(ba[a])
                + (0..gn)
                    .map(|j| g[b * gn + j] * f64::from(wa[a * gn + j]))
                    .sum::<f64>();
        }
    }
    (narrow(&g), narrow(&adv))
}

/// What [`Kernels::branch_head_backward`](crate::kernels::Kernels::branch_head_backward) computes.
#[derive(Clone, Debug)]
pub struct BranchHeadReference {
    /// `du[B, 2G]`.
    pub du: Vec<f32>,
    /// `dwa[A, G] = dadvᵀ g`.
    pub dwa: Vec<f32>,
    /// `dba[A] = Σ_b dadv[b, ·]`.
    pub dba: Vec<f32>,
    /// `dbg[2G] = Σ_b du[b, ·]`.
    pub dbg: Vec<f32>,
}

/// What [`Kernels::branch_head_backward`](crate::kernels::Kernels::branch_head_backward) computes, in
/// f64: the advantage layer's gradients (`dg = dadv wa` on the way), the GLU's through
/// [`glu_backward_reference`]'s formula, and the gate layer's bias gradient.
pub fn branch_head_backward_reference(
    dims: BranchHeadDims,
    dadv: &[f32],
    u: &[f32],
    g: &[f32],
    wa: &[f32],
) -> BranchHeadReference {
    let out = branch_head_backward64(dims, &widen(dadv), &widen(u), &widen(g), &widen(wa));
    BranchHeadReference {
        du: narrow(&out.0),
        dwa: narrow(&out.1),
        dba: narrow(&out.2),
        dbg: narrow(&out.3),
    }
}

/// `(du, dwa, dba, dbg)` in f64.
type BranchHeadGrads = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

fn branch_head_backward64(
    dims: BranchHeadDims,
    dadv: &[f64],
    u: &[f64],
    g: &[f64],
    wa: &[f64],
) -> BranchHeadGrads {
    let BranchHeadDims {
        batch: bn,
        glu: gn,
        actions: an,
    } = dims;
    check("branch_head_backward_reference: dadv", dadv.len(), bn * an);
    check("branch_head_backward_reference: g", g.len(), bn * gn);
    check("branch_head_backward_reference: wa", wa.len(), an * gn);
    let mut dg = vec![0.0; bn * gn];
    let mut dwa = vec![0.0; an * gn];
    let mut dba = vec![0.0; an];
    for b in 0..bn {
        for a in 0..an {
            let d = dadv[b * an + a];
            dba[a] += d;
            for j in 0..gn {
                dg[b * gn + j] += d * wa[a * gn + j];
                dwa[a * gn + j] += d * g[b * gn + j];
            }
        }
    }
    let du = glu_backward64(u, &dg, bn, gn);
    let mut dbg = vec![0.0; 2 * gn];
    for row in du.chunks(2 * gn) {
        for (s, x) in dbg.iter_mut().zip(row) {
            *s += x;
        }
    }
    (du, dwa, dba, dbg)
}

/// `q[a] = v + adv[a] − mean(adv)` for one sample and branch.
fn dueling_q(v: f64, adv: &[f64]) -> Vec<f64> {
    let mean = adv.iter().sum::<f64>() / adv.len() as f64;
    adv.iter().map(|&x| v + x - mean).collect()
}

/// The branch `d`, sample `b` row of a packed `[D, B, A]` tensor.
fn branch_row(x: &[f64], dims: DuelingDims, d: usize, b: usize) -> &[f64] {
    let start = (d * dims.batch + b) * dims.actions;
    &x[start..start + dims.actions]
}

/// What [`Kernels::ddqn_target`](crate::kernels::Kernels::ddqn_target) computes: `(y[B, D],
/// ybar[B])`. The first maximum wins ties.
#[allow(clippy::too_many_arguments)] // the kernel's inputs, one slice each
pub fn ddqn_target_reference(
    dims: DuelingDims,
    v2: &[f32],
    adv2: &[f32],
    vt: &[f32],
    advt: &[f32],
    r: &[f32],
    done: &[f32],
    gamma: f32,
) -> (Vec<f32>, Vec<f32>) {
    let DuelingDims {
        batch: bn,
        branches: dn,
        actions: an,
    } = dims;
    check("ddqn_target_reference: v2", v2.len(), bn);
    check("ddqn_target_reference: adv2", adv2.len(), dn * bn * an);
    check("ddqn_target_reference: vt", vt.len(), bn);
    check("ddqn_target_reference: advt", advt.len(), dn * bn * an);
    check("ddqn_target_reference: r", r.len(), bn);
    check("ddqn_target_reference: done", done.len(), bn);
    let (adv2, advt) = (widen(adv2), widen(advt));
    let mut y = vec![0.0; bn * dn];
    let mut ybar = vec![0.0; bn];
    for b in 0..bn {
        for d in 0..dn {
            let q_online = dueling_q(f64::from(v2[b]), branch_row(&adv2, dims, d, b));
            let q_target = dueling_q(f64::from(vt[b]), branch_row(&advt, dims, d, b));
            let mut best = 0;
            for a in 1..an {
                if q_online[a] > q_online[best] {
                    best = a;
                }
            }
            let yd =
                f64::from(r[b]) + f64::from(gamma) * (1.0 - f64::from(done[b])) * q_target[best];
            y[b * dn + d] = yd;
            ybar[b] += yd / dn as f64;
        }
    }
    (narrow(&y), narrow(&ybar))
}

/// What [`Kernels::dueling_losses`](crate::kernels::Kernels::dueling_losses) computes.
#[derive(Clone, Debug, PartialEq)]
pub struct DuelingLossesReference {
    /// `dv[B]`.
    pub dv: Vec<f32>,
    /// `dadv[D, B, A]`.
    pub dadv: Vec<f32>,
    /// `qbar[B]`.
    pub qbar: Vec<f32>,
    /// What the kernel adds into the loss buffer (`Td`, `Cql`, `Conf`, `Total`).
    pub losses: LossContributions,
}

/// What [`Kernels::dueling_losses`](crate::kernels::Kernels::dueling_losses) computes, the
/// gradients by the full chain rule.
///
/// # Panics
/// If a length is wrong or an action is outside `0..A`.
pub fn dueling_losses_reference(
    dims: DuelingDims,
    v: &[f32],
    adv: &[f32],
    act: &[i32],
    y: &[f32],
    coef: DuelingCoefficients,
) -> DuelingLossesReference {
    let out = dueling64(dims, &widen(v), &widen(adv), act, &widen(y), coef);
    let mut losses = [0.0; LOSS_SLOTS];
    losses[LossSlot::Td.index()] = out.l_td;
    losses[LossSlot::Cql.index()] = out.l_cql;
    losses[LossSlot::Conf.index()] = out.l_conf;
    losses[LossSlot::Total.index()] = out.total(coef);
    DuelingLossesReference {
        dv: narrow(&out.dv),
        dadv: narrow(&out.dadv),
        qbar: narrow(&out.qbar),
        losses,
    }
}

struct Dueling64 {
    dv: Vec<f64>,
    dadv: Vec<f64>,
    qbar: Vec<f64>,
    l_td: f64,
    l_cql: f64,
    l_conf: f64,
}

impl Dueling64 {
    fn total(&self, coef: DuelingCoefficients) -> f64 {
        f64::from(coef.td) * self.l_td
            + f64::from(coef.cql) * self.l_cql
            + f64::from(coef.conf) * self.l_conf
    }
}

fn dueling64(
    dims: DuelingDims,
    v: &[f64],
    adv: &[f64],
    act: &[i32],
    y: &[f64],
    coef: DuelingCoefficients,
) -> Dueling64 {
    let DuelingDims {
        batch: bn,
        branches: dn,
        actions: an,
    } = dims;
    check("dueling_losses_reference: v", v.len(), bn);
    check("dueling_losses_reference: adv", adv.len(), dn * bn * an);
    check("dueling_losses_reference: act", act.len(), bn * dn);
    check("dueling_losses_reference: y", y.len(), bn * dn);
    let (c_td, c_cql, c_conf) = (
        f64::from(coef.td),
        f64::from(coef.cql),
        f64::from(coef.conf),
    );
    let (fb, fd, fa) = (bn as f64, dn as f64, an as f64);
    let mut out = Dueling64 {
        dv: vec![0.0; bn],
        dadv: vec![0.0; dn * bn * an],
        qbar: vec![0.0; bn],
        l_td: 0.0,
        l_cql: 0.0,
        l_conf: 0.0,
    };
    for b in 0..bn {
        let q: Vec<Vec<f64>> = (0..dn)
            .map(|d| dueling_q(v[b], branch_row(adv, dims, d, b)))
            .collect();
        let taken: Vec<usize> = (0..dn)
            .map(|d| {
                let a = act[b * dn + d];
                assert!(
                    (0..an as i32).contains(&a),
                    "dueling_losses_reference: action {a} is outside 0..{an}"
                );
                a as usize
            })
            .collect();
        let qa: Vec<f64> = (0..dn).map(|d| q[d][taken[d]]).collect();
        let qm = qa.iter().sum::<f64>() / fd;
        out.qbar[b] = qm;
        out.l_conf += qa.iter().map(|x| (x - qm) * (x - qm)).sum::<f64>() / fd / fb;
        // d var / d qa[k] = (2/D)(qa[k] - qm) - (2/D^2) sum_d (qa[d] - qm): the second term
        // is zero, but it is kept to follow qm's dependence on every qa.
        let centred_sum: f64 = qa.iter().map(|x| x - qm).sum();
        for d in 0..dn {
            let delta = qa[d] - y[b * dn + d];
            out.l_td += huber(delta) / (fb * fd);
            let mx = q[d].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let se: f64 = q[d].iter().map(|x| (x - mx).exp()).sum();
            out.l_cql += (mx + se.ln() - qa[d]) / (fb * fd);

            let dqa = c_td * huber_grad(delta) / (fb * fd)
                + c_conf * ((2.0 / fd) * (qa[d] - qm) - 2.0 / (fd * fd) * centred_sum) / fb
                - c_cql / (fb * fd);
            let dq: Vec<f64> = (0..an)
                .map(|a| {
                    let softmax = (q[d][a] - mx).exp() / se;
                    c_cql * softmax / (fb * fd) + if a == taken[d] { dqa } else { 0.0 }
                })
                .collect();
            // q[a] = v + adv[a] - mean(adv): dv = sum_a dq, dadv[a] = dq[a] - mean(dq).
            let dq_mean = dq.iter().sum::<f64>() / fa;
            for (a, g) in dq.iter().enumerate() {
                out.dadv[(d * bn + b) * an + a] = g - dq_mean;
                out.dv[b] += g;
            }
        }
    }
    out
}

/// What [`Kernels::expectile_loss`](crate::kernels::Kernels::expectile_loss) computes.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectileReference {
    /// `de[B]`, the gradient of `coef · L`.
    pub de: Vec<f32>,
    /// What the kernel adds into the loss buffer (`Iql`, `Total`).
    pub losses: LossContributions,
}

/// What [`Kernels::expectile_loss`](crate::kernels::Kernels::expectile_loss) computes for one head.
pub fn expectile_loss_reference(
    e: &[f32],
    qbar: &[f32],
    expectile: Expectile,
) -> ExpectileReference {
    check("expectile_loss_reference: qbar", qbar.len(), e.len());
    let (loss, de) = expectile64(&widen(e), &widen(qbar), expectile);
    let mut losses = [0.0; LOSS_SLOTS];
    losses[LossSlot::Iql.index()] = loss;
    losses[LossSlot::Total.index()] = f64::from(expectile.coef) * loss;
    ExpectileReference {
        de: narrow(&de),
        losses,
    }
}

/// What [`Kernels::expectile_head`](crate::kernels::Kernels::expectile_head) computes.
#[derive(Clone, Debug)]
pub struct ExpectileHeadReference {
    /// `e[B]`.
    pub e: Vec<f32>,
    /// `de[B]`.
    pub de: Vec<f32>,
    /// `dwe[H]`.
    pub dwe: Vec<f32>,
    /// `dbe`.
    pub dbe: f32,
    /// What the kernels add into the loss buffer (`Iql`, `Total`).
    pub losses: LossContributions,
}

/// What [`Kernels::expectile_head`](crate::kernels::Kernels::expectile_head) computes, in f64: the
/// layer `e = h weᵀ + be`, [`expectile_loss_reference`]'s loss and `de`, and the layer's
/// gradients through `de`.
pub fn expectile_head_reference(
    dims: ExpectileHeadDims,
    h: &[f32],
    we: &[f32],
    be: f32,
    qbar: &[f32],
    expectile: Expectile,
) -> ExpectileHeadReference {
    let ExpectileHeadDims {
        batch: bn,
        hidden: hn,
    } = dims;
    check("expectile_head_reference: h", h.len(), bn * hn);
    check("expectile_head_reference: we", we.len(), hn);
    check("expectile_head_reference: qbar", qbar.len(), bn);
    let e: Vec<f64> = h
        .chunks(hn)
        .map(|row| {
            f64::from(be)
                + row
                    .iter()
                    .zip(we)
                    .map(|(x, w)| f64::from(*x) * f64::from(*w))
                    .sum::<f64>()
        })
        .collect();
    let (loss, de) = expectile64(&e, &widen(qbar), expectile);
    let mut dwe = vec![0.0f64; hn];
    for (row, d) in h.chunks(hn).zip(&de) {
        for (s, x) in dwe.iter_mut().zip(row) {
            *s += d * f64::from(*x);
        }
    }
    let mut losses = [0.0; LOSS_SLOTS];
    losses[LossSlot::Iql.index()] = loss;
    losses[LossSlot::Total.index()] = f64::from(expectile.coef) * loss;
    ExpectileHeadReference {
        e: narrow(&e),
        de: narrow(&de),
        dwe: narrow(&dwe),
        dbe: de.iter().sum::<f64>() as f32,
        losses,
    }
}

/// `(L, d(coef L)/de)`.
fn expectile64(e: &[f64], qbar: &[f64], expectile: Expectile) -> (f64, Vec<f64>) {
    let (tau, coef) = (f64::from(expectile.tau), f64::from(expectile.coef));
    let fb = e.len() as f64;
    let mut loss = 0.0;
    let mut de = vec![0.0; e.len()];
    for b in 0..e.len() {
        let u = qbar[b] - e[b];
        let w = asymmetric_weight(tau, u);
        loss += w * u * u / fb;
        // d/de of w u^2 with u = qbar - e: -2 w u; w is piecewise constant.
        de[b] = -(coef * w * 2.0 * u) / fb;
    }
    (loss, de)
}

/// What [`Kernels::trunk_grad_join`](crate::kernels::Kernels::trunk_grad_join) computes.
#[derive(Clone, Debug)]
pub struct TrunkJoinReference {
    /// `[B, H]`.
    pub dz2: Vec<f32>,
    /// Layer 2's bias gradient `Σ_b dz2[b, ·]`, `[H]`.
    pub db2: Vec<f32>,
    /// The value head's weight gradient `Σ_b dv[b] h_out[b, ·]`, `[H]`.
    pub dwv: Vec<f32>,
    /// Its bias gradient `Σ_b dv[b]`.
    pub dbv: f32,
}

/// What [`Kernels::trunk_grad_join`](crate::kernels::Kernels::trunk_grad_join) computes, in f64
/// (`dh_branch` packed `[D, B, H]`).
#[allow(clippy::too_many_arguments)] // the kernel's inputs, one slice each
pub fn trunk_grad_join_reference(
    dims: TrunkDims,
    h_out: &[f32],
    dv: &[f32],
    wv: &[f32],
    dh_branch: &[f32],
    de_hi: &[f32],
    we_hi: &[f32],
    de_lo: &[f32],
    we_lo: &[f32],
    dh_iqn: &[f32],
) -> TrunkJoinReference {
    let TrunkDims {
        batch: bn,
        hidden: hn,
        branches: dn,
    } = dims;
    check("trunk_grad_join_reference: h_out", h_out.len(), bn * hn);
    check(
        "trunk_grad_join_reference: dh_branch",
        dh_branch.len(),
        dn * bn * hn,
    );
    check("trunk_grad_join_reference: dh_iqn", dh_iqn.len(), bn * hn);
    let mut dz2 = vec![0.0f32; bn * hn];
    let mut db2 = vec![0.0f64; hn];
    let mut dwv = vec![0.0f64; hn];
    let mut dbv = 0.0f64;
    for b in 0..bn {
        dbv += f64::from(dv[b]);
        for h in 0..hn {
            let i = b * hn + h;
            dwv[h] += f64::from(dv[b]) * f64::from(h_out[i]);
            if h_out[i] <= 0.0 {
                continue;
            }
            let mut g = f64::from(dv[b]) * f64::from(wv[h])
                + f64::from(de_hi[b]) * f64::from(we_hi[h])
                + f64::from(de_lo[b]) * f64::from(we_lo[h])
                + f64::from(dh_iqn[i]);
            for d in 0..dn {
                g += f64::from(dh_branch[d * bn * hn + i]);
            }
            dz2[i] = g as f32;
            db2[h] += g;
        }
    }
    TrunkJoinReference {
        dz2,
        db2: narrow(&db2),
        dwv: narrow(&dwv),
        dbv: dbv as f32,
    }
}

// ---- IQN ----

/// What [`Kernels::iqn_cos_features`](crate::kernels::Kernels::iqn_cos_features) computes:
/// `cosf[r, i] = cos(π (i + 1) tau[r])`, `[tau.len(), features]`.
pub fn iqn_cos_features_reference(tau: &[f32], features: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(tau.len() * features);
    for &t in tau {
        for i in 0..features {
            out.push((std::f64::consts::PI * (i + 1) as f64 * f64::from(t)).cos() as f32);
        }
    }
    out
}

/// What [`Kernels::iqn_forward_backward`](crate::kernels::Kernels::iqn_forward_backward) computes.
#[derive(Clone, Debug, PartialEq)]
pub struct IqnReference {
    /// `zq[B, N]`, the quantile values (not an output of the kernel; for diagnosis).
    pub zq: Vec<f32>,
    /// `dphi_pre[B N, H]`.
    pub dphi_pre: Vec<f32>,
    /// `dh[B, H]`.
    pub dh: Vec<f32>,
    /// `dwq[H]`.
    pub dwq: Vec<f32>,
    /// `dbphi[H]`.
    pub dbphi: Vec<f32>,
    /// `dbq`.
    pub dbq: f32,
    /// What the kernels add into the loss buffer (`Iqn`, `Total`).
    pub losses: LossContributions,
}

/// What [`Kernels::iqn_forward_backward`](crate::kernels::Kernels::iqn_forward_backward) computes
/// (every gradient of `coef · L_iqn`; `phi` is after its ReLU, as the kernel takes it).
#[allow(clippy::too_many_arguments)] // the kernel's inputs, one slice each
pub fn iqn_forward_backward_reference(
    dims: IqnDims,
    h: &[f32],
    phi: &[f32],
    wq: &[f32],
    bq: f32,
    ybar: &[f32],
    tau: &[f32],
    coef: f32,
) -> IqnReference {
    let out = iqn64(
        dims,
        &widen(h),
        &widen(phi),
        &widen(wq),
        f64::from(bq),
        &widen(ybar),
        &widen(tau),
        f64::from(coef),
    );
    let mut losses = [0.0; LOSS_SLOTS];
    losses[LossSlot::Iqn.index()] = out.loss;
    losses[LossSlot::Total.index()] = f64::from(coef) * out.loss;
    IqnReference {
        zq: narrow(&out.zq),
        dphi_pre: narrow(&out.dphi_pre),
        dh: narrow(&out.dh),
        dwq: narrow(&out.dwq),
        dbphi: narrow(&out.dbphi),
        dbq: out.dbq as f32,
        losses,
    }
}

struct Iqn64 {
    zq: Vec<f64>,
    dphi_pre: Vec<f64>,
    dh: Vec<f64>,
    dwq: Vec<f64>,
    dbphi: Vec<f64>,
    dbq: f64,
    loss: f64,
}

#[allow(clippy::too_many_arguments)]
fn iqn64(
    dims: IqnDims,
    h: &[f64],
    phi: &[f64],
    wq: &[f64],
    bq: f64,
    ybar: &[f64],
    tau: &[f64],
    coef: f64,
) -> Iqn64 {
    let IqnDims {
        batch: bn,
        quantiles: nn,
        hidden: hn,
    } = dims;
    check("iqn_forward_backward_reference: h", h.len(), bn * hn);
    check(
        "iqn_forward_backward_reference: phi",
        phi.len(),
        bn * nn * hn,
    );
    check("iqn_forward_backward_reference: wq", wq.len(), hn);
    check("iqn_forward_backward_reference: ybar", ybar.len(), bn);
    check("iqn_forward_backward_reference: tau", tau.len(), bn * nn);
    let scale = (bn * nn) as f64;
    let mut out = Iqn64 {
        zq: vec![0.0; bn * nn],
        dphi_pre: vec![0.0; bn * nn * hn],
        dh: vec![0.0; bn * hn],
        dwq: vec![0.0; hn],
        dbphi: vec![0.0; hn],
        dbq: 0.0,
        loss: 0.0,
    };
    for b in 0..bn {
        for j in 0..nn {
            let row = (b * nn + j) * hn;
            let zq = (0..hn)
                .map(|k| h[b * hn + k] * phi[row + k] * wq[k])
                .sum::<f64>()
                + bq;
            out.zq[b * nn + j] = zq;
            let u = ybar[b] - zq;
            let w = asymmetric_weight(tau[b * nn + j], u);
            out.loss += w * huber(u) / scale;
            // d(coef L)/dzq: u = ybar - zq, so the sign flips.
            let dz = -(coef * w * huber_grad(u)) / scale;
            out.dbq += dz;
            for k in 0..hn {
                // zq = sum_k h phi wq + bq, phi = relu(phi_pre).
                let dphi = dz * h[b * hn + k] * wq[k];
                let dpre = if phi[row + k] > 0.0 { dphi } else { 0.0 };
                out.dphi_pre[row + k] = dpre;
                out.dbphi[k] += dpre;
                out.dh[b * hn + k] += dz * phi[row + k] * wq[k];
                out.dwq[k] += dz * h[b * hn + k] * phi[row + k];
            }
        }
    }
    out
}

/// What [`Kernels::iqn_fused`](crate::kernels::Kernels::iqn_fused) computes: the whole IQN head.
#[derive(Clone, Debug, PartialEq)]
pub struct IqnFusedReference {
    /// `dh[B, H]`.
    pub dh: Vec<f32>,
    /// `dwphi[H, C]`.
    pub dwphi: Vec<f32>,
    /// `dwq[H]`.
    pub dwq: Vec<f32>,
    /// `dbphi[H]`.
    pub dbphi: Vec<f32>,
    /// `dbq`.
    pub dbq: f32,
    /// What the kernels add into the loss buffer (`Iqn`, `Total`).
    pub losses: LossContributions,
}

/// How a CPU reference treats the operands of the products that the GPU runs on tensor
/// cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmOperands {
    /// As given: the model's math, in f64.
    Exact,
    /// Rounded to TF32 first, as the kernels' `cvt.rna.tf32.f32` does ([`tf32_round`]);
    /// products and sums stay exact (f64). Where a ReLU follows a product, this is what
    /// lets a comparison be tight: a pre-activation within TF32's error of zero flips its
    /// mask in one computation and not in the other, and each flip moves a gradient by a
    /// whole term.
    Tf32,
}

impl GemmOperands {
    /// The operand a product reads for the f32 value `x`.
    fn operand(self, x: f32) -> f64 {
        match self {
            GemmOperands::Exact => f64::from(x),
            GemmOperands::Tf32 => f64::from(tf32_round(x)),
        }
    }
}

/// `x` rounded to TF32 (10 explicit mantissa bits) to nearest, ties away from zero, as
/// `cvt.rna.tf32.f32` rounds; NaN and infinities pass through.
pub fn tf32_round(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    // Half of the 13 dropped bits' unit, added to the magnitude (the sign bit is apart):
    // a carry into the exponent is the correct rounding up.
    f32::from_bits((x.to_bits() + 0x1000) & 0xFFFF_E000)
}

/// What [`Kernels::iqn_fused`](crate::kernels::Kernels::iqn_fused) computes, the long way: the cosine
/// features (`cos` in f64 of the f32 `tau`, rounded to f32 as
/// [`iqn_cos_features_reference`] does), `phi = relu(cosf wphiᵀ + bphi)`, the head of
/// [`iqn_forward_backward_reference`], and `dwphi = dphi_preᵀ cosf`. With
/// [`GemmOperands::Tf32`], `cosf` and `wphi` are rounded for the first product and
/// `dphi_pre` (as f32) and `cosf` for the second, as the kernel rounds them.
#[allow(clippy::too_many_arguments)] // the kernel's inputs, one slice each
pub fn iqn_fused_reference(
    dims: IqnFusedDims,
    h: &[f32],
    tau: &[f32],
    ybar: &[f32],
    wphi: &[f32],
    bphi: &[f32],
    wq: &[f32],
    bq: f32,
    coef: f32,
    operands: GemmOperands,
) -> IqnFusedReference {
    let round = |x: f32| operands.operand(x);
    let cosf: Vec<f64> = iqn_cos_features_reference(tau, dims.cosines)
        .into_iter()
        .map(round)
        .collect();
    let wphi: Vec<f64> = wphi.iter().map(|&w| round(w)).collect();
    let (out, dwphi) = iqn_fused64(
        dims,
        &widen(h),
        &widen(tau),
        &widen(ybar),
        &cosf,
        &wphi,
        &widen(bphi),
        &widen(wq),
        f64::from(bq),
        f64::from(coef),
        &|d| round(d as f32),
    );
    let mut losses = [0.0; LOSS_SLOTS];
    losses[LossSlot::Iqn.index()] = out.loss;
    losses[LossSlot::Total.index()] = f64::from(coef) * out.loss;
    IqnFusedReference {
        dh: narrow(&out.dh),
        dwphi: narrow(&dwphi),
        dwq: narrow(&out.dwq),
        dbphi: narrow(&out.dbphi),
        dbq: out.dbq as f32,
        losses,
    }
}

/// The fused head in f64 from the cosine features `cosf[B N, C]`: [`iqn64`]'s outputs and
/// `dwphi[H, C]`, whose product reads `dphi_pre` through `operand` (a rounding, or none).
#[allow(clippy::too_many_arguments)]
fn iqn_fused64(
    dims: IqnFusedDims,
    h: &[f64],
    tau: &[f64],
    ybar: &[f64],
    cosf: &[f64],
    wphi: &[f64],
    bphi: &[f64],
    wq: &[f64],
    bq: f64,
    coef: f64,
    operand: &dyn Fn(f64) -> f64,
) -> (Iqn64, Vec<f64>) {
    let IqnFusedDims {
        batch: bn,
        quantiles: nn,
        hidden: hn,
        cosines: cn,
        sms: _,
    } = dims;
    check("iqn_fused_reference: tau", tau.len(), bn * nn);
    check("iqn_fused_reference: wphi", wphi.len(), hn * cn);
    check("iqn_fused_reference: bphi", bphi.len(), hn);
    let rows = bn * nn;
    check("iqn_fused_reference: cosf", cosf.len(), rows * cn);
    let mut phi = vec![0.0; rows * hn];
    for r in 0..rows {
        let x = &cosf[r * cn..(r + 1) * cn];
        for k in 0..hn {
            let w = &wphi[k * cn..(k + 1) * cn];
            let pre = x.iter().zip(w).map(|(a, b)| a * b).sum::<f64>() + bphi[k];
            phi[r * hn + k] = pre.max(0.0);
        }
    }
    let out = iqn64(dims.unfused(), h, &phi, wq, bq, ybar, tau, coef);
    let mut dwphi = vec![0.0; hn * cn];
    for r in 0..rows {
        let x = &cosf[r * cn..(r + 1) * cn];
        for k in 0..hn {
            let d = operand(out.dphi_pre[r * hn + k]);
            if d != 0.0 {
                for (acc, a) in dwphi[k * cn..(k + 1) * cn].iter_mut().zip(x) {
                    *acc += d * a;
                }
            }
        }
    }
    (out, dwphi)
}

// ---- attention ----

/// What [`Kernels::attention_forward`](crate::kernels::Kernels::attention_forward) computes:
/// `(att[B W, E], probs[B, Hh, W, W])`.
pub fn attention_forward_reference(dims: AttentionDims, qkv: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let (att, probs) = attention_forward64(dims, &widen(qkv));
    (narrow(&att), narrow(&probs))
}

fn attention_forward64(dims: AttentionDims, qkv: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let AttentionDims {
        batch: bn,
        window: wn,
        width: e,
        heads: hn,
    } = dims;
    check(
        "attention_forward_reference: qkv",
        qkv.len(),
        bn * wn * 3 * e,
    );
    let dh = dims.head_width();
    let scale = 1.0 / (dh as f64).sqrt();
    let at = |b: usize, w: usize, c: usize| qkv[(b * wn + w) * 3 * e + c];
    let mut att = vec![0.0; bn * wn * e];
    let mut probs = vec![0.0; bn * hn * wn * wn];
    for b in 0..bn {
        for hd in 0..hn {
            for i in 0..wn {
                let s: Vec<f64> = (0..wn)
                    .map(|k| {
                        (0..dh)
                            .map(|c| at(b, i, hd * dh + c) * at(b, k, e + hd * dh + c))
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let se: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                for k in 0..wn {
                    let p = (s[k] - mx).exp() / se;
                    probs[((b * hn + hd) * wn + i) * wn + k] = p;
                    for c in 0..dh {
                        att[(b * wn + i) * e + hd * dh + c] += p * at(b, k, 2 * e + hd * dh + c);
                    }
                }
            }
        }
    }
    (att, probs)
}

/// What [`Kernels::attention_backward`](crate::kernels::Kernels::attention_backward) computes:
/// `dqkv[B W, 3E]` from `qkv`, the forward's `probs` and `datt[B W, E]`.
pub fn attention_backward_reference(
    dims: AttentionDims,
    qkv: &[f32],
    probs: &[f32],
    datt: &[f32],
) -> Vec<f32> {
    narrow(&attention_backward64(
        dims,
        &widen(qkv),
        &widen(probs),
        &widen(datt),
    ))
}

fn attention_backward64(dims: AttentionDims, qkv: &[f64], probs: &[f64], datt: &[f64]) -> Vec<f64> {
    let AttentionDims {
        batch: bn,
        window: wn,
        width: e,
        heads: hn,
    } = dims;
    check(
        "attention_backward_reference: qkv",
        qkv.len(),
        bn * wn * 3 * e,
    );
    check(
        "attention_backward_reference: probs",
        probs.len(),
        bn * hn * wn * wn,
    );
    check(
        "attention_backward_reference: datt",
        datt.len(),
        bn * wn * e,
    );
    let dh = dims.head_width();
    let scale = 1.0 / (dh as f64).sqrt();
    let at = |b: usize, w: usize, c: usize| qkv[(b * wn + w) * 3 * e + c];
    let mut dqkv = vec![0.0; bn * wn * 3 * e];
    for b in 0..bn {
        for hd in 0..hn {
            let p = |i: usize, k: usize| probs[((b * hn + hd) * wn + i) * wn + k];
            let da = |i: usize, c: usize| datt[(b * wn + i) * e + hd * dh + c];
            for i in 0..wn {
                // att[i, c] = sum_k p[i, k] V[k, c]
                let dp: Vec<f64> = (0..wn)
                    .map(|k| {
                        (0..dh)
                            .map(|c| da(i, c) * at(b, k, 2 * e + hd * dh + c))
                            .sum()
                    })
                    .collect();
                for k in 0..wn {
                    for c in 0..dh {
                        dqkv[(b * wn + k) * 3 * e + 2 * e + hd * dh + c] += p(i, k) * da(i, c);
                    }
                }
                // p[i, .] = softmax(s[i, .]): ds[k] = sum_k' dp[k'] p[k'] (delta(k, k') - p[k])
                for k in 0..wn {
                    let ds: f64 = (0..wn)
                        .map(|kk| dp[kk] * p(i, kk) * (if kk == k { 1.0 } else { 0.0 } - p(i, k)))
                        .sum();
                    // s[i, k] = scale sum_c Q[i, c] K[k, c]
                    for c in 0..dh {
                        dqkv[(b * wn + i) * 3 * e + hd * dh + c] +=
                            ds * scale * at(b, k, e + hd * dh + c);
                        dqkv[(b * wn + k) * 3 * e + e + hd * dh + c] +=
                            ds * scale * at(b, i, hd * dh + c);
                    }
                }
            }
        }
    }
    dqkv
}

/// What [`Kernels::attn_pool_loss`](crate::kernels::Kernels::attn_pool_loss) computes.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnPoolReference {
    /// `pred[B]`.
    pub pred: Vec<f32>,
    /// `d_o[B W, E]`, the gradient of `coef · L_attn`.
    pub d_o: Vec<f32>,
    /// `dwp[E]`.
    pub dwp: Vec<f32>,
    /// `dbp`.
    pub dbp: f32,
    /// What the kernels add into the loss buffer (`Attn`, `Total`).
    pub losses: LossContributions,
}

/// What [`Kernels::attn_pool_loss`](crate::kernels::Kernels::attn_pool_loss) computes.
pub fn attn_pool_loss_reference(
    dims: AttnPoolDims,
    o: &[f32],
    wp: &[f32],
    bp: f32,
    r: &[f32],
    coef: f32,
) -> AttnPoolReference {
    let out = attn_pool64(
        dims,
        &widen(o),
        &widen(wp),
        f64::from(bp),
        &widen(r),
        f64::from(coef),
    );
    let mut losses = [0.0; LOSS_SLOTS];
    losses[LossSlot::Attn.index()] = out.loss;
    losses[LossSlot::Total.index()] = f64::from(coef) * out.loss;
    AttnPoolReference {
        pred: narrow(&out.pred),
        d_o: narrow(&out.d_o),
        dwp: narrow(&out.dwp),
        dbp: out.dbp as f32,
        losses,
    }
}

struct AttnPool64 {
    pred: Vec<f64>,
    d_o: Vec<f64>,
    dwp: Vec<f64>,
    dbp: f64,
    loss: f64,
}

fn attn_pool64(
    dims: AttnPoolDims,
    o: &[f64],
    wp: &[f64],
    bp: f64,
    r: &[f64],
    coef: f64,
) -> AttnPool64 {
    let AttnPoolDims {
        batch: bn,
        window: wn,
        width: e,
    } = dims;
    check("attn_pool_loss_reference: o", o.len(), bn * wn * e);
    check("attn_pool_loss_reference: wp", wp.len(), e);
    check("attn_pool_loss_reference: r", r.len(), bn);
    let fb = bn as f64;
    let mut out = AttnPool64 {
        pred: vec![0.0; bn],
        d_o: vec![0.0; bn * wn * e],
        dwp: vec![0.0; e],
        dbp: 0.0,
        loss: 0.0,
    };
    for b in 0..bn {
        let m: Vec<f64> = (0..e)
            .map(|c| (0..wn).map(|w| o[(b * wn + w) * e + c]).sum::<f64>() / wn as f64)
            .collect();
        let pred = (0..e).map(|c| m[c] * wp[c]).sum::<f64>() + bp;
        out.pred[b] = pred;
        out.loss += (pred - r[b]) * (pred - r[b]) / fb;
        let dpred = coef * 2.0 * (pred - r[b]) / fb;
        out.dbp += dpred;
        for c in 0..e {
            out.dwp[c] += dpred * m[c];
            for w in 0..wn {
                out.d_o[(b * wn + w) * e + c] = dpred * wp[c] / wn as f64;
            }
        }
    }
    out
}

/// What [`Kernels::attention_fused`](crate::kernels::Kernels::attention_fused) computes: the
/// whole attention head, forward and backward.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnFusedReference {
    /// `pred[B]`.
    pub pred: Vec<f32>,
    /// `dwemb[E, S]`.
    pub dwemb: Vec<f32>,
    /// `dbemb[E]`.
    pub dbemb: Vec<f32>,
    /// `dwqkv[3E, E]`.
    pub dwqkv: Vec<f32>,
    /// `dwo[E, E]`.
    pub dwo: Vec<f32>,
    /// `dwp[E]`.
    pub dwp: Vec<f32>,
    /// `dbp`.
    pub dbp: f32,
    /// What the kernels add into the loss buffer (`Attn`, `Total`).
    pub losses: LossContributions,
}

/// What [`Kernels::attention_fused`](crate::kernels::Kernels::attention_fused) computes, in
/// the kernel's order: `qkv = win W'ᵀ + b'` with `W' = wqkv wemb` and `b' = wqkv bemb`, the
/// attention of [`attention_forward_reference`], `o = att woᵀ`, the pooled loss of
/// [`attn_pool_loss_reference`], then back through `datt = d_o wo` (with `dwo = d_oᵀ att`)
/// to [`attention_backward_reference`]'s `dqkv`, and the weight gradients from
/// `G = dqkvᵀ win` and `csum`, the column sums of `dqkv`: `dwqkv = G wembᵀ + csum bembᵀ`
/// (`dqkvᵀ emb`), `dwemb = wqkvᵀ G` (`dembᵀ win`) and `dbemb = wqkvᵀ csum`. `csum` is as the
/// kernel takes it: its Q part summed, its K part 0 and its V part `dbp v`, `v = wpᵀ wo`
/// (each exact; the kernel's file says why). Every gradient is of `coef · L_attn`. With
/// exact arithmetic this is the long way's result (`emb = win wembᵀ + bemb`,
/// `qkv = emb wqkvᵀ`, `demb = dqkv wqkv`, ...); the finite-difference test checks that.
///
/// With [`GemmOperands::Tf32`] the operands of the two products the kernel runs on the
/// tensor cores are rounded, as the kernel rounds them where it stores them: `win` and `W'`
/// (as f32) for `qkv`; `dqkv` (as f32) and `win` for `G`, and `csum`'s Q part sums the
/// rounded `dq`. Nothing else is: `qkv` enters the attention as the product gives it, the
/// weights enter `W'`, `b'` and the finish's products as they are, and the output
/// projection and the pool, which the kernel folds into `wpᵀ wo` in f32 (no product), read
/// `att`, `wo` and `wp` as they are. With [`GemmOperands::Exact`] nothing is rounded.
#[allow(clippy::too_many_arguments)] // the kernel's inputs, one slice each
pub fn attention_fused_reference(
    dims: AttnFusedDims,
    win: &[f32],
    wemb: &[f32],
    bemb: &[f32],
    wqkv: &[f32],
    wo: &[f32],
    wp: &[f32],
    bp: f32,
    r: &[f32],
    coef: f32,
    operands: GemmOperands,
) -> AttnFusedReference {
    let rounded = |x: &[f32]| -> Vec<f64> { x.iter().map(|&v| operands.operand(v)).collect() };
    let out = attention_fused64(
        dims,
        &rounded(win),
        &widen(wemb),
        &widen(bemb),
        &widen(wqkv),
        &widen(wo),
        &widen(wp),
        f64::from(bp),
        &widen(r),
        f64::from(coef),
        &|x| match operands {
            GemmOperands::Exact => x,
            GemmOperands::Tf32 => operands.operand(x as f32),
        },
    );
    let mut losses = [0.0; LOSS_SLOTS];
    losses[LossSlot::Attn.index()] = out.pool.loss;
    losses[LossSlot::Total.index()] = f64::from(coef) * out.pool.loss;
    AttnFusedReference {
        pred: narrow(&out.pool.pred),
        dwemb: narrow(&out.dwemb),
        dbemb: narrow(&out.dbemb),
        dwqkv: narrow(&out.dwqkv),
        dwo: narrow(&out.dwo),
        dwp: narrow(&out.pool.dwp),
        dbp: out.pool.dbp as f32,
        losses,
    }
}

/// The fused head's outputs in f64: the pool's (`pred`, `dwp`, `dbp`, the loss) and the
/// gradients of the four weights before it.
struct AttnFused64 {
    pool: AttnPool64,
    dwemb: Vec<f64>,
    dbemb: Vec<f64>,
    dwqkv: Vec<f64>,
    dwo: Vec<f64>,
}

/// The whole attention head in f64, in the kernel's order. `win` is read as given (the
/// caller rounds it); `W'` and `dqkv` are read through `operand` (a rounding, or none)
/// where a product takes them.
#[allow(clippy::too_many_arguments)]
fn attention_fused64(
    dims: AttnFusedDims,
    win: &[f64],
    wemb: &[f64],
    bemb: &[f64],
    wqkv: &[f64],
    wo: &[f64],
    wp: &[f64],
    bp: f64,
    r: &[f64],
    coef: f64,
    operand: &dyn Fn(f64) -> f64,
) -> AttnFused64 {
    let AttnFusedDims {
        batch: bn,
        state: sn,
        window: wn,
        width: e,
        heads: _,
        sms: _,
    } = dims;
    let rows = bn * wn;
    check("attention_fused_reference: win", win.len(), rows * sn);
    check("attention_fused_reference: wemb", wemb.len(), e * sn);
    check("attention_fused_reference: bemb", bemb.len(), e);
    check("attention_fused_reference: wqkv", wqkv.len(), 3 * e * e);
    check("attention_fused_reference: wo", wo.len(), e * e);
    let through = |x: Vec<f64>| -> Vec<f64> { x.into_iter().map(operand).collect() };
    // W' = wqkv wemb ([3E, S]) and b' = wqkv bemb: wqkv as [3E, E] times wemb as [E, S].
    let w_fold = through(times(wqkv, wemb, 3 * e, e, sn));
    let b_fold = times(wqkv, bemb, 3 * e, e, 1);
    let mut qkv = times_transposed(win, &w_fold, rows, sn, 3 * e);
    for row in qkv.chunks_mut(3 * e) {
        for (x, b) in row.iter_mut().zip(&b_fold) {
            *x += b;
        }
    }
    let (att, probs) = attention_forward64(dims.attention(), &qkv);
    let o = times_transposed(&att, wo, rows, e, e);
    let pool = attn_pool64(dims.pool(), &o, wp, bp, r, coef);
    let datt = times(&pool.d_o, wo, rows, e, e);
    let dwo = transposed_times(&pool.d_o, &att, rows, e, e);
    let dqkv = through(attention_backward64(dims.attention(), &qkv, &probs, &datt));
    let g = transposed_times(&dqkv, win, rows, 3 * e, sn);
    // csum: the Q part summed, the K part 0, the V part dbp v with v = wpᵀ wo.
    let v = times(wp, wo, 1, e, e);
    let mut csum = vec![0.0; 3 * e];
    for row in dqkv.chunks(3 * e) {
        for (s, x) in csum[..e].iter_mut().zip(row) {
            *s += x;
        }
    }
    for (s, x) in csum[2 * e..].iter_mut().zip(&v) {
        *s = pool.dbp * x;
    }
    let mut dwqkv = times_transposed(&g, wemb, 3 * e, sn, e);
    for (row, c) in dwqkv.chunks_mut(e).zip(&csum) {
        for (x, b) in row.iter_mut().zip(bemb) {
            *x += c * b;
        }
    }
    let dwemb = transposed_times(wqkv, &g, 3 * e, e, sn);
    let dbemb = times(&csum, wqkv, 1, 3 * e, e);
    AttnFused64 {
        pool,
        dwemb,
        dbemb,
        dwqkv,
        dwo,
    }
}

/// `x wᵀ`, `[rows, out]`, for `x[rows, inp]` and `w[out, inp]` (a layer's forward).
fn times_transposed(x: &[f64], w: &[f64], rows: usize, inp: usize, out: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(rows * out);
    for xr in x.chunks(inp).take(rows) {
        y.extend(
            w.chunks(inp)
                .take(out)
                .map(|wr| xr.iter().zip(wr).map(|(a, b)| a * b).sum::<f64>()),
        );
    }
    y
}

/// `dy w`, `[rows, inp]`, for `dy[rows, out]` and `w[out, inp]` (a layer's input gradient).
fn times(dy: &[f64], w: &[f64], rows: usize, out: usize, inp: usize) -> Vec<f64> {
    let mut dx = vec![0.0; rows * inp];
    for (dxr, dyr) in dx.chunks_mut(inp).zip(dy.chunks(out).take(rows)) {
        for (&d, wr) in dyr.iter().zip(w.chunks(inp)) {
            for (acc, b) in dxr.iter_mut().zip(wr) {
                *acc += d * b;
            }
        }
    }
    dx
}

/// `dyᵀ x`, `[out, inp]`, over `rows` rows of `dy[rows, out]` and `x[rows, inp]` (a layer's
/// weight gradient).
fn transposed_times(dy: &[f64], x: &[f64], rows: usize, out: usize, inp: usize) -> Vec<f64> {
    let mut dw = vec![0.0; out * inp];
    for (dyr, xr) in dy.chunks(out).zip(x.chunks(inp)).take(rows) {
        for (&d, dwr) in dyr.iter().zip(dw.chunks_mut(inp)) {
            for (acc, b) in dwr.iter_mut().zip(xr) {
                *acc += d * b;
            }
        }
    }
    dw
}

/// What [`Kernels::trunk_l1_grad`](crate::kernels::Kernels::trunk_l1_grad) computes, in f64 with
/// no TF32 rounding: `dw1[H, S] = Σ_b dz1[b, ·]ᵀ s[b, ·]` and `db1[H] = Σ_b dz1[b, ·]`,
/// with `dz1 = dh1` where `h1 > 0`, else 0.
pub fn trunk_l1_grad_reference(
    dh1: &[f32],
    h1: &[f32],
    s: &[f32],
    dims: TrunkL1Dims,
) -> (Vec<f32>, Vec<f32>) {
    let (b, h, st) = (dims.batch, dims.hidden, dims.state);
    check("trunk_l1_grad_reference: dh1", dh1.len(), b * h);
    check("trunk_l1_grad_reference: h1", h1.len(), b * h);
    check("trunk_l1_grad_reference: s", s.len(), b * st);
    let (mut dw1, mut db1) = (vec![0.0f64; h * st], vec![0.0f64; h]);
    for r in 0..b {
        for u in 0..h {
            if h1[r * h + u] <= 0.0 {
                continue;
            }
            let z = f64::from(dh1[r * h + u]);
            db1[u] += z;
            for c in 0..st {
                dw1[u * st + c] += z * f64::from(s[r * st + c]);
            }
        }
    }
    (narrow(&dw1), narrow(&db1))
}

// ---- the replay buffer's generator (cuda/replay.cu) ----

const REPLAY_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function, as `splitmix` in `cuda/replay.cu`.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(REPLAY_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of one replay's draw (or, with `!seed`, of one tensor's fill).
pub fn replay_key(seed: u64, counter: u64) -> u64 {
    splitmix(splitmix(seed) ^ counter)
}

/// The bits of element `e` under `key`.
pub fn replay_bits(key: u64, e: u64) -> u64 {
    splitmix(key.wrapping_add(e.wrapping_mul(REPLAY_GAMMA)))
}

/// The top 24 bits as a float in `[0, 1)`, exactly.
pub fn uniform24(bits: u64) -> f32 {
    (bits >> 40) as f32 * (1.0 / 16_777_216.0)
}

/// Uniform in `[0, n)`: the high word of `bits n`.
pub fn below(bits: u64, n: u32) -> u32 {
    ((u128::from(bits) * u128::from(n)) >> 64) as u32
}

/// What [`Kernels::replay_draw`](crate::kernels::Kernels::replay_draw) draws at counter
/// `counter`: `batch` indices in `[0, capacity)` and `taus` fractions in `[0.02, 0.98]`,
/// the same bits.
pub fn replay_draw_reference(
    seed: u64,
    counter: u64,
    capacity: u32,
    batch: usize,
    taus: usize,
) -> (Vec<u32>, Vec<f32>) {
    let key = replay_key(seed, counter);
    let idx = (0..batch)
        .map(|b| below(replay_bits(key, b as u64), capacity))
        .collect();
    let tau = (0..taus)
        .map(|j| 0.96f32.mul_add(uniform24(replay_bits(key, (batch + j) as u64)), 0.02))
        .collect();
    (idx, tau)
}

/// What [`Kernels::replay_fill_actions`](crate::kernels::Kernels::replay_fill_actions)
/// writes, bit for bit.
pub fn replay_fill_actions_reference(n: usize, actions: u32, seed: u64, tensor: u64) -> Vec<i32> {
    let key = replay_key(!seed, tensor);
    (0..n)
        .map(|i| below(replay_bits(key, i as u64), actions) as i32)
        .collect()
}

/// What [`Kernels::replay_fill_bernoulli`](crate::kernels::Kernels::replay_fill_bernoulli)
/// writes, bit for bit.
pub fn replay_fill_bernoulli_reference(n: usize, p: f32, seed: u64, tensor: u64) -> Vec<f32> {
    let key = replay_key(!seed, tensor);
    (0..n)
        .map(|i| f32::from(u8::from(uniform24(replay_bits(key, i as u64)) < p)))
        .collect()
}

/// What [`Kernels::replay_fill_normal`](crate::kernels::Kernels::replay_fill_normal)
/// writes, in f64 (the kernel's `logf` and `cosf` differ in the last bits).
pub fn replay_fill_normal_reference(n: usize, seed: u64, tensor: u64) -> Vec<f32> {
    let key = replay_key(!seed, tensor);
    (0..n)
        .map(|i| {
            let bits = replay_bits(key, i as u64);
            let u1 = f64::from(uniform24(bits).max(1e-7));
            let u2 = f64::from(uniform24(bits << 24));
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::PERSISTENT_SMS;
    use stepgraph_testkit::Rng;

    /// Central differences of `f` at `x`, one coordinate at a time.
    fn numeric_grad(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
        let h = 1e-6;
        let mut x = x.to_vec();
        (0..x.len())
            .map(|i| {
                let x0 = x[i];
                x[i] = x0 + h;
                let up = f(&x);
                x[i] = x0 - h;
                let down = f(&x);
                x[i] = x0;
                (up - down) / (2.0 * h)
            })
            .collect()
    }

    fn assert_close(what: &str, analytic: &[f64], numeric: &[f64]) {
        assert_eq!(analytic.len(), numeric.len(), "{what}: lengths");
        let scale = numeric.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-3);
        for (i, (a, n)) in analytic.iter().zip(numeric).enumerate() {
            assert!(
                (a - n).abs() <= 1e-6 * scale + 1e-9,
                "{what}[{i}]: analytic {a:e} vs finite differences {n:e}"
            );
        }
        assert!(
            numeric.iter().any(|x| x.abs() > 1e-6 * scale),
            "{what}: every derivative is zero, the check proves nothing"
        );
    }

    #[test]
    fn glu_backward_matches_finite_differences() {
        let mut rng = Rng::new(1);
        let (rows, g) = (3, 4);
        let u = rng.vec_f64(rows * 2 * g, -3.0, 3.0);
        let dg = rng.vec_f64(rows * g, -1.0, 1.0);
        let loss = |u: &[f64]| -> f64 {
            glu_forward64(u, rows, g)
                .iter()
                .zip(&dg)
                .map(|(a, b)| a * b)
                .sum()
        };
        assert_close(
            "glu du",
            &glu_backward64(&u, &dg, rows, g),
            &numeric_grad(&u, loss),
        );
    }

    /// The head's layer gradients are those of `coef · L(h weᵀ + be)`.
    #[test]
    fn expectile_head_layer_gradients_match_finite_differences() {
        let mut rng = Rng::new(5);
        let dims = ExpectileHeadDims {
            batch: 6,
            hidden: 3,
        };
        let h32: Vec<f32> = rng
            .vec_f64(dims.batch * dims.hidden, -1.0, 1.0)
            .iter()
            .map(|&x| x as f32)
            .collect();
        let qbar32: Vec<f32> = rng
            .vec_f64(dims.batch, -1.0, 1.0)
            .iter()
            .map(|&x| x as f32)
            .collect();
        let we = rng.vec_f64(dims.hidden, -1.0, 1.0);
        let be = 0.25f64;
        let ex = Expectile::HIGH;
        let scaled_loss = |we: &[f64], be: f64| -> f64 {
            let e: Vec<f64> = h32
                .chunks(dims.hidden)
                .map(|row| {
                    be + row
                        .iter()
                        .zip(we)
                        .map(|(x, w)| f64::from(*x) * w)
                        .sum::<f64>()
                })
                .collect();
            f64::from(ex.coef) * expectile64(&e, &widen(&qbar32), ex).0
        };
        let we32: Vec<f32> = we.iter().map(|&x| x as f32).collect();
        let r = expectile_head_reference(dims, &h32, &we32, be as f32, &qbar32, ex);
        let we_f32: Vec<f64> = widen(&we32);
        assert_close(
            "dwe",
            &widen(&r.dwe),
            &numeric_grad(&we_f32, |w| scaled_loss(w, be)),
        );
        assert_close(
            "dbe",
            &[f64::from(r.dbe)],
            &numeric_grad(&[be], |b| scaled_loss(&we_f32, b[0])),
        );
        // dbe is the sum of de, and the loss slots carry L and coef L.
        let de_sum: f64 = r.de.iter().map(|&x| f64::from(x)).sum();
        assert!((de_sum - f64::from(r.dbe)).abs() <= 1e-6 * de_sum.abs().max(1e-6));
        let total = r.losses[LossSlot::Total.index()];
        assert!((total - f64::from(ex.coef) * r.losses[LossSlot::Iql.index()]).abs() < 1e-12);
        assert!(r.losses[LossSlot::Iql.index()] > 0.0);
    }

    #[test]
    fn branch_head_forward_gates_then_applies_the_advantage_layer() {
        let dims = BranchHeadDims {
            batch: 1,
            glu: 2,
            actions: 2,
        };
        // u = [2, -4 | 0, 0]: g = [1, -2]; adv = ba + wa g.
        let (g, adv) = branch_head_forward_reference(
            dims,
            &[2.0, -4.0, 0.0, 0.0],
            &[1.0, 1.0, 3.0, 0.0],
            &[0.5, -1.0],
        );
        assert_eq!(g, vec![1.0, -2.0]);
        assert_eq!(adv, vec![-0.5, 2.0]);
    }

    /// The branch head's gradients are those of `Σ dadv ⊙ adv` with
    /// `adv = glu(h wgᵀ + bg) waᵀ + ba`: through `u` (and `bg`, summed over the rows), `wa`
    /// and `ba`, each against central differences.
    #[test]
    fn branch_head_backward_matches_finite_differences() {
        let mut rng = Rng::new(4);
        let dims = BranchHeadDims {
            batch: 3,
            glu: 4,
            actions: 2,
        };
        let (bn, gn, an) = (dims.batch, dims.glu, dims.actions);
        let u = rng.vec_f64(bn * 2 * gn, -3.0, 3.0);
        let wa = rng.vec_f64(an * gn, -1.0, 1.0);
        let ba = rng.vec_f64(an, -1.0, 1.0);
        let dadv = rng.vec_f64(bn * an, -1.0, 1.0);
        let bg0 = vec![0.0; 2 * gn];
        // L(u + bg broadcast over rows, wa, ba).
        let loss = |u: &[f64], bg: &[f64], wa: &[f64], ba: &[f64]| -> f64 {
            let shifted: Vec<f64> = u
                .chunks(2 * gn)
                .flat_map(|row| row.iter().zip(bg).map(|(x, b)| x + b))
                .collect();
            let g = glu_forward64(&shifted, bn, gn);
            let mut l = 0.0;
            for b in 0..bn {
                for a in 0..an {
                    let adv = ba[a] + (0..gn).map(|j| g[b * gn + j] * wa[a * gn + j]).sum::<f64>();
                    l += dadv[b * an + a] * adv;
                }
            }
            l
        };
        let g = glu_forward64(&u, bn, gn);
        let (du, dwa, dba, dbg) = branch_head_backward64(dims, &dadv, &u, &g, &wa);
        assert_close("du", &du, &numeric_grad(&u, |x| loss(x, &bg0, &wa, &ba)));
        assert_close("dwa", &dwa, &numeric_grad(&wa, |x| loss(&u, &bg0, x, &ba)));
        assert_close("dba", &dba, &numeric_grad(&ba, |x| loss(&u, &bg0, &wa, x)));
        assert_close("dbg", &dbg, &numeric_grad(&bg0, |x| loss(&u, x, &wa, &ba)));
    }

    #[test]
    fn glu_forward_gates_with_the_second_half() {
        // u = [a0, a1 | b0, b1]: g = a * sigmoid(b); sigmoid(0) = 1/2.
        let g = glu_forward_reference(&[2.0, -4.0, 0.0, 0.0], 1, 2);
        assert_eq!(g, vec![1.0, -2.0]);
    }

    #[test]
    fn ddqn_target_takes_the_first_online_maximum_and_the_target_value_there() {
        let dims = DuelingDims {
            batch: 2,
            branches: 2,
            actions: 3,
        };
        // [D, B, A]: branch 0 then branch 1, each sample 0 then 1.
        let adv2 = [
            1.0, 3.0, 3.0, /* d0 b0: tie between 1 and 2 -> 1 */
            0.0, 0.0, 5.0, /* d0 b1 -> 2 */
            9.0, 0.0, 0.0, /* d1 b0 -> 0 */
            0.0, 2.0, 1.0, /* d1 b1 -> 1 */
        ];
        let advt = [
            0.0, 6.0, 0.0, /* mean 2 */
            3.0, 3.0, 3.0, /* mean 3 */
            1.0, 2.0, 3.0, /* mean 2 */
            4.0, 1.0, 1.0, /* mean 2 */
        ];
        let (y, ybar) = ddqn_target_reference(
            dims,
            &[10.0, -10.0],
            &adv2,
            &[1.0, 2.0],
            &advt,
            &[0.5, 1.0],
            &[0.0, 1.0],
            0.5,
        );
        // b0 (not done): q- = vt + advt[a*] - mean.  d0: 1 + 6 - 2 = 5; d1: 1 + 1 - 2 = 0.
        // b1 (done): y = r.
        assert_eq!(y, vec![0.5 + 0.5 * 5.0, 0.5, 1.0, 1.0]);
        assert_eq!(ybar, vec![(3.0 + 0.5) / 2.0, 1.0]);
    }

    fn dueling_case(rng: &mut Rng) -> (DuelingDims, Vec<f64>, Vec<f64>, Vec<i32>, Vec<f64>) {
        let dims = DuelingDims {
            batch: 3,
            branches: 4,
            actions: 5,
        };
        let v = rng.vec_f64(dims.batch, -1.0, 1.0);
        let adv = rng.vec_f64(dims.branches * dims.batch * dims.actions, -2.0, 2.0);
        let act = (0..dims.batch * dims.branches)
            .map(|_| rng.below(dims.actions) as i32)
            .collect();
        // Targets within 1 of some Q values and far from others: both Huber regimes.
        let y = rng.vec_f64(dims.batch * dims.branches, -3.0, 3.0);
        (dims, v, adv, act, y)
    }

    #[test]
    fn dueling_losses_gradients_match_finite_differences() {
        let mut rng = Rng::new(2);
        let coef = DuelingCoefficients::default();
        for _ in 0..4 {
            let (dims, v, adv, act, y) = dueling_case(&mut rng);
            let out = dueling64(dims, &v, &adv, &act, &y, coef);
            let dv = numeric_grad(&v, |v| dueling64(dims, v, &adv, &act, &y, coef).total(coef));
            let dadv = numeric_grad(&adv, |a| dueling64(dims, &v, a, &act, &y, coef).total(coef));
            assert_close("dueling dv", &out.dv, &dv);
            assert_close("dueling dadv", &out.dadv, &dadv);
        }
    }

    #[test]
    fn dueling_losses_gradient_of_each_term_matches_finite_differences() {
        // One coefficient at a time, so a wrong term cannot hide behind the others.
        let mut rng = Rng::new(3);
        let (dims, v, adv, act, y) = dueling_case(&mut rng);
        for coef in [
            DuelingCoefficients {
                td: 1.0,
                cql: 0.0,
                conf: 0.0,
            },
            DuelingCoefficients {
                td: 0.0,
                cql: 1.0,
                conf: 0.0,
            },
            DuelingCoefficients {
                td: 0.0,
                cql: 0.0,
                conf: 1.0,
            },
        ] {
            let out = dueling64(dims, &v, &adv, &act, &y, coef);
            let dadv = numeric_grad(&adv, |a| dueling64(dims, &v, a, &act, &y, coef).total(coef));
            let dv = numeric_grad(&v, |v| dueling64(dims, v, &adv, &act, &y, coef).total(coef));
            assert_close(&format!("dadv, {coef:?}"), &out.dadv, &dadv);
            if coef.td != 0.0 {
                assert_close(&format!("dv, {coef:?}"), &out.dv, &dv);
            } else {
                // L_cql and L_conf do not depend on v: it shifts every q of a sample alike,
                // which logsumexp - qa and the variance over branches both cancel.
                assert!(dv.iter().chain(&out.dv).all(|x| x.abs() < 1e-8), "{dv:?}");
            }
        }
    }

    #[test]
    fn dueling_losses_values_by_hand() {
        // B = 1, D = 2, A = 2, v = 0. Branch 0: adv = [1, -1] -> q = [1, -1], action 0,
        // qa = 1. Branch 1: adv = [0, 0] -> q = [0, 0], action 1, qa = 0.
        let dims = DuelingDims {
            batch: 1,
            branches: 2,
            actions: 2,
        };
        let coef = DuelingCoefficients::default();
        let out = dueling_losses_reference(
            dims,
            &[0.0],
            &[1.0, -1.0, 0.0, 0.0],
            &[0, 1],
            &[3.0, 0.5],
            coef,
        );
        // delta = [-2, -0.5]: huber = [1.5, 0.125].
        let td = (1.5 + 0.125) / 2.0;
        // logsumexp: ln(e + e^-1) - 1 and ln 2 - 0.
        let cql = ((1f64.exp() + (-1f64).exp()).ln() - 1.0 + 2f64.ln()) / 2.0;
        // qa = [1, 0], mean 0.5, population variance 0.25.
        let conf = 0.25;
        let l = out.losses;
        assert!((l[LossSlot::Td.index()] - td).abs() < 1e-12);
        assert!((l[LossSlot::Cql.index()] - cql).abs() < 1e-12);
        assert!((l[LossSlot::Conf.index()] - conf).abs() < 1e-12);
        let total =
            f64::from(coef.td) * td + f64::from(coef.cql) * cql + f64::from(coef.conf) * conf;
        assert!((l[LossSlot::Total.index()] - total).abs() < 1e-12);
        assert_eq!(out.qbar, vec![0.5]);
    }

    #[test]
    fn expectile_gradient_matches_finite_differences() {
        let mut rng = Rng::new(4);
        let e = rng.vec_f64(7, -1.0, 1.0);
        let qbar = rng.vec_f64(7, -1.0, 1.0);
        for head in [Expectile::HIGH, Expectile::LOW] {
            let (_, de) = expectile64(&e, &qbar, head);
            let num = numeric_grad(&e, |e| f64::from(head.coef) * expectile64(e, &qbar, head).0);
            assert_close("expectile de", &de, &num);
        }
    }

    #[test]
    fn expectile_weights_the_two_sides() {
        // u = qbar - e = 1 (weight tau) and -1 (weight 1 - tau).
        let r = expectile_loss_reference(&[0.0, 2.0], &[1.0, 1.0], Expectile::HIGH);
        let loss = (0.7 + 0.3) / 2.0;
        assert!((r.losses[LossSlot::Iql.index()] - loss).abs() < 1e-7);
        assert!((r.losses[LossSlot::Total.index()] - 0.5 * loss).abs() < 1e-7);
        assert!(
            (r.de[0] + 0.35).abs() < 1e-7 && (r.de[1] - 0.15).abs() < 1e-7,
            "{:?}",
            r.de
        );
    }

    #[test]
    fn trunk_join_sums_every_part_under_the_mask() {
        let dims = TrunkDims {
            batch: 2,
            hidden: 2,
            branches: 2,
        };
        let r = trunk_grad_join_reference(
            dims,
            &[1.0, 0.0, 2.0, -1.0],
            &[1.0, 2.0],
            &[10.0, 20.0],
            &[1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0],
            &[0.5, 0.0],
            &[2.0, 2.0],
            &[0.0, 1.0],
            &[4.0, 4.0],
            &[100.0, 100.0, 100.0, 100.0],
        );
        // [b0, h0]: 10 + 3 + 1 + 0 + 100; [b1, h0]: 20 + 3 + 0 + 4 + 100; masked elsewhere.
        assert_eq!(r.dz2, vec![114.0, 0.0, 127.0, 0.0]);
        // Column sums of dz2; dv-weighted column sums of h_out, masked or not
        // (1·1 + 2·2 and 1·0 + 2·(−1)); the sum of dv.
        assert_eq!(r.db2, vec![241.0, 0.0]);
        assert_eq!(r.dwv, vec![5.0, -2.0]);
        assert_eq!(r.dbv, 3.0);
    }

    #[test]
    fn cos_features_follow_the_quantile() {
        let c = iqn_cos_features_reference(&[0.5, 0.25], 3);
        let want = [0.0, -1.0, 0.0, 0.5f64.sqrt(), 0.0, -(0.5f64.sqrt())];
        for (a, b) in c.iter().zip(want) {
            assert!((f64::from(*a) - b).abs() < 1e-7, "{c:?}");
        }
    }

    struct IqnCase {
        dims: IqnDims,
        h: Vec<f64>,
        phi_pre: Vec<f64>,
        wq: Vec<f64>,
        bq: f64,
        ybar: Vec<f64>,
        tau: Vec<f64>,
    }

    impl IqnCase {
        fn new(rng: &mut Rng) -> IqnCase {
            let dims = IqnDims {
                batch: 2,
                quantiles: 3,
                hidden: 5,
            };
            IqnCase {
                dims,
                h: rng.vec_f64(dims.batch * dims.hidden, 0.0, 1.5),
                phi_pre: rng.vec_f64(dims.batch * dims.quantiles * dims.hidden, -1.0, 1.0),
                wq: rng.vec_f64(dims.hidden, -1.5, 1.5),
                bq: 0.1,
                // Wide enough that some |u| > 1 and u takes both signs.
                ybar: rng.vec_f64(dims.batch, -2.0, 2.0),
                tau: rng.vec_f64(dims.batch * dims.quantiles, 0.0, 1.0),
            }
        }

        fn run(&self, h: &[f64], phi_pre: &[f64], wq: &[f64], bq: f64, bphi: &[f64]) -> Iqn64 {
            let hn = self.dims.hidden;
            let phi: Vec<f64> = phi_pre
                .iter()
                .enumerate()
                .map(|(i, &x)| (x + bphi[i % hn]).max(0.0))
                .collect();
            iqn64(self.dims, h, &phi, wq, bq, &self.ybar, &self.tau, 0.5)
        }

        fn loss(&self, h: &[f64], phi_pre: &[f64], wq: &[f64], bq: f64, bphi: &[f64]) -> f64 {
            0.5 * self.run(h, phi_pre, wq, bq, bphi).loss
        }
    }

    #[test]
    fn iqn_gradients_match_finite_differences() {
        let mut rng = Rng::new(5);
        for _ in 0..3 {
            let c = IqnCase::new(&mut rng);
            let zero = vec![0.0; c.dims.hidden];
            let out = c.run(&c.h, &c.phi_pre, &c.wq, c.bq, &zero);
            assert_close(
                "iqn dphi_pre",
                &out.dphi_pre,
                &numeric_grad(&c.phi_pre, |p| c.loss(&c.h, p, &c.wq, c.bq, &zero)),
            );
            assert_close(
                "iqn dh",
                &out.dh,
                &numeric_grad(&c.h, |h| c.loss(h, &c.phi_pre, &c.wq, c.bq, &zero)),
            );
            assert_close(
                "iqn dwq",
                &out.dwq,
                &numeric_grad(&c.wq, |w| c.loss(&c.h, &c.phi_pre, w, c.bq, &zero)),
            );
            assert_close(
                "iqn dbphi",
                &out.dbphi,
                &numeric_grad(&zero, |b| c.loss(&c.h, &c.phi_pre, &c.wq, c.bq, b)),
            );
            assert_close(
                "iqn dbq",
                &[out.dbq],
                &numeric_grad(&[c.bq], |b| c.loss(&c.h, &c.phi_pre, &c.wq, b[0], &zero)),
            );
        }
    }

    /// The cosine features `[rows, C]` of `tau`, in f64.
    fn cos_features64(tau: &[f64], cn: usize) -> Vec<f64> {
        (0..tau.len() * cn)
            .map(|e| (std::f64::consts::PI * (e % cn + 1) as f64 * tau[e / cn]).cos())
            .collect()
    }

    #[test]
    fn iqn_fused_weight_gradients_match_finite_differences() {
        let mut rng = Rng::new(11);
        let dims = IqnFusedDims {
            batch: 2,
            quantiles: 3,
            hidden: 5,
            cosines: 4,
            sms: PERSISTENT_SMS,
        };
        for _ in 0..3 {
            let h = rng.vec_f64(dims.batch * dims.hidden, 0.0, 1.5);
            let tau = rng.vec_f64(dims.batch * dims.quantiles, 0.0, 1.0);
            let ybar = rng.vec_f64(dims.batch, -2.0, 2.0);
            let wphi = rng.vec_f64(dims.hidden * dims.cosines, -1.0, 1.0);
            let bphi = rng.vec_f64(dims.hidden, -0.5, 0.5);
            let wq = rng.vec_f64(dims.hidden, -1.5, 1.5);
            let cosf = cos_features64(&tau, dims.cosines);
            let run = |wphi: &[f64], bphi: &[f64]| {
                iqn_fused64(
                    dims,
                    &h,
                    &tau,
                    &ybar,
                    &cosf,
                    wphi,
                    bphi,
                    &wq,
                    0.1,
                    0.5,
                    &|d| d,
                )
            };
            let loss = |wphi: &[f64], bphi: &[f64]| 0.5 * run(wphi, bphi).0.loss;
            let (out, dwphi) = run(&wphi, &bphi);
            assert_close(
                "iqn fused dwphi",
                &dwphi,
                &numeric_grad(&wphi, |w| loss(w, &bphi)),
            );
            assert_close(
                "iqn fused dbphi",
                &out.dbphi,
                &numeric_grad(&bphi, |b| loss(&wphi, b)),
            );
        }
    }

    #[test]
    fn iqn_fused_reference_is_the_unfused_chain() {
        let mut rng = Rng::new(12);
        let dims = IqnFusedDims {
            batch: 3,
            quantiles: 4,
            hidden: 6,
            cosines: 5,
            sms: PERSISTENT_SMS,
        };
        let f32s = |v: Vec<f64>| narrow(&v);
        let h = f32s(rng.vec_f64(dims.batch * dims.hidden, 0.0, 1.5));
        let tau = f32s(rng.vec_f64(dims.batch * dims.quantiles, 0.0, 1.0));
        let ybar = f32s(rng.vec_f64(dims.batch, -2.0, 2.0));
        let wphi = f32s(rng.vec_f64(dims.hidden * dims.cosines, -1.0, 1.0));
        let bphi = f32s(rng.vec_f64(dims.hidden, -0.5, 0.5));
        let wq = f32s(rng.vec_f64(dims.hidden, -1.5, 1.5));
        let fused = iqn_fused_reference(
            dims,
            &h,
            &tau,
            &ybar,
            &wphi,
            &bphi,
            &wq,
            0.1,
            0.5,
            GemmOperands::Exact,
        );
        // The chain the step runs without the fused kernel, on the CPU.
        let cosf = iqn_cos_features_reference(&tau, dims.cosines);
        let rows = dims.batch * dims.quantiles;
        let (cn, hn) = (dims.cosines, dims.hidden);
        let phi: Vec<f32> = (0..rows * hn)
            .map(|e| {
                let (r, k) = (e / hn, e % hn);
                let pre = (0..cn)
                    .map(|c| f64::from(cosf[r * cn + c]) * f64::from(wphi[k * cn + c]))
                    .sum::<f64>()
                    + f64::from(bphi[k]);
                pre.max(0.0) as f32
            })
            .collect();
        let head =
            iqn_forward_backward_reference(dims.unfused(), &h, &phi, &wq, 0.1, &ybar, &tau, 0.5);
        let dwphi: Vec<f64> = (0..hn * cn)
            .map(|e| {
                let (k, c) = (e / cn, e % cn);
                (0..rows)
                    .map(|r| f64::from(head.dphi_pre[r * hn + k]) * f64::from(cosf[r * cn + c]))
                    .sum()
            })
            .collect();
        let close = |what: &str, a: &[f32], b: &[f64]| {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (f64::from(*x) - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "{what}[{i}]: fused {x} vs chain {y}"
                );
            }
        };
        close("dh", &fused.dh, &widen(&head.dh));
        close("dwq", &fused.dwq, &widen(&head.dwq));
        close("dbphi", &fused.dbphi, &widen(&head.dbphi));
        close("dbq", &[fused.dbq], &[f64::from(head.dbq)]);
        close("dwphi", &fused.dwphi, &dwphi);
        for slot in [LossSlot::Iqn, LossSlot::Total] {
            let (a, b) = (fused.losses[slot.index()], head.losses[slot.index()]);
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "{slot:?}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn tf32_rounding_keeps_ten_mantissa_bits_to_nearest_ties_away() {
        let ulp = 2.0f32.powi(-10); // of TF32 at 1.0
        assert_eq!(tf32_round(1.0), 1.0);
        assert_eq!(tf32_round(1.0 + ulp), 1.0 + ulp);
        // Below half an ulp rounds down, half an ulp (a tie) rounds away from zero.
        assert_eq!(tf32_round(1.0 + 0.49 * ulp), 1.0);
        assert_eq!(tf32_round(1.0 + 0.5 * ulp), 1.0 + ulp);
        assert_eq!(tf32_round(-(1.0 + 0.5 * ulp)), -(1.0 + ulp));
        // A carry into the exponent.
        assert_eq!(tf32_round(2.0 - 0.25 * ulp), 2.0);
        assert_eq!(tf32_round(0.0), 0.0);
        assert!(tf32_round(f32::NAN).is_nan());
        assert_eq!(tf32_round(f32::NEG_INFINITY), f32::NEG_INFINITY);
        let x = 0.123_456_79f32;
        assert_eq!(tf32_round(x).to_bits() & 0x1FFF, 0);
        assert!((tf32_round(x) - x).abs() <= x * 2.0f32.powi(-11));
    }

    fn attention_dims() -> AttentionDims {
        AttentionDims {
            batch: 2,
            window: 3,
            width: 8,
            heads: 2,
        }
    }

    #[test]
    fn attention_probs_are_softmax_rows() {
        let dims = attention_dims();
        let mut rng = Rng::new(6);
        let qkv = rng.vec_f64(dims.batch * dims.window * 3 * dims.width, -2.0, 2.0);
        let (_, probs) = attention_forward64(dims, &qkv);
        for row in probs.chunks(dims.window) {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            assert!(row.iter().all(|&p| p > 0.0));
        }
    }

    #[test]
    fn attention_with_zero_queries_averages_the_values() {
        let dims = AttentionDims {
            batch: 1,
            window: 2,
            width: 4,
            heads: 2,
        };
        // Rows [Q | K | V]: Q = 0, so every weight is 1/2 whatever K is.
        let qkv = [
            0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0, //
            0.0, 0.0, 0.0, 0.0, 5.0, 6.0, 7.0, 8.0, 3.0, 6.0, 9.0, 12.0,
        ];
        let (att, probs) = attention_forward_reference(dims, &qkv);
        assert!(probs.iter().all(|&p| p == 0.5));
        assert_eq!(att, vec![2.0, 4.0, 6.0, 8.0, 2.0, 4.0, 6.0, 8.0]);
    }

    #[test]
    fn attention_backward_matches_finite_differences() {
        let dims = attention_dims();
        let mut rng = Rng::new(7);
        let qkv = rng.vec_f64(dims.batch * dims.window * 3 * dims.width, -1.5, 1.5);
        let datt = rng.vec_f64(dims.batch * dims.window * dims.width, -1.0, 1.0);
        let (_, probs) = attention_forward64(dims, &qkv);
        let loss = |x: &[f64]| -> f64 {
            attention_forward64(dims, x)
                .0
                .iter()
                .zip(&datt)
                .map(|(a, b)| a * b)
                .sum()
        };
        assert_close(
            "attention dqkv",
            &attention_backward64(dims, &qkv, &probs, &datt),
            &numeric_grad(&qkv, loss),
        );
    }

    #[test]
    fn attn_pool_gradients_match_finite_differences() {
        let dims = AttnPoolDims {
            batch: 3,
            window: 4,
            width: 5,
        };
        let mut rng = Rng::new(8);
        let o = rng.vec_f64(dims.batch * dims.window * dims.width, -1.0, 1.0);
        let wp = rng.vec_f64(dims.width, -1.0, 1.0);
        let r = rng.vec_f64(dims.batch, -1.0, 1.0);
        let (bp, coef) = (0.2, 0.1);
        let out = attn_pool64(dims, &o, &wp, bp, &r, coef);
        let loss =
            |o: &[f64], wp: &[f64], bp: f64| coef * attn_pool64(dims, o, wp, bp, &r, coef).loss;
        assert_close(
            "attn_pool d_o",
            &out.d_o,
            &numeric_grad(&o, |x| loss(x, &wp, bp)),
        );
        assert_close(
            "attn_pool dwp",
            &out.dwp,
            &numeric_grad(&wp, |x| loss(&o, x, bp)),
        );
        assert_close(
            "attn_pool dbp",
            &[out.dbp],
            &numeric_grad(&[bp], |x| loss(&o, &wp, x[0])),
        );
    }

    /// Random inputs of the fused attention head at `dims`: windows in ±1.5, weights in ±1
    /// (`bemb` ±0.5), rewards in ±1, so that scores are of order 1.
    struct AttnInputs64 {
        win: Vec<f64>,
        wemb: Vec<f64>,
        bemb: Vec<f64>,
        wqkv: Vec<f64>,
        wo: Vec<f64>,
        wp: Vec<f64>,
        r: Vec<f64>,
    }

    impl AttnInputs64 {
        fn random(dims: AttnFusedDims, seed: u64) -> AttnInputs64 {
            let (bn, sn, e) = (dims.batch, dims.state, dims.width);
            let mut rng = Rng::new(seed);
            AttnInputs64 {
                win: rng.vec_f64(bn * dims.window * sn, -1.5, 1.5),
                wemb: rng.vec_f64(e * sn, -1.0, 1.0),
                bemb: rng.vec_f64(e, -0.5, 0.5),
                wqkv: rng.vec_f64(3 * e * e, -1.0, 1.0),
                wo: rng.vec_f64(e * e, -1.0, 1.0),
                wp: rng.vec_f64(e, -1.0, 1.0),
                r: rng.vec_f64(bn, -1.0, 1.0),
            }
        }
    }

    /// The fused attention head's gradients are those of `coef · L_attn` through the whole
    /// head (the embedding, the QKV projection, the attention, the output projection and the
    /// pool): every element of every weight against central differences, with exact
    /// operands. Scores of order 1, so the softmax is far from uniform.
    #[test]
    fn attention_fused_gradients_match_finite_differences() {
        let dims = AttnFusedDims {
            batch: 3,
            state: 4,
            window: 2,
            width: 4,
            heads: 2,
            sms: PERSISTENT_SMS,
        };
        let AttnInputs64 {
            win,
            wemb,
            bemb,
            wqkv,
            wo,
            wp,
            r,
        } = AttnInputs64::random(dims, 13);
        let (bp, coef) = (0.2, 0.1);
        let run = |w: [&[f64]; 5], bp: f64| {
            let [wemb, bemb, wqkv, wo, wp] = w;
            attention_fused64(dims, &win, wemb, bemb, wqkv, wo, wp, bp, &r, coef, &|x| x)
        };
        let loss = |w: [&[f64]; 5], bp: f64| coef * run(w, bp).pool.loss;
        let weights: [&[f64]; 5] = [&wemb, &bemb, &wqkv, &wo, &wp];
        let out = run(weights, bp);
        let analytic: [&[f64]; 5] = [&out.dwemb, &out.dbemb, &out.dwqkv, &out.dwo, &out.pool.dwp];
        let names = ["dwemb", "dbemb", "dwqkv", "dwo", "dwp"];
        for (i, (name, grad)) in names.into_iter().zip(analytic).enumerate() {
            let numeric = numeric_grad(weights[i], |x| {
                let mut w = weights;
                w[i] = x;
                loss(w, bp)
            });
            assert_close(&format!("attention fused {name}"), grad, &numeric);
        }
        assert_close(
            "attention fused dbp",
            &[out.pool.dbp],
            &numeric_grad(&[bp], |x| loss(weights, x[0])),
        );
    }

    /// The fused head's reference in the kernel's order (the embedding folded into
    /// `W' = wqkv wemb`, one product `G = dqkvᵀ win` for every weight gradient, `csum`'s K
    /// part 0 and V part `dbp v`) gives, with exact operands, what the long way gives:
    /// `emb = win wembᵀ + bemb`, `qkv = emb wqkvᵀ`, `demb = dqkv wqkv`, `dwqkv = dqkvᵀ emb`,
    /// `dbemb = Σ demb`, `dwemb = dembᵀ win` (the kernel's form before the fold). At sizes
    /// where `S ≠ E` and with several heads, so that no transposition can hide.
    #[test]
    fn attention_fused_in_the_kernels_order_is_the_long_way() {
        let dims = AttnFusedDims {
            batch: 5,
            state: 6,
            window: 4,
            width: 8,
            heads: 2,
            sms: PERSISTENT_SMS,
        };
        let (sn, e) = (dims.state, dims.width);
        let rows = dims.batch * dims.window;
        let x = AttnInputs64::random(dims, 15);
        let (win, wemb, bemb, wqkv) = (&x.win[..], &x.wemb[..], &x.bemb[..], &x.wqkv[..]);
        let (wo, wp, r) = (&x.wo[..], &x.wp[..], &x.r[..]);
        let (bp, coef) = (0.2, 0.1);
        let folded = attention_fused64(dims, win, wemb, bemb, wqkv, wo, wp, bp, r, coef, &|x| x);
        // The long way.
        let mut emb = times_transposed(win, wemb, rows, sn, e);
        for row in emb.chunks_mut(e) {
            for (x, b) in row.iter_mut().zip(bemb) {
                *x += b;
            }
        }
        let qkv = times_transposed(&emb, wqkv, rows, e, 3 * e);
        let (att, probs) = attention_forward64(dims.attention(), &qkv);
        let o = times_transposed(&att, wo, rows, e, e);
        let pool = attn_pool64(dims.pool(), &o, wp, bp, r, coef);
        let datt = times(&pool.d_o, wo, rows, e, e);
        let dqkv = attention_backward64(dims.attention(), &qkv, &probs, &datt);
        let demb = times(&dqkv, wqkv, rows, 3 * e, e);
        let mut dbemb = vec![0.0; e];
        for row in demb.chunks(e) {
            for (s, x) in dbemb.iter_mut().zip(row) {
                *s += x;
            }
        }
        let dwqkv = transposed_times(&dqkv, &emb, rows, 3 * e, e);
        let dwemb = transposed_times(&demb, win, rows, e, sn);
        let dwo = transposed_times(&pool.d_o, &att, rows, e, e);
        // (assert_close's message calls the long way "finite differences".)
        for (what, got, want) in [
            ("pred", &folded.pool.pred, &pool.pred),
            ("dwqkv", &folded.dwqkv, &dwqkv),
            ("dwemb", &folded.dwemb, &dwemb),
            ("dbemb", &folded.dbemb, &dbemb),
            ("dwo", &folded.dwo, &dwo),
            ("dwp", &folded.pool.dwp, &pool.dwp),
            ("dbp", &vec![folded.pool.dbp], &vec![pool.dbp]),
        ] {
            assert_close(&format!("folded against the long way: {what}"), got, want);
        }
    }

    /// The public reference fills the loss slots as the kernel does, and rounding the
    /// products' operands to TF32 moves every output, by about TF32's unit roundoff.
    #[test]
    fn attention_fused_reference_with_tf32_operands_is_near_the_exact_one() {
        let dims = AttnFusedDims {
            batch: 5,
            state: 6,
            window: 3,
            width: 8,
            heads: 2,
            sms: PERSISTENT_SMS,
        };
        let (bn, sn, e) = (dims.batch, dims.state, dims.width);
        let mut rng = Rng::new(14);
        let mut f32s = |n: usize, scale: f64| narrow(&rng.vec_f64(n, -scale, scale));
        let win = f32s(bn * dims.window * sn, 1.5);
        let wemb = f32s(e * sn, 0.7);
        let bemb = f32s(e, 0.5);
        let wqkv = f32s(3 * e * e, 0.6);
        let wo = f32s(e * e, 0.6);
        let wp = f32s(e, 0.6);
        let r = f32s(bn, 1.0);
        let reference = |operands| {
            attention_fused_reference(
                dims, &win, &wemb, &bemb, &wqkv, &wo, &wp, 0.2, &r, 0.1, operands,
            )
        };
        let (exact, tf32) = (
            reference(GemmOperands::Exact),
            reference(GemmOperands::Tf32),
        );
        for (what, a, b) in [
            ("pred", &exact.pred, &tf32.pred),
            ("dwemb", &exact.dwemb, &tf32.dwemb),
            ("dbemb", &exact.dbemb, &tf32.dbemb),
            ("dwqkv", &exact.dwqkv, &tf32.dwqkv),
            ("dwo", &exact.dwo, &tf32.dwo),
            ("dwp", &exact.dwp, &tf32.dwp),
            ("dbp", &vec![exact.dbp], &vec![tf32.dbp]),
        ] {
            let norm = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
            let diff = a
                .iter()
                .zip(b)
                .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!(
                diff > 0.0 && diff < 1e-2 * norm,
                "{what}: TF32 operands moved it by {diff:e} of {norm:e}"
            );
        }
        for out in [&exact, &tf32] {
            let l = out.losses;
            assert!(l[LossSlot::Attn.index()] > 0.0);
            assert_eq!(
                l[LossSlot::Total.index()],
                0.1f32 as f64 * l[LossSlot::Attn.index()]
            );
            for (i, &x) in l.iter().enumerate() {
                if i != LossSlot::Attn.index() && i != LossSlot::Total.index() {
                    assert_eq!(x, 0.0, "slot {i}");
                }
            }
        }
    }

    /// The replay generator's draw: indices in range and spread evenly over the buffer,
    /// fractions in [0.02, 0.98] with mean 0.5, a fresh draw at every counter, and the
    /// same draw again for the same (seed, counter).
    #[test]
    fn the_replay_draw_is_uniform_in_range_and_fresh_per_counter() {
        let (capacity, batch, taus) = (1000u32, 20_000, 40_000);
        let (idx, tau) = replay_draw_reference(7, 0, capacity, batch, taus);
        assert!(idx.iter().all(|&i| i < capacity));
        let mut counts = vec![0usize; 10];
        for &i in &idx {
            counts[(i / 100) as usize] += 1;
        }
        // 2000 expected a decile; 5 sigma is about 210.
        assert!(counts.iter().all(|&c| c.abs_diff(2000) < 250), "{counts:?}");
        assert!(tau.iter().all(|&t| (0.02..=0.98).contains(&t)));
        let mean = tau.iter().map(|&t| f64::from(t)).sum::<f64>() / taus as f64;
        // sd of the mean: 0.96 / sqrt(12 * 40000) = 1.4e-3.
        assert!((mean - 0.5).abs() < 7e-3, "{mean}");
        let (again, _) = replay_draw_reference(7, 0, capacity, batch, taus);
        assert_eq!(idx, again);
        let (next, _) = replay_draw_reference(7, 1, capacity, batch, taus);
        let same = idx.iter().zip(&next).filter(|(a, b)| a == b).count();
        // 1 in 1000 rows alike by chance: about 20.
        assert!(
            same < 60,
            "{same} of {batch} indices equal at the next counter"
        );
        let (other_seed, _) = replay_draw_reference(8, 0, capacity, batch, taus);
        assert_ne!(idx, other_seed);
    }

    /// The fills have the host generator's distributions: normals of mean 0 and variance
    /// 1, actions uniform over 0..A, done at probability 0.1.
    #[test]
    fn the_replay_fills_have_the_generated_transitions_distributions() {
        let n = 50_000;
        let x = replay_fill_normal_reference(n, 3, 0);
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
        let act = replay_fill_actions_reference(n, 5, 3, 2);
        let mut counts = [0usize; 5];
        for &a in &act {
            counts[usize::try_from(a).unwrap()] += 1;
        }
        assert!(
            counts.iter().all(|&c| c.abs_diff(n / 5) < 500),
            "{counts:?}"
        );
        let done = replay_fill_bernoulli_reference(n, 0.1, 3, 4);
        let ones = done.iter().filter(|&&d| d == 1.0).count();
        assert!(done.iter().all(|&d| d == 0.0 || d == 1.0));
        assert!(ones.abs_diff(n / 10) < 350, "{ones}");
        // Two tensors of one seed are independent draws.
        let y = replay_fill_normal_reference(n, 3, 1);
        assert_ne!(x, y);
    }

    /// `below` is the high word of a 128-bit product: 0 for bits 0, n - 1 for all ones.
    #[test]
    fn below_maps_the_bits_onto_the_range() {
        assert_eq!(below(0, 7), 0);
        assert_eq!(below(u64::MAX, 7), 6);
        assert_eq!(below(1 << 63, 10), 5);
        assert_eq!(uniform24(u64::MAX), 1.0 - 1.0 / 16_777_216.0);
        assert_eq!(splitmix(0), 0xE220_A839_7B1D_CDAF);
    }
}
