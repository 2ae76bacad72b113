#!/usr/bin/env bash
# Cycle 6 (H200): GPU tests (with the trunk join's), memcheck of the new kernels, the DQN
# check against PyTorch, and an A/B of the whole dqn run (bounds included): the step
# before the tail changes (.device/before/dqn, b577a84) and after, alternated twice.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
( timeout 150 $B/bin/gpu --include-ignored --test-threads=1 ) > "$L/gpu.log" 2>&1; echo "gpu rc=$?" >> "$L/gpu.log"
( timeout 120 compute-sanitizer --tool memcheck $B/bin/gpu --include-ignored --test-threads=1 trunk ) > "$L/memcheck-trunk.log" 2>&1; echo "memcheck rc=$?" >> "$L/memcheck-trunk.log"
rm -rf /tmp/chk
( timeout 60 $B/bin/dqn --check /tmp/chk && timeout 120 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check.log" 2>&1; echo "check rc=$?" >> "$L/check.log"
for i in 1 2; do
  ( timeout 150 .device/before/dqn ) > "$L/before-$i.log" 2>&1; echo "before rc=$?" >> "$L/before-$i.log"
  ( timeout 150 $B/bin/dqn ) > "$L/after-$i.log" 2>&1; echo "after rc=$?" >> "$L/after-$i.log"
done
cp "$L"/* "$OUT"/
cat "$L/device.txt"
grep -h "test result\|reference check:\|rc=\|FAILED\|panicked\|ERROR SUMMARY" "$L"/*.log | head -30
for f in before-1 after-1 before-2 after-2; do
  echo "== $f"; grep -hE "^\| \((a|b|c|c'|d|w|w')\) |work bound:|step breakdown:|saves|^\* trunk_backward|^\* clip_and_adam" "$L/$f.log"
done
