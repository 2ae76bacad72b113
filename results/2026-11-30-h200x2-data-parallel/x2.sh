#!/usr/bin/env bash
# Issue 6 on two GPUs: dqn --gpus 2 (check against one GPU, throughput, hidden all-reduce)
# at the default batch and at twice it, and --gpus 1 for the one-rank figures.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
{ nvidia-smi; nvidia-smi topo -m; } > "$L/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
env | grep -E "NCCL|MULTICAST|NVLS|NVSHMEM" > "$L/env.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
    nccl2="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))')"
    mkdir -p /tmp/nccl-links && ln -sf "$nccl2" /tmp/nccl-links/libnccl.so
    LD_LIBRARY_PATH=/tmp/nccl-links:$LD_LIBRARY_PATH
    echo "linked $nccl2" >> "$L/env.txt"
fi
( STEPGRAPH_GRAPH_DOT="$L/graph-gpu{device}.dot" timeout -s INT 120 $B/bin/dqn --gpus 2 --steps 200 ) > "$L/gpus2.log" 2>&1; echo "gpus2 rc=$?" >> "$L/gpus2.log"
grep -q "gpus2 rc=0" "$L/gpus2.log" && ( timeout -s INT 120 $B/bin/dqn --gpus 2 --steps 200 --batch 32768 ) > "$L/gpus2-b32768.log" 2>&1; echo "gpus2-b32768 rc=$?" >> "$L/gpus2-b32768.log"
gzip -f "$L"/*.dot 2>/dev/null; cp "$L"/* "$OUT"/
cat "$L/device.txt" "$L/env.txt"
grep -hE "rank [01]:|data parallel|verified against|data-parallel check|step time|all-reduce on rank|rc=|FAIL|error|Error" "$L"/gpus*.log
