#!/usr/bin/env bash
# Session 4, cycle 4 (2026-12-01): stream priorities and hardware queues on V2 (the branch
# heads and the IQL heads in one pass each, .device/v2/dqn): the declared priorities
# (attention high, its weight gradients low), four overrides, and CUDA_DEVICE_MAX_CONNECTIONS
# = 16 (the step has 10 streams, the driver's default is 8 queues); alternated twice.
set -u -o pipefail
cd "$(dirname "$0")/.."
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
X=.device/v2/dqn
for i in 1 2; do
  ( timeout 100 $X ) > "$L/declared-$i.log" 2>&1
  ( STEPGRAPH_STREAM_PRIORITIES="main=high,branch=high,ddqn=high,attn_wgrad=low" timeout 100 $X ) > "$L/p1-chain-high-$i.log" 2>&1
  ( STEPGRAPH_STREAM_PRIORITIES="aux_attn=high,main=high,branch=high,ddqn=high,attn_wgrad=low" timeout 100 $X ) > "$L/p2-all-high-$i.log" 2>&1
  ( STEPGRAPH_STREAM_PRIORITIES="aux_attn=high,ddqn=high,attn_wgrad=low" timeout 100 $X ) > "$L/p3-ddqn-high-$i.log" 2>&1
  ( STEPGRAPH_STREAM_PRIORITIES="aux_attn=high,branch=high,attn_wgrad=low" timeout 100 $X ) > "$L/p4-branch-high-$i.log" 2>&1
  ( CUDA_DEVICE_MAX_CONNECTIONS=16 timeout 100 $X ) > "$L/conn16-$i.log" 2>&1
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
for f in "$L"/*.log; do
  printf "%-22s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((c|w)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}')"
done
