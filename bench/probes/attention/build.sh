#!/usr/bin/env bash
# Builds the attention_fused probe with the project's nvcc (CUDA 13.0) for sm_90a, linking
# the CUDA runtime statically: af_probe (the kernel as the step builds it) and
# af_probe_clocks (-DAF_PHASE_CLOCKS: the same kernel with its phase clocks). Fails on any
# ptxas warning or spill. Run both on the GPU host from this folder: ./af_probe, then
# ./af_probe_clocks (each takes grids, default 132 66).
#
#   ./build.sh                      -> ./af_probe, ./af_probe_clocks, ptxas.log
#   NVCC=/path/to/nvcc ./build.sh   to use another nvcc
#   KERNEL=/path/attention_fused.cu SUFFIX=_base ./build.sh
#                                   -> ./af_probe_base, ./af_probe_clocks_base, built from
#                                      another copy of the kernel (its dqn.cuh beside it),
#                                      for an A/B of kernel variants in one call
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(git rev-parse --show-toplevel)
. ../nvcc.sh
LIBDIR=""
for d in "$CUDA_ROOT/lib64" "$CUDA_ROOT/lib" "$CUDA_ROOT/targets/x86_64-linux/lib"; do
    if [ -f "$d/libcudart_static.a" ]; then LIBDIR=$d; break; fi
done
[ -n "$LIBDIR" ] || { echo "no libcudart_static.a under $CUDA_ROOT" >&2; exit 1; }
: > ptxas.log
SUFFIX=${SUFFIX:-}
KDEF=""
if [ -n "${KERNEL:-}" ]; then
    [ -f "$KERNEL" ] || { echo "KERNEL=$KERNEL: no such file" >&2; exit 1; }
    KDEF="-DAF_KERNEL=\"$(cd "$(dirname "$KERNEL")" && pwd)/$(basename "$KERNEL")\""
fi
for base in af_probe af_probe_clocks; do
    v=$base$SUFFIX
    def="$KDEF"; [ "$base" = af_probe_clocks ] && def="$def -DAF_PHASE_CLOCKS"
    "$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo $def \
        -I"$ROOT/kernels/cuda" -Xptxas -v -Xptxas -warn-spills -Xptxas -warn-lmem-usage \
        -Xcompiler -O3,-Wall -cudart static -L"$LIBDIR" -o "$v" af_probe.cu 2>> ptxas.log \
        || { cat ptxas.log; exit 1; }
done
grep -A3 "entry function 'attention_fused' " ptxas.log | grep -E "registers|spill" || true
if grep -Ei "warning" ptxas.log; then
    echo "BUILD FAILED: warnings above" >&2
    exit 1
fi
echo "built af_probe$SUFFIX and af_probe_clocks$SUFFIX"
