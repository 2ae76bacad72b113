#!/usr/bin/env bash
# Session 4, cycle 13 (2026-12-01): after the clean-up of the whole change (a shared
# reduce-scatter, byte-identical cubins; the head wrappers' refusals and launch configs from
# one place; a shared bits helper in the GPU tests): GPU tests, the check at the default sizes and at the
# fallback sizes (three training steps at each), the example with its benchmark.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
( timeout 120 $B/bin/gpu --test-threads=1 --include-ignored ) > "$L/gpu.log" 2>&1; echo "gpu rc=$?" >> "$L/gpu.log"
rm -rf /tmp/chk /tmp/chk2
( timeout 60 $B/bin/dqn --check /tmp/chk && timeout 90 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check.log" 2>&1
echo "check rc=$?" >> "$L/check.log"
( timeout 60 $B/bin/dqn --check /tmp/chk2 --batch 1024 --hidden 320 --width 48 --heads 4 --glu 72 --actions 9 && timeout 90 python3 examples/dqn/reference.py check /tmp/chk2 --device cuda ) > "$L/check-fallback-sizes.log" 2>&1
echo "check rc=$?" >> "$L/check-fallback-sizes.log"
( timeout 100 $B/bin/dqn ) > "$L/dqn.log" 2>&1; echo "dqn rc=$?" >> "$L/dqn.log"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "test result\|reference check:\|rc=\|FAILED\|panicked" "$L"/*.log | head -20
grep -h "  grad.w1 " "$L"/check*.log | awk '{printf "%s ", $2}'; echo
grep -hE "^\| \((b|c|w|w.)\) " "$L/dqn.log"
