#!/usr/bin/env bash
# Session 4, cycle 3 (2026-12-01): the double-DQN target and the dueling losses a thread per
# (sample, branch) (V3, .device/bundle) against V2 (.device/v2: with the IQL heads in one pass), and V3 with IQN after the dueling losses (V3a, .device/v3a), alternated twice; GPU tests, the DQN
# check at the default sizes and at sizes that take every fallback path (IQN, branch
# heads and IQL: hidden 320), the one-rank data-parallel run, memcheck of a small step.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L/run"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
( timeout 150 $B/bin/gpu --test-threads=1 --include-ignored ) > "$L/gpu.log" 2>&1; echo "gpu rc=$?" >> "$L/gpu.log"
rm -rf /tmp/chk /tmp/chk2
( timeout 60 $B/bin/dqn --check /tmp/chk && timeout 90 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check.log" 2>&1
echo "check rc=$?" >> "$L/check.log"
( timeout 60 $B/bin/dqn --check /tmp/chk2 --batch 1024 --hidden 320 --width 48 --heads 4 --glu 72 --actions 9 && timeout 90 python3 examples/dqn/reference.py check /tmp/chk2 --device cuda ) > "$L/check-fallback-sizes.log" 2>&1
echo "check rc=$?" >> "$L/check-fallback-sizes.log"
for i in 1 2; do
  ( timeout 150 .device/v2/dqn ) > "$L/v2-$i.log" 2>&1; echo "v2 rc=$?" >> "$L/v2-$i.log"
  ( timeout 150 $B/bin/dqn ) > "$L/v3-$i.log" 2>&1; echo "v3 rc=$?" >> "$L/v3-$i.log"
  ( timeout 150 .device/v3a/dqn ) > "$L/v3a-$i.log" 2>&1; echo "v3a rc=$?" >> "$L/v3a-$i.log"
done
( timeout 60 $B/bin/dqn --gpus 1 --steps 50 ) > "$L/gpus1.log" 2>&1
echo "gpus1 rc=$?" >> "$L/gpus1.log"
( timeout 100 compute-sanitizer --tool memcheck $B/bin/dqn --batch 512 --steps 3 ) > "$L/memcheck.log" 2>&1
echo "memcheck rc=$?" >> "$L/memcheck.log"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "test result\|reference check:\|data-parallel check\|ERROR SUMMARY\|rc=\|FAILED\|panicked" "$L"/*.log | head -40
for f in v2-1 v3-1 v3a-1 v2-2 v3-2 v3a-2; do
  echo "== $f"; grep -hE "^\| \((b|c|w|w')\) |^. (double_dqn_target|dueling_losses|iqn_head|trunk_backward) |^\| (double_dqn_target|dueling_losses|iqn_head) " "$L/$f.log"
done
