#!/usr/bin/env python3
"""Merges the DQN benchmarks into one record with the ratios the comparison is about.

    combine.py dqn_bench.json pytorch_bench.json [--json FILE]

`dqn_bench.json` comes from the Rust example (`dqn --steps N`, written to $OUT): (a)
eager, (b) the one-stream graph, (c) the stepgraph graph, (d) the critical-path bound
and (w) the work bound (with (w'), its variant with each kernel's grid share
min(1, blocks / resident) not averaged over waves, when the record has it).
`pytorch_bench.json` comes from `reference.py bench`. Prints one table and writes
$OUT/dqn_results.json (./dqn_results.json when OUT is unset) with both records and the
ratios (c)/(b), (c)/(d), (c)/(w), (c)/max((d), (w)), (c)/max((d), (w')), and best
PyTorch/(c). Refuses results from different devices or batches: a ratio across them
would mean nothing. Needs only the standard library.
"""

import argparse
import json
import os
import sys

RUST_KEYS = ("device", "batch", "one_stream_graph_ms", "stepgraph_graph_ms",
             "critical_path_bound_ms", "work_bound_ms")
TORCH_KEYS = ("device", "sizes", "median_ms")


def combine(rust, torch_bench):
    """Both records and the ratios; ValueError naming what is missing or inconsistent."""
    problems = [f"dqn_bench.json: expected key {k!r}, not found"
                for k in RUST_KEYS if k not in rust]
    problems += [f"pytorch_bench.json: expected key {k!r}, not found"
                 for k in TORCH_KEYS if k not in torch_bench]
    if problems:
        raise ValueError("; ".join(problems))
    if rust["device"] != torch_bench["device"]:
        raise ValueError(f"the two benchmarks ran on different devices: "
                         f"{rust['device']!r} and {torch_bench['device']!r}")
    if rust["batch"] != torch_bench["sizes"].get("B"):
        raise ValueError(f"the two benchmarks used different batches: "
                         f"{rust['batch']} and {torch_bench['sizes'].get('B')}")
    if not torch_bench["median_ms"]:
        raise ValueError("pytorch_bench.json: no PyTorch variant succeeded")
    best_name, best = min(torch_bench["median_ms"].items(), key=lambda kv: kv[1])
    b, c = rust["one_stream_graph_ms"], rust["stepgraph_graph_ms"]
    d, w = rust["critical_path_bound_ms"], rust["work_bound_ms"]
    bound = max(d, w)
    wg = rust.get("grid_work_bound_ms")
    grid_bound = None if wg is None else max(d, wg)
    # (p), the chains and the work between them (records from c626f31 on; 0: not measured).
    p = rust.get("chains_bound_ms") or None
    return {
        "device": rust["device"],
        "batch": rust["batch"],
        "stepgraph": rust,
        "pytorch": torch_bench,
        "ratios": {
            "c_over_b": c / b,
            "c_over_d": c / d,
            "c_over_w": c / w,
            "larger_bound": "critical path (d)" if d >= w else "work (w)",
            "larger_bound_ms": bound,
            "c_over_larger_bound": c / bound,
            # The same against max((d), (w')): the work bound with each kernel's grid share.
            "larger_grid_bound_ms": grid_bound,
            "c_over_larger_grid_bound": None if grid_bound is None else c / grid_bound,
            "chains_bound_ms": p,
            "c_over_chains_bound": None if p is None else c / p,
            # Of the time (b) spends above the larger bound, how much (c) saved.
            "share_of_allowed_saving_taken": (b - c) / (b - bound) if b > bound else None,
            "best_pytorch_variant": best_name,
            "best_pytorch_ms": best,
            "best_pytorch_over_c": best / c,
        },
    }


def table(res):
    """The comparison as Markdown lines."""
    rust, r = res["stepgraph"], res["ratios"]
    c = rust["stepgraph_graph_ms"]
    rows = [("(a) eager, one stream", rust.get("eager_ms"), ""),
            ("(b) one-stream graph", rust["one_stream_graph_ms"], ""),
            ("(c) stepgraph graph", c, f"(c)/(b) = {r['c_over_b']:.3f}")]
    if "equal_priority_graph_ms" in rust:
        cf = rust["equal_priority_graph_ms"]
        rows.append(("(c') stepgraph graph, equal stream priorities", cf, f"(c)/(c') = {c / cf:.3f}"))
    rows += [("(d) critical-path bound", rust["critical_path_bound_ms"],
              f"(c)/(d) = {r['c_over_d']:.3f}"),
             ("(w) work bound", rust["work_bound_ms"], f"(c)/(w) = {r['c_over_w']:.3f}")]
    if "grid_work_bound_ms" in rust:
        wg = rust["grid_work_bound_ms"]
        rows.append(("(w') work bound, grid shares not averaged over waves", wg,
                     f"(c)/(w') = {c / wg:.3f}"))
    if r["chains_bound_ms"] is not None:
        rows.append(("(p) chains and the work between them", r["chains_bound_ms"],
                     f"(c)/(p) = {r['c_over_chains_bound']:.3f}"))
    rows += [(f"(e) PyTorch {name}", ms, f"/(c) = {ms / c:.2f}")
             for name, ms in res["pytorch"]["median_ms"].items()]
    lines = [f"DQN step on {res['device']}, batch {res['batch']}",
             "| variant | median ms | ratio |", "| --- | --- | --- |"]
    lines += [f"| {n} | {'-' if ms is None else f'{ms:.3f}'} | {ratio} |" for n, ms, ratio in rows]
    taken = r["share_of_allowed_saving_taken"]
    lines.append(f"(c) against the larger bound, {r['larger_bound']} {r['larger_bound_ms']:.3f} ms: "
                 f"{r['c_over_larger_bound']:.3f}; (c) takes "
                 f"{'-' if taken is None else f'{100 * taken:.0f}%'} of the saving from (b) "
                 f"down to it; best PyTorch ({r['best_pytorch_variant']}) / (c) = "
                 f"{r['best_pytorch_over_c']:.2f}x")
    if r.get("c_over_larger_grid_bound") is not None:
        lines.append(f"(c) against max((d), (w')), the bound with each kernel's grid share, "
                     f"{r['larger_grid_bound_ms']:.3f} ms: {r['c_over_larger_grid_bound']:.3f}")
    if "breakdown" in rust:
        lines.append(f"step breakdown: {rust['breakdown']}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rust", help="dqn_bench.json from the Rust benchmark")
    ap.add_argument("pytorch", help="pytorch_bench.json from `reference.py bench`")
    ap.add_argument("--json", default=None, help="default: $OUT/dqn_results.json")
    args = ap.parse_args(argv)
    try:
        with open(args.rust) as f:
            rust = json.load(f)
        with open(args.pytorch) as f:
            torch_bench = json.load(f)
        res = combine(rust, torch_bench)
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        print(f"combine: {e}", file=sys.stderr)
        return 1
    print("\n".join(table(res)))
    out = args.json or os.path.join(os.environ.get("OUT") or ".", "dqn_results.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
