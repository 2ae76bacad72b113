#!/usr/bin/env bash
# Cycle 8 (H200): layer 1's bias gradient from column sums instead of DRELU_BGRAD (V2,
# .device/v2) against V1 (.device/v1), alternated twice; V2 under three other stream
# priority settings; V2 checked against PyTorch.
set -u -o pipefail
cd "$(dirname "$0")/.."
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
rm -rf /tmp/chk
( timeout 60 .device/v2/dqn --check /tmp/chk && timeout 120 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check-v2.log" 2>&1; echo "check rc=$?" >> "$L/check-v2.log"
for i in 1 2; do
  for v in v1 v2; do
    ( timeout 150 .device/$v/dqn ) > "$L/$v-$i.log" 2>&1; echo "$v rc=$?" >> "$L/$v-$i.log"
  done
done
run_prio() {
  ( STEPGRAPH_STREAM_PRIORITIES="$2" timeout 150 .device/v2/dqn ) > "$L/v2-$1.log" 2>&1; echo "v2-$1 rc=$?" >> "$L/v2-$1.log"
}
run_prio iqnhigh "aux_attn=high,attn_wgrad=low,aux_iqn=high"
run_prio ddqnhigh "aux_attn=high,attn_wgrad=low,ddqn=high"
run_prio attnnormal "attn_wgrad=low"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "reference check:\|rc=\|FAILED\|panicked" "$L"/*.log | head -20
for f in v1-1 v2-1 v1-2 v2-2 v2-iqnhigh v2-ddqnhigh v2-attnnormal; do
  echo "== $f"; grep -hE "^\| \((b|c|c'|w|w')\) |saves|^\* trunk_backward" "$L/$f.log"
done
