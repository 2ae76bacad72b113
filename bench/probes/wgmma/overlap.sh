#!/usr/bin/env bash
# Compiles overlap.cu for sm_90a (no GPU needed) and prints, per kernel, whether ptxas
# serialized its wgmmas. Uses examples/dqn/cuda/wgmma.cuh, the wrappers iqn_wgmma uses.
#   ./overlap.sh            (NVCC=/path/to/nvcc ./overlap.sh for another nvcc)
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(git rev-parse --show-toplevel)
. ../nvcc.sh
"$NVCC" --version | tail -1
log=$("$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I"$ROOT/examples/dqn/cuda" \
    -Xptxas -v -cubin -o /dev/null overlap.cu 2>&1)
for v in 0 1 2 3; do
    name="_Z1kILi${v}EEvPfimm"
    if grep -E "C751[45]" <<<"$log" | grep -q "$name"; then verdict="serialized"; else verdict="asynchronous"; fi
    case $v in 0) what="wait_group 1, read the finished set";; 1) what="wait_group 0";;
               2) what="wait_group 1, no register fences";;
               3) what="wait_group 1, nothing in flight across the back edge";; esac
    echo "k<$v> ($what): $verdict"
done
