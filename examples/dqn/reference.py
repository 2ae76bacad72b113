#!/usr/bin/env python3
"""PyTorch oracle for the DQN training step of examples/dqn (contract: MODEL.md).

The Rust example and this script meet only through a directory of .npy files, laid out
below. Everything in it is numpy's .npy format (version 1.0 header), little-endian,
C order: float32 ('<f4') for every tensor except `act`, which is int32 ('<i4').
Shapes are exactly those of MODEL.md; a bias or scalar of one element has shape [1],
never 0-d. `<d>` is the branch index 0..D-1 and `<k>` the step number 1..K, both in
decimal without padding (step1, step2, ..., step10).

DIR/
  sizes.json                    one flat JSON object, every key required:
                                  "B","S","H","D","G","A","N","C","W","E","Hh"  (integers)
                                  "gamma","lr","beta1","beta2","eps","max_norm",
                                  "c_iql","c_iqn","c_attn","c_cql","c_conf"     (numbers)
                                the coefficients weight L = L_td + c_iql L_iql + c_iqn L_iqn
                                + c_attn L_attn + c_cql L_cql + c_conf L_conf. Other keys
                                (e.g. "steps", "seed") are allowed and ignored.
  init/<name>.npy               online parameters before step 1, one file per name:
                                  w1 b1 w2 b2 wv bv
                                  wg.<d> bg.<d> wa.<d> ba.<d>      for d in 0..D
                                  we_hi be_hi we_lo be_lo wphi bphi wq bq
                                  wemb bemb wqkv wo wp bp
  target/<name>.npy             target parameters θ⁻ (never updated): w1 b1 w2 b2 wv bv
                                and wg.<d> bg.<d> wa.<d> ba.<d>
  step<k>/in/<t>.npy            the batch of step k, t in:
                                  s [B,S]  s2 [B,S]  act [B,D] (int32 in 0..A)  r [B]
                                  done [B] (0.0 or 1.0)  win [B,W,S]  tau [B,N] (in (0,1))
  step<k>/out/loss.npy          [7]: L, L_td, L_iql, L_iqn, L_attn, L_cql, L_conf
  step<k>/out/grad/<name>.npy   dL/d<name> for every online parameter, before clipping
  step<k>/out/param/<name>.npy  every online parameter after step k's Adam update
  step<k>/out/adam_m/<name>.npy Adam's first moment m of every parameter after step k
  step<k>/out/adam_v/<name>.npy Adam's second moment v of every parameter after step k
Files not named here are ignored.

Adam's m and v are zero before step 1 and the step count t is k at step k. Step k
starts from the state after step k-1: parameters, m and v (after step 0: init/, zeros).

Commands (run with --help for every flag):
  reference.py check DIR [--device cuda|cpu] [--steps K]
      recompute each step k from the Rust side's state after step k-1 (step 1 from
      init/) and step k's inputs, and compare with step<k>/out/ per tensor as
      ‖x − ref‖/‖ref‖: each loss component on its own ≤ 1e-3, grad ≤ 1e-2, param ≤ 1e-3,
      adam_m ≤ 1e-2 (against max(‖m‖, (1 − β1)‖clipped grad‖)), adam_v ≤ 2.1e-2, and
      the update of all parameters together (row update.all, θ_k − θ_{k−1}) ≤ 5e-2.
      Print a table per step and `reference check: N passed, M failed`; exit 1 on any
      failure. Also run the reference's own
      trajectory from init/ (each step from its own previous state) and report, without
      failing on it, how far the Rust outputs are from it: there rounding differences
      compound (see MODEL.md, "Precision"). JSON summary to $OUT/reference_check.json
      (DIR/reference_check.json when OUT is unset). Default --steps: every step<k>/in/.
  reference.py write-inputs DIR [sizes] [--steps 3] [--seed 0]
      write sizes.json, init/, target/ and step<k>/in/ with random data
  reference.py write-expected DIR [--device ...] [--steps K] [--from-step J]
      write step<k>/out/ as the reference computes it (a stand-in for the Rust side);
      with --from-step J, steps J..K only, step J starting from DIR's step<J-1>/out/
  reference.py bench [--device cuda] [sizes] [--steps 200] [--warmup 30]
                     [--variants eager,graph,compile] [--compile-modes M1,M2,...|none]
      time the full step in PyTorch (eager, CUDA graph, torch.compile);
      JSON to $OUT/pytorch_bench.json (./pytorch_bench.json when OUT is unset)
Sizes are flags named for MODEL.md (--B 16384 --S 64 ...) or spelled out (--batch ...).
Precision: on cuda, TF32 GEMMs unless --no-tf32; --dtype float64 computes the oracle in
double. check and write-expected also take --emulate-tf32 [--tf32-rounding nearest|
truncate]: every GEMM operand rounded to TF32 in software, to study on a CPU what TF32
does to the comparison.
`--write-inputs` and `--write-expected` are accepted as spellings of the subcommands.
"""

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

SIZE_KEYS = ("B", "S", "H", "D", "G", "A", "N", "C", "W", "E", "Hh")
DEFAULT_SIZES = dict(B=16384, S=64, H=256, D=4, G=32, A=5, N=32, C=64, W=8, E=64, Hh=4)
HYPER_KEYS = ("gamma", "lr", "beta1", "beta2", "eps", "max_norm",
              "c_iql", "c_iqn", "c_attn", "c_cql", "c_conf")
DEFAULT_HYPER = dict(gamma=0.99, lr=3e-4, beta1=0.9, beta2=0.999, eps=1e-8, max_norm=10.0,
                     c_iql=0.5, c_iqn=0.5, c_attn=0.1, c_cql=0.1, c_conf=0.05)
LOSS_NAMES = ("L", "L_td", "L_iql", "L_iqn", "L_attn", "L_cql", "L_conf")
INPUT_NAMES = ("s", "s2", "act", "r", "done", "win", "tau")
# Fixed by MODEL.md, not by sizes.json.
EXPECTILE_HI, EXPECTILE_LO = 0.7, 0.3
CLIP_EPS = 1e-6
BOUND_LOSS, BOUND_GRAD, BOUND_PARAM = 1e-3, 1e-2, 1e-3
# From the same m_{k−1}, v_{k−1}: m_k's error is (1 − β1) times the clipped gradient's, so
# it keeps the gradient's bound when measured against max(‖m_k‖, (1 − β1)‖clip g_k‖) (the
# two terms may cancel); v_k adds (1 − β2) g_k², whose relative error is at most
# 2r + r² ≤ 2.01e-2 for a gradient within r = 1e-2, and β2 v_{k−1} cannot cancel it.
BOUND_ADAM_M, BOUND_ADAM_V = 1e-2, 2.1e-2
# The update θ_k − θ_{k−1} of all parameters together, which the parameter rows barely
# see (an update is ~lr, small beside a parameter). An element whose gradient sign rounds
# differently moves 2·lr apart in Adam's first steps, so the update's relative error is
# about 2·√(share of such elements), and that share grows as the batch shrinks: 5e-2
# allows 6e-4 of them. Measured with TF32 on an H200: at most 1.7e-3 at the default
# sizes, 2.4e-3 at the fallback sizes, 8.4e-3 at batch 1024 with G = 48. A learning rate
# 5% or more off, or a wrong bias correction, is off by more.
BOUND_UPDATE = 5e-2
# What a step writes to step<k>/out/ per parameter, with the bound each is held to.
STATE_KINDS = (("grad", BOUND_GRAD), ("param", BOUND_PARAM),
               ("adam_m", BOUND_ADAM_M), ("adam_v", BOUND_ADAM_V))


# ----------------------------------------------------------------------------- shapes

def trunk_shapes(z):
    """Parameters the online and the target network share, in a fixed order."""
    H, S, G, A = z["H"], z["S"], z["G"], z["A"]
    out = {"w1": (H, S), "b1": (H,), "w2": (H, H), "b2": (H,), "wv": (1, H), "bv": (1,)}
    for d in range(z["D"]):
        out[f"wg.{d}"] = (2 * G, H)
        out[f"bg.{d}"] = (2 * G,)
        out[f"wa.{d}"] = (A, G)
        out[f"ba.{d}"] = (A,)
    return out


def param_shapes(z):
    """Every online (trained) parameter, in a fixed order."""
    H, S, C, E = z["H"], z["S"], z["C"], z["E"]
    out = trunk_shapes(z)
    out.update({
        "we_hi": (1, H), "be_hi": (1,), "we_lo": (1, H), "be_lo": (1,),
        "wphi": (H, C), "bphi": (H,), "wq": (1, H), "bq": (1,),
        "wemb": (E, S), "bemb": (E,), "wqkv": (3 * E, E), "wo": (E, E),
        "wp": (1, E), "bp": (1,),
    })
    return out


def input_specs(z):
    B, S, D, W, N = z["B"], z["S"], z["D"], z["W"], z["N"]
    return {"s": ((B, S), np.float32), "s2": ((B, S), np.float32),
            "act": ((B, D), np.int32), "r": ((B,), np.float32),
            "done": ((B,), np.float32), "win": ((B, W, S), np.float32),
            "tau": ((B, N), np.float32)}


def validate_sizes(z):
    for k in SIZE_KEYS:
        if not isinstance(z[k], int) or z[k] < 1:
            raise ValueError(f"size {k} must be a positive integer, got {z[k]!r}")
    if z["E"] % z["Hh"]:
        raise ValueError(f"E={z['E']} is not a multiple of Hh={z['Hh']}")


# ----------------------------------------------------------------------------- precision

class Matmul:
    """Where every GEMM of the model goes, so a test can emulate TF32 on a CPU.

    `emulate_tf32` rounds both operands of every product (forward and backward) to
    TF32's 10-bit mantissa before an ordinary f32 product: what the tensor cores see.
    `tf32_rounding` says how: "nearest" (ties to even) or "truncate" (the low 13 bits
    dropped); which one a given cuBLAS kernel does is not documented.
    """
    emulate_tf32 = False
    tf32_rounding = "nearest"


def round_tf32(x):
    if x.dtype != torch.float32:
        return x
    i = x.contiguous().view(torch.int32)
    if Matmul.tf32_rounding == "nearest":
        i = i + (0xFFF + ((i >> 13) & 1))  # round to nearest, ties to even
    return (i & ~0x1FFF).view(torch.float32)


class _Tf32Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_b = b is not None
        y = round_tf32(x) @ round_tf32(w).t()
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        g = round_tf32(gy)
        gx = g @ round_tf32(w)
        gw = (g.reshape(-1, g.shape[-1]).t() @ round_tf32(x).reshape(-1, x.shape[-1]))
        gb = gy.reshape(-1, gy.shape[-1]).sum(0) if ctx.has_b else None
        return gx, gw, gb


class _Tf32Bmm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return round_tf32(a) @ round_tf32(b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        g = round_tf32(g)
        return g @ round_tf32(b).transpose(-1, -2), round_tf32(a).transpose(-1, -2) @ g


def lin(x, w, b=None):
    """x wᵀ + b."""
    if Matmul.emulate_tf32:
        return _Tf32Linear.apply(x, w, b)
    return F.linear(x, w, b)


def bmm(a, b):
    if Matmul.emulate_tf32:
        return _Tf32Bmm.apply(a, b)
    return a @ b


def set_tf32(device, on):
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


# ----------------------------------------------------------------------------- the model

def huber(x):
    """x²/2 if |x| ≤ 1 else |x| − 1/2 (δ = 1)."""
    ax = x.abs()
    return torch.where(ax <= 1.0, 0.5 * x * x, ax - 0.5)


def network(p, x, z, fast=False):
    """f(x; θ) of MODEL.md: the trunk's output h [B,H] and q [B,D,A].

    `fast` computes the same thing with the branches' GEMMs batched (bench only).
    """
    D, G = z["D"], z["G"]
    h1 = torch.relu(lin(x, p["w1"], p["b1"]))
    h = torch.relu(lin(h1, p["w2"], p["b2"]))
    v = lin(h, p["wv"], p["bv"])                                   # [B,1]
    if fast:
        wg = torch.cat([p[f"wg.{d}"] for d in range(D)], 0)        # [D*2G, H]
        bg = torch.cat([p[f"bg.{d}"] for d in range(D)], 0)
        u = F.linear(h, wg, bg).view(h.shape[0], D, 2 * G)         # [B,D,2G]
        g = u[..., :G] * torch.sigmoid(u[..., G:])                 # [B,D,G]
        wa = torch.stack([p[f"wa.{d}"] for d in range(D)], 0)      # [D,A,G]
        ba = torch.stack([p[f"ba.{d}"] for d in range(D)], 0)      # [D,A]
        adv = torch.bmm(g.transpose(0, 1), wa.transpose(1, 2)).transpose(0, 1) + ba
        return h, v[:, :, None] + adv - adv.mean(-1, keepdim=True)
    qs = []
    for d in range(D):
        u = lin(h, p[f"wg.{d}"], p[f"bg.{d}"])                     # [B,2G]
        g = u[:, :G] * torch.sigmoid(u[:, G:])                     # GLU [B,G]
        adv = lin(g, p[f"wa.{d}"], p[f"ba.{d}"])                   # [B,A]
        qs.append(v + adv - adv.mean(1, keepdim=True))             # dueling
    return h, torch.stack(qs, 1)                                   # [B,D,A]


def attention_pred(p, win, z, fast=False):
    """pred [B] of the attention head over the window."""
    B, W, E, Hh = win.shape[0], z["W"], z["E"], z["Hh"]
    dh = E // Hh
    emb = lin(win, p["wemb"], p["bemb"])                           # [B,W,E]
    qkv = lin(emb, p["wqkv"])                                      # [B,W,3E]
    qa, ka, va = qkv.split(E, dim=-1)

    def heads(x):  # head j = columns j*dh:(j+1)*dh
        return x.reshape(B, W, Hh, dh).transpose(1, 2)            # [B,Hh,W,dh]

    qa, ka, va = heads(qa), heads(ka), heads(va)
    if fast:
        att = F.scaled_dot_product_attention(qa, ka, va)
    else:
        scores = bmm(qa, ka.transpose(-1, -2)) / math.sqrt(dh)    # [B,Hh,Wq,Wk]
        att = bmm(torch.softmax(scores, dim=-1), va)               # softmax over keys
    att = att.transpose(1, 2).reshape(B, W, E)
    o = lin(att, p["wo"])                                          # [B,W,E]
    return lin(o.mean(1), p["wp"], p["bp"])[:, 0]                  # [B]


def losses(p, tp, batch, z, hp, fast=False, aux=None, frozen=None):
    """[L, L_td, L_iql, L_iqn, L_attn, L_cql, L_conf] as one tensor with its graph.

    aux (optional dict) receives the values MODEL.md takes with no gradient (a_star, y,
    qbar); frozen (optional dict) supplies y and qbar instead of computing them, so a
    finite-difference test holds them fixed as the analytic gradient does.
    """
    s, s2, r, done, win, tau = (batch[k] for k in ("s", "s2", "r", "done", "win", "tau"))
    act = batch["act"].long()
    C = z["C"]
    h, q = network(p, s, z, fast)                                  # [B,H], [B,D,A]
    with torch.no_grad():
        _, q_next = network(p, s2, z, fast)                        # q'
        _, q_tgt = network(tp, s2, z, fast)                        # q⁻
        a_star = q_next.argmax(-1, keepdim=True)                   # first maximum on ties
        y = r[:, None] + hp["gamma"] * (1.0 - done)[:, None] * q_tgt.gather(-1, a_star)[..., 0]
    qa = q.gather(-1, act[..., None])[..., 0]                      # [B,D]
    qbar = qa.detach().mean(1)                                     # [B]
    if frozen is not None:
        y, qbar = frozen["y"], frozen["qbar"]
    if aux is not None:
        aux.update(a_star=a_star[..., 0], y=y, qbar=qbar)
    l_td = huber(qa - y).mean()

    d_hi = qbar - lin(h, p["we_hi"], p["be_hi"])[:, 0]
    d_lo = qbar - lin(h, p["we_lo"], p["be_lo"])[:, 0]
    l_iql = ((EXPECTILE_HI - (d_hi < 0).to(d_hi.dtype)).abs() * d_hi * d_hi).mean() \
        + ((EXPECTILE_LO - (d_lo < 0).to(d_lo.dtype)).abs() * d_lo * d_lo).mean()

    freq = math.pi * torch.arange(1, C + 1, device=tau.device, dtype=tau.dtype)  # π (i+1)
    cosf = torch.cos(tau[..., None] * freq)                        # [B,N,C]
    phi = torch.relu(lin(cosf, p["wphi"], p["bphi"]))              # [B,N,H]
    zq = lin(h[:, None, :] * phi, p["wq"], p["bq"])[..., 0]        # [B,N]
    u = y.mean(1)[:, None] - zq
    l_iqn = ((tau - (u < 0).to(u.dtype)).abs() * huber(u)).mean()

    pred = attention_pred(p, win, z, fast)
    l_attn = ((pred - r) ** 2).mean()

    l_cql = (torch.logsumexp(q, dim=-1) - qa).mean()
    l_conf = qa.var(dim=1, correction=0).mean()

    total = l_td + hp["c_iql"] * l_iql + hp["c_iqn"] * l_iqn + hp["c_attn"] * l_attn \
        + hp["c_cql"] * l_cql + hp["c_conf"] * l_conf
    return torch.stack([total, l_td, l_iql, l_iqn, l_attn, l_cql, l_conf])


# ----------------------------------------------------------------------------- update

def clip_grads(grads, max_norm):
    """Global-norm clipping; returns (clipped grads, norm, scale) with norm/scale as tensors."""
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    scale = torch.clamp(max_norm / (norm + CLIP_EPS), max=1.0)
    return [g * scale for g in grads], norm, scale


@torch.no_grad()
def adam_hand(params, grads, ms, vs, t, hp):
    """One Adam step in place, written as MODEL.md writes it; t starts at 1.

    The bias corrections are computed on the host in double precision, as the Rust
    step does.
    """
    b1, b2, lr, eps = hp["beta1"], hp["beta2"], hp["lr"], hp["eps"]
    bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
    for p, g, m, v in zip(params, grads, ms, vs):
        m.mul_(b1).add_(g, alpha=1.0 - b1)
        v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        p.sub_(lr * (m / bc1) / (torch.sqrt(v / bc2) + eps))


@torch.no_grad()
def clip_adam_foreach(params, grads, ms, vs, t, hp):
    """Clipping and the same Adam with _foreach ops and a device step count `t`
    (a 0-d tensor, incremented here): no host synchronisation, so it can be captured."""
    b1, b2, lr, eps = hp["beta1"], hp["beta2"], hp["lr"], hp["eps"]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    scale = torch.clamp(hp["max_norm"] / (norm + CLIP_EPS), max=1.0)
    grads = torch._foreach_mul(grads, scale)
    t.add_(1)
    bc1 = 1.0 - torch.pow(b1, t)
    bc2_sqrt = torch.sqrt(1.0 - torch.pow(b2, t))
    torch._foreach_mul_(ms, b1)
    torch._foreach_add_(ms, grads, alpha=1.0 - b1)
    torch._foreach_mul_(vs, b2)
    torch._foreach_addcmul_(vs, grads, grads, value=1.0 - b2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_div_(denom, bc2_sqrt)
    torch._foreach_add_(denom, eps)
    upd = torch._foreach_div(ms, denom)
    torch._foreach_mul_(upd, lr / bc1)
    torch._foreach_sub_(params, upd)


def reference_step(params, target, batch, ms, vs, t, z, hp):
    """One full step in place on params/ms/vs. Returns losses, raw grads, norm, scale."""
    names = list(params)
    leaves = [params[n] for n in names]
    for x in leaves:
        x.requires_grad_(True)
    out = losses(params, target, batch, z, hp)
    grads = torch.autograd.grad(out[0], leaves)
    for x in leaves:
        x.requires_grad_(False)
    out = out.detach()
    clipped, norm, scale = clip_grads(grads, hp["max_norm"])
    adam_hand(leaves, clipped, [ms[n] for n in names], [vs[n] for n in names], t, hp)
    return out, dict(zip(names, grads)), float(norm), float(scale)


# ----------------------------------------------------------------------------- files

class Problems:
    """Every problem found while reading a directory, reported together."""

    def __init__(self):
        self.items = []

    def add(self, name, msg):
        self.items.append((name, msg))


def read_npy(path, shape, dtype, problems, name):
    if not os.path.isfile(path):
        problems.add(name, f"missing file {path}")
        return None
    try:
        a = np.load(path, allow_pickle=False)
    except Exception as e:  # a malformed header, a truncated file
        problems.add(name, f"unreadable {path}: {e}")
        return None
    want = np.dtype(dtype).newbyteorder("<")
    if a.dtype != want:
        problems.add(name, f"dtype {a.dtype.str}, expected {want.str}")
        return None
    if a.ndim > 1 and not a.flags.c_contiguous:
        problems.add(name, "Fortran order, expected C order")
        return None
    if tuple(a.shape) != tuple(shape):
        problems.add(name, f"shape {list(a.shape)}, expected {list(shape)}")
        return None
    return a


def write_npy(path, a):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    a = np.ascontiguousarray(a)
    assert a.dtype in (np.dtype("<f4"), np.dtype("<i4")), a.dtype
    np.save(path, a, allow_pickle=False)


def load_config(d):
    path = os.path.join(d, "sizes.json")
    with open(path) as f:
        cfg = json.load(f)
    missing = [k for k in SIZE_KEYS + HYPER_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    z = {k: cfg[k] for k in SIZE_KEYS}
    validate_sizes(z)
    hp = {k: float(cfg[k]) for k in HYPER_KEYS}
    return z, hp, cfg


def load_params(d, sub, shapes, problems):
    out = {}
    for n, shp in shapes.items():
        a = read_npy(os.path.join(d, sub, n + ".npy"), shp, np.float32, problems, f"{sub}/{n}")
        if a is not None:
            out[n] = a
    return out


def load_inputs(d, k, z, problems):
    out = {}
    for n, (shp, dt) in input_specs(z).items():
        name = f"step{k}/in/{n}"
        a = read_npy(os.path.join(d, f"step{k}", "in", n + ".npy"), shp, dt, problems, name)
        if a is None:
            continue
        if n == "act" and a.size and (a.min() < 0 or a.max() >= z["A"]):
            problems.add(name, f"values outside 0..{z['A']}")
        elif n == "done" and not np.all((a == 0) | (a == 1)):
            problems.add(name, "values other than 0 and 1")
        elif n == "tau" and not np.all((a > 0) & (a < 1)):
            problems.add(name, "values outside (0, 1)")
        elif a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            problems.add(name, "non-finite values")
        out[n] = a
    return out


def count_steps(d):
    k = 0
    while os.path.isdir(os.path.join(d, f"step{k + 1}", "in")):
        k += 1
    return k


def to_dev(arrs, device, dtype):
    """Copies: on the CPU from_numpy would share memory with the arrays read."""
    return {n: torch.from_numpy(a.copy()).to(device=device,
                                             dtype=torch.int32 if a.dtype.kind == "i" else dtype)
            for n, a in arrs.items()}


def to_np(t):
    """A copy: on the CPU .numpy() would share memory with a tensor Adam updates in place."""
    return t.detach().to("cpu", torch.float32).numpy().copy()


# ----------------------------------------------------------------------------- check

def nonfinite(a):
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    return f"non-finite: {int(np.isnan(a).sum())} NaN, {int(np.isinf(a).sum())} Inf"


def rel_err(x, ref, floor=0.0):
    """‖x − ref‖ / max(‖ref‖, floor)."""
    x = x.astype(np.float64)
    ref = ref.astype(np.float64)
    den = max(float(np.linalg.norm(ref)), floor)
    num = np.linalg.norm(x - ref)
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return float(num / den)


def new_row(name, kind, bound, note=""):
    """A row of the table, failing until an error within `bound` is set."""
    return {"tensor": name, "kind": kind, "bound": bound, "rel_err": None, "ok": False,
            "note": note}


def compare(name, kind, x, ref, bound, floor=0.0):
    """One row of the table. x: the Rust value (None: missing/unreadable), ref: ours;
    the error is relative to max(‖ref‖, floor)."""
    row = new_row(name, kind, bound)
    if x is None:
        row["note"] = "missing or unreadable"
        return row
    bad_x, bad_ref = nonfinite(x), nonfinite(ref)
    if bad_x or bad_ref:
        row["note"] = "; ".join(
            s for s in (bad_x and f"rust {bad_x}", bad_ref and f"reference {bad_ref}") if s)
        return row
    row["rel_err"] = rel_err(x, ref, floor)
    row["ok"] = row["rel_err"] <= bound
    return row


def global_rel(xs, refs):
    num = sum(float(np.sum((x.astype(np.float64) - r.astype(np.float64)) ** 2))
              for x, r in zip(xs, refs))
    den = sum(float(np.sum(r.astype(np.float64) ** 2)) for r in refs)
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)


def print_rows(rows, file=None):
    w = max([len(r["tensor"]) for r in rows] + [6])
    print(f"  {'tensor':<{w}}  {'rel err':>10}  {'bound':>7}  ok", file=file)
    for r in rows:
        e = "-" if r["rel_err"] is None else f"{r['rel_err']:.3e}"
        ok = "ok" if r["ok"] else "FAIL"
        note = f"  {r['note']}" if r["note"] else ""
        b = "-" if r["bound"] is None else f"{r['bound']:.0e}"
        print(f"  {r['tensor']:<{w}}  {e:>10}  {b:>7}  {ok}{note}", file=file)


def pick_device(name):
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible to torch")
    return dev


def precision_setup(args, device):
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    tf32 = device.type == "cuda" and not args.no_tf32 and dtype == torch.float32
    set_tf32(device, tf32)
    Matmul.emulate_tf32 = bool(getattr(args, "emulate_tf32", False))
    Matmul.tf32_rounding = getattr(args, "tf32_rounding", "nearest")
    if Matmul.emulate_tf32 and dtype != torch.float32:
        raise SystemExit("--emulate-tf32 needs --dtype float32")
    return dtype, tf32


def zeros_like_np(arrs):
    return {n: np.zeros_like(a) for n, a in arrs.items()}


def on_device(state, device, dtype):
    """(params, m, v) as numpy dicts -> the same as device tensors (copies)."""
    return tuple(to_dev(x, device, dtype) for x in state)


def run_step(state, target, batch, k, z, hp):
    """Step k of the reference from `state` = (params, m, v), dicts of device tensors,
    which it updates in place (in the oracle's dtype: a float64 trajectory stays float64).

    Returns what the Rust side writes to step<k>/out/, as numpy, with the clipping scale
    under "clip_scale", and the gradient norm."""
    params, ms, vs = state
    loss, grads, norm, scale = reference_step(params, target, batch, ms, vs, k, z, hp)
    out = {"loss": to_np(loss), "grad": {n: to_np(g) for n, g in grads.items()},
           "clip_scale": scale}
    for kind, x in (("param", params), ("adam_m", ms), ("adam_v", vs)):
        out[kind] = {n: to_np(t) for n, t in x.items()}
    return out, norm


def read_step_out(d, k, shapes, problems, kinds=None):
    """The Rust side's step<k>/out/ (`kinds`: only those of STATE_KINDS, and no loss); a
    missing or malformed file is None, its problem recorded under the row name it
    belongs to."""
    outp = os.path.join(d, f"step{k}", "out")
    res = {}
    if kinds is None:
        kinds = [kind for kind, _ in STATE_KINDS]
        res["loss"] = read_npy(os.path.join(outp, "loss.npy"), (7,), np.float32, problems,
                               "loss")
    for kind in kinds:
        res[kind] = {n: read_npy(os.path.join(outp, kind, n + ".npy"), shp, np.float32,
                                 problems, f"{kind}.{n}")
                     for n, shp in shapes.items()}
    return res


def compare_outputs(rust, ref, why, hp):
    """One row per loss component and per parameter of each kind in STATE_KINDS."""
    rows = [compare(f"loss.{ln}", "loss",
                    None if rust["loss"] is None else rust["loss"][i:i + 1],
                    ref["loss"][i:i + 1], BOUND_LOSS)
            for i, ln in enumerate(LOSS_NAMES)]
    for kind, bound in STATE_KINDS:
        for n, x in rust[kind].items():
            floor = 0.0
            if kind == "adam_m":
                # m_k = β1 m_{k−1} + (1 − β1) g_k: its error is (1 − β1) times the clipped
                # gradient's, and the two terms may nearly cancel (a bias whose gradient
                # changes sign), so measure it against the gradient term's size too.
                floor = (1.0 - hp["beta1"]) * ref["clip_scale"] * float(
                    np.linalg.norm(ref["grad"][n].astype(np.float64)))
            rows.append(compare(f"{kind}.{n}", kind, x, ref[kind][n], bound, floor))
    for r in rows:
        key = r["tensor"] if r["kind"] != "loss" else "loss"
        if key in why:
            r["note"] = why[key]
    return rows


def state_after(out):
    """(params, m, v) of a step's outputs, or the reasons the next step cannot start
    from them."""
    bad = []
    for kind in ("param", "adam_m", "adam_v"):
        for n, a in out[kind].items():
            if a is None:
                bad.append(f"{kind}.{n} missing or unreadable")
            elif nonfinite(a):
                bad.append(f"{kind}.{n} {nonfinite(a)}")
    if bad:
        return None, bad
    return (out["param"], out["adam_m"], out["adam_v"]), []


def update_row(rust_params, start, ref_params, usable):
    """The row `update.all`: the step's update θ_k − θ_{k−1} of the `usable` parameters
    together, Rust against the reference from the same start (the others fail their own
    rows)."""
    row = new_row("update.all", "update", BOUND_UPDATE)
    if not usable:
        row["note"] = "no usable parameter"
        return row
    row["rel_err"] = global_rel([rust_params[n] - start[n] for n in usable],
                                [ref_params[n] - start[n] for n in usable])
    row["ok"] = row["rel_err"] <= BOUND_UPDATE
    if len(usable) < len(rust_params):
        row["note"] = f"over {len(usable)} of {len(rust_params)} parameters"
    return row


def fmt_opt(x):
    return "-" if x is None else f"{x:.6g}"


def worst_by_kind(rows):
    """{kind: (tensor, rel_err)} of the largest error of each kind (non-finite or
    missing counts as inf)."""
    out = {}
    for r in rows:
        e = math.inf if r["rel_err"] is None else r["rel_err"]
        if r["kind"] not in out or e > out[r["kind"]][1]:
            out[r["kind"]] = (r["tensor"], e)
    return out


def cmd_check(args):
    device = pick_device(args.device)
    dtype, tf32 = precision_setup(args, device)
    d = args.dir
    z, hp, _ = load_config(d)
    steps = args.steps if args.steps is not None else count_steps(d)
    shapes = param_shapes(z)
    names = list(shapes)
    summary = {"dir": os.path.abspath(d), "device": device_name(device),
               "torch": torch.__version__, "dtype": args.dtype, "tf32": tf32,
               "emulate_tf32": Matmul.emulate_tf32 and Matmul.tf32_rounding,
               "sizes": z, "hyper": hp, "steps": [], "setup_problems": []}
    passed = failed = 0

    print(f"reference check of {d}: {steps} step(s) on {summary['device']}, "
          f"{args.dtype}{' with TF32' if tf32 else ''}"
          f"{f' (TF32 emulated, {Matmul.tf32_rounding})' if Matmul.emulate_tf32 else ''}")
    print("sizes " + " ".join(f"{k}={z[k]}" for k in SIZE_KEYS))
    print("each step starts from the Rust side's state after the step before; the "
          "reference's own trajectory is reported below each table")

    problems = Problems()
    init = load_params(d, "init", shapes, problems)
    tgt = load_params(d, "target", trunk_shapes(z), problems)
    if steps < 1:
        problems.add("step1", "no step directories (step1/in/) found")
    for n, a in list(init.items()) + [("target/" + n, a) for n, a in tgt.items()]:
        bad = nonfinite(a)
        if bad:
            problems.add(n, bad)
    if problems.items:
        return finish_setup_failure(problems, summary, d)

    target = to_dev(tgt, device, dtype)
    start_state = (init, zeros_like_np(init), zeros_like_np(init))
    rust_state, rust_state_bad = start_state, []
    own_state = on_device(start_state, device, dtype)  # the reference's own trajectory

    for k in range(1, steps + 1):
        problems = Problems()
        batch_np = load_inputs(d, k, z, problems)
        if problems.items:
            return finish_setup_failure(problems, summary, d, passed, failed)
        batch = to_dev(batch_np, device, dtype)
        rp = Problems()  # unreadable Rust outputs are failures of their own row
        rust = read_step_out(d, k, shapes, rp)
        why = dict(rp.items)

        # The Rust side's parameters that can be compared as a whole (the others fail
        # their own rows).
        usable = [n for n in names if rust["param"][n] is not None
                  and not nonfinite(rust["param"][n])]

        # The check: step k from exactly the state the Rust side started it from.
        norm = scale = loss_ref = update_drift = None
        if rust_state is None:
            rows = [new_row(f"start of step {k}", "start", None,
                            f"the Rust state after step {k - 1} is unusable: "
                            + "; ".join(rust_state_bad[:5])
                            + (" ..." if len(rust_state_bad) > 5 else ""))]
        else:
            ref, norm = run_step(on_device(rust_state, device, dtype), target, batch, k, z,
                                 hp)
            scale = ref["clip_scale"]
            rows = compare_outputs(rust, ref, why, hp)
            loss_ref = float(ref["loss"][0])
            rows.append(update_row(rust["param"], rust_state[0], ref["param"], usable))
            update_drift = rows[-1]["rel_err"]

        # Informative: the reference's own trajectory, where differences compound.
        own, own_norm = run_step(own_state, target, batch, k, z, hp)
        own_rows = compare_outputs(rust, own, why, hp)
        drift = global_rel([rust["param"][n] for n in usable],
                           [own["param"][n] for n in usable]) if usable else None

        gnorm_rust = None
        if all(g is not None and not nonfinite(g) for g in rust["grad"].values()):
            gnorm_rust = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2))
                                       for g in rust["grad"].values()))
        rust_state, rust_state_bad = state_after(rust)

        print(f"\nstep {k}: L={fmt_opt(loss_ref)}  "
              f"grad norm={fmt_opt(norm)} (rust {fmt_opt(gnorm_rust)})  clip scale={fmt_opt(scale)}")
        print_rows(rows)
        over = [r for r in own_rows if not r["ok"]]
        worst = worst_by_kind(own_rows)
        print("  reference's own trajectory from init/ (informative): worst "
              + ", ".join(f"{t} {e:.3e}" for t, e in worst.values())
              + f"; {len(over)} of {len(own_rows)} rows over their bounds"
              + (": " + ", ".join(r["tensor"] for r in over[:10]) if over else ""))
        print(f"  drift of all parameters from that trajectory ‖θ_rust − θ_own‖/‖θ_own‖ = "
              f"{'-' if drift is None else f'{drift:.3e}'}")
        p_ = sum(r["ok"] for r in rows)
        passed += p_
        failed += len(rows) - p_
        summary["steps"].append({
            "step": k, "rows": rows, "grad_norm_ref": norm, "grad_norm_rust": gnorm_rust,
            "clip_scale_ref": scale, "update_drift": update_drift,
            "own_trajectory": {"grad_norm": own_norm, "param_drift": drift,
                               "worst": {kd: {"tensor": t, "rel_err": e}
                                         for kd, (t, e) in worst.items()},
                               "over_bound": [r["tensor"] for r in over]}})

    return finish(summary, d, passed, failed)


def finish_setup_failure(problems, summary, d, passed=0, failed=0):
    print("\nproblems with the directory:")
    for name, msg in problems.items:
        print(f"  {name}: {msg}")
    summary["setup_problems"] = [{"tensor": n, "note": m} for n, m in problems.items]
    return finish(summary, d, passed, failed + len(problems.items))


def finish(summary, d, passed, failed):
    summary["passed"], summary["failed"] = passed, failed
    out_dir = os.environ.get("OUT") or d
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "reference_check.json")
    write_json(path, summary)
    fails = [r["tensor"] for s in summary["steps"] for r in s["rows"] if not r["ok"]]
    fails += [p["tensor"] for p in summary["setup_problems"]]
    if fails:
        shown = ", ".join(fails[:20]) + (" ..." if len(fails) > 20 else "")
        print(f"\nfailed: {shown}")
    print(f"\nsummary written to {path}")
    print(f"reference check: {passed} passed, {failed} failed")
    return 1 if failed else 0


def json_clean(o):
    """Strict JSON: a non-finite float becomes its string ("inf", "nan")."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: json_clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_clean(v) for v in o]
    return o


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(json_clean(obj), f, indent=1, allow_nan=False)


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


# ----------------------------------------------------------------------------- writers

def cmd_write_inputs(args):
    z = {k: getattr(args, k) for k in SIZE_KEYS}
    validate_sizes(z)
    hp = {k: getattr(args, k) for k in HYPER_KEYS}
    write_inputs(args.dir, z, hp, args.steps, args.seed)
    print(f"wrote sizes.json, init/, target/ and step1..{args.steps}/in/ to {args.dir}")
    return 0


def write_inputs(d, z, hp, steps, seed=0):
    rng = np.random.default_rng(seed)
    cfg = dict(z)
    cfg.update(hp)
    cfg["steps"] = steps
    cfg["seed"] = seed
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "sizes.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    shapes = param_shapes(z)
    init = {}
    for n, shp in shapes.items():
        # PyTorch Linear's init, U(±1/√fan_in) for weight and bias; a bias takes the
        # fan-in of the weight it belongs to.
        fan_in = shp[1] if len(shp) == 2 else shapes["w" + n[1:]][1]
        bound = 1.0 / math.sqrt(fan_in)
        init[n] = rng.uniform(-bound, bound, size=shp).astype(np.float32)
        write_npy(os.path.join(d, "init", n + ".npy"), init[n])
    for n, shp in trunk_shapes(z).items():
        fan_in = shp[1] if len(shp) == 2 else shapes["w" + n[1:]][1]
        noise = rng.uniform(-0.1, 0.1, size=shp) / math.sqrt(fan_in)
        write_npy(os.path.join(d, "target", n + ".npy"), (init[n] + noise).astype(np.float32))
    B = z["B"]

    def f32(a):
        return np.asarray(a, dtype=np.float32)

    for k in range(1, steps + 1):
        p = os.path.join(d, f"step{k}", "in")
        write_npy(os.path.join(p, "s.npy"), f32(rng.standard_normal((B, z["S"]))))
        write_npy(os.path.join(p, "s2.npy"), f32(rng.standard_normal((B, z["S"]))))
        write_npy(os.path.join(p, "act.npy"),
                  rng.integers(0, z["A"], size=(B, z["D"])).astype(np.int32))
        write_npy(os.path.join(p, "r.npy"), f32(rng.standard_normal(B)))
        write_npy(os.path.join(p, "done.npy"), f32(rng.random(B) < 0.1))
        write_npy(os.path.join(p, "win.npy"), f32(rng.standard_normal((B, z["W"], z["S"]))))
        write_npy(os.path.join(p, "tau.npy"), f32(rng.uniform(0.02, 0.98, size=(B, z["N"]))))


def cmd_write_expected(args):
    device = pick_device(args.device)
    dtype, _ = precision_setup(args, device)
    d = args.dir
    z, hp, _ = load_config(d)
    steps = args.steps if args.steps is not None else count_steps(d)
    first = args.from_step
    if not 1 <= first <= max(steps, 1):
        print(f"--from-step {first}: expected a step in 1..{steps}", file=sys.stderr)
        return 2
    problems = Problems()
    shapes = param_shapes(z)
    state = None
    if first == 1:
        init = load_params(d, "init", shapes, problems)
        state = (init, zeros_like_np(init), zeros_like_np(init))
    else:
        # Only the state is needed: step J-1's loss and gradients may be missing.
        got = read_step_out(d, first - 1, shapes, problems, kinds=("param", "adam_m", "adam_v"))
        if not problems.items:
            state, bad = state_after(got)
            for msg in bad:
                problems.add(f"step{first - 1}/out", msg)
    tgt = load_params(d, "target", trunk_shapes(z), problems)
    batches = {k: load_inputs(d, k, z, problems) for k in range(first, steps + 1)}
    if problems.items:
        for n, m in problems.items:
            print(f"{n}: {m}", file=sys.stderr)
        return 2
    target = to_dev(tgt, device, dtype)
    state = on_device(state, device, dtype)
    for k in range(first, steps + 1):
        out, _ = run_step(state, target, to_dev(batches[k], device, dtype), k, z, hp)
        outp = os.path.join(d, f"step{k}", "out")
        write_npy(os.path.join(outp, "loss.npy"), out["loss"])
        for kind, _ in STATE_KINDS:
            for n in shapes:
                write_npy(os.path.join(outp, kind, n + ".npy"), out[kind][n])
    print(f"wrote step{first}..{steps}/out/ to {d}")
    return 0


# ----------------------------------------------------------------------------- bench

def random_batch(z, device, dtype, gen):
    B = z["B"]

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    return {
        "s": randn(B, z["S"]), "s2": randn(B, z["S"]),
        "act": torch.randint(0, z["A"], (B, z["D"]), device=device, dtype=torch.int32,
                             generator=gen),
        "r": randn(B),
        "done": (torch.rand(B, device=device, generator=gen) < 0.1).to(dtype),
        "win": randn(B, z["W"], z["S"]),
        "tau": 0.02 + 0.96 * torch.rand(B, z["N"], device=device, dtype=dtype, generator=gen),
    }


def random_params(shapes, device, dtype, gen):
    out = {}
    for n, shp in shapes.items():
        fan_in = shp[1] if len(shp) == 2 else shapes["w" + n[1:]][1]
        bound = 1.0 / math.sqrt(fan_in)
        out[n] = (torch.rand(shp, device=device, dtype=dtype, generator=gen) * 2 - 1) * bound
    return out


class BenchState:
    """Parameters, optimizer state and one static batch, fresh for every variant."""

    def __init__(self, init, target, batch, device):
        self.names = list(init)
        self.params = [init[n].clone().requires_grad_(True) for n in self.names]
        self.target = {n: x.clone() for n, x in target.items()}
        self.batch = {n: x.clone() for n, x in batch.items()}
        self.ms = [torch.zeros_like(x) for x in self.params]
        self.vs = [torch.zeros_like(x) for x in self.params]
        self.t = torch.zeros((), device=device, dtype=self.params[0].dtype)
        self.first_loss = None

    def pdict(self):
        return dict(zip(self.names, self.params))


def time_steps(step, steps, warmup, device):
    for _ in range(warmup):
        step()
    if device.type != "cuda":
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        return times, sum(times) / steps
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(steps)]
    t0 = time.perf_counter()
    for a, b in ev:
        a.record()
        step()
        b.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    return [a.elapsed_time(b) for a, b in ev], wall


def bench_eager(st, z, hp, fast):
    def step():
        out = losses(st.pdict(), st.target, st.batch, z, hp, fast)
        grads = torch.autograd.grad(out[0], st.params)
        clip_adam_foreach(st.params, list(grads), st.ms, st.vs, st.t, hp)
        return out
    return step


def bench_graph(st, z, hp, fast):
    """Whole-step capture, after the documented recipe: warm up on a side stream,
    capture once, replay with the static inputs and state updated in place."""
    first = bench_eager(st, z, hp, fast)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            out = first()
            if i == 0:
                st.first_loss = out[0].detach().clone()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = first()
    st.static_out = static_out

    def step():
        graph.replay()
        return static_out
    return step


def bench_compile(st, z, hp, fast, mode):
    import torch._dynamo
    torch._dynamo.reset()
    for x in st.params + st.ms + st.vs + [st.t] + list(st.batch.values()) \
            + list(st.target.values()):
        torch._dynamo.mark_static_address(x)
    loss_c = torch.compile(lambda p, tp, b: losses(p, tp, b, z, hp, fast), mode=mode)
    opt_c = torch.compile(lambda p, g, m, v, t: clip_adam_foreach(p, g, m, v, t, hp), mode=mode)

    def step():
        torch.compiler.cudagraph_mark_step_begin()
        out = loss_c(st.pdict(), st.target, st.batch)
        grads = torch.autograd.grad(out[0], st.params)
        opt_c(st.params, list(grads), st.ms, st.vs, st.t)
        return out
    return step


def cmd_bench(args):
    device = pick_device(args.device)
    dtype, tf32 = precision_setup(args, device)
    z = {k: getattr(args, k) for k in SIZE_KEYS}
    validate_sizes(z)
    hp = {k: getattr(args, k) for k in HYPER_KEYS}
    fast = args.impl == "fast"
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)
    shapes = param_shapes(z)
    init = random_params(shapes, device, dtype, gen)
    target = {n: init[n] + 0.01 * torch.randn(init[n].shape, device=device, dtype=dtype,
                                              generator=gen) for n in trunk_shapes(z)}
    batch = random_batch(z, device, dtype, gen)
    nparam = sum(math.prod(s) for s in shapes.values())
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    modes = [] if args.compile_modes in ("", "none") else \
        [m.strip() for m in args.compile_modes.split(",") if m.strip()]
    plan = []
    for v in variants:
        if v == "compile":
            plan += [(f"compile:{m}", m) for m in modes]
        elif v in ("eager", "graph"):
            plan.append((v, None))
        else:
            raise SystemExit(f"unknown variant {v!r} (eager, graph, compile)")

    print(f"bench on {device_name(device)}, torch {torch.__version__}, {args.dtype}"
          f"{' TF32' if tf32 else ''}, impl={args.impl}, {nparam} parameters")
    print("sizes " + " ".join(f"{k}={z[k]}" for k in SIZE_KEYS)
          + f"; {args.steps} timed steps after {args.warmup} warm-up")
    results = {}
    for name, mode in plan:
        st = BenchState(init, target, batch, device)
        t0 = time.perf_counter()
        step = first = None
        try:
            if name == "eager":
                step = bench_eager(st, z, hp, fast)
            elif name == "graph":
                if device.type != "cuda":
                    raise RuntimeError("CUDA graphs need --device cuda")
                step = bench_graph(st, z, hp, fast)
            else:
                step = bench_compile(st, z, hp, fast, mode)
            first = step()
            if st.first_loss is None:
                st.first_loss = first[0].detach()
            first_loss = float(st.first_loss)  # the loss of step 1, a check on the variant
            first = None
            times, wall = time_steps(step, args.steps, args.warmup, device)
            final = float(step()[0].detach())
            res = {"ok": True, "median_ms": statistics.median(times),
                   "p10_ms": float(np.percentile(times, 10)),
                   "p90_ms": float(np.percentile(times, 90)),
                   "mean_ms": statistics.fmean(times), "wall_ms_per_step": wall,
                   "first_loss": first_loss, "last_loss": final}
        except Exception as e:  # a mode that does not work is reported, not fatal
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                   "traceback": traceback.format_exc()[-4000:]}
            print(f"  {name}: FAILED: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        res["total_s"] = time.perf_counter() - t0
        results[name] = res
        step = first = st = None  # frees a captured graph's memory pool before the next
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    ok = {n: r for n, r in results.items() if r["ok"]}
    best_compile = min((n for n in ok if n.startswith("compile:")),
                       key=lambda n: ok[n]["median_ms"], default=None)
    print(f"\n  {'variant':<40} {'median ms':>10} {'p10':>9} {'p90':>9} "
          f"{'wall ms':>9} {'loss@1':>10}")
    for n, r in results.items():
        if r["ok"]:
            print(f"  {n:<40} {r['median_ms']:>10.3f} {r['p10_ms']:>9.3f} {r['p90_ms']:>9.3f} "
                  f"{r['wall_ms_per_step']:>9.3f} {r['first_loss']:>10.5g}")
        else:
            print(f"  {n:<40} {'failed':>10}  {r['error'][:120]}")
    if best_compile:
        print(f"  best torch.compile mode: {best_compile} ({ok[best_compile]['median_ms']:.3f} ms)")
    out = {"device": device_name(device), "torch": torch.__version__,
           "cuda": torch.version.cuda, "dtype": args.dtype, "tf32": tf32, "impl": args.impl,
           "sizes": z, "hyper": hp, "parameters": nparam, "steps": args.steps,
           "warmup": args.warmup, "variants": results,
           "median_ms": {n: r["median_ms"] for n, r in ok.items()},
           "best_compile": best_compile}
    path = args.json or os.path.join(os.environ.get("OUT") or ".", "pytorch_bench.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json(path, out)
    print(f"wrote {path}")
    return 0 if ok else 1


# ----------------------------------------------------------------------------- CLI

def add_sizes(p):
    g = p.add_argument_group("sizes (MODEL.md's names work too: --B, --S, ...)")
    long = dict(B="batch", S="state", H="hidden", D="branches", G="glu", A="actions",
                N="quantiles", C="cos", W="window", E="emb", Hh="heads")
    for k in SIZE_KEYS:
        g.add_argument(f"--{long[k]}", f"--{k}", dest=k, type=int, default=DEFAULT_SIZES[k],
                       metavar="N", help=f"{k} (default {DEFAULT_SIZES[k]})")
    h = p.add_argument_group("hyper-parameters")
    for k in HYPER_KEYS:
        h.add_argument(f"--{k.replace('_', '-')}", dest=k, type=float, default=DEFAULT_HYPER[k],
                       metavar="X", help=f"(default {DEFAULT_HYPER[k]})")


def add_precision(p, emulation=False):
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda when available, else cpu")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--no-tf32", action="store_true", help="plain f32 GEMMs on cuda")
    if emulation:  # an experiment on a CPU: what TF32 GEMMs do to the comparison
        p.add_argument("--emulate-tf32", action="store_true",
                       help="round every GEMM operand to TF32 in software")
        p.add_argument("--tf32-rounding", choices=("nearest", "truncate"), default="nearest",
                       help="how --emulate-tf32 rounds (default nearest, ties to even)")


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="DIR layout: see the top of this file.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("check", help="compare a directory of Rust results with the reference")
    c.add_argument("dir", metavar="DIR")
    c.add_argument("--steps", type=int, default=None, help="default: every step<k>/ present")
    add_precision(c, emulation=True)
    c.set_defaults(fn=cmd_check)

    w = sub.add_parser("write-inputs", help="write sizes.json, init/, target/, step<k>/in/")
    w.add_argument("dir", metavar="DIR")
    w.add_argument("--steps", type=int, default=3)
    w.add_argument("--seed", type=int, default=0)
    add_sizes(w)
    w.set_defaults(fn=cmd_write_inputs)

    e = sub.add_parser("write-expected", help="write step<k>/out/ as the reference computes it")
    e.add_argument("dir", metavar="DIR")
    e.add_argument("--steps", type=int, default=None)
    e.add_argument("--from-step", type=int, default=1,
                   help="start at this step, from DIR's step<J-1>/out/ state")
    add_precision(e, emulation=True)
    e.set_defaults(fn=cmd_write_expected)

    b = sub.add_parser("bench", help="time the step in PyTorch")
    add_sizes(b)
    add_precision(b)
    b.add_argument("--steps", type=int, default=200, help="timed steps (the median is reported)")
    b.add_argument("--warmup", type=int, default=30, help="untimed steps before them")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--variants", default="eager,graph,compile",
                   help="comma-separated, of eager, graph (CUDA only), compile")
    b.add_argument("--compile-modes", default="max-autotune-no-cudagraphs,reduce-overhead,default",
                   help="comma-separated torch.compile modes, or 'none'")
    b.add_argument("--impl", choices=("fast", "plain"), default="fast",
                   help="fast: batched branch GEMMs and scaled_dot_product_attention")
    b.add_argument("--json", default=None, help="default: $OUT/pytorch_bench.json")
    b.set_defaults(fn=cmd_bench)
    return ap


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--write-inputs", "--write-expected", "--check", "--bench"):
        argv[0] = argv[0][2:]
    args = parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
