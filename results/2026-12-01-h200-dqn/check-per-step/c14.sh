#!/usr/bin/env bash
# The per-step check: reference.py's own tests (pytest, CPU, tiny sizes), then the DQN
# check at the default sizes, at the fallback sizes, and at batch 1024 with --glu 48
# (where the free-running comparison failed grad.w1 at step 3).
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
pip install -q --no-deps --target /tmp/pyt .device/wheels/*.whl > "$L/pip.log" 2>&1
( cd examples/dqn && PYTHONPATH=/tmp/pyt timeout 300 python3 -m pytest -q -p no:cacheprovider test_reference.py test_combine.py test_dram_bound.py ) > "$L/pytest.log" 2>&1
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
tar czf "$OUT/logs.tgz" -C "$L" .
cp "$L"/*.json "$OUT/" 2>/dev/null
cat "$L/device.txt"
tail -5 "$L/pytest.log"
grep -h "reference check:\|rc=\|own trajectory\|update.all" "$L"/check-*.log | head -40
