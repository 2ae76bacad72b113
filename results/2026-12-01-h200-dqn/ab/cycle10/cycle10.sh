#!/usr/bin/env bash
# Session 4, cycle 10 (2026-12-01): the check at GLU 48, batch 1024 failed one tensor at
# step 3 (grad.w1 1.20e-2 > 1e-2). Is it the branch head kernels or the trajectories
# drifting apart over three Adam steps? 0890e63 (.device/v5) and 989f29b (.device/v0, no
# branch head kernels) at GLU 48 and at the default GLU 32, batch 1024, each against
# PyTorch in TF32 and against a float64 oracle.
set -u -o pipefail
cd "$(dirname "$0")/.."
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
for v in v5 v0; do
  for glu in 48 32; do
    d=/tmp/chk-$v-$glu; rm -rf $d
    timeout 60 .device/$v/dqn --check $d --batch 1024 --glu $glu > "$L/dump-$v-$glu.log" 2>&1
    ( timeout 90 python3 examples/dqn/reference.py check $d --device cuda ) > "$L/check-$v-glu$glu-tf32.log" 2>&1
    ( timeout 90 python3 examples/dqn/reference.py check $d --device cuda --dtype float64 ) > "$L/check-$v-glu$glu-f64.log" 2>&1
  done
done
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
for f in "$L"/check-*.log; do
  printf "%-26s %s | %s\n" "$(basename $f .log)" "$(grep -h 'reference check:' $f)" "$(grep -h '  grad.w1 ' $f | awk '{printf "%s ", $2}')"
done
