#!/usr/bin/env bash
# The trunk's layer-1 backward in one kernel (trunk_l1_grad): GPU tests (trunk::*, and
# all), the check against PyTorch at the default and fallback sizes, then the step of
# 648a323 (base) against the first version (l1a: a block per chunk, 8 warps of 32 units)
# and this one (l1: two blocks per chunk of 128 units each), alternated three times.
set -u -o pipefail
cd "$(dirname "$0")/.."
R="$(pwd)"
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
( timeout 150 $B/bin/gpu --test-threads 1 --include-ignored --nocapture ) > "$L/gpu.log" 2>&1
echo "gpu rc=$?" >> "$L/gpu.log"
check() {  # name, dqn flags...
  local n=$1; shift
  rm -rf /tmp/chk-$n
  ( timeout 60 $B/bin/dqn --check /tmp/chk-$n "$@" && OUT=/tmp/chk-$n timeout 90 python3 examples/dqn/reference.py check /tmp/chk-$n --device cuda ) > "$L/check-$n.log" 2>&1
  echo "check rc=$?" >> "$L/check-$n.log"
}
check default
check b1024-glu48 --batch 1024 --glu 48
check fallback --batch 1024 --hidden 320 --width 48 --heads 4 --glu 72 --actions 9
for i in 1 2 3; do
  for v in base l1a l1; do
    ( cd "$L" && timeout 100 $R/.device/ab/$v ) > "$L/$v-$i.log" 2>&1 || true
  done
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "test result\|rc=\|FAILED\|panicked\|reference check:" "$L"/*.log | head -20
grep -h "dw1\|db1" "$L/gpu.log" | head -12
grep -h "grad.w1 \|grad.b1 " "$L/check-default.log" | head -3
for f in "$L"/base-*.log "$L"/l1a-*.log "$L"/l1-*.log; do
  printf "%-8s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((b|c|w|w.)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}' | sed 's/stepgraph graph//; s/one-stream graph//; s/work bound, grid shares not averaged over waves//; s/work bound//')"
done
for v in base l1a l1; do echo "$v: $(grep -E "^\*? *(trunk_backward|clip_and_adam) " $L/$v-1.log | head -4 | tr -s ' ' | tr '\n' '|')"; grep -E "^\s+trunk_backward .* blocks" $L/$v-1.log; done
