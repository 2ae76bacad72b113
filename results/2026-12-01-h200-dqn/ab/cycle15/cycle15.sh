#!/usr/bin/env bash
# A/B of IQN_FUSED_WAVES (kernels/src/lib.rs): 1 (as committed: 132 persistent blocks),
# 2 and 4 (264 and 528 shorter blocks the hardware can balance when some SMs start
# late), alternated twice in one call.
set -u -o pipefail
cd "$(dirname "$0")/.."
R="$(pwd)"
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
for i in 1 2; do
  for v in w1 w2 w4; do
    ( cd "$L" && timeout 100 $R/.device/ab/$v ) > "$L/$v-$i.log" 2>&1 || true
  done
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
for f in "$L"/w*.log; do
  printf "%-6s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((b|c|w|w.)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}' | sed 's/stepgraph graph//; s/one-stream graph//; s/work bound, grid shares not averaged over waves//; s/work bound//')"
done
for v in w1 w2 w4; do echo "$v: $(grep -E "^\*? *iqn_head " $L/$v-1.log | head -2 | tr -s ' ' | tr '\n' '|')"; done
