#!/usr/bin/env bash
# reference.py's own tests (pytest on the CPU of the GPU host, which has torch).
set -u -o pipefail
cd "$(dirname "$0")/.."
pip install -q --no-deps --target /tmp/pyt .device/wheels/*.whl > /dev/null 2>&1
cd examples/dqn && PYTHONPATH=/tmp/pyt timeout 200 python3 -m pytest -q -p no:cacheprovider test_reference.py test_combine.py test_dram_bound.py 2>&1 | tail -15
