#!/usr/bin/env bash
# Final cycle of 2026-12-01 (H200; the branches' head kernels and the IQL heads in one
# pass each, their GEMM products in TF32): GPU tests and examples (run.sh, with dqn's
# benchmark and bounds), the DQN check at the default sizes, at sizes that take every
# fallback path (IQN at hidden 320, the branch heads at GLU 72 and 9 actions, IQL at
# hidden 320) and at batch 1024 with GLU 32 and 48 (where f32 products drifted, cycle
# 10), the PyTorch benchmark and the merged table, the one-rank data-parallel run,
# memcheck of a small step, and the steps of 989f29b (.device/v0/dqn) and 0890e63 (f32
# products, .device/v5/dqn) against this one, alternated twice.
# Run as `bash .device/cycle.sh` from a copy in .device/ with `cargo xtask bundle
# --gpu-tests` in .device/bundle.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L/run"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
( time OUT="$L/run" timeout 150 bash $B/run.sh ) > "$L/run.log" 2>&1
echo "run.sh rc=$?" >> "$L/run.log"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
rm -rf /tmp/chk /tmp/chk2
( timeout 60 $B/bin/dqn --check /tmp/chk && timeout 90 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check.log" 2>&1
echo "check rc=$?" >> "$L/check.log"
cp /tmp/chk/reference_check.json "$L/" 2>/dev/null
( timeout 60 $B/bin/dqn --check /tmp/chk2 --batch 1024 --hidden 320 --width 48 --heads 4 --glu 72 --actions 9 && timeout 90 python3 examples/dqn/reference.py check /tmp/chk2 --device cuda ) > "$L/check-fallback-sizes.log" 2>&1
echo "check rc=$?" >> "$L/check-fallback-sizes.log"
for glu in 32 48; do
  rm -rf /tmp/chk-$glu
  ( timeout 60 $B/bin/dqn --check /tmp/chk-$glu --batch 1024 --glu $glu && timeout 90 python3 examples/dqn/reference.py check /tmp/chk-$glu --device cuda ) > "$L/check-b1024-glu$glu.log" 2>&1
  echo "check rc=$?" >> "$L/check-b1024-glu$glu.log"
done
( time OUT="$L" timeout 200 python3 examples/dqn/reference.py bench --device cuda --steps 200 --warmup 30 \
    --variants eager,graph,compile --compile-modes reduce-overhead ) > "$L/pytorch_bench.log" 2>&1
echo "bench rc=$?" >> "$L/pytorch_bench.log"
OUT="$L" python3 examples/dqn/combine.py "$L/run/dqn_bench.json" "$L/pytorch_bench.json" > "$L/combine.log" 2>&1
( timeout 60 $B/bin/dqn --gpus 1 --steps 50 ) > "$L/gpus1.log" 2>&1
echo "gpus1 rc=$?" >> "$L/gpus1.log"
( timeout 100 compute-sanitizer --tool memcheck $B/bin/dqn --batch 512 --steps 3 ) > "$L/memcheck.log" 2>&1
echo "memcheck rc=$?" >> "$L/memcheck.log"
for i in 1 2; do
  ( timeout 100 .device/v0/dqn ) > "$L/ab-989f29b-$i.log" 2>&1
  ( timeout 100 .device/v5/dqn ) > "$L/ab-0890e63-$i.log" 2>&1
  ( timeout 100 $B/bin/dqn ) > "$L/ab-final-$i.log" 2>&1
done
tar czf "$OUT/logs.tgz" -C "$L" .
cp "$L"/*.json "$L"/run/dqn_bench.json "$OUT/" 2>/dev/null
cat "$L/device.txt"
grep -h "test result\|reference check:\|data-parallel check\|ERROR SUMMARY\|rc=\|FAILED\|panicked" "$L"/run/*.log "$L"/*.log | head -40
grep -h "  grad.w1 " "$L"/check*.log | awk '{printf "%s ", $2}'; echo
grep -B3 -A20 "panicked" "$L"/run/gpu.log | head -60
cat "$L/combine.log" | head -30
for f in "$L"/ab-*.log; do
  printf "%-18s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((b|c|w|w.)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}')"
done
