#!/usr/bin/env bash
# A/B of attention_wgrad's start: v0 as committed (after attention_head), v1 also after
# dueling_losses, v2 also after iqn_head, v3 also after double_dqn_target. Each binary's
# full run (train 200 steps, then (a)..(w')), alternated twice.
set -u -o pipefail
cd "$(dirname "$0")/.."
R="$(pwd)"
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
for i in 1 2; do
  for v in v0 v1 v2 v3; do
    ( cd "$L" && timeout 100 $R/.device/ab/$v/dqn ) > "$L/$v-$i.log" 2>&1 || true
  done
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
for f in "$L"/v*.log; do
  printf "%-8s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((b|c|w|w.)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}' | sed 's/stepgraph graph//; s/one-stream graph//; s/work bound, grid shares not averaged over waves//; s/work bound//')"
done
for v in v0 v1 v2 v3; do echo "$v: $(grep -E "^\s+(iqn_head|attention_wgrad|trunk_backward|dueling_losses) " $L/$v-1.log | awk '{printf "%s %s-%s  ", $1, $3, $4}')"; done
