#!/usr/bin/env bash
# Cycle 5 (after the review clean-up): GPU tests and examples (run.sh, with dqn's
# benchmark and work bound), the DQN check against PyTorch, the one-rank NCCL run.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L/run"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
( time OUT="$L/run" timeout 200 bash $B/run.sh ) > "$L/run.log" 2>&1
echo "run.sh rc=$?" >> "$L/run.log"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
rm -rf /tmp/chk
( timeout 60 $B/bin/dqn --check /tmp/chk && timeout 90 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check.log" 2>&1
echo "check rc=$?" >> "$L/check.log"
( timeout 60 $B/bin/dqn --gpus 1 --steps 50 ) > "$L/gpus1.log" 2>&1
echo "gpus1 rc=$?" >> "$L/gpus1.log"
tar czf "$OUT/logs.tgz" -C "$L" .
grep -h "test result\|reference check:\|data-parallel check\|rc=\|FAILED\|panicked\|  passed\|  FAILED" "$L"/run/*.log "$L"/*.log | head -30
grep -hE "^\| \((a|b|c|c'|d|w|w')\) |work bound:|step breakdown:|all-reduce on rank|step time:" "$L"/run/dqn.log "$L"/gpus1.log
