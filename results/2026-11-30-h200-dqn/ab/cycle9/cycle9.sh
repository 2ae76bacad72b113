#!/usr/bin/env bash
# Cycle 9 (H200, final code candidate V3 = tail fusion + attention weight gradients on
# their own stream + per-sample kernels in blocks of 64): GPU tests and examples (run.sh,
# with dqn's benchmark and bounds), the DQN check at the default and the fallback sizes,
# the PyTorch benchmark and the merged table, an A/B of V1 (.device/v1, blocks of 256)
# against V3 alternated twice, the one-rank data-parallel run, memcheck.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L/run"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
( time OUT="$L/run" timeout 150 bash $B/run.sh ) > "$L/run.log" 2>&1
echo "run.sh rc=$?" >> "$L/run.log"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
rm -rf /tmp/chk /tmp/chk2
( timeout 60 $B/bin/dqn --check /tmp/chk && timeout 90 python3 examples/dqn/reference.py check /tmp/chk --device cuda ) > "$L/check.log" 2>&1
echo "check rc=$?" >> "$L/check.log"
cp /tmp/chk/reference_check.json "$L/" 2>/dev/null
( timeout 60 $B/bin/dqn --check /tmp/chk2 --batch 1024 --hidden 320 --width 48 --heads 4 && timeout 90 python3 examples/dqn/reference.py check /tmp/chk2 --device cuda ) > "$L/check-fallback-sizes.log" 2>&1
echo "check rc=$?" >> "$L/check-fallback-sizes.log"
( time OUT="$L" timeout 200 python3 examples/dqn/reference.py bench --device cuda --steps 200 --warmup 30 \
    --variants eager,graph,compile --compile-modes reduce-overhead ) > "$L/pytorch_bench.log" 2>&1
echo "bench rc=$?" >> "$L/pytorch_bench.log"
OUT="$L" python3 examples/dqn/combine.py "$L/run/dqn_bench.json" "$L/pytorch_bench.json" > "$L/combine.log" 2>&1
for i in 1 2; do
  for v in v1 v3; do
    ( timeout 60 .device/$v/dqn ) > "$L/ab-$v-$i.log" 2>&1; echo "$v rc=$?" >> "$L/ab-$v-$i.log"
  done
done
( timeout 60 $B/bin/dqn --gpus 1 --steps 50 ) > "$L/gpus1.log" 2>&1
echo "gpus1 rc=$?" >> "$L/gpus1.log"
( timeout 100 compute-sanitizer --tool memcheck $B/bin/dqn --batch 512 --steps 3 ) > "$L/memcheck.log" 2>&1
echo "memcheck rc=$?" >> "$L/memcheck.log"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "test result\|reference check:\|data-parallel check\|ERROR SUMMARY\|rc=\|FAILED\|panicked" "$L"/run/*.log "$L"/*.log | head -40
cat "$L/combine.log" | head -30
for f in ab-v1-1 ab-v3-1 ab-v1-2 ab-v3-2; do
  echo "== $f"; grep -hE "^\| \((b|c|w|w')\) |saves|^\* (double_dqn_target|dueling_losses)" "$L/$f.log"
done
