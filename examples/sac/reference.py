#!/usr/bin/env python3
"""PyTorch reference for the SAC update step of examples/sac (contract: MODEL.md).

The Rust example and this script meet only through a directory of .npy files (numpy's
format version 1.0, little-endian float32 '<f4', C order; a scalar has shape [1]).
`<i>` is a critic's index 0..N-1 (N = "critics" of config.json), `<k>` a step 1..K, in
decimal without padding. A network's tensors are `<net>.l1.w [H, in]`, `<net>.l1.b [H]`,
`<net>.l2.w [H, H]`, `<net>.l2.b [H]`, `<net>.l3.w [out, H]`, `<net>.l3.b [out]`, with
in = S + A, out = 1 for a critic and in = S, out = 2A for the actor.

DIR/
  config.json              one JSON object; required keys (CONFIG_KEYS):
                             batch obs action hidden critics (integers),
                             gamma tau target_entropy lr beta1 beta2 eps max_norm;
                           optional: log_std_min (-20), log_std_max (2), tanh_eps (1e-6);
                           seed, steps, schedule are recorded, not read
  init/<name>.npy          the state before step 1, every name of STATE:
                             critic<i>.<t>, critic<i>.<t>.adam_m, critic<i>.<t>.adam_v,
                             critic<i>_target.<t>, actor.<t>, actor.<t>.adam_m,
                             actor.<t>.adam_v, log_alpha, log_alpha.adam_m,
                             log_alpha.adam_v  (<t> each of l1.w l1.b l2.w l2.b l3.w l3.b)
  step<k>/in/<name>.npy    what step k read: s [B,S], a [B,A], r [B], s2 [B,S],
                           done [B] (0 or 1), eps [B,A], eps_next [B,A] (the noise)
  step<k>/out/<name>.npy   what step k wrote: critic<i>.loss [1], actor.loss [1],
                           alpha.loss [1], every gradient before clipping
                           (critic<i>.<t>.grad, actor.<t>.grad, log_alpha.grad [1]),
                           y [B] (the soft target), critic<i>.q_pi [B] (critic i, as
                           updated, at the actor's sample: its smallest routes the actor's
                           gradient), and every name of STATE after the step
Files not named here are ignored. Adam's step count is k at step k.

Commands (--help for every flag):
  reference.py check DIR [--steps K] [--device cuda|cpu] [--no-tf32] [--dtype float64]
      For each step k, start from the Rust side's state before it (init/ for k = 1,
      step<k-1>/out/ after), run the step here (autograd for every gradient,
      torch.optim.Adam after clip_grad_norm_ for every update), and compare; prints a
      table (name, kind, error, bound, pass) per step and `reference check: N of M
      passed`; exit status 1 on any failure. JSON summary: DIR/reference_check.json
      (or --json PATH).
  reference.py write-fake DIR [sizes] [--critics N] [--steps K] [--seed S]
                          [--emulate-tf32]
      a directory in the Rust side's layout from the reference's own steps (for tests)
  reference.py bench [sizes] [--critics N] [--iters 200] [--warmup 30]
                     [--variants eager,graph,compile:default,...] [--limit SECONDS]
      the same update in PyTorch on CUDA, timed with CUDA events, each variant in a
      process of its own under a time limit; JSON to --json PATH
Sizes: --batch B --obs S --action A --hidden H (MODEL.md's defaults 16384, 64, 8, 256).
"""

import argparse
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

CONFIG_KEYS = ("batch", "obs", "action", "hidden", "critics", "gamma", "tau",
               "target_entropy", "lr", "beta1", "beta2", "eps", "max_norm")
OPTIONAL = dict(log_std_min=-20.0, log_std_max=2.0, tanh_eps=1e-6)
DEFAULT_SIZES = dict(batch=16384, obs=64, action=8, hidden=256)
DEFAULT_HYPER = dict(gamma=0.99, tau=0.005, lr=3e-4, beta1=0.9, beta2=0.999, eps=1e-8,
                     max_norm=10.0)
TENSORS = ("l1.w", "l1.b", "l2.w", "l2.b", "l3.w", "l3.b")
INPUTS = ("s", "a", "r", "s2", "done", "eps", "eps_next")
LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
CLIP_EPS = 1e-6  # the clipping's `+ 1e-6`, kernels/cuda/optim.cu and clip_grad_norm_

# Bounds, on ‖x − ref‖ / max(‖ref‖, floor) per tensor. The Rust step runs every GEMM in
# TF32 (cuBLASLt CUBLAS_COMPUTE_32F_FAST_TF32, runtime/src/blas.rs: 10 mantissa bits,
# unit roundoff 2⁻¹¹ ≈ 4.9e-4 per rounded operand), and so does this reference on CUDA
# (torch's allow_tf32), each rounding on its own. Measured with every GEMM operand of the
# dump rounded to TF32 (write-fake --emulate-tf32) against plain f32, three steps, at
# B 1000, S 64, A 6, H 200: loss 1.5e-5, y and q_pi 7.6e-4, a critic's gradient 1.2e-2, the
# actor's 2.5e-2 (l1.w, the end of the longest chain: a critic's forward and input
# backward, then the actor's backward, ReLU masks flipping where a pre-activation is
# within rounding of 0), a parameter 1.0e-3. The bounds leave about twice that, for the
# second side's own rounding.
BOUND_LOSS = 2e-3      # a mean over the batch: its rounding errors mostly average out
BOUND_VALUE = 5e-3     # y and q_pi, per-row forward values
BOUND_GRAD = 2e-2
# A parameter moves by about lr per step; one whose small gradient rounds to the other
# sign moves 2 lr apart (Adam's early steps move an element by ±lr whatever the size of
# its gradient), 1e-3 of a bias of H elements at B 1000. The update rows below hold the
# update itself, tightly.
BOUND_PARAM = 5e-3
BOUND_TARGET = 1e-3    # τ times the parameter's difference
# m_k = β1 m_{k−1} + (1 − β1) g: (1 − β1) times the clipped gradient's error, measured
# against max(‖m‖, (1 − β1)‖clip g‖); v adds (1 − β2) g², whose relative error is at most
# 2r + r² for a gradient within r.
BOUND_ADAM_M, BOUND_ADAM_V = BOUND_GRAD, 2 * BOUND_GRAD + BOUND_GRAD ** 2
ACTOR_GRAD = 5e-2
ACTOR_BOUNDS = dict(grad=ACTOR_GRAD, adam_m=ACTOR_GRAD, adam_v=2 * ACTOR_GRAD + ACTOR_GRAD ** 2)
# θ_k − θ_{k−1} of one network together, against the optimizer applied to the Rust
# side's own gradients (update_row): only f32 rounding separates the two, θ_k rounded at
# about 6e-8 |θ| beside an update of about lr = 3e-4 (measured: 5e-6 at most), so 1e-3.
# A learning rate 0.1 % off, a wrong bias correction or clipping factor is off by more.
BOUND_UPDATE = 1e-3
# Routing: rows whose smallest critic differs although the reference's margin to the
# second smallest is above MARGIN × rms(q); bound 0.
MARGIN = 2e-2


# ----------------------------------------------------------------------------- names

def net_shapes(inp, hidden, out):
    return {"l1.w": (hidden, inp), "l1.b": (hidden,), "l2.w": (hidden, hidden),
            "l2.b": (hidden,), "l3.w": (out, hidden), "l3.b": (out,)}


def critic_names(c):
    return [f"critic{i}" for i in range(c["critics"])]


def trained(c):
    """{network: its shapes} of every trained network: the critics, then the actor."""
    S, A, H = c["obs"], c["action"], c["hidden"]
    out = {n: net_shapes(S + A, H, 1) for n in critic_names(c)}
    out["actor"] = net_shapes(S, H, 2 * A)
    return out


def state_shapes(c):
    """Every tensor of the state, name -> shape, in the order the Rust side lists it."""
    out = {}
    nets = trained(c)
    for net, shapes in nets.items():
        for suffix in ("", ".adam_m", ".adam_v"):
            out.update({f"{net}.{t}{suffix}": s for t, s in shapes.items()})
        if net != "actor":
            out.update({f"{net}_target.{t}": s for t, s in shapes.items()})
    for suffix in ("", ".adam_m", ".adam_v"):
        out["log_alpha" + suffix] = (1,)
    return out


def output_shapes(c):
    """Every file of step<k>/out/."""
    B = c["batch"]
    out = {}
    for net, shapes in trained(c).items():
        out[f"{net}.loss"] = (1,)
        out.update({f"{net}.{t}.grad": s for t, s in shapes.items()})
        if net != "actor":
            out[f"{net}.q_pi"] = (B,)
    out.update({"alpha.loss": (1,), "log_alpha.grad": (1,), "y": (B,)})
    out.update(state_shapes(c))
    return out


def input_shapes(c):
    B, S, A = c["batch"], c["obs"], c["action"]
    return {"s": (B, S), "a": (B, A), "r": (B,), "s2": (B, S), "done": (B,),
            "eps": (B, A), "eps_next": (B, A)}


# ----------------------------------------------------------------------------- precision

class Matmul:
    """Where every GEMM goes, so a test can emulate TF32 on a CPU: both operands of every
    product (forward and backward) rounded to TF32's 10-bit mantissa, nearest-even."""
    emulate_tf32 = False


def round_tf32(x):
    if x.dtype != torch.float32:
        return x
    i = x.contiguous().view(torch.int32)
    i = i + (0xFFF + ((i >> 13) & 1))
    return (i & ~0x1FFF).view(torch.float32)


class _Tf32Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return round_tf32(x) @ round_tf32(w).t() + b

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        g = round_tf32(gy)
        return g @ round_tf32(w), g.t() @ round_tf32(x), gy.sum(0)


def lin(x, w, b):
    """x wᵀ + b."""
    if Matmul.emulate_tf32:
        return _Tf32Linear.apply(x, w, b)
    return F.linear(x, w, b)


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


# ----------------------------------------------------------------------------- the model

def mlp(p, x):
    """l3(relu(l2(relu(l1(x))))); p maps TENSORS to tensors."""
    h = torch.relu(lin(x, p["l1.w"], p["l1.b"]))
    h = torch.relu(lin(h, p["l2.w"], p["l2.b"]))
    return lin(h, p["l3.w"], p["l3.b"])


def sample(actor, obs, eps, c):
    """â [B,A] and log π [B] of MODEL.md's sample, log π computed from ε."""
    A = c["action"]
    o = mlp(actor, obs)
    mu = o[:, :A]
    ls = torch.clamp(o[:, A:], c["log_std_min"], c["log_std_max"])
    a = torch.tanh(mu + torch.exp(ls) * eps)
    logp = (-0.5 * eps * eps - ls - LOG_SQRT_2PI - torch.log(1 - a * a + c["tanh_eps"])).sum(1)
    return a, logp


def first_min(qs):
    """The smallest of the rows of qs [N, B] per column and its index, the first on ties
    (MODEL.md: ties to Q1)."""
    best, idx = qs[0], torch.zeros_like(qs[0], dtype=torch.long)
    for i in range(1, qs.shape[0]):
        take = qs[i] < best
        best = torch.where(take, qs[i], best)
        idx = torch.where(take, torch.full_like(idx, i), idx)
    return best, idx


def net_of(st, prefix):
    return {t: st[f"{prefix}.{t}"] for t in TENSORS}


def adam(params, grads, ms, vs, k, c):
    """One clipped Adam step as stepgraph-kernels' adam_clip_update does it: the global
    norm clipping of clip_grad_norm_ (min(1, max_norm / (‖g‖ + 1e-6)), the same formula),
    then torch.optim.Adam from moments m, v at step count k − 1, whose update
    lr (m / (1 − β1ᵗ)) / (√v / √(1 − β2ᵗ) + ε) is the kernel's in real arithmetic (ε
    outside the root, bias corrections in double). Returns (params, m, v) after it."""
    leaves = [p.detach().clone().requires_grad_(True) for p in params]
    for p, g in zip(leaves, grads):
        p.grad = g.detach().clone()
    torch.nn.utils.clip_grad_norm_(leaves, c["max_norm"], foreach=False)
    opt = torch.optim.Adam(leaves, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                           foreach=False)
    for p, m, v in zip(leaves, ms, vs):
        opt.state[p] = {"step": torch.tensor(float(k - 1)), "exp_avg": m.detach().clone(),
                        "exp_avg_sq": v.detach().clone()}
    opt.step()
    return ([p.detach() for p in leaves], [opt.state[p]["exp_avg"] for p in leaves],
            [opt.state[p]["exp_avg_sq"] for p in leaves])


def reference_step(st, inp, k, c, route=None):
    """Step k from the state `st` (name -> tensor, STATE's names) and the inputs `inp`.

    `route` [B] (optional): the critic whose value is the smallest at the actor's sample,
    per row, as the other side found it; by default the reference's own. Returns
    every output of step<k>/out/ by name (tensors), and the reference's own routing under
    "_route"."""
    N = c["critics"]
    out = {}
    s, a, r, s2, done = (inp[n] for n in ("s", "a", "r", "s2", "done"))
    la = st["log_alpha"]
    alpha = torch.exp(la).detach()
    actor = net_of(st, "actor")
    with torch.no_grad():
        a2, logp2 = sample(actor, s2, inp["eps_next"], c)
        x2 = torch.cat([s2, a2], 1)
        qn = torch.stack([mlp(net_of(st, f"critic{i}_target"), x2)[:, 0] for i in range(N)])
        y = r + c["gamma"] * (1 - done) * (first_min(qn)[0] - alpha * logp2)
    out["y"] = y
    x = torch.cat([s, a], 1)
    critics = []
    for i in range(N):
        name = f"critic{i}"
        leaves = [st[f"{name}.{t}"].detach().clone().requires_grad_(True) for t in TENSORS]
        q = mlp(dict(zip(TENSORS, leaves)), x)[:, 0]
        loss = ((q - y) ** 2).mean()
        grads = torch.autograd.grad(loss, leaves)
        out[f"{name}.loss"] = loss.detach().reshape(1)
        new, ms, vs = adam(leaves, grads, [st[f"{name}.{t}.adam_m"] for t in TENSORS],
                           [st[f"{name}.{t}.adam_v"] for t in TENSORS], k, c)
        for t, g, p, m, v in zip(TENSORS, grads, new, ms, vs):
            out[f"{name}.{t}.grad"], out[f"{name}.{t}"] = g, p
            out[f"{name}.{t}.adam_m"], out[f"{name}.{t}.adam_v"] = m, v
        critics.append(dict(zip(TENSORS, new)))

    leaves = [st[f"actor.{t}"].detach().clone().requires_grad_(True) for t in TENSORS]
    a_pi, logp = sample(dict(zip(TENSORS, leaves)), s, inp["eps"], c)
    xp = torch.cat([s, a_pi], 1)
    qs = torch.stack([mlp(critics[i], xp)[:, 0] for i in range(N)])
    _, own = first_min(qs.detach())
    out["_route"] = own
    pick = own if route is None else route
    q_min = qs.gather(0, pick[None, :])[0]
    loss = (alpha * logp - q_min).mean()
    grads = torch.autograd.grad(loss, leaves)
    for i in range(N):
        out[f"critic{i}.q_pi"] = qs[i].detach()
    out["actor.loss"] = loss.detach().reshape(1)
    new, ms, vs = adam(leaves, grads, [st[f"actor.{t}.adam_m"] for t in TENSORS],
                       [st[f"actor.{t}.adam_v"] for t in TENSORS], k, c)
    for t, g, p, m, v in zip(TENSORS, grads, new, ms, vs):
        out[f"actor.{t}.grad"], out[f"actor.{t}"] = g, p
        out[f"actor.{t}.adam_m"], out[f"actor.{t}.adam_v"] = m, v

    leaf = la.detach().clone().requires_grad_(True)
    loss = -(leaf * (logp.detach() + c["target_entropy"]).mean()).reshape(1)
    (g,) = torch.autograd.grad(loss.sum(), [leaf])
    out["alpha.loss"], out["log_alpha.grad"] = loss.detach(), g
    (p,), (m,), (v,) = adam([leaf], [g], [st["log_alpha.adam_m"]], [st["log_alpha.adam_v"]],
                            k, c)
    out["log_alpha"], out["log_alpha.adam_m"], out["log_alpha.adam_v"] = p, m, v

    with torch.no_grad():
        tau = c["tau"]
        for i in range(N):
            for t in TENSORS:
                out[f"critic{i}_target.{t}"] = \
                    tau * critics[i][t] + (1 - tau) * st[f"critic{i}_target.{t}"]
    return out


# ----------------------------------------------------------------------------- files

class Problems:
    """Every problem found reading a directory, reported together."""

    def __init__(self):
        self.items = []

    def add(self, name, msg):
        self.items.append((name, msg))


def read_npy(path, shape, problems, name):
    """The array at `path` if it is float32 of `shape`; else None, with the problem
    (missing, unreadable, wrong dtype or shape: expected and found) in `problems`."""
    if not os.path.isfile(path):
        problems.add(name, f"missing file {path}")
        return None
    try:
        a = np.load(path, allow_pickle=False)
    except Exception as e:  # a malformed header, a truncated file
        problems.add(name, f"unreadable {path}: {e}")
        return None
    if a.dtype != np.dtype("<f4"):
        problems.add(name, f"{path}: dtype {a.dtype.str}, expected <f4")
        return None
    if tuple(a.shape) != tuple(shape):
        problems.add(name, f"{path}: shape expected {list(shape)}, found {list(a.shape)}")
        return None
    return a


def read_dir(d, shapes, problems):
    out = {}
    for n, shp in shapes.items():
        a = read_npy(os.path.join(d, n + ".npy"), shp, problems, n)
        if a is not None:
            out[n] = a
    return out


def write_npy(path, a):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, np.ascontiguousarray(a, dtype=np.float32), allow_pickle=False)


def load_config(d):
    path = os.path.join(d, "config.json")
    if not os.path.isfile(path):
        raise SystemExit(f"reference check: missing file {path} (is {d} a `sac --check` "
                         "directory?)")
    with open(path) as f:
        cfg = json.load(f)
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise SystemExit(f"reference check: {path}: missing keys {missing}")
    c = {k: cfg[k] for k in CONFIG_KEYS}
    for k in ("batch", "obs", "action", "hidden", "critics"):
        if not isinstance(c[k], int) or c[k] < 1:
            raise SystemExit(f"reference check: {path}: {k} must be a positive integer, "
                             f"found {c[k]!r}")
    for k, v in OPTIONAL.items():
        c[k] = float(cfg.get(k, v))
    return c, cfg


def count_steps(d):
    k = 0
    while os.path.isdir(os.path.join(d, f"step{k + 1}")):
        k += 1
    return k


def to_dev(arrs, device, dtype):
    return {n: torch.from_numpy(np.array(a)).to(device=device, dtype=dtype)
            for n, a in arrs.items()}


def to_np(t):
    return t.detach().to("cpu", torch.float32).numpy().copy()


# ----------------------------------------------------------------------------- check

def nonfinite(a):
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    return f"non-finite: {int(np.isnan(a).sum())} NaN, {int(np.isinf(a).sum())} Inf"


def rel_err(x, ref, floor=0.0):
    x, ref = x.astype(np.float64), ref.astype(np.float64)
    num = float(np.linalg.norm(x - ref))
    den = max(float(np.linalg.norm(ref)), floor)
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return num / den


def row(name, kind, bound, err=None, note=""):
    return {"name": name, "kind": kind, "error": err, "bound": bound,
            "pass": err is not None and err <= bound, "note": note}


def compare(name, kind, x, ref, bound, floor=0.0, why=None):
    """A row: x the Rust value (None: missing, `why` says why), ref the reference's."""
    if x is None:
        return row(name, kind, bound, note=why or "missing")
    bad = "; ".join(f"{who} {b}" for who, b in (("rust", nonfinite(x)),
                                                 ("reference", nonfinite(ref))) if b)
    if bad:
        return row(name, kind, bound, note=bad)
    return row(name, kind, bound, rel_err(x, ref, floor))


def kind_of(name):
    if name.endswith(".loss"):
        return "loss", BOUND_LOSS
    if name.endswith(".grad"):
        return "grad", BOUND_GRAD
    if name.endswith(".adam_m"):
        return "adam_m", BOUND_ADAM_M
    if name.endswith(".adam_v"):
        return "adam_v", BOUND_ADAM_V
    if "_target." in name:
        return "target", BOUND_TARGET
    if name in ("y",) or name.endswith(".q_pi"):
        return "value", BOUND_VALUE
    return "param", BOUND_PARAM


def compare_step(rust, ref, start, c, why, k):
    """Every row of one step: each output, the routing, alpha, each network's update."""
    rows = []
    for name in output_shapes(c):
        kind, bound = kind_of(name)
        if name.startswith("actor.") and kind in ACTOR_BOUNDS:
            bound = ACTOR_BOUNDS[kind]
        floor = 0.0
        ref_np = to_np(ref[name])
        if kind == "adam_m":
            # The two terms of m may nearly cancel (a gradient that changes sign).
            g = to_np(ref[name[:-len(".adam_m")] + ".grad"])
            floor = (1 - c["beta1"]) * min(1.0, ref["_clip"][name]) * float(np.linalg.norm(g))
        elif name == "alpha.loss":
            # −log α mean(log π + H̄) is 0 at log α = 0; measure it against the size the
            # first update gives it.
            floor = c["lr"] * abs(float(to_np(ref["log_alpha.grad"])[0]))
        rows.append(compare(name, kind, rust.get(name), ref_np, bound, floor, why.get(name)))
    rows.append(routing_row(rust, ref, c))
    la = rust.get("log_alpha")
    rows.append(compare("alpha", "param", None if la is None else np.exp(la),
                        np.exp(to_np(ref["log_alpha"])), BOUND_PARAM, why=why.get("log_alpha")))
    groups = {net: [f"{net}.{t}" for t in TENSORS] for net in trained(c)}
    groups["log_alpha"] = ["log_alpha"]
    for net, names in groups.items():
        rows.append(update_row(net, names, rust, start, c, k))
    return rows


def update_row(net, names, rust, start, c, k):
    """The row `<net>.update`: the Rust update θ_k − θ_{k−1} of one network against
    clip_grad_norm_ and torch.optim.Adam (in double) applied to the Rust side's own
    gradients from its own state before the step. The gradient rows check the gradients;
    this one checks the optimizer alone, tightly: the learning rate, the clipping, the
    bias corrections of step k, the moments' update."""
    need = names + [n + sfx for n in names for sfx in (".grad", ".adam_m", ".adam_v")]
    if any(rust.get(n) is None or nonfinite(rust[n]) for n in need):
        return row(f"{net}.update", "update", BOUND_UPDATE, note="a tensor is unusable")
    f64 = lambda a: torch.from_numpy(np.asarray(a, np.float64))  # noqa: E731
    new, _, _ = adam([f64(start[n]) for n in names], [f64(rust[n + ".grad"]) for n in names],
                     [f64(start[n + ".adam_m"]) for n in names],
                     [f64(start[n + ".adam_v"]) for n in names], k, c)
    num = den = 0.0
    for n, p in zip(names, new):
        want = p.numpy() - start[n].astype(np.float64)
        got = rust[n].astype(np.float64) - start[n].astype(np.float64)
        num += float(np.sum((got - want) ** 2))
        den += float(np.sum(want ** 2))
    err = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)
    return row(f"{net}.update", "update", BOUND_UPDATE, err)


def routing_row(rust, ref, c):
    """Rows whose smallest critic at the actor's sample differs on the two sides although
    the reference's margin is clear of rounding: a wrong min, not TF32."""
    names = [f"critic{i}.q_pi" for i in range(c["critics"])]
    if any(rust.get(n) is None for n in names):
        return row("routing", "routing", 0, note="a q_pi is missing")
    if c["critics"] == 1:
        return row("routing", "routing", 0, 0.0)
    q = np.stack([to_np(ref[n]) for n in names]).astype(np.float64)
    srt = np.sort(q, axis=0)
    margin = srt[1] - srt[0]
    theirs = first_min(torch.from_numpy(np.stack([rust[n] for n in names])))[1].numpy()
    own = ref["_route"].cpu().numpy()
    tol = MARGIN * math.sqrt(float(np.mean(q * q)))
    differ = theirs != own
    wrong = int(np.sum(differ & (margin > tol)))
    return row("routing", "routing", 0, float(wrong),
               f"{int(differ.sum())} of {q.shape[1]} rows differ, {wrong} with a margin "
               f"above {tol:.2e}")


def rust_route(rust, c, device):
    names = [f"critic{i}.q_pi" for i in range(c["critics"])]
    if any(rust.get(n) is None for n in names):
        return None
    return first_min(torch.from_numpy(np.stack([rust[n] for n in names])))[1].to(device)


def clip_scales(ref, c):
    """The clipping factor of each moment's optimizer, by moment name."""
    out = {}
    for net in list(trained(c)) + ["log_alpha"]:
        names = [f"{net}.{t}" for t in TENSORS] if net != "log_alpha" else ["log_alpha"]
        norm = math.sqrt(sum(float(np.sum(to_np(ref[n + ".grad"]).astype(np.float64) ** 2))
                             for n in names))
        scale = c["max_norm"] / (norm + CLIP_EPS)
        for n in names:
            out[n + ".adam_m"] = scale
    return out


def print_rows(rows):
    w = max([len(r["name"]) for r in rows] + [4])
    print(f"  {'name':<{w}}  {'kind':<7}  {'error':>10}  {'bound':>7}  pass")
    for r in rows:
        e = "-" if r["error"] is None else f"{r['error']:.3e}"
        b = f"{r['bound']:.0e}" if r["bound"] else "0"
        note = f"  {r['note']}" if r["note"] else ""
        print(f"  {r['name']:<{w}}  {r['kind']:<7}  {e:>10}  {b:>7}  "
              f"{'ok' if r['pass'] else 'FAIL'}{note}")


def pick_device(name):
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible to torch")
    return torch.device(name)


def json_clean(o):
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: json_clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_clean(v) for v in o]
    return o


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(json_clean(obj), f, indent=1, allow_nan=False)


def cmd_check(args):
    device = pick_device(args.device)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    tf32 = device.type == "cuda" and not args.no_tf32 and dtype == torch.float32
    if device.type == "cuda":
        set_tf32(tf32)
    Matmul.emulate_tf32 = args.emulate_tf32
    d = args.dir
    c, cfg = load_config(d)
    steps = args.steps if args.steps is not None else count_steps(d)
    summary = {"dir": os.path.abspath(d), "device": str(device), "torch": torch.__version__,
               "dtype": args.dtype, "tf32": tf32, "config": cfg, "steps": [],
               "problems": []}
    print(f"reference check of {d}: {steps} step(s), {c['critics']} critics, on "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"{args.dtype}{' with TF32' if tf32 else ''}"
          f"{' (TF32 emulated)' if Matmul.emulate_tf32 else ''}")
    print("sizes " + " ".join(f"{k}={c[k]}" for k in ("batch", "obs", "action", "hidden")))
    problems = Problems()
    if steps < 1:
        problems.add("step1", f"no step directories (step1/) in {d}")
    start = read_dir(os.path.join(d, "init"), state_shapes(c), problems)
    for n, a in start.items():
        if nonfinite(a):
            problems.add(f"init/{n}", nonfinite(a))
    if problems.items:
        return finish(summary, d, args, problems)
    passed = total = 0
    for k in range(1, steps + 1):
        p = Problems()
        inp = read_dir(os.path.join(d, f"step{k}", "in"), input_shapes(c), p)
        if p.items:
            problems.items += [(f"step{k}/in/{n}", m) for n, m in p.items]
            return finish(summary, d, args, problems, passed, total)
        rp = Problems()
        rust = read_dir(os.path.join(d, f"step{k}", "out"), output_shapes(c), rp)
        why = dict(rp.items)
        if start is None:
            rows = [row(f"start of step {k}", "start", 0,
                        note=f"the Rust state after step {k - 1} is unusable")]
        else:
            st = to_dev(start, device, dtype)
            ref = reference_step(st, to_dev(inp, device, dtype), k, c,
                                 route=rust_route(rust, c, device))
            ref["_clip"] = clip_scales(ref, c)
            rows = compare_step(rust, ref, start, c, why, k)
        names = state_shapes(c)
        start = {n: rust[n] for n in names} \
            if all(n in rust and not nonfinite(rust[n]) for n in names) else None
        print(f"\nstep {k}:")
        print_rows(rows)
        ok = sum(r["pass"] for r in rows)
        passed, total = passed + ok, total + len(rows)
        summary["steps"].append({"step": k, "rows": rows})
    return finish(summary, d, args, problems, passed, total)


def finish(summary, d, args, problems, passed=0, total=0):
    if problems.items:
        print("\nproblems with the directory:")
        for n, m in problems.items:
            print(f"  {n}: {m}")
    summary["problems"] = [{"name": n, "note": m} for n, m in problems.items]
    total += len(problems.items)
    summary["passed"], summary["total"] = passed, total
    fails = [r["name"] for s in summary["steps"] for r in s["rows"] if not r["pass"]]
    if fails:
        print(f"\nfailed: {', '.join(fails[:20])}{' ...' if len(fails) > 20 else ''}")
    path = args.json or os.path.join(d, "reference_check.json")
    write_json(path, summary)
    print(f"\nsummary written to {path}")
    print(f"reference check: {passed} of {total} passed")
    return 0 if passed == total and total > 0 else 1


# ----------------------------------------------------------------------------- fake dump

def init_state(c, rng):
    """PyTorch Linear's initialisation, U(±1/√fan_in), targets copies, α = 1, zero
    moments: the Rust side's initial state, from numpy's generator."""
    st = {}
    for net, shapes in trained(c).items():
        fan = shapes["l1.w"][1], shapes["l2.w"][1], shapes["l3.w"][1]
        for t, shp in shapes.items():
            bound = 1 / math.sqrt(fan[int(t[1]) - 1])
            st[f"{net}.{t}"] = rng.uniform(-bound, bound, size=shp).astype(np.float32)
            st[f"{net}.{t}.adam_m"] = np.zeros(shp, np.float32)
            st[f"{net}.{t}.adam_v"] = np.zeros(shp, np.float32)
            if net != "actor":
                st[f"{net}_target.{t}"] = st[f"{net}.{t}"].copy()
    for n in ("log_alpha", "log_alpha.adam_m", "log_alpha.adam_v"):
        st[n] = np.zeros(1, np.float32)
    return st


def random_inputs(c, rng):
    B, S, A = c["batch"], c["obs"], c["action"]
    f = np.float32
    return {"s": rng.uniform(-1, 1, (B, S)).astype(f), "a": rng.uniform(-0.99, 0.99, (B, A)).astype(f),
            "r": rng.uniform(-1, 1, B).astype(f), "s2": rng.uniform(-1, 1, (B, S)).astype(f),
            "done": (rng.random(B) < 0.1).astype(f), "eps": rng.standard_normal((B, A)).astype(f),
            "eps_next": rng.standard_normal((B, A)).astype(f)}


def fake_config(args):
    c = {k: getattr(args, k) for k in ("batch", "obs", "action", "hidden", "critics")}
    c.update(DEFAULT_HYPER)
    c["target_entropy"] = -float(args.action)
    c.update(OPTIONAL)
    return c


def write_fake(d, c, steps, seed=0):
    """A directory in the Rust side's layout, each step the reference's own from the
    state the one before wrote."""
    rng = np.random.default_rng(seed)
    cfg = dict(c, seed=seed, steps=steps, schedule="reference.py")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    st = init_state(c, rng)
    for n, a in st.items():
        write_npy(os.path.join(d, "init", n + ".npy"), a)
    inp = random_inputs(c, rng)
    for k in range(1, steps + 1):
        # The Rust step trains on one batch; the noise is new at every step.
        inp["eps"] = rng.standard_normal(inp["eps"].shape).astype(np.float32)
        inp["eps_next"] = rng.standard_normal(inp["eps"].shape).astype(np.float32)
        for n, a in inp.items():
            write_npy(os.path.join(d, f"step{k}", "in", n + ".npy"), a)
        out = reference_step(to_dev(st, "cpu", torch.float32),
                             to_dev(inp, "cpu", torch.float32), k, c)
        for n in output_shapes(c):
            write_npy(os.path.join(d, f"step{k}", "out", n + ".npy"), to_np(out[n]))
        st = {n: to_np(out[n]) for n in state_shapes(c)}


def cmd_write_fake(args):
    Matmul.emulate_tf32 = args.emulate_tf32
    write_fake(args.dir, fake_config(args), args.steps, args.seed)
    print(f"wrote config.json, init/ and step1..{args.steps}/ to {args.dir}")
    return 0


# ----------------------------------------------------------------------------- bench

# Rows of the bench's replay buffer, the Rust example's default (`DEFAULT_REPLAY`).
REPLAY_ROWS = 1 << 18


class BenchModel:
    """The update with N critics in PyTorch, as fast as eager PyTorch reasonably goes:
    fused Adam (foreach on a CPU), foreach clipping and a foreach lerp for Polyak, the
    critic losses summed into one backward (their gradients stay separate), the noise
    drawn by torch.randn. `capturable` Adam for a CUDA graph or torch.compile."""

    def __init__(self, c, device, gen, capturable):
        self.c = c
        B, S, A = c["batch"], c["obs"], c["action"]
        rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
        st = init_state(c, rng)
        dev = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
        self.critics = [[dev(st[f"critic{i}.{t}"]).requires_grad_(True) for t in TENSORS]
                        for i in range(c["critics"])]
        self.targets = [[dev(st[f"critic{i}_target.{t}"]) for t in TENSORS]
                        for i in range(c["critics"])]
        self.actor = [dev(st[f"actor.{t}"]).requires_grad_(True) for t in TENSORS]
        self.log_alpha = torch.zeros(1, device=device, requires_grad=True)
        kw = dict(lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
        if device.type == "cuda":
            kw["fused"] = True
        else:
            kw["foreach"] = True
        kw["capturable"] = capturable
        self.opts = [torch.optim.Adam(p, **kw) for p in self.critics] + \
            [torch.optim.Adam(self.actor, **kw), torch.optim.Adam([self.log_alpha], **kw)]
        # A replay buffer on the device, as the Rust step's, that each update draws its
        # batch from (the same work: an index draw and a gather per update).
        rows = c.get("replay", REPLAY_ROWS)
        self.replay = torch.rand(rows, 2 * S + A + 2, generator=gen).to(device)
        self.device = device
        self.draw_batch()
        self.losses = torch.zeros(c["critics"] + 2, device=device)

    def draw_batch(self):
        """B rows of the replay buffer into the batch's tensors, in place (a CUDA graph
        replays into the same memory)."""
        c = self.c
        B, S, A = c["batch"], c["obs"], c["action"]
        idx = torch.randint(self.replay.shape[0], (B,), device=self.device)
        x = self.replay.index_select(0, idx)
        parts = dict(s=x[:, :S] * 2 - 1, s2=x[:, S:2 * S] * 2 - 1,
                     a=(x[:, 2 * S:2 * S + A] * 2 - 1) * 0.99, r=x[:, -2] * 2 - 1,
                     done=(x[:, -1] < 0.1).float())
        for name, v in parts.items():
            if hasattr(self, name):
                getattr(self, name).copy_(v)
            else:
                setattr(self, name, v.clone())

    def critic_loss(self, eps_next):
        c = self.c
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            a2, logp2 = sample(dict(zip(TENSORS, self.actor)), self.s2, eps_next, c)
            x2 = torch.cat([self.s2, a2], 1)
            qn = torch.stack([mlp(dict(zip(TENSORS, t)), x2)[:, 0] for t in self.targets])
            y = self.r + c["gamma"] * (1 - self.done) * (qn.min(0).values - alpha * logp2)
        x = torch.cat([self.s, self.a], 1)
        return torch.stack([((mlp(dict(zip(TENSORS, p)), x)[:, 0] - y) ** 2).mean()
                            for p in self.critics])

    def actor_loss(self, eps):
        c = self.c
        alpha = self.log_alpha.detach().exp()
        a, logp = sample(dict(zip(TENSORS, self.actor)), self.s, eps, c)
        x = torch.cat([self.s, a], 1)
        q = torch.stack([mlp({t: w.detach() for t, w in zip(TENSORS, p)}, x)[:, 0]
                         for p in self.critics])
        loss_pi = (alpha * logp - q.min(0).values).mean()
        loss_a = -(self.log_alpha * (logp.detach() + c["target_entropy"]).mean()).sum()
        return loss_pi, loss_a

    def step_opt(self, opt):
        torch.nn.utils.clip_grad_norm_(opt.param_groups[0]["params"], self.c["max_norm"],
                                       foreach=True)
        opt.step()

    def polyak(self):
        with torch.no_grad():
            for p, t in zip(self.critics, self.targets):
                torch._foreach_lerp_(t, [w.detach() for w in p], self.c["tau"])

    def make_update(self, compiled=None):
        """The whole update as one function; `compiled` wraps its pieces (torch.compile)."""
        wrap = compiled or (lambda f: f)
        critic_loss, actor_loss = wrap(self.critic_loss), wrap(self.actor_loss)
        opt_steps = [wrap(lambda o=o: self.step_opt(o)) for o in self.opts]
        polyak = wrap(self.polyak)
        N, B, A = self.c["critics"], self.c["batch"], self.c["action"]

        def update():
            for o in self.opts:
                o.zero_grad(set_to_none=True)
            self.draw_batch()
            noise = torch.randn(2, B, A, device=self.device)
            lq = critic_loss(noise[0])
            lq.sum().backward()
            for i in range(N):
                opt_steps[i]()
            lpi, la = actor_loss(noise[1])
            (lpi + la).backward()
            opt_steps[N]()
            opt_steps[N + 1]()
            polyak()
            self.losses[:N].copy_(lq.detach())
            self.losses[N] = lpi.detach()
            self.losses[N + 1] = la.detach()
        return update


def run_variant(name, c, args, device):
    """Times one variant: `eager`, `graph` or `compile:MODE`."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(args.seed)
    torch.manual_seed(args.seed)
    capturable = name != "eager"
    model = BenchModel(c, device, gen, capturable)
    t0 = time.perf_counter()
    if name == "eager":
        step = model.make_update()
    elif name == "graph":
        if device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        update = model.make_update()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                update()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        for o in model.opts:
            o.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            update()
        step = graph.replay
    elif name.startswith("compile:"):
        mode = name.split(":", 1)[1]
        importlib.import_module("torch._dynamo").reset()
        # dynamic=False: the four optimizer steps share one code object with different
        # shapes, and automatic dynamic shapes then fail in torch 2.11's guards
        # (IndexError in produce_guards, measured on the H200).
        inner = model.make_update(lambda f: torch.compile(f, mode=mode, dynamic=False))

        def step():
            if mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            inner()
    else:
        raise SystemExit(f"unknown variant {name!r}: expected eager, graph or compile:MODE")
    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    setup_s = time.perf_counter() - t0
    times = []
    if device.type == "cuda":
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(args.iters)]
        for a, b in ev:
            a.record()
            step()
            b.record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in ev]
    else:
        for _ in range(args.iters):
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1e3)
    losses = model.losses.tolist()
    if not all(math.isfinite(x) for x in losses):
        raise RuntimeError(f"non-finite losses {losses}")
    return {"ok": True, "median_ms": statistics.median(times),
            "p10_ms": float(np.percentile(times, 10)), "p90_ms": float(np.percentile(times, 90)),
            "iters": args.iters, "warmup": args.warmup, "setup_s": setup_s, "losses": losses}


def bench_config(args):
    c = fake_config(args)
    return c


def cmd_bench(args):
    device = pick_device(args.device)
    if device.type == "cuda":
        set_tf32(not args.no_tf32)
    c = bench_config(args)
    if args.only:
        try:
            res = run_variant(args.only, c, args, device)
        except Exception as e:  # reported to the parent, which goes on
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                   "traceback": traceback.format_exc()[-4000:]}
        write_json(args.json, res)
        return 0 if res["ok"] else 1
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    nparam = sum(math.prod(s) for net in trained(c).values() for s in net.values())
    print(f"bench on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"torch {torch.__version__}, TF32 {'on' if device.type == 'cuda' and not args.no_tf32 else 'off'}, "
          f"{c['critics']} critics, {nparam} parameters")
    print("sizes " + " ".join(f"{k}={c[k]}" for k in ("batch", "obs", "action", "hidden"))
          + f"; median of {args.iters} updates after {args.warmup} warm-up, "
          f"{args.limit:.0f} s limit per variant")
    results = {}
    for v in variants:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "variant.json")
            cmd = [sys.executable, os.path.abspath(__file__), "bench", "--only", v,
                   "--json", out, "--device", device.type, "--critics", str(args.critics),
                   "--iters", str(args.iters), "--warmup", str(args.warmup),
                   "--seed", str(args.seed)]
            for k in ("batch", "obs", "action", "hidden"):
                cmd += [f"--{k}", str(getattr(args, k))]
            if args.no_tf32:
                cmd.append("--no-tf32")
            try:
                p = subprocess.run(cmd, timeout=args.limit, capture_output=True, text=True)
                if os.path.isfile(out):
                    with open(out) as f:
                        res = json.load(f)
                else:
                    res = {"ok": False, "error": f"exit status {p.returncode}: "
                           f"{(p.stderr or p.stdout)[-1500:]}"}
            except subprocess.TimeoutExpired:
                res = {"ok": False, "skipped": True,
                       "error": f"skipped: over the {args.limit:.0f} s limit"}
        res["total_s"] = time.perf_counter() - t0
        results[v] = res
        if not res["ok"]:
            print(f"  {v}: {res['error'][:300]}", file=sys.stderr)
    print(f"\n  {'variant':<36} {'median ms':>10} {'p10':>9} {'p90':>9} {'setup s':>8}")
    for v, r in results.items():
        if r["ok"]:
            print(f"  {v:<36} {r['median_ms']:>10.3f} {r['p10_ms']:>9.3f} {r['p90_ms']:>9.3f} "
                  f"{r['setup_s']:>8.1f}")
        else:
            print(f"  {v:<36} {'skipped' if r.get('skipped') else 'failed':>10}  "
                  f"{r['error'][:100]}")
    ok = {v: r for v, r in results.items() if r["ok"]}
    summary = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "cuda": torch.version.cuda,
               "tf32": device.type == "cuda" and not args.no_tf32, "config": c,
               "parameters": nparam, "iters": args.iters, "warmup": args.warmup,
               "limit_s": args.limit, "variants": results,
               "median_ms": {v: r["median_ms"] for v, r in ok.items()}}
    path = args.json or os.path.join(os.environ.get("OUT") or ".", "sac_pytorch_bench.json")
    write_json(path, summary)
    print(f"wrote {path}")
    return 0 if ok else 1


# ----------------------------------------------------------------------------- CLI

def add_sizes(p, defaults=DEFAULT_SIZES):
    for k, v in defaults.items():
        p.add_argument(f"--{k}", type=int, default=v, metavar="N", help=f"(default {v})")
    p.add_argument("--critics", type=int, default=2, metavar="N", help="(default 2)")


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="DIR layout: see the top of this file.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="compare a `sac --check` directory with the reference")
    c.add_argument("dir", metavar="DIR")
    c.add_argument("--steps", type=int, default=None, help="default: every step<k>/")
    c.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda when available")
    c.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    c.add_argument("--no-tf32", action="store_true", help="plain f32 GEMMs on cuda")
    c.add_argument("--emulate-tf32", action="store_true",
                   help="round every GEMM operand to TF32 in software (for a CPU)")
    c.add_argument("--json", default=None, help="default: DIR/reference_check.json")
    c.set_defaults(fn=cmd_check)

    w = sub.add_parser("write-fake", help="a directory in the Rust layout, from the reference")
    w.add_argument("dir", metavar="DIR")
    add_sizes(w, dict(batch=64, obs=5, action=3, hidden=16))
    w.add_argument("--steps", type=int, default=3)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--emulate-tf32", action="store_true")
    w.set_defaults(fn=cmd_write_fake)

    b = sub.add_parser("bench", help="time the update in PyTorch")
    add_sizes(b)
    b.add_argument("--device", choices=("cuda", "cpu"), default=None)
    b.add_argument("--no-tf32", action="store_true")
    b.add_argument("--iters", type=int, default=200, help="timed updates (default 200)")
    b.add_argument("--warmup", type=int, default=30)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--variants",
                   default="eager,graph,compile:default,compile:reduce-overhead,"
                           "compile:max-autotune-no-cudagraphs")
    b.add_argument("--limit", type=float, default=300.0,
                   help="seconds a variant may take, compiling included (default 300)")
    b.add_argument("--json", default=None, help="default: $OUT/sac_pytorch_bench.json")
    b.add_argument("--only", default=None, help=argparse.SUPPRESS)
    b.set_defaults(fn=cmd_bench)
    return ap


def main(argv=None):
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
