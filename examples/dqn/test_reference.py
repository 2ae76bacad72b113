"""Tests of the PyTorch oracle (reference.py), on the CPU at tiny sizes.

    python3 -m pytest examples/dqn/test_reference.py
"""

import json
import math
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as R  # noqa: E402

# Tiny, and deliberately not MODEL.md's D=4 or E/Hh=16, so nothing relies on those.
TINY = dict(B=7, S=5, H=8, D=3, G=4, A=5, N=4, C=6, W=3, E=8, Hh=2)
HP = dict(R.DEFAULT_HYPER)


def size_flags(z=TINY):
    out = []
    for k, v in z.items():
        out += [f"--{k}", str(v)]
    return out


def run_main(argv, capsys):
    rc = R.main(argv)
    return rc, capsys.readouterr().out


@pytest.fixture(autouse=True)
def cpu_f32():
    R.Matmul.emulate_tf32, R.Matmul.tf32_rounding = False, "nearest"
    torch.manual_seed(0)
    yield
    R.Matmul.emulate_tf32, R.Matmul.tf32_rounding = False, "nearest"


@pytest.fixture
def expected_dir(tmp_path, monkeypatch, capsys):
    """A DIR whose 'Rust outputs' are the reference's own, 3 steps."""
    d = str(tmp_path / "dir")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    assert R.main(["--write-inputs", d, "--steps", "3", "--seed", "1"] + size_flags()) == 0
    assert R.main(["--write-expected", d, "--device", "cpu"]) == 0
    capsys.readouterr()
    return d


def summary(tmp_path):
    with open(tmp_path / "out" / "reference_check.json") as f:
        return json.load(f)


def failing(s):
    return [(st["step"], r["tensor"]) for st in s["steps"] for r in st["rows"] if not r["ok"]]


def load_np(d, z=TINY, step=1):
    p = R.Problems()
    init = R.load_params(d, "init", R.param_shapes(z), p)
    tgt = R.load_params(d, "target", R.trunk_shapes(z), p)
    batch = R.load_inputs(d, step, z, p)
    assert not p.items, p.items
    return init, tgt, batch


def to64(arrs):
    return R.to_dev(arrs, "cpu", torch.float64)


# ----------------------------------------------------------------------------- the check

def test_check_passes_on_its_own_outputs(expected_dir, tmp_path, capsys):
    rc, out = run_main(["check", expected_dir, "--device", "cpu"], capsys)
    assert rc == 0, out
    n_rows = 3 * (7 + 4 * len(R.param_shapes(TINY)) + 1)
    assert f"reference check: {n_rows} passed, 0 failed" in out.splitlines()[-1]
    s = summary(tmp_path)
    assert s["passed"] == n_rows and s["failed"] == 0
    assert [st["step"] for st in s["steps"]] == [1, 2, 3]
    assert all(st["own_trajectory"]["param_drift"] == 0.0 for st in s["steps"])
    assert all(st["update_drift"] == 0.0 for st in s["steps"])
    kinds = {r["kind"] for r in s["steps"][0]["rows"]}
    assert kinds == {"loss", "grad", "param", "adam_m", "adam_v", "update"}


def test_steps_flag_limits_the_check(expected_dir, capsys):
    rc, out = run_main(["check", expected_dir, "--device", "cpu", "--steps", "1"], capsys)
    assert rc == 0
    assert "step 2" not in out


def test_perturbed_gradient_fails_by_name(expected_dir, tmp_path, capsys):
    path = os.path.join(expected_dir, "step2", "out", "grad", "wqkv.npy")
    np.save(path, (np.load(path) * 1.1).astype(np.float32))
    rc, out = run_main(["check", expected_dir, "--device", "cpu"], capsys)
    assert rc == 1
    assert failing(summary(tmp_path)) == [(2, "grad.wqkv")]
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("grad.wqkv ")
                and "FAIL" in ln)
    assert "1.000e-01" in line  # ‖0.1 g‖ / ‖g‖
    assert out.splitlines()[-1].endswith("1 failed")


def test_nan_in_rust_gradient_is_named(expected_dir, tmp_path, capsys):
    path = os.path.join(expected_dir, "step1", "out", "grad", "b2.npy")
    g = np.load(path)
    g[3] = np.nan
    np.save(path, g)
    lpath = os.path.join(expected_dir, "step3", "out", "loss.npy")
    loss = np.load(lpath)
    loss[5] = np.inf  # L_cql
    np.save(lpath, loss)
    rc, out = run_main(["check", expected_dir, "--device", "cpu"], capsys)
    assert rc == 1
    assert failing(summary(tmp_path)) == [(1, "grad.b2"), (3, "loss.L_cql")]
    b2 = next(ln for ln in out.splitlines() if ln.strip().startswith("grad.b2 ") and "FAIL" in ln)
    assert "rust non-finite: 1 NaN, 0 Inf" in b2
    cql = next(ln for ln in out.splitlines() if "loss.L_cql" in ln and "FAIL" in ln)
    assert "0 NaN, 1 Inf" in cql


def test_non_finite_reference_is_named(expected_dir, tmp_path, capsys):
    # A huge but finite expectile head overflows the reference's L_iql in f32.
    path = os.path.join(expected_dir, "init", "we_hi.npy")
    np.save(path, np.full_like(np.load(path), 1e30))
    rc, out = run_main(["check", expected_dir, "--device", "cpu", "--steps", "1"], capsys)
    assert rc == 1
    rows = {r["tensor"]: r for r in summary(tmp_path)["steps"][0]["rows"]}
    assert not rows["loss.L_iql"]["ok"]
    assert "reference non-finite" in rows["loss.L_iql"]["note"]
    assert "loss.L_iql" in out


def test_each_step_starts_from_the_rust_state(expected_dir, tmp_path, capsys):
    # A Rust side whose step 1 updates w1 wrongly and then carries on correctly from its
    # own (wrong) state: only step 1 fails. Its own trajectory leaves the reference's,
    # which the check reports but does not fail on.
    path = os.path.join(expected_dir, "step1", "out", "param", "w1.npy")
    np.save(path, (np.load(path) * 1.05).astype(np.float32))
    assert R.main(["write-expected", expected_dir, "--device", "cpu", "--from-step", "2"]) == 0
    rc, out = run_main(["check", expected_dir, "--device", "cpu"], capsys)
    assert rc == 1
    s = summary(tmp_path)
    assert failing(s) == [(1, "param.w1"), (1, "update.all")]
    own = [st["own_trajectory"] for st in s["steps"]]
    assert own[0]["param_drift"] > 0 and own[1]["param_drift"] > 0
    assert own[1]["over_bound"]  # the Rust side's gradients left the reference's own
    assert "rows over their bounds: " in out


def test_a_wrong_learning_rate_fails_the_update_row(expected_dir, tmp_path, capsys):
    # 10% too large an update of every parameter: most parameter rows stay inside 1e-3
    # (an update is ~lr beside parameters of ~1/√fan_in; a bias drawn near zero is the
    # exception), the update row does not.
    p = R.Problems()
    init = R.load_params(expected_dir, "init", R.param_shapes(TINY), p)
    for n, x0 in init.items():
        path = os.path.join(expected_dir, "step1", "out", "param", n + ".npy")
        x1 = np.load(path)
        np.save(path, (x0 + 1.1 * (x1 - x0)).astype(np.float32))
    rc, out = run_main(["check", expected_dir, "--device", "cpu", "--steps", "1"], capsys)
    assert rc == 1
    s = summary(tmp_path)
    assert (1, "update.all") in failing(s)
    missed = [t for _, t in failing(s) if t.startswith("param.")]
    assert len(missed) < len(R.param_shapes(TINY)) // 4, missed
    row = next(r for r in s["steps"][0]["rows"] if r["tensor"] == "update.all")
    assert abs(row["rel_err"] - 0.1) < 1e-3  # the parameters' f32 rounding
    assert any("update.all" in ln and "FAIL" in ln for ln in out.splitlines())


def test_a_wrong_adam_moment_fails_by_name(expected_dir, tmp_path, capsys):
    # The parameters barely show a wrong v (an update is ~lr), the moment's own row does.
    path = os.path.join(expected_dir, "step2", "out", "adam_v", "wphi.npy")
    np.save(path, (np.load(path) * 1.5).astype(np.float32))
    rc, _ = run_main(["check", expected_dir, "--device", "cpu", "--steps", "2"], capsys)
    assert rc == 1
    assert failing(summary(tmp_path)) == [(2, "adam_v.wphi")]


def test_an_unusable_rust_state_fails_the_next_step_by_name(expected_dir, tmp_path, capsys):
    os.remove(os.path.join(expected_dir, "step1", "out", "adam_m", "bp.npy"))
    rc, out = run_main(["check", expected_dir, "--device", "cpu"], capsys)
    assert rc == 1
    assert failing(summary(tmp_path)) == [(1, "adam_m.bp"), (2, "start of step 2")]
    row = next(ln for ln in out.splitlines() if "start of step 2" in ln)
    assert "the Rust state after step 1 is unusable: adam_m.bp missing" in row


def test_write_expected_from_step_reads_only_the_state(expected_dir, capsys):
    os.remove(os.path.join(expected_dir, "step1", "out", "loss.npy"))
    os.remove(os.path.join(expected_dir, "step1", "out", "grad", "w1.npy"))
    assert R.main(["write-expected", expected_dir, "--device", "cpu", "--from-step", "2"]) == 0
    os.remove(os.path.join(expected_dir, "step1", "out", "param", "w1.npy"))
    rc = R.main(["write-expected", expected_dir, "--device", "cpu", "--from-step", "2"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "w1" in ln]  # reported once, by name
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("param.w1: missing file"), err


def test_write_expected_from_step_needs_a_usable_state(expected_dir, capsys):
    path = os.path.join(expected_dir, "step1", "out", "adam_v", "w2.npy")
    v = np.load(path)
    v[0, 0] = np.inf
    np.save(path, v)
    rc = R.main(["write-expected", expected_dir, "--device", "cpu", "--from-step", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "step1/out: adam_v.w2 non-finite: 0 NaN, 1 Inf" in err
    rc = R.main(["write-expected", expected_dir, "--device", "cpu", "--from-step", "9"])
    assert rc == 2 and "--from-step 9: expected a step in 1..3" in capsys.readouterr().err


def test_clipping_active_still_self_consistent(tmp_path, monkeypatch, capsys):
    d = str(tmp_path / "clip")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    assert R.main(["write-inputs", d, "--steps", "2", "--max-norm", "0.01"] + size_flags()) == 0
    assert R.main(["write-expected", d, "--device", "cpu"]) == 0
    rc, out = run_main(["check", d, "--device", "cpu"], capsys)
    assert rc == 0, out
    assert all(st["clip_scale_ref"] < 1 for st in summary(tmp_path)["steps"])


def test_directory_problems_are_named(expected_dir, tmp_path, capsys):
    os.remove(os.path.join(expected_dir, "init", "wo.npy"))
    act = os.path.join(expected_dir, "step1", "in", "act.npy")
    np.save(act, np.load(act).astype(np.int64))
    rc, out = run_main(["check", expected_dir, "--device", "cpu"], capsys)
    assert rc == 1
    assert "init/wo: missing file" in out
    # init is unusable, so the check stops before reading step1's inputs
    rc = R.main(["write-expected", expected_dir, "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "step1/in/act: dtype <i8, expected <i4" in err
    s = summary(tmp_path)
    assert s["failed"] == 1 and s["setup_problems"][0]["tensor"] == "init/wo"


def test_missing_rust_output_fails_that_row(expected_dir, tmp_path, capsys):
    os.remove(os.path.join(expected_dir, "step2", "out", "param", "bq.npy"))
    rc, out = run_main(["check", expected_dir, "--device", "cpu"], capsys)
    assert rc == 1
    # and step 3 cannot start from the state after step 2
    assert failing(summary(tmp_path)) == [(2, "param.bq"), (3, "start of step 3")]
    row = next(ln for ln in out.splitlines() if "param.bq" in ln and "FAIL" in ln)
    assert "missing file" in row
    n = len(R.param_shapes(TINY))
    assert any("update.all" in ln and ln.endswith(f"over {n - 1} of {n} parameters")
               for ln in out.splitlines())


def test_wrong_shape_is_named(expected_dir, tmp_path, capsys):
    path = os.path.join(expected_dir, "step1", "out", "grad", "wv.npy")
    np.save(path, np.load(path).reshape(-1))  # [H] instead of [1, H]
    rc, out = run_main(["check", expected_dir, "--device", "cpu"], capsys)
    assert rc == 1
    assert failing(summary(tmp_path)) == [(1, "grad.wv")]
    assert "shape [8], expected [1, 8]" in out


# ----------------------------------------------------------------------------- the layout

def test_write_inputs_layout(tmp_path):
    d = str(tmp_path / "d")
    z = dict(TINY, B=200)
    R.write_inputs(d, z, HP, steps=2, seed=3)
    with open(os.path.join(d, "sizes.json")) as f:
        cfg = json.load(f)
    assert all(k in cfg for k in R.SIZE_KEYS + R.HYPER_KEYS)
    assert sorted(os.listdir(os.path.join(d, "init"))) == \
        sorted(n + ".npy" for n in R.param_shapes(z))
    assert sorted(os.listdir(os.path.join(d, "target"))) == \
        sorted(n + ".npy" for n in R.trunk_shapes(z))
    for n, shp in R.param_shapes(z).items():
        a = np.load(os.path.join(d, "init", n + ".npy"))
        assert a.dtype.str == "<f4" and a.shape == shp and a.flags.c_contiguous
        fan_in = shp[1] if len(shp) == 2 else R.param_shapes(z)["w" + n[1:]][1]
        assert np.abs(a).max() <= 1 / math.sqrt(fan_in)
    for n in R.trunk_shapes(z):
        a = np.load(os.path.join(d, "init", n + ".npy"))
        t = np.load(os.path.join(d, "target", n + ".npy"))
        assert not np.array_equal(a, t) and np.abs(a - t).max() < 0.1
    init, tgt, b = load_np(d, z, step=2)
    assert b["act"].dtype.str == "<i4" and b["act"].min() >= 0 and b["act"].max() < z["A"]
    assert set(np.unique(b["done"])) <= {0.0, 1.0} and 0 < b["done"].mean() < 0.3
    assert b["tau"].min() >= 0.02 and b["tau"].max() <= 0.98
    for k in ("s", "s2", "r", "win"):
        assert b[k].dtype.str == "<f4" and abs(b[k].std() - 1) < 0.2
    with open(os.path.join(d, "step1", "in", "win.npy"), "rb") as f:
        assert f.read(6) == b"\x93NUMPY"


# ----------------------------------------------------------------------------- Adam, clipping

def test_hand_adam_matches_torch_adam():
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        shapes = [(4, 3), (5,), (1,)]
        ours = [torch.randn(s, dtype=dtype) for s in shapes]
        theirs = [x.clone().requires_grad_(True) for x in ours]
        opt = torch.optim.Adam(theirs, lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]),
                               eps=HP["eps"], weight_decay=0.0, foreach=False)
        ms = [torch.zeros_like(x) for x in ours]
        vs = [torch.zeros_like(x) for x in ours]
        for t in range(1, 7):
            grads = [torch.randn(s, dtype=dtype) * 10 ** (t % 3 - 1) for s in shapes]
            R.adam_hand(ours, grads, ms, vs, t, HP)
            for x, g in zip(theirs, grads):
                x.grad = g.clone()
            opt.step()
            for a, b in zip(ours, theirs):
                assert torch.allclose(a, b.detach(), rtol=tol, atol=0), (t, (a - b).abs().max())


def test_foreach_clip_adam_matches_hand_version():
    for max_norm in (1e-3, 1e3):  # clipping active, and not
        hp = dict(HP, max_norm=max_norm)
        shapes = [(4, 3), (5,), (1,)]
        a = [torch.randn(s, dtype=torch.float64) for s in shapes]
        b = [x.clone() for x in a]
        ma, va = [torch.zeros_like(x) for x in a], [torch.zeros_like(x) for x in a]
        mb, vb = [torch.zeros_like(x) for x in a], [torch.zeros_like(x) for x in a]
        t = torch.zeros((), dtype=torch.float64)
        for k in range(1, 5):
            g = [torch.randn(s, dtype=torch.float64) for s in shapes]
            clipped, _, scale = R.clip_grads(g, max_norm)
            assert (float(scale) < 1) == (max_norm < 1)
            R.adam_hand(a, clipped, ma, va, k, hp)
            R.clip_adam_foreach(b, g, mb, vb, t, hp)
            assert float(t) == k
            for x, y in zip(a, b):
                assert torch.allclose(x, y, rtol=1e-12, atol=0)


def test_clip_matches_torch_clip_grad_norm():
    g = [torch.randn(3, 4, dtype=torch.float64) * 5, torch.randn(7, dtype=torch.float64)]
    ps = [torch.zeros_like(x, requires_grad=True) for x in g]
    for p, x in zip(ps, g):
        p.grad = x.clone()
    torch.nn.utils.clip_grad_norm_(ps, 2.0)
    ours, norm, _ = R.clip_grads(g, 2.0)
    assert math.isclose(float(norm), math.sqrt(sum(float((x ** 2).sum()) for x in g)))
    for p, x in zip(ps, ours):
        assert torch.allclose(p.grad, x, rtol=1e-14)


# ----------------------------------------------------------------------------- the model

def tiny_model(z=TINY, seed=0, step=1, tmp=None):
    d = tmp
    R.write_inputs(d, z, HP, steps=1, seed=seed)
    init, tgt, b = load_np(d, z, step)
    return to64(init), to64(tgt), to64(b)


def np_losses(p, tp, b, z, hp):
    """The loss of MODEL.md again, in float64 numpy, written without reference.py."""
    p = {k: v.numpy() for k, v in p.items()}
    tp = {k: v.numpy() for k, v in tp.items()}
    b = {k: v.numpy() for k, v in b.items()}
    B, D, G, E, Hh, C = z["B"], z["D"], z["G"], z["E"], z["Hh"], z["C"]

    def relu(x):
        return np.maximum(x, 0)

    def net(p, x):
        h = relu(relu(x @ p["w1"].T + p["b1"]) @ p["w2"].T + p["b2"])
        v = h @ p["wv"].T + p["bv"]
        q = np.zeros((B, D, z["A"]))
        for d in range(D):
            u = h @ p[f"wg.{d}"].T + p[f"bg.{d}"]
            g = u[:, :G] / (1 + np.exp(-u[:, G:]))
            adv = g @ p[f"wa.{d}"].T + p[f"ba.{d}"]
            q[:, d] = v + adv - adv.mean(axis=1, keepdims=True)
        return h, q

    def huber(x):
        return np.where(np.abs(x) <= 1, x * x / 2, np.abs(x) - 0.5)

    h, q = net(p, b["s"])
    _, q2 = net(p, b["s2"])
    _, qt = net(tp, b["s2"])
    act = b["act"].astype(np.int64)
    qa = np.zeros((B, D))
    y = np.zeros((B, D))
    for i in range(B):
        for d in range(D):
            qa[i, d] = q[i, d, act[i, d]]
            best = 0
            for a in range(z["A"]):
                if q2[i, d, a] > q2[i, d, best]:
                    best = a
            y[i, d] = b["r"][i] + hp["gamma"] * (1 - b["done"][i]) * qt[i, d, best]
    l_td = huber(qa - y).mean()
    qbar = qa.mean(1)
    l_iql = 0.0
    for name, e in (("hi", 0.7), ("lo", 0.3)):
        dd = qbar - (h @ p[f"we_{name}"].T + p[f"be_{name}"])[:, 0]
        l_iql += (np.abs(e - (dd < 0)) * dd ** 2).mean()
    tau = b["tau"]
    cosf = np.cos(np.pi * (np.arange(C) + 1)[None, None, :] * tau[:, :, None])
    phi = relu(cosf @ p["wphi"].T + p["bphi"])
    zq = ((h[:, None, :] * phi) @ p["wq"].T + p["bq"])[..., 0]
    u = y.mean(1)[:, None] - zq
    l_iqn = (np.abs(tau - (u < 0)) * huber(u)).mean()
    emb = b["win"] @ p["wemb"].T + p["bemb"]
    qkv = emb @ p["wqkv"].T
    dh = E // Hh
    att = np.zeros_like(emb)
    for j in range(Hh):
        c = slice(j * dh, (j + 1) * dh)
        Q, K, V = qkv[..., c], qkv[..., E:][..., c], qkv[..., 2 * E:][..., c]
        sc = np.einsum("bqd,bkd->bqk", Q, K) / math.sqrt(dh)
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        att[..., c] = (sc / sc.sum(-1, keepdims=True)) @ V
    pred = ((att @ p["wo"].T).mean(1) @ p["wp"].T + p["bp"])[:, 0]
    l_attn = ((pred - b["r"]) ** 2).mean()
    mx = q.max(-1)
    l_cql = (mx + np.log(np.exp(q - mx[..., None]).sum(-1)) - qa).mean()
    l_conf = ((qa - qa.mean(1, keepdims=True)) ** 2).mean(1).mean()
    total = l_td + hp["c_iql"] * l_iql + hp["c_iqn"] * l_iqn + hp["c_attn"] * l_attn \
        + hp["c_cql"] * l_cql + hp["c_conf"] * l_conf
    return np.array([total, l_td, l_iql, l_iqn, l_attn, l_cql, l_conf])


def test_losses_match_an_independent_numpy_version(tmp_path):
    for seed in range(3):
        p, tp, b = tiny_model(seed=seed, tmp=str(tmp_path / str(seed)))
        ours = R.losses(p, tp, b, TINY, HP).numpy()
        assert np.allclose(ours, np_losses(p, tp, b, TINY, HP), rtol=1e-12, atol=1e-14), seed


def test_fast_path_equals_plain_path(tmp_path):
    p, tp, b = tiny_model(tmp=str(tmp_path))
    names = list(p)
    for x in p.values():
        x.requires_grad_(True)
    out = [R.losses(p, tp, b, TINY, HP, fast=f) for f in (False, True)]
    grads = [torch.autograd.grad(o[0], [p[n] for n in names]) for o in out]
    assert torch.allclose(out[0], out[1], rtol=1e-12)
    for n, a, c in zip(names, *grads):
        assert torch.allclose(a, c, rtol=1e-10, atol=1e-14), n


def test_attention_layout_matches_multihead_attention():
    # nn.MultiheadAttention keeps q, k, v as the three row blocks of in_proj_weight and a
    # head as a contiguous chunk of E/Hh inside each: MODEL.md's split, independently.
    z = dict(TINY, E=12, Hh=3)
    B, W, S, E = 5, z["W"], z["S"], z["E"]
    g = torch.Generator().manual_seed(1)
    p = {"wemb": torch.randn(E, S, generator=g, dtype=torch.float64),
         "bemb": torch.randn(E, generator=g, dtype=torch.float64),
         "wqkv": torch.randn(3 * E, E, generator=g, dtype=torch.float64) * 0.3,
         "wo": torch.randn(E, E, generator=g, dtype=torch.float64),
         "wp": torch.randn(1, E, generator=g, dtype=torch.float64),
         "bp": torch.randn(1, generator=g, dtype=torch.float64)}
    win = torch.randn(B, W, S, generator=g, dtype=torch.float64)
    mha = torch.nn.MultiheadAttention(E, z["Hh"], bias=False, batch_first=True,
                                      dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(p["wqkv"])
        mha.out_proj.weight.copy_(p["wo"])
        emb = win @ p["wemb"].T + p["bemb"]
        o, _ = mha(emb, emb, emb, need_weights=False)
        want = (o.mean(1) @ p["wp"].T + p["bp"])[:, 0]
    for fast in (False, True):
        got = R.attention_pred(p, win, z, fast)
        assert torch.allclose(got, want, rtol=1e-12), fast


def test_argmax_takes_the_first_maximum_on_ties(tmp_path):
    p, tp, b = tiny_model(tmp=str(tmp_path))
    for d in range(TINY["D"]):  # advantages all zero: every action of q' ties
        p[f"wa.{d}"].zero_()
        p[f"ba.{d}"].zero_()
    aux = {}
    R.losses(p, tp, b, TINY, HP, aux=aux)
    assert (aux["a_star"] == 0).all()
    _, qt = R.network(tp, b["s2"], TINY)
    y = b["r"][:, None] + HP["gamma"] * (1 - b["done"])[:, None] * qt[:, :, 0]
    assert torch.allclose(aux["y"], y, rtol=1e-14)


def test_huber_and_variance_conventions():
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.5], dtype=torch.float64)
    assert R.huber(x).tolist() == [2.5, 0.5, 0.125, 0.0, 0.125, 0.5, 2.0]
    qa = torch.tensor([[1.0, 2.0, 3.0, 6.0]], dtype=torch.float64)
    assert float(qa.var(dim=1, correction=0)) == 3.5  # population: 14 / 4


# ----------------------------------------------------------------------------- derivatives

def gradcheck_params(fn, p, names):
    leaves = [p[n].clone().requires_grad_(True) for n in names]

    def f(*xs):
        q = dict(p)
        q.update(zip(names, xs))
        return fn(q)

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-6, rtol=1e-4)


def test_glu_branches_have_finite_difference_gradients(tmp_path):
    p, _, b = tiny_model(tmp=str(tmp_path))
    names = ["w2", "b2", "wv", "bv"] + [f"{k}.{d}" for d in range(TINY["D"])
                                        for k in ("wg", "bg", "wa", "ba")]
    gradcheck_params(lambda q: R.network(q, b["s"], TINY)[1], p, names)


def test_attention_head_has_finite_difference_gradients(tmp_path):
    p, _, b = tiny_model(tmp=str(tmp_path))
    names = ["wemb", "bemb", "wqkv", "wo", "wp", "bp"]
    for fast in (False, True):
        gradcheck_params(lambda q: R.attention_pred(q, b["win"], TINY, fast), p, names)


def test_iqn_head_has_finite_difference_gradients(tmp_path):
    p, tp, b = tiny_model(tmp=str(tmp_path))
    gradcheck_params(lambda q: R.losses(q, tp, b, TINY, HP)[3], p,
                     ["w1", "b1", "w2", "b2", "wphi", "bphi", "wq", "bq"])


def test_whole_loss_has_finite_difference_gradients(tmp_path):
    # y and q̄ carry no gradient (MODEL.md), so finite differences hold them fixed too.
    p, tp, b = tiny_model(tmp=str(tmp_path))
    aux = {}
    R.losses(p, tp, b, TINY, HP, aux=aux)
    frozen = {"y": aux["y"], "qbar": aux["qbar"]}
    gradcheck_params(lambda q: R.losses(q, tp, b, TINY, HP, frozen=frozen), p, list(p))


def test_no_gradient_where_model_md_says_none(tmp_path):
    # q̄ and y are constants: L_iql and L_iqn reach the trunk only through h, never the
    # branches; L_attn touches nothing but the attention head.
    p, tp, b = tiny_model(tmp=str(tmp_path))
    names = list(p)
    for x in p.values():
        x.requires_grad_(True)
    out = R.losses(p, tp, b, TINY, HP)
    branches = [n for n in names if n.split(".")[0] in ("wg", "bg", "wa", "ba", "wv", "bv")]
    attn = ["wemb", "bemb", "wqkv", "wo", "wp", "bp"]
    for i, keep in ((2, None), (3, None), (4, attn)):
        g = dict(zip(names, torch.autograd.grad(out[i], [p[n] for n in names],
                                                retain_graph=True, allow_unused=True)))
        zero = branches if keep is None else [n for n in names if n not in keep]
        for n in zero:
            assert g[n] is None or not g[n].any(), (R.LOSS_NAMES[i], n)
        assert any(g[n] is not None and g[n].any() for n in names if n not in zero)


# ----------------------------------------------------------------------------- TF32, bench

def test_round_tf32_keeps_ten_mantissa_bits():
    x = torch.randn(10000)
    for mode, ulp in (("nearest", 2.0 ** -11), ("truncate", 2.0 ** -10)):
        R.Matmul.tf32_rounding = mode
        r = R.round_tf32(x)
        assert (r.view(torch.int32) & 0x1FFF).eq(0).all()
        assert ((r - x).abs() <= x.abs() * ulp).all()
        assert ((r - x).abs() > 0).float().mean() > 0.9
    assert (R.round_tf32(x).abs() <= x.abs()).all()  # truncation shrinks
    x = torch.tensor([1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1 + 1.5 * 2.0 ** -11])
    R.Matmul.tf32_rounding = "nearest"  # ties to even, then a plain round up
    assert R.round_tf32(x).tolist() == [1.0, 1 + 4 * 2.0 ** -11, 1 + 2 * 2.0 ** -11]


def test_emulated_tf32_check_runs(expected_dir, capsys):
    rc, out = run_main(["check", expected_dir, "--device", "cpu", "--emulate-tf32",
                        "--steps", "1"], capsys)
    assert "(TF32 emulated, nearest)" in out and "reference check:" in out.splitlines()[-1]
    rc, out = run_main(["check", expected_dir, "--device", "cpu", "--emulate-tf32",
                        "--tf32-rounding", "truncate", "--steps", "1"], capsys)
    assert "(TF32 emulated, truncate)" in out


def test_bench_smoke_on_cpu(tmp_path, capsys):
    path = str(tmp_path / "bench.json")
    rc, out = run_main(["bench", "--device", "cpu", "--steps", "3", "--warmup", "1",
                        "--variants", "eager,graph", "--json", path] + size_flags(), capsys)
    assert rc == 0
    with open(path) as f:
        res = json.load(f)
    assert res["variants"]["eager"]["ok"] and res["median_ms"]["eager"] > 0
    assert not res["variants"]["graph"]["ok"]  # needs CUDA, reported, not fatal
    assert math.isfinite(res["variants"]["eager"]["first_loss"])


def test_json_is_strict():
    assert R.json_clean({"a": [math.inf, 1.0], "b": (math.nan,)}) == {"a": ["inf", 1.0],
                                                                    "b": ["nan"]}
