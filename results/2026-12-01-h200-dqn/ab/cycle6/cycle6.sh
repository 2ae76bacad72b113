#!/usr/bin/env bash
# Session 4, cycle 6 (2026-12-01): attention's data-gradient backward (the output and QKV
# projections' input gradients and attention_backward) moved onto the low-priority
# attn_wgrad stream with the weight gradients (V6, .device/v6) against the committed step
# (V5, .device/bundle, 0890e63), alternated twice.
set -u -o pipefail
cd "$(dirname "$0")/.."
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
for i in 1 2; do
  ( timeout 100 .device/bundle/bin/dqn ) > "$L/v5-$i.log" 2>&1
  ( timeout 100 .device/v6/dqn ) > "$L/v6-$i.log" 2>&1
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
for f in "$L"/*.log; do
  printf "%-10s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((b|c|w)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}')"
done
for f in v6-2; do echo "== $f"; grep -n "profile \`dqn\`" -A30 "$L/$f.log" | sed -n 2,31p; done
