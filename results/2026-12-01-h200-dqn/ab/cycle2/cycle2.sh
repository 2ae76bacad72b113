#!/usr/bin/env bash
# Session 4, cycle 2 (2026-12-01): the IQL heads in one pass each (V2, .device/bundle) against
# the branch head kernels alone (V1, .device/v1), alternated twice; GPU tests, the DQN
# V2 also with the main stream at high priority; the DQN
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
  ( timeout 150 .device/v1/dqn ) > "$L/v1-$i.log" 2>&1; echo "v1 rc=$?" >> "$L/v1-$i.log"
  ( timeout 150 $B/bin/dqn ) > "$L/v2-$i.log" 2>&1; echo "v2 rc=$?" >> "$L/v2-$i.log"
  ( STEPGRAPH_STREAM_PRIORITIES="aux_attn=high,attn_wgrad=low,main=high" timeout 150 $B/bin/dqn ) > "$L/v2-mainhigh-$i.log" 2>&1; echo "v2-mainhigh rc=$?" >> "$L/v2-mainhigh-$i.log"
done
( timeout 60 $B/bin/dqn --gpus 1 --steps 50 ) > "$L/gpus1.log" 2>&1
echo "gpus1 rc=$?" >> "$L/gpus1.log"
( timeout 100 compute-sanitizer --tool memcheck $B/bin/dqn --batch 512 --steps 3 ) > "$L/memcheck.log" 2>&1
echo "memcheck rc=$?" >> "$L/memcheck.log"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "test result\|reference check:\|data-parallel check\|ERROR SUMMARY\|rc=\|FAILED\|panicked" "$L"/*.log | head -40
for f in v1-1 v2-1 v2-mainhigh-1 v1-2 v2-2 v2-mainhigh-2; do
  echo "== $f"; grep -hE "^\| \((b|c|d|w|w')\) |saves|^\* trunk_backward|^\* clip_and_adam|^  (iqn_head|branch_backward\[0\]|branch_forward\[0\]|branch_forward_next\[0\]|iql_high|iql_low) |^. (double_dqn|dueling|iql_high|iql_low|trunk_backward)" "$L/$f.log"
done
