#!/usr/bin/env bash
# Session 4, cycle 7 (2026-12-01): V6 (attention's whole backward on the attn_wgrad stream)
# with that stream at normal and at high priority instead of low, against V5, alternated.
set -u -o pipefail
cd "$(dirname "$0")/.."
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
for i in 1 2; do
  ( timeout 100 .device/bundle/bin/dqn ) > "$L/v5-$i.log" 2>&1
  ( STEPGRAPH_STREAM_PRIORITIES="aux_attn=high" timeout 100 .device/v6/dqn ) > "$L/v6-normal-$i.log" 2>&1
  ( STEPGRAPH_STREAM_PRIORITIES="aux_attn=high,attn_wgrad=high" timeout 100 .device/v6/dqn ) > "$L/v6-high-$i.log" 2>&1
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
for f in "$L"/*.log; do
  printf "%-14s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((b|c|w)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}')"
done
for f in v6-normal-2 v6-high-2; do echo "== $f"; grep -n "profile \`dqn\`" -A30 "$L/$f.log" | sed -n 2,31p; done
