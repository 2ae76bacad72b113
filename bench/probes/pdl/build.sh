#!/usr/bin/env bash
# Builds the programmatic-dependent-launch probe with the project's nvcc (CUDA 13.0) for
# sm_90, the CUDA runtime linked statically, so that the binary runs on the GPU host
# with only its driver. Run it there with no arguments: it prints each variant's median
# graph launch over 300 launches and checks every result against the host.
#
#   ./build.sh                      -> ./pdl
#   NVCC=/path/to/nvcc ./build.sh   to use another nvcc
set -euo pipefail
cd "$(dirname "$0")"
. ../nvcc.sh
"$NVCC" -gencode=arch=compute_90,code=sm_90 -O3 -std=c++17 -o pdl pdl.cu
echo "built $(pwd)/pdl"
