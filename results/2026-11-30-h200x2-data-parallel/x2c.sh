#!/usr/bin/env bash
# dqn --gpus 2 under NCCL_MAX_CTAS settings: NCCL's kernels spin on SMs while they wait
# for the peer, so fewer of them may leave more of the GPU to the backward they overlap.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
for batch in 32768 16384; do
  for ctas in default 16 8 4 2; do
    f="$L/gpus2-b$batch-ctas$ctas.log"
    if [ "$ctas" = default ]; then
      ( timeout -s INT 60 $B/bin/dqn --gpus 2 --steps 200 --batch $batch ) > "$f" 2>&1
    else
      ( NCCL_MAX_CTAS=$ctas timeout -s INT 60 $B/bin/dqn --gpus 2 --steps 200 --batch $batch ) > "$f" 2>&1
    fi
    echo "rc=$?" >> "$f"
    echo "== batch $batch, NCCL_MAX_CTAS $ctas: $(grep -hE 'step time|all-reduce on rank|data-parallel check|rc=' "$f" | sed 's/^/  /')"
  done
done
cp "$L"/* "$OUT"/
