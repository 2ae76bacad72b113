#!/usr/bin/env bash
# Cycle of 2026-12-01 (session 5): the per-step check, the non-finite guard (also in the
# data-parallel check), the runtime and macro input checks, and the trunk's layer-1
# backward in one kernel (trunk_l1_grad).
# GPU tests and examples (run.sh, with dqn's benchmark and bounds), reference.py's own
# tests (pytest on the CPU), the DQN check at the default sizes, at the fallback sizes and
# at batch 1024 with --glu 48, the guard shown with --inject-nan, the PyTorch benchmark
# and the merged table, the one-rank data-parallel run, memcheck of a small step, and the
# step's benchmark twice more for the spread.
# Run as `bash .device/cycle.sh` with `cargo xtask bundle --gpu-tests` in .device/bundle
# and pytest's wheels in .device/wheels (`pip download pytest iniconfig pluggy packaging`).
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L/run"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
( time OUT="$L/run" timeout 170 bash $B/run.sh ) > "$L/run.log" 2>&1
echo "run.sh rc=$?" >> "$L/run.log"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
pip install -q --no-deps --target /tmp/pyt .device/wheels/*.whl > "$L/pip.log" 2>&1
( cd examples/dqn && PYTHONPATH=/tmp/pyt timeout 200 python3 -m pytest -q -p no:cacheprovider test_reference.py test_combine.py test_dram_bound.py ) > "$L/pytest.log" 2>&1
echo "pytest rc=$?" >> "$L/pytest.log"
check() {  # name, dqn flags...
  local n=$1; shift
  rm -rf /tmp/chk-$n
  ( timeout 60 $B/bin/dqn --check /tmp/chk-$n "$@" && OUT=/tmp/chk-$n timeout 90 python3 examples/dqn/reference.py check /tmp/chk-$n --device cuda ) > "$L/check-$n.log" 2>&1
  echo "check rc=$?" >> "$L/check-$n.log"
  cp /tmp/chk-$n/reference_check.json "$L/reference_check-$n.json" 2>/dev/null
}
check default
check fallback --batch 1024 --hidden 320 --width 48 --heads 4 --glu 72 --actions 9
check b1024-glu48 --batch 1024 --glu 48
( timeout 60 $B/bin/dqn --steps 30 --inject-nan 17 ) > "$L/inject-nan.log" 2>&1
echo "inject-nan rc=$?" >> "$L/inject-nan.log"
( time OUT="$L" timeout 200 python3 examples/dqn/reference.py bench --device cuda --steps 200 --warmup 30 \
    --variants eager,graph,compile --compile-modes reduce-overhead ) > "$L/pytorch_bench.log" 2>&1
echo "bench rc=$?" >> "$L/pytorch_bench.log"
OUT="$L" python3 examples/dqn/combine.py "$L/run/dqn_bench.json" "$L/pytorch_bench.json" > "$L/combine.log" 2>&1
( timeout 60 $B/bin/dqn --gpus 1 --steps 50 ) > "$L/gpus1.log" 2>&1
echo "gpus1 rc=$?" >> "$L/gpus1.log"
( timeout 100 compute-sanitizer --tool memcheck $B/bin/dqn --batch 512 --steps 3 ) > "$L/memcheck.log" 2>&1
echo "memcheck rc=$?" >> "$L/memcheck.log"
for i in 1 2; do
  ( timeout 100 $B/bin/dqn ) > "$L/bench-$i.log" 2>&1
done
tar czf "$OUT/logs.tgz" -C "$L" .
cp "$L"/*.json "$L"/run/dqn_bench.json "$OUT/" 2>/dev/null
cat "$L/device.txt"
grep -h "test result\|reference check:\|data-parallel check\|ERROR SUMMARY\|rc=\|FAILED\|panicked\| passed" "$L"/run/*.log "$L"/*.log | head -40
grep -h "inject-nan\|not finite" "$L/inject-nan.log"
cat "$L/combine.log" | head -30
for f in "$L"/bench-*.log "$L/run/dqn.log"; do
  printf "%-18s %s\n" "$(basename $f .log)" "$(grep -hE '^\| \((b|c|w|w.)\) ' $f | awk -F'|' '{printf "%s %s ", $2, $3}')"
done
