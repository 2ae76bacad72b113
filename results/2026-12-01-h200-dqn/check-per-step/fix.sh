#!/usr/bin/env bash
# Re-run of what failed in the cycle: the GPU tests (optim's update check) and
# reference.py's own tests.
set -u -o pipefail
cd "$(dirname "$0")/.."
B=.device/bundle
L=/tmp/logs; rm -rf "$L"; mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/device.txt"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
( timeout 120 $B/bin/gpu --test-threads 1 --include-ignored ) > "$L/gpu.log" 2>&1
echo "gpu rc=$?" >> "$L/gpu.log"
pip install -q --no-deps --target /tmp/pyt .device/wheels/*.whl > "$L/pip.log" 2>&1
( cd examples/dqn && PYTHONPATH=/tmp/pyt timeout 200 python3 -m pytest -q -p no:cacheprovider test_reference.py test_combine.py test_dram_bound.py ) > "$L/pytest.log" 2>&1
echo "pytest rc=$?" >> "$L/pytest.log"
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/device.txt"
grep -h "test result\|rc=\|FAILED\|panicked\| passed\|optim" "$L"/*.log | head -30
