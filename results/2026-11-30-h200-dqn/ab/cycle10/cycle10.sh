#!/usr/bin/env bash
# Cycle 10 (H200): the branches' next-state passes on streams of their own (V4,
# .device/v4) against V1 (.device/v1), alternated twice; V4 checked against PyTorch.
set -u -o pipefail
cd "$(dirname "$0")/.."
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
rm -rf /tmp/chk
( timeout 60 .device/v4/dqn --check /tmp/chk && timeout 120 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check-v4.log" 2>&1; echo "check rc=$?" >> "$L/check-v4.log"
for i in 1 2; do
  for v in v1 v4; do
    ( timeout 150 .device/$v/dqn ) > "$L/$v-$i.log" 2>&1; echo "$v rc=$?" >> "$L/$v-$i.log"
  done
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "reference check:\|rc=\|FAILED\|panicked" "$L"/*.log | head -20
for f in v1-1 v4-1 v1-2 v4-2; do
  echo "== $f"; grep -hE "^\| \((b|c|c'|w|w')\) |saves|^\*? *(branch_forward|double_dqn|dueling|iqn_head)" "$L/$f.log"
done
