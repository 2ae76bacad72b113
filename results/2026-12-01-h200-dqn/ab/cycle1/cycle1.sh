#!/usr/bin/env bash
# Session 4, cycle 1 (2026-12-01): the branch head kernels (forward: GLU + advantage layer;
# backward: advantage layer + GLU + the gate's bias gradient) in .device/bundle (V1)
# against HEAD 989f29b (V0, .device/v0), alternated twice; GPU tests and examples (run.sh),
# the DQN check at the default sizes and at sizes that take both fallback paths (IQN's and
# the branch heads'), the one-rank data-parallel run, memcheck of a small step.
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
  ( timeout 150 .device/v0/dqn ) > "$L/v0-$i.log" 2>&1; echo "v0 rc=$?" >> "$L/v0-$i.log"
  ( timeout 150 $B/bin/dqn ) > "$L/v1-$i.log" 2>&1; echo "v1 rc=$?" >> "$L/v1-$i.log"
done
( timeout 60 $B/bin/dqn --gpus 1 --steps 50 ) > "$L/gpus1.log" 2>&1
echo "gpus1 rc=$?" >> "$L/gpus1.log"
( timeout 100 compute-sanitizer --tool memcheck $B/bin/dqn --batch 512 --steps 3 ) > "$L/memcheck.log" 2>&1
echo "memcheck rc=$?" >> "$L/memcheck.log"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "test result\|reference check:\|data-parallel check\|ERROR SUMMARY\|rc=\|FAILED\|panicked" "$L"/*.log | head -40
for f in v0-1 v1-1 v0-2 v1-2; do
  echo "== $f"; grep -hE "^\| \((b|c|d|w|w')\) |saves|^\* trunk_backward|^\* clip_and_adam|^  (iqn_head|branch_backward\[0\]|branch_forward\[0\]|branch_forward_next\[0\]) |^\* (double_dqn|dueling)" "$L/$f.log"
done
