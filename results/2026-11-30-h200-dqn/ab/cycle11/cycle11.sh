#!/usr/bin/env bash
# Cycle 11 (H200): CUDA_DEVICE_MAX_CONNECTIONS=32 (the driver's hardware work queues; the
# default is 8) for V1 (10 streams) and V4 (14 streams), alternated with the defaults.
set -u -o pipefail
cd "$(dirname "$0")/.."
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
for i in 1 2; do
  for v in v1 v4; do
    ( timeout 60 .device/$v/dqn ) > "$L/$v-$i.log" 2>&1; echo "$v rc=$?" >> "$L/$v-$i.log"
    ( CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 60 .device/$v/dqn ) > "$L/$v-conn32-$i.log" 2>&1; echo "$v-conn32 rc=$?" >> "$L/$v-conn32-$i.log"
  done
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "rc=\|FAILED\|panicked" "$L"/*.log | sort | uniq -c
for f in v1-1 v1-conn32-1 v4-1 v4-conn32-1 v1-2 v1-conn32-2 v4-2 v4-conn32-2; do
  echo "== $f: $(grep -hE "^\| \((c)\) " "$L/$f.log")  $(grep -hE "^\| \(w'\) " "$L/$f.log" | cut -d'|' -f3-4)  attention start $(grep -hE "^ +attention_head +aux_attn" "$L/$f.log" | awk '{print $3}')"
done
