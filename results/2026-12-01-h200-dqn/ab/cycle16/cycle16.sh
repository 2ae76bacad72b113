#!/usr/bin/env bash
# A/B: layer 1's bias gradient from cuBLASLt's DRELU_BGRAD epilogue on the dz1 GEMM (base,
# as committed) or from the BGRAD epilogue of the dw1 GEMM (bgrada), alternated twice;
# then bgrada's check against PyTorch at the default sizes.
set -u -o pipefail
cd "$(dirname "$0")/.."
R="$(pwd)"
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
for i in 1 2; do
  for v in base bgrada; do
    ( cd "$L" && timeout 100 $R/.device/ab/$v ) > "$L/$v-$i.log" 2>&1 || true
  done
done
rm -rf /tmp/chk
( timeout 60 .device/ab/bgrada --check /tmp/chk && OUT=/tmp/chk timeout 90 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check-bgrada.log" 2>&1
echo "check rc=$?" >> "$L/check-bgrada.log"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
for f in "$L"/base-*.log "$L"/bgrada-*.log; do
  printf "%-9s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((b|c|w|w.)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}' | sed 's/stepgraph graph//; s/one-stream graph//; s/work bound, grid shares not averaged over waves//; s/work bound//')"
done
for v in base bgrada; do echo "$v: $(grep -E "^\*? *(trunk_backward|clip_and_adam) " $L/$v-1.log | head -4 | tr -s ' ' | tr '\n' '|')"; grep -E "^\s+trunk_backward .* blocks" $L/$v-1.log; done
grep -h "reference check:\|grad.b1 \|grad.w1 " "$L/check-bgrada.log"
