#!/usr/bin/env bash
# Cycle 7 (H200): attention's weight gradients on a low-priority stream of their own (V1,
# .device/bundle) against the tail-fused step (V0, .device/v0), alternated twice, V1 also
# with the weight-gradient stream at normal priority; V1 checked against PyTorch.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
rm -rf /tmp/chk
( timeout 60 $B/bin/dqn --check /tmp/chk && timeout 120 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check-v1.log" 2>&1; echo "check rc=$?" >> "$L/check-v1.log"
for i in 1 2; do
  ( timeout 150 .device/v0/dqn ) > "$L/v0-$i.log" 2>&1; echo "v0 rc=$?" >> "$L/v0-$i.log"
  ( timeout 150 $B/bin/dqn ) > "$L/v1-$i.log" 2>&1; echo "v1 rc=$?" >> "$L/v1-$i.log"
  ( STEPGRAPH_STREAM_PRIORITIES="aux_attn=high" timeout 150 $B/bin/dqn ) > "$L/v1-wnormal-$i.log" 2>&1; echo "v1-wnormal rc=$?" >> "$L/v1-wnormal-$i.log"
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "reference check:\|rc=\|FAILED\|panicked" "$L"/*.log | head -20
for f in v0-1 v1-1 v1-wnormal-1 v0-2 v1-2 v1-wnormal-2; do
  echo "== $f"; grep -hE "^\| \((b|c|c'|d|w|w')\) |saves|^\* trunk_backward|^\* clip_and_adam|^  attention_(head|wgrad) " "$L/$f.log"
done
