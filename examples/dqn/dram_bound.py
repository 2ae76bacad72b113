#!/usr/bin/env python3
"""A work bound that counts DRAM bandwidth as well as SMs.

    dram_bound.py dqn_bench.json ncu.csv [--peak-gbs 3350] [--json FILE]

The work bound of the Rust benchmark (`dqn_bench.json`, key "kernels") charges each
kernel its time alone times the share of the GPU's SMs its grid occupies. A kernel that
streams memory can hold few SMs and still use all of the DRAM bandwidth, which no other
stream can then use. This adds each kernel's DRAM share, its bytes over what the peak
bandwidth moves in its time alone, and charges it the larger of the two shares:

    W_c = sum_k  t_k * max(sm_share_k, min(1, bytes_k / (t_k * peak)))

The bytes come from Nsight Compute profiling one replay of the one-stream step
(`dqn --serial-replay`), whose kernels are the last ones in the profile, in capture
order:

    ncu --csv --print-units base --print-kernel-base mangled --graph-profiling node \\
        --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \\
        dqn --serial-replay > ncu.csv

Each kernel is matched to the benchmark's list by name and grid; a mismatch is an error
naming the first one. --peak-gbs is the DRAM bandwidth in GB/s (3350: the H100 SXM's
HBM3, a figure no kernel reaches, so the shares are if anything low and the bound stays a
lower bound). Prints the totals and the kernels that weigh most, writes
$OUT/dram_bound.json. Needs only the standard library.
"""

import argparse
import csv
import json
import os
import sys

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")


def read_ncu(lines):
    """Kernels of an `ncu --csv` log in profile order: name, blocks, bytes, ncu time (ms)."""
    rows = list(csv.DictReader(line for line in lines if line.startswith('"')))
    kernels, index = [], {}
    for row in rows:
        key = row.get("ID")
        if key is None or "Metric Name" not in row:
            raise ValueError("ncu.csv: expected ncu --csv columns ID, Metric Name, ..., found "
                             + ", ".join(row))
        if key not in index:
            grid = [int(x) for x in row["Grid Size"].strip("()").split(",")]
            index[key] = len(kernels)
            blocks = 1
            for g in grid:
                blocks *= g
            kernels.append({"name": row["Kernel Name"], "blocks": blocks, "metrics": {}})
        value = float(row["Metric Value"].replace(",", ""))
        kernels[index[key]]["metrics"][row["Metric Name"]] = value
    for k in kernels:
        missing = [m for m in METRICS if m not in k["metrics"]]
        if missing:
            raise ValueError(f"ncu.csv: kernel {k['name']} lacks metrics {missing}")
        m = k.pop("metrics")
        k["bytes"] = m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]
        k["ncu_ms"] = m["gpu__time_duration.sum"] * 1e-6
    return kernels


def bound(bench, ncu_kernels, peak_gbs):
    """Each kernel with its shares, and the three sums; ValueError when the lists differ."""
    ours = bench.get("kernels")
    if not ours:
        raise ValueError("dqn_bench.json: expected a non-empty \"kernels\" list, found none")
    if len(ncu_kernels) < len(ours):
        raise ValueError(f"ncu.csv: expected at least {len(ours)} kernels (one replay), "
                         f"found {len(ncu_kernels)}")
    theirs = ncu_kernels[-len(ours):]
    peak = peak_gbs * 1e9
    rows, w_sm, w_dram, w_c = [], 0.0, 0.0, 0.0
    for i, (k, n) in enumerate(zip(ours, theirs)):
        if k["name"] != n["name"] or k["blocks"] != n["blocks"]:
            raise ValueError(f"kernel {i} (op {k['op']}): the benchmark has {k['name']} with "
                             f"{k['blocks']} blocks, ncu has {n['name']} with {n['blocks']}")
        t = k["alone_ms"]
        dram = min(1.0, n["bytes"] / (t * 1e-3 * peak)) if t > 0 else 0.0
        share = max(k["share"], dram)
        w_sm += t * k["share"]
        w_dram += t * dram
        w_c += t * share
        rows.append({"op": k["op"], "name": k["name"], "alone_ms": t, "ncu_ms": n["ncu_ms"],
                     "bytes": n["bytes"], "sm_share": k["share"], "dram_share": dram,
                     "work_ms": t * share})
    return {"kernels": rows, "sm_bound_ms": w_sm, "dram_bound_ms": w_dram,
            "combined_bound_ms": w_c, "peak_gbs": peak_gbs,
            "bytes": sum(r["bytes"] for r in rows)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", help="dqn_bench.json of the Rust benchmark")
    ap.add_argument("ncu", help="ncu --csv output of dqn --serial-replay")
    ap.add_argument("--peak-gbs", type=float, default=3350.0)
    ap.add_argument("--json", default=None, help="default: $OUT/dram_bound.json")
    args = ap.parse_args(argv)
    try:
        with open(args.bench) as f:
            bench = json.load(f)
        with open(args.ncu) as f:
            ncu_kernels = read_ncu(f.read().splitlines())
        res = bound(bench, ncu_kernels, args.peak_gbs)
    except (OSError, ValueError, KeyError) as e:
        print(f"dram_bound: {e}", file=sys.stderr)
        return 1
    c = bench.get("stepgraph_graph_ms")
    print(f"{len(res['kernels'])} kernels, {res['bytes'] / 1e9:.3f} GB of DRAM traffic "
          f"({res['bytes'] / 1e9 / (args.peak_gbs / 1e3):.3f} ms at {args.peak_gbs:.0f} GB/s)")
    print(f"work bound, SM shares only:          {res['sm_bound_ms']:.3f} ms")
    print(f"work bound, DRAM shares only:        {res['dram_bound_ms']:.3f} ms")
    print(f"work bound, the larger share each:   {res['combined_bound_ms']:.3f} ms"
          + (f"   (c) = {c:.3f} ms, (c)/bound = {c / res['combined_bound_ms']:.3f}" if c else ""))
    print("heaviest kernels (op, name, alone ms, ncu ms, MB, SM share, DRAM share):")
    for r in sorted(res["kernels"], key=lambda r: -r["work_ms"])[:12]:
        print(f"  {r['op']:<24} {r['name'][:48]:<48} {r['alone_ms']:.4f} {r['ncu_ms']:.4f} "
              f"{r['bytes'] / 1e6:8.1f} {r['sm_share']:.2f} {r['dram_share']:.2f}")
    out = args.json or os.path.join(os.environ.get("OUT") or ".", "dram_bound.json")
    with open(out, "w") as f:
        json.dump(dict(res, stepgraph_graph_ms=c, device=bench.get("device")), f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
