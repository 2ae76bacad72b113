"""Tests of the SAC step's PyTorch reference (reference.py), on the CPU at tiny sizes.

    python3 -m pytest examples/sac/test_reference.py
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

TINY = dict(batch=9, obs=4, action=2, hidden=6)


def config(critics=2, **sizes):
    z = dict(TINY, **sizes)
    c = dict(z, critics=critics, target_entropy=-float(z["action"]))
    c.update(R.DEFAULT_HYPER)
    c.update(R.OPTIONAL)
    return c


@pytest.fixture(autouse=True)
def plain_f32():
    R.Matmul.emulate_tf32 = False
    torch.manual_seed(0)
    yield
    R.Matmul.emulate_tf32 = False


def fake(tmp_path, critics=2, steps=3, **sizes):
    d = str(tmp_path / "dump")
    R.write_fake(d, config(critics, **sizes), steps, seed=1)
    return d


def check(d, *more):
    return R.main(["check", d, "--device", "cpu", *more])


def summary(d):
    with open(os.path.join(d, "reference_check.json")) as f:
        return json.load(f)


def failing(d):
    return [(s["step"], r["name"]) for s in summary(d)["steps"] for r in s["rows"]
            if not r["pass"]]


def state64(c, seed=3):
    rng = np.random.default_rng(seed)
    st = R.init_state(c, rng)
    # Moments and a temperature that are not those of step 1, so that every term counts.
    for n in st:
        if n.endswith(".adam_m"):
            st[n] = (rng.standard_normal(st[n].shape) * 1e-2).astype(np.float32)
        elif n.endswith(".adam_v"):
            st[n] = (rng.random(st[n].shape) * 1e-4).astype(np.float32)
    st["log_alpha"] = np.array([-0.3], np.float32)
    return (R.to_dev(st, "cpu", torch.float64),
            R.to_dev(R.random_inputs(c, rng), "cpu", torch.float64))


# ----------------------------------------------------------------------------- the check

@pytest.mark.parametrize("critics", [2, 3])
def test_check_passes_on_a_consistent_dump(tmp_path, capsys, critics):
    d = fake(tmp_path, critics)
    assert check(d) == 0
    out = capsys.readouterr().out
    s = summary(d)
    assert s["passed"] == s["total"] > 0
    assert f"reference check: {s['total']} of {s['total']} passed" in out
    names = {r["name"] for r in s["steps"][0]["rows"]}
    for i in range(critics):
        assert {f"critic{i}.loss", f"critic{i}.l1.w.grad", f"critic{i}_target.l3.b",
                f"critic{i}.l2.w.adam_v", f"critic{i}.update"} <= names
    assert {"actor.loss", "alpha.loss", "log_alpha", "alpha", "routing", "y"} <= names
    assert len(s["steps"]) == 3


def test_a_perturbed_gradient_fails_by_name(tmp_path, capsys):
    d = fake(tmp_path)
    p = os.path.join(d, "step2", "out", "critic1.l2.w.grad.npy")
    g = np.load(p)
    g[0, 0] += 0.1 * np.linalg.norm(g)
    np.save(p, g)
    assert check(d) == 1
    # The update row replays the optimizer on the dumped gradients: it fails too.
    assert failing(d) == [(2, "critic1.l2.w.grad"), (2, "critic1.update")]
    out = capsys.readouterr().out
    assert "FAIL" in out and "of" in out.splitlines()[-1]


def test_a_wrong_learning_rate_fails_the_update_rows(tmp_path, capsys):
    d = fake(tmp_path, steps=1)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["lr"] *= 1.1
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    assert check(d) == 1
    bad = {n for _, n in failing(d)}
    assert {"critic0.update", "critic1.update", "actor.update"} <= bad
    capsys.readouterr()


def test_a_wrong_routing_fails(tmp_path, capsys):
    """The actor's gradient through the larger critic: the routing row names it."""
    d = fake(tmp_path, steps=1)
    out = os.path.join(d, "step1", "out")
    q0, q1 = (np.load(os.path.join(out, f"critic{i}.q_pi.npy")) for i in (0, 1))
    np.save(os.path.join(out, "critic0.q_pi.npy"), q1)
    np.save(os.path.join(out, "critic1.q_pi.npy"), q0)
    assert check(d) == 1
    bad = {n for _, n in failing(d)}
    assert {"routing", "critic0.q_pi", "critic1.q_pi"} <= bad
    capsys.readouterr()


def test_each_step_starts_from_the_rust_state(tmp_path, capsys):
    """A state after step 1 that is off (but written consistently on) fails step 1's
    rows only (the tensor and its network's update): step 2 starts from it."""
    d = fake(tmp_path, steps=2)
    p = os.path.join(d, "step1", "out", "actor.l1.b.npy")
    b = np.load(p)
    b += 0.05
    np.save(p, b)
    # Step 2 as the reference computes it from the perturbed state.
    c, _ = R.load_config(d)
    pr = R.Problems()
    st = R.read_dir(os.path.join(d, "step1", "out"), R.state_shapes(c), pr)
    inp = R.read_dir(os.path.join(d, "step2", "in"), R.input_shapes(c), pr)
    assert not pr.items
    out = R.reference_step(R.to_dev(st, "cpu", torch.float32),
                           R.to_dev(inp, "cpu", torch.float32), 2, c)
    for n in R.output_shapes(c):
        R.write_npy(os.path.join(d, "step2", "out", n + ".npy"), R.to_np(out[n]))
    assert check(d) == 1
    assert failing(d) == [(1, "actor.l1.b"), (1, "actor.update")]
    capsys.readouterr()


def test_an_emulated_tf32_dump_passes(tmp_path, capsys):
    """A dump with every GEMM operand rounded to TF32 (what the Rust side's cuBLASLt
    does) passes the check in plain f32, with room: the bounds are for TF32 on both
    sides."""
    d = str(tmp_path / "tf32")
    R.Matmul.emulate_tf32 = True
    R.write_fake(d, config(2, batch=256, obs=12, action=3, hidden=32), 3, seed=2)
    R.Matmul.emulate_tf32 = False
    assert check(d) == 0, capsys.readouterr().out
    capsys.readouterr()
    for s in summary(d)["steps"]:
        for r in s["rows"]:
            if r["bound"]:
                assert r["error"] <= r["bound"] / 2, r


def test_a_missing_file_is_named(tmp_path, capsys):
    d = fake(tmp_path, steps=1)
    os.remove(os.path.join(d, "init", "critic1_target.l2.w.npy"))
    assert check(d) == 1
    out = capsys.readouterr().out
    assert "critic1_target.l2.w: missing file" in out
    assert summary(d)["problems"][0]["name"] == "critic1_target.l2.w"


def test_a_missing_output_fails_its_row(tmp_path, capsys):
    d = fake(tmp_path, steps=1)
    os.remove(os.path.join(d, "step1", "out", "actor.l3.w.grad.npy"))
    assert check(d) == 1
    assert failing(d) == [(1, "actor.l3.w.grad"), (1, "actor.update")]
    assert "missing file" in capsys.readouterr().out


def test_a_wrong_shape_says_expected_and_found(tmp_path, capsys):
    d = fake(tmp_path, steps=1)
    p = os.path.join(d, "step1", "in", "eps.npy")
    np.save(p, np.zeros((TINY["batch"], TINY["action"] + 1), np.float32))
    assert check(d) == 1
    out = capsys.readouterr().out
    assert f"shape expected [{TINY['batch']}, {TINY['action']}], found " \
           f"[{TINY['batch']}, {TINY['action'] + 1}]" in out


def test_a_missing_config_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="missing file .*config.json"):
        check(str(tmp_path))
    d = fake(tmp_path, steps=1)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"batch": 3}, f)
    with pytest.raises(SystemExit, match="missing keys"):
        check(d)


# ----------------------------------------------------------------------------- the step

def flat_loss(which, st, inp, c):
    """The loss whose gradient the step takes for `which`, as a function of the state,
    with what MODEL.md holds constant (y, α) computed from `st` once."""
    N = c["critics"]
    s, a, r, s2, done = (inp[n] for n in ("s", "a", "r", "s2", "done"))
    alpha = torch.exp(st["log_alpha"]).detach()
    with torch.no_grad():
        a2, lp2 = R.sample(R.net_of(st, "actor"), s2, inp["eps_next"], c)
        x2 = torch.cat([s2, a2], 1)
        qn = torch.stack([R.mlp(R.net_of(st, f"critic{i}_target"), x2)[:, 0]
                          for i in range(N)])
        y = r + c["gamma"] * (1 - done) * (qn.min(0).values - alpha * lp2)

    def critic(i, p):
        q = R.mlp(p, torch.cat([s, a], 1))[:, 0]
        return ((q - y) ** 2).mean()

    def actor(p, critics):
        act, lp = R.sample(p, s, inp["eps"], c)
        q = torch.stack([R.mlp(cr, torch.cat([s, act], 1))[:, 0] for cr in critics])
        return (alpha * lp - q.min(0).values).mean()
    return critic if which == "critic" else actor


def finite_difference(f, params, names, h=1e-6):
    out = {}
    for n in names:
        g = torch.zeros_like(params[n])
        flat = params[n].view(-1)
        for j in range(flat.numel()):
            old = flat[j].item()
            flat[j] = old + h
            up = f(params).item()
            flat[j] = old - h
            down = f(params).item()
            flat[j] = old
            g.view(-1)[j] = (up - down) / (2 * h)
        out[n] = g
    return out


def test_critic_gradients_agree_with_finite_differences():
    c = config(3)
    st, inp = state64(c)
    out = R.reference_step(st, inp, 2, c)
    for i in range(3):
        f = flat_loss("critic", st, inp, c)
        p = {t: st[f"critic{i}.{t}"].clone() for t in R.TENSORS}
        fd = finite_difference(lambda q: f(i, q), p, R.TENSORS)
        for t in R.TENSORS:
            assert torch.allclose(out[f"critic{i}.{t}.grad"], fd[t], rtol=1e-5, atol=1e-8), t


def test_actor_gradients_agree_with_finite_differences():
    """Through the critics as updated in this step, routed to the smallest."""
    c = config(2)
    st, inp = state64(c)
    out = R.reference_step(st, inp, 2, c)
    critics = [{t: out[f"critic{i}.{t}"] for t in R.TENSORS} for i in range(2)]
    f = flat_loss("actor", st, inp, c)
    p = {t: st[f"actor.{t}"].clone() for t in R.TENSORS}
    fd = finite_difference(lambda q: f(q, critics), p, R.TENSORS)
    for t in R.TENSORS:
        assert torch.allclose(out[f"actor.{t}.grad"], fd[t], rtol=1e-5, atol=1e-8), t


def test_the_sample_is_the_normal_log_density_with_the_tanh_correction():
    """log π from ε equals Normal(μ, σ).log_prob(u) corrected for tanh, and so do its
    gradients with respect to the head."""
    c = config(2)
    st, inp = state64(c)
    actor = {t: st[f"actor.{t}"].clone().requires_grad_(True) for t in R.TENSORS}
    a, lp = R.sample(actor, inp["s"], inp["eps"], c)
    o = R.mlp(actor, inp["s"])
    A = c["action"]
    mu, ls = o[:, :A], o[:, A:].clamp(-20, 2)
    u = mu + ls.exp() * inp["eps"]
    want = (torch.distributions.Normal(mu, ls.exp()).log_prob(u)
            - torch.log(1 - torch.tanh(u) ** 2 + 1e-6)).sum(1)
    assert torch.allclose(lp, want, rtol=1e-10, atol=1e-10)
    g1 = torch.autograd.grad(lp.sum(), list(actor.values()), retain_graph=True)
    g2 = torch.autograd.grad(want.sum(), list(actor.values()))
    for x, y in zip(g1, g2):
        assert torch.allclose(x, y, rtol=1e-8, atol=1e-10)


def test_adam_is_the_kernels_formula():
    """clip_grad_norm_ then torch.optim.Adam from given moments is stepgraph-kernels'
    adam_clip_update (kernels/cuda/optim.cu) written out: clip = min(1, max_norm /
    (‖g‖ + 1e-6)), ε outside the root, bias corrections of step k."""
    c = dict(R.DEFAULT_HYPER, max_norm=0.5)
    rng = np.random.default_rng(0)
    ps = [torch.from_numpy(rng.standard_normal(s)) for s in [(3, 4), (4,)]]
    gs = [torch.from_numpy(rng.standard_normal(p.shape)) for p in ps]
    ms = [torch.from_numpy(rng.standard_normal(p.shape) * 0.1) for p in ps]
    vs = [torch.from_numpy(rng.random(p.shape) * 0.1) for p in ps]
    k = 4
    new, m2, v2 = R.adam(ps, gs, ms, vs, k, c)
    norm = math.sqrt(sum(float((g * g).sum()) for g in gs))
    clip = min(1.0, c["max_norm"] / (norm + 1e-6))
    assert clip < 1
    b1, b2 = c["beta1"], c["beta2"]
    for p, g, m, v, pn, mn, vn in zip(ps, gs, ms, vs, new, m2, v2):
        g = clip * g
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        want = p - c["lr"] * (m / (1 - b1 ** k)) / (torch.sqrt(v / (1 - b2 ** k)) + c["eps"])
        assert torch.allclose(mn, m, rtol=1e-12) and torch.allclose(vn, v, rtol=1e-12)
        assert torch.allclose(pn, want, rtol=1e-12, atol=1e-15)


def test_ties_go_to_the_first_critic():
    q = torch.tensor([[1.0, 2.0, 0.5], [1.0, 1.0, 0.5], [3.0, 1.0, 0.7]])
    best, idx = R.first_min(q)
    assert idx.tolist() == [0, 1, 0] and best.tolist() == [1.0, 1.0, 0.5]


def test_temperature_and_polyak_follow_model_md():
    c = config(2)
    st, inp = state64(c)
    st["log_alpha.adam_m"].zero_()
    st["log_alpha.adam_v"].zero_()
    out = R.reference_step(st, inp, 1, c)
    _, lp = R.sample(R.net_of(st, "actor"), inp["s"], inp["eps"], c)
    mean = float((lp + c["target_entropy"]).mean())
    assert math.isclose(float(out["log_alpha.grad"]), -mean, rel_tol=1e-10)
    assert math.isclose(float(out["alpha.loss"]), -float(st["log_alpha"]) * mean, rel_tol=1e-10)
    # Adam's first step moves log α by lr against the gradient's sign.
    want = float(st["log_alpha"]) - c["lr"] * math.copysign(1, -mean)
    assert math.isclose(float(out["log_alpha"]), want, rel_tol=1e-6)
    t = "l2.w"
    want = c["tau"] * out[f"critic1.{t}"] + (1 - c["tau"]) * st[f"critic1_target.{t}"]
    assert torch.allclose(out[f"critic1_target.{t}"], want)


def test_the_dump_names_match_the_rust_check_module():
    """Every name reference.py reads is one check.rs writes, by its pattern."""
    src = open(os.path.join(os.path.dirname(R.__file__), "src", "check.rs")).read()
    for pattern in ('"critic{i}"', '"critic{i}_target"', '".adam_m"', '".adam_v"', '".grad"',
                    '"critic{i}.loss"', '"critic{i}.q_pi"', '"actor.loss"', '"alpha.loss"',
                    '"log_alpha.grad"', '"y"', '"log_alpha"', '"eps_next"', '"{prefix}.l{l}.w{suffix}"'):
        assert pattern in src, pattern
    c = config(2)
    assert set(R.input_shapes(c)) == set(R.INPUTS)


def test_bench_runs_eager_on_the_cpu(tmp_path, capsys):
    out = str(tmp_path / "bench.json")
    argv = ["bench", "--device", "cpu", "--iters", "3", "--warmup", "1", "--variants",
            "eager,graph", "--json", out, "--critics", "3", "--limit", "120"]
    for k, v in TINY.items():
        argv += [f"--{k}", str(v)]
    assert R.main(argv) == 0
    capsys.readouterr()
    with open(out) as f:
        s = json.load(f)
    assert s["variants"]["eager"]["ok"] and s["variants"]["eager"]["median_ms"] > 0
    assert len(s["variants"]["eager"]["losses"]) == 5
    assert not s["variants"]["graph"]["ok"] and "CUDA" in s["variants"]["graph"]["error"]


def test_bench_reports_a_variant_over_its_limit_as_skipped(tmp_path, capsys):
    out = str(tmp_path / "bench.json")
    argv = ["bench", "--device", "cpu", "--iters", "2", "--warmup", "0", "--variants", "eager",
            "--json", out, "--limit", "0.01"]
    R.main(argv)
    capsys.readouterr()
    with open(out) as f:
        s = json.load(f)
    assert s["variants"]["eager"]["skipped"]
