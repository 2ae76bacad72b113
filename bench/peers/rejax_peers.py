#!/usr/bin/env python3
"""Peer benchmark: rejax's DQN on gymnax CartPole-v1 and SAC on Pendulum-v1.

Runs rejax's published configurations and measures, for each algorithm:

- one agent (seed `--seed`): time from process start to the first evaluation whose mean
  return reaches the solve threshold, compilation included; the compile time on its own;
  environment steps per second of the compiled train function (a second, timed call);
  the return curve (rejax's evaluation: mean return of 128 episodes every `eval_freq`
  steps) with the wall-clock time of each evaluation;
- the same train function with rejax's own evaluation callback and with no evaluation
  at all, to show what the evaluation and the timing callback cost;
- `--seeds` agents vmapped in one train function: environment steps per second and how
  many end at or above the threshold at the final evaluation.

Environment steps are training steps (the train state's `global_step`), not the steps
the evaluation episodes take. Writes one JSON file per algorithm into `--out` and a short
summary on stdout. `--algo all` runs each algorithm in its own process, so each one's
time to solve starts at its own process start.
"""

import time

# Taken before any other import: the time to solve counts the imports and compilation,
# which a user pays as well.
PROCESS_START = time.time()

import argparse
import datetime
import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# gymnax imports matplotlib and seaborn at module level, only to render environments.
# Appended, not prepended: where the real packages are installed, they win.
sys.path.append(str(HERE / "render_stubs"))

ALGOS = ("dqn", "sac")

# rejax 0.1.3 ships no configuration files in its wheel. These are, unchanged, the `dqn`
# block of configs/gymnax/cartpole.yaml and the `sac` block of configs/gymnax/pendulum.yaml
# in the rejax repository at tag v0.1.3 (commit 4587115ef2462f60219b8c65efdd6f7f3e027968).
CONFIG_SOURCE = {
    "dqn": "rejax v0.1.3 configs/gymnax/cartpole.yaml, key dqn",
    "sac": "rejax v0.1.3 configs/gymnax/pendulum.yaml, key sac",
}
CONFIGS = {
    "dqn": {
        "env": "CartPole-v1",
        "agent": "DuelingQNetwork",
        "agent_kwargs": {"activation": "swish"},
        "num_envs": 10,
        "buffer_size": 50_000,
        "fill_buffer": 5_000,
        "batch_size": 100,
        "max_grad_norm": 10,
        "learning_rate": 0.001,
        "num_epochs": 5,
        "total_timesteps": 100_000,
        "eval_freq": 2_500,
        "polyak": 0.98,
        "eps_start": 1,
        "eps_end": 0.05,
        "exploration_fraction": 0.5,
        "gamma": 0.99,
        "ddqn": True,
        "normalize_observations": False,
    },
    "sac": {
        "env": "Pendulum-v1",
        "agent_kwargs": {"activation": "swish"},
        "num_envs": 1,
        "buffer_size": 10_000,
        "fill_buffer": 256,
        "batch_size": 256,
        "learning_rate": 0.01,
        "num_epochs": 1,
        "total_timesteps": 10_000,
        "eval_freq": 100,
        "gamma": 0.99,
        "polyak": 0.98,
        "target_entropy_ratio": None,
        "normalize_observations": True,
    },
}

# Mean evaluation return at or above which an agent counts as solved: gymnasium's reward
# threshold for CartPole-v1, and the customary one for Pendulum-v1 (it has none).
THRESHOLDS = {"dqn": 475.0, "sac": -200.0}

# `--quick` budgets: a smoke test of the harness on a CPU, not a measurement.
QUICK = {
    "dqn": {"total_timesteps": 2_000, "eval_freq": 500, "fill_buffer": 500},
    "sac": {"total_timesteps": 300, "eval_freq": 100, "fill_buffer": 100},
}

VERSIONED = (
    "rejax",
    "gymnax",
    "distrax",
    "tfp-nightly",
    "chex",
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "numpy",
)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algo", choices=(*ALGOS, "all"), default="all")
    p.add_argument("--seeds", type=int, default=8, help="agents in the vmapped run")
    p.add_argument("--seed", type=int, default=0, help="seed of the single agent")
    p.add_argument("--quick", action="store_true", help="tiny budgets: a smoke test")
    p.add_argument(
        "--out", type=Path, default=Path("peers-results"), help="JSON folder"
    )
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be at least 1, found {args.seeds}")
    return args


def run_all(args):
    """Runs each algorithm in a process of its own and returns the worst exit status."""
    passthrough = [
        "--seeds",
        str(args.seeds),
        "--seed",
        str(args.seed),
        "--out",
        str(args.out),
    ] + (["--quick"] if args.quick else [])
    status = 0
    for algo in ALGOS:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--algo",
            algo,
            *passthrough,
        ]
        rc = subprocess.run(cmd, check=False).returncode
        if rc != 0:
            print(f"rejax {algo}: exited with status {rc}", file=sys.stderr)
            status = max(status, rc)
    return status


def versions():
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def first_solve(curve, threshold):
    """The first point of `curve` whose return reaches `threshold`, or None."""
    for point in curve:
        if point["return"] >= threshold:
            return point
    return None


def run_algo(args):
    import jax
    import jax.numpy as jnp
    import rejax

    imported_s = time.time() - PROCESS_START
    name = args.algo
    config = dict(CONFIGS[name])
    if args.quick:
        config.update(QUICK[name])
    threshold = THRESHOLDS[name]
    algo_cls = rejax.get_algo(name)
    key = jax.random.PRNGKey(args.seed)

    def timed(fn, *a):
        t = time.perf_counter()
        out = jax.block_until_ready(fn(*a))
        return out, time.perf_counter() - t

    def compile_train(train, *a):
        t = time.perf_counter()
        lowered = train.lower(*a)
        lower_s = time.perf_counter() - t
        compiled = lowered.compile()
        return compiled, lower_s, time.perf_counter() - t - lower_s

    # The time of each evaluation has to be read on the host while the jitted train
    # function runs, so the evaluation callback wraps rejax's own one (as rejax's
    # train.py does for printing) and hands step and mean return to the host with an
    # ordered `jax.debug.callback`; it waits for the evaluation's result, so the host's
    # clock then marks the evaluation's end. It costs a device-to-host copy of two scalars
    # and a synchronisation per evaluation (41 for DQN, 101 for SAC). Rather than trust
    # that to be negligible, the same configuration is also timed with rejax's own
    # callback (`rejax_eval`) and with no evaluation (`no_eval`).
    records = []
    recording = [True]

    def on_eval(step, mean_return):
        if recording[0]:
            records.append((int(step), float(mean_return), time.time() - PROCESS_START))

    algo_plain = algo_cls.create(**config)
    rejax_eval_callback = algo_plain.eval_callback

    def timed_eval_callback(algo, ts, rng):
        lengths, returns = rejax_eval_callback(algo, ts, rng)
        jax.debug.callback(on_eval, ts.global_step, returns.mean(), ordered=True)
        return lengths, returns

    algo_timed = algo_plain.replace(eval_callback=timed_eval_callback)

    # One agent, with timing callback: compiled ahead of time so the compile time is
    # measured on its own; the first run gives the time to solve, the second the rate.
    train = jax.jit(algo_cls.train)
    compiled, lower_s, compile_s = compile_train(train, algo_timed, key)
    (ts, (_, returns)), first_run_s = timed(compiled, algo_timed, key)
    # Every evaluation's callback has run before the record closes.
    jax.effects_barrier()
    recording[0] = False
    (ts2, _), second_run_s = timed(compiled, algo_timed, key)

    mean_returns = [float(r) for r in jnp.mean(returns, axis=-1)]
    if len(records) != len(mean_returns):
        raise RuntimeError(
            f"expected one timing record per evaluation ({len(mean_returns)}), "
            f"found {len(records)}"
        )
    curve = []
    for (step, ret, wall_s), ret_out in zip(records, mean_returns):
        if abs(ret - ret_out) > 1e-3 * max(1.0, abs(ret_out)):
            raise RuntimeError(
                f"the timing callback saw return {ret} at step {step}, the train "
                f"function returned {ret_out}"
            )
        curve.append({"step": step, "return": ret_out, "wall_s": wall_s})
    solved = first_solve(curve, threshold)
    env_steps = int(ts.global_step)
    single = {
        "seed": args.seed,
        "lower_s": lower_s,
        "compile_s": compile_s,
        "jit_s": lower_s + compile_s,
        "first_run_s": first_run_s,
        "second_run_s": second_run_s,
        "env_steps": env_steps,
        "steps_per_s": env_steps / second_run_s,
        "solved": solved is not None,
        "solve_step": solved["step"] if solved else None,
        "time_to_solve_s": solved["wall_s"] if solved else None,
        "final_return": curve[-1]["return"],
        "curve": curve,
    }
    del ts2

    def rate(algo, train_fn, keys, n_agents):
        compiled, lower_s, compile_s = compile_train(train_fn, algo, keys)
        _, first_s = timed(compiled, algo, keys)
        (ts, evaluation), run_s = timed(compiled, algo, keys)
        steps = int(jnp.sum(ts.global_step))
        result = {
            "agents": n_agents,
            "jit_s": lower_s + compile_s,
            "first_run_s": first_s,
            "run_s": run_s,
            "env_steps": steps,
            "steps_per_s": steps / run_s,
        }
        return result, evaluation

    rejax_eval, _ = rate(algo_plain, jax.jit(algo_cls.train), key, 1)
    no_eval, _ = rate(
        algo_plain.replace(eval_callback=lambda algo, ts, rng: ()),
        jax.jit(algo_cls.train),
        key,
        1,
    )

    # The vmapped agents use rejax's own evaluation, exactly as rejax's train.py does.
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.seeds)
    vmapped = jax.jit(jax.vmap(algo_cls.train, in_axes=(None, 0)))
    seeds, (_, seed_returns) = rate(algo_plain, vmapped, keys, args.seeds)
    final = [float(r) for r in jnp.mean(seed_returns[:, -1], axis=-1)]
    seeds["final_returns"] = final
    seeds["solved"] = sum(r >= threshold for r in final)

    device = jax.devices()[0]
    result = {
        "harness": "bench/peers/rejax_peers.py",
        "algo": name,
        "env": config["env"],
        "quick": args.quick,
        "config": config,
        "config_source": CONFIG_SOURCE[name],
        "quick_overrides": QUICK[name] if args.quick else None,
        "threshold": threshold,
        "eval_episodes": 128,
        "backend": jax.default_backend(),
        "device": str(device),
        "device_kind": device.device_kind,
        "host": platform.node(),
        "versions": versions(),
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "process_start_unix": PROCESS_START,
        "import_s": imported_s,
        "single": single,
        "rejax_eval": rejax_eval,
        "no_eval": no_eval,
        "seeds": seeds,
        "total_s": time.time() - PROCESS_START,
    }
    return result


def summary(r):
    s = r["single"]
    lines = [
        f"rejax {r['algo']} on {r['env']}, {r['device_kind']} ({r['backend']})"
        + (" [quick: not a measurement]" if r["quick"] else ""),
        (
            f"  imports {r['import_s']:.1f} s; jit {s['jit_s']:.1f} s "
            f"(lower {s['lower_s']:.1f} + compile {s['compile_s']:.1f})"
        ),
    ]
    if s["solved"]:
        lines.append(
            f"  one agent: mean return >= {r['threshold']:g} at step {s['solve_step']}, "
            f"{s['time_to_solve_s']:.1f} s after process start"
        )
    else:
        lines.append(f"  one agent: never reached {r['threshold']:g}")
    lines.append(
        f"  one agent: final return {s['final_return']:.1f}; env steps/s "
        f"{s['steps_per_s']:.4g} (timing callback), "
        f"{r['rejax_eval']['steps_per_s']:.4g} (rejax's evaluation), "
        f"{r['no_eval']['steps_per_s']:.4g} (no evaluation)"
    )
    n = r["seeds"]
    lines.append(
        f"  {n['agents']} agents vmapped: env steps/s {n['steps_per_s']:.4g}; "
        f"{n['solved']}/{n['agents']} at or above {r['threshold']:g} at the end"
    )
    return "\n".join(lines)


def main(argv):
    args = parse_args(argv)
    if args.algo == "all":
        return run_all(args)
    result = run_algo(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    quick = "-quick" if args.quick else ""
    path = args.out / f"rejax-{args.algo}{quick}-{stamp}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    print(f"  wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
