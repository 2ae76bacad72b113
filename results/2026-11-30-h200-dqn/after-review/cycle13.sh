#!/usr/bin/env bash
# Cycle 13 (H200, after the review fixes): GPU tests (the trunk join's with 8 branches
# and the 1024-block cap), the one-rank data-parallel run (ranks meet after
# verification), the DQN check against PyTorch.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
( timeout 100 $B/bin/gpu --include-ignored --test-threads=1 ) > "$L/gpu.log" 2>&1; echo "gpu rc=$?" >> "$L/gpu.log"
( timeout 60 $B/bin/dqn --gpus 1 --steps 50 ) > "$L/gpus1.log" 2>&1; echo "gpus1 rc=$?" >> "$L/gpus1.log"
rm -rf /tmp/chk
( timeout 60 $B/bin/dqn --check /tmp/chk && timeout 90 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check.log" 2>&1; echo "check rc=$?" >> "$L/check.log"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "test result\|reference check:\|data-parallel check\|rank 0: verified\|step time\|rc=\|FAILED\|panicked" "$L"/*.log | head -20
grep -h "trunk_grad_join\|BranchIn\|4096" "$L/gpu.log" | head -12
