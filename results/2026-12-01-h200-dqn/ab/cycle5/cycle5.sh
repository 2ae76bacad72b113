#!/usr/bin/env bash
# Session 4, cycle 5 (2026-12-01): IQN after the branches' backward and the IQL heads (V4b)
# or after the branches' backward only (V4c), against V2 (no ordering: IQN starts when its
# target is ready), alternated twice. V2 is .device/bundle/bin/dqn (rebuilt; the same code).
set -u -o pipefail
cd "$(dirname "$0")/.."
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
for i in 1 2; do
  ( timeout 100 .device/bundle/bin/dqn ) > "$L/v2-$i.log" 2>&1
  ( timeout 100 .device/v4b/dqn ) > "$L/v4b-$i.log" 2>&1
  ( timeout 100 .device/v4c/dqn ) > "$L/v4c-$i.log" 2>&1
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
for f in "$L"/*.log; do
  printf "%-10s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((b|c|w)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}')"
done
for f in v4b-2 v4c-2; do echo "== $f"; grep -n "profile \`dqn\`" -A30 "$L/$f.log" | sed -n 2,31p; done
