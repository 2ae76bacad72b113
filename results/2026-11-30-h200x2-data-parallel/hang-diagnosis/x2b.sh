#!/usr/bin/env bash
# Why does dqn --gpus 2 hang after "data parallel"? NCCL's own log, then two variants.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
/sbin/ldconfig -p | grep -i nccl > "$L/ldconfig.txt"
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET,P2P,SHM,BOOTSTRAP
( timeout -s INT 45 $B/bin/dqn --gpus 2 --steps 20 ) > "$L/a-default.log" 2>&1; echo "rc=$?" >> "$L/a-default.log"
( NCCL_CUMEM_ENABLE=0 timeout -s INT 45 $B/bin/dqn --gpus 2 --steps 20 ) > "$L/b-nocumem.log" 2>&1; echo "rc=$?" >> "$L/b-nocumem.log"
( NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=0 timeout -s INT 45 $B/bin/dqn --gpus 2 --steps 20 ) > "$L/c-nop2p.log" 2>&1; echo "rc=$?" >> "$L/c-nop2p.log"
cp "$L"/* "$OUT"/
for f in "$L"/*.log; do echo "== $f"; grep -v "^ \|^plan\|critical" "$f" | tail -25; done
