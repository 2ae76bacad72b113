#!/usr/bin/env bash
# Session 4, cycle 9 (2026-12-01): a branch pass as one kernel (branch_pass: the gate layer
# on the tensor cores with the GLU and the advantage layer; V7, .device/bundle) against
# 0890e63 (V5, .device/v5), alternated twice; GPU tests, the DQN check at the default sizes,
# at sizes that take every fallback path, and at GLU 48 (the gate GEMM with
# branch_head_forward), the one-rank data-parallel run, memcheck of a small step.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
( timeout 150 $B/bin/gpu --test-threads=1 --include-ignored ) > "$L/gpu.log" 2>&1; echo "gpu rc=$?" >> "$L/gpu.log"
rm -rf /tmp/chk /tmp/chk2 /tmp/chk3
( timeout 60 $B/bin/dqn --check /tmp/chk && timeout 90 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check.log" 2>&1
echo "check rc=$?" >> "$L/check.log"
( timeout 60 $B/bin/dqn --check /tmp/chk2 --batch 1024 --hidden 320 --width 48 --heads 4 --glu 72 --actions 9 && timeout 90 python3 examples/dqn/reference.py check /tmp/chk2 --device cuda ) > "$L/check-fallback-sizes.log" 2>&1
echo "check rc=$?" >> "$L/check-fallback-sizes.log"
( timeout 60 $B/bin/dqn --check /tmp/chk3 --batch 1024 --glu 48 && timeout 90 python3 examples/dqn/reference.py check /tmp/chk3 --device cuda ) > "$L/check-glu48.log" 2>&1
echo "check rc=$?" >> "$L/check-glu48.log"
for i in 1 2; do
  ( timeout 100 .device/v5/dqn ) > "$L/v5-$i.log" 2>&1
  ( timeout 100 $B/bin/dqn ) > "$L/v7-$i.log" 2>&1
done
( timeout 60 $B/bin/dqn --gpus 1 --steps 50 ) > "$L/gpus1.log" 2>&1
echo "gpus1 rc=$?" >> "$L/gpus1.log"
( timeout 100 compute-sanitizer --tool memcheck $B/bin/dqn --batch 512 --steps 3 ) > "$L/memcheck.log" 2>&1
echo "memcheck rc=$?" >> "$L/memcheck.log"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "test result\|reference check:\|data-parallel check\|ERROR SUMMARY\|rc=\|FAILED\|panicked" "$L"/*.log | head -30
for f in v5-1 v7-1 v5-2 v7-2; do
  printf "%-6s %s\n" "$f" "$(grep -hE '^\| \((b|c|w|w.)\) ' $L/$f.log | awk -F'|' '{printf "%s %s ", $2, $3}')"
done
grep -hE "^  (branch_forward|branch_forward_next)\[0\] " "$L/v7-2.log" "$L/v5-2.log"
grep -n "profile \`dqn\`" -A30 "$L/v7-2.log" | sed -n 2,31p
grep -B2 -A12 "panicked\|FAILED" "$L/gpu.log" | head -60
