#!/usr/bin/env bash
# Builds the wgmma TF32 probe with the project's nvcc (CUDA 13.0) for sm_90a, links the
# CUDA runtime statically, saves the ptxas report and the SASS, and checks that HGMMA
# instructions are in it. Fails on any ptxas warning (incl. wgmma serialization notes).
#
#   ./build.sh            -> ./wgmma_tf32, ptxas.log, wgmma_tf32.sass, hgmma_grep.txt
#   NVCC=/path/to/nvcc ./build.sh   to use another nvcc
set -euo pipefail
cd "$(dirname "$0")"

. ../nvcc.sh

# The wrappers in the .cu must match their generator.
python3 gen_wrappers.py --check wgmma_tf32.cu

# Static cudart when the toolkit has it (the pip wheel does: lib/libcudart_static.a).
LIBDIR=""
for d in "$CUDA_ROOT/lib64" "$CUDA_ROOT/lib" "$CUDA_ROOT/targets/x86_64-linux/lib" "$CUDA_ROOT/targets/sbsa-linux/lib"; do
    if [ -f "$d/libcudart_static.a" ]; then LIBDIR=$d; break; fi
done
if [ -n "$LIBDIR" ]; then
    CUDART="-cudart static -L$LIBDIR"
    echo "linking libcudart_static.a from $LIBDIR (the GPU host needs only a driver >= CUDA 13.0, i.e. r580+)"
else
    CUDART="-cudart shared -L$CUDA_ROOT/lib"
    echo "WARNING: no libcudart_static.a; linking libcudart.so.13 dynamically (the GPU host needs CUDA 13 runtime libraries)"
fi

set -x
"$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo \
    -Xptxas -v -Xptxas -warn-spills -Xptxas -warn-lmem-usage \
    -Xcompiler -O3,-pthread,-Wall \
    $CUDART -o wgmma_tf32 wgmma_tf32.cu 2> ptxas.log || { cat ptxas.log; exit 1; }
set +x
cat ptxas.log

# Any ptxas/nvcc warning, or a note that wgmma is serialized, fails the build.
if grep -Ei "warning|serializ|Potential Performance Loss" ptxas.log; then
    echo "BUILD FAILED: warnings above" >&2
    exit 1
fi

# SASS: cuobjdump (it needs nvdisasm) next to nvcc, else on PATH, else a local copy in
# .tools/ unpacked from PyPI's nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels.
fetch_tool() {  # name, pip requirement
    [ -x ".tools/nvidia/cu13/bin/$1" ] && return 0
    command -v pip3 >/dev/null 2>&1 || return 0
    local tmp
    tmp=$(mktemp -d)
    if pip3 download -q --no-deps -d "$tmp" "$2" >/dev/null 2>&1; then
        unzip -o -q "$tmp"/*.whl "nvidia/cu13/bin/$1" -d .tools && chmod +x ".tools/nvidia/cu13/bin/$1"
    fi
    rm -rf "$tmp"
}
CUOBJDUMP=${CUOBJDUMP:-}
if [ -z "$CUOBJDUMP" ]; then
    if [ -x "$(dirname "$NVCC")/cuobjdump" ] && [ -x "$(dirname "$NVCC")/nvdisasm" ]; then
        CUOBJDUMP="$(dirname "$NVCC")/cuobjdump"
    elif command -v cuobjdump >/dev/null 2>&1 && command -v nvdisasm >/dev/null 2>&1; then
        CUOBJDUMP=$(command -v cuobjdump)
    else
        fetch_tool cuobjdump "nvidia-cuda-cuobjdump==13.2.86"
        fetch_tool nvdisasm "nvidia-cuda-nvdisasm==13.2.86"
        if [ -x .tools/nvidia/cu13/bin/cuobjdump ] && [ -x .tools/nvidia/cu13/bin/nvdisasm ]; then
            CUOBJDUMP=.tools/nvidia/cu13/bin/cuobjdump
            export PATH="$PWD/.tools/nvidia/cu13/bin:$PATH"
        fi
    fi
fi
if [ -n "$CUOBJDUMP" ]; then
    "$CUOBJDUMP" -sass wgmma_tf32 > wgmma_tf32.sass
    {
        echo "# $CUOBJDUMP -sass wgmma_tf32 | HGMMA per kernel (function: count, shapes)"
        awk '/Function :/ {fn=$3}
             /HGMMA/ {n[fn]++; if (match($0, /HGMMA\.[0-9A-Za-z.]+/)) s[fn " " substr($0, RSTART, RLENGTH)]++}
             END {for (f in n) print f ": " n[f] " HGMMA"; for (k in s) print "  " k " x" s[k]}' wgmma_tf32.sass | sort
        echo "# all HGMMA lines"
        grep -n "HGMMA" wgmma_tf32.sass
    } > hgmma_grep.txt
    nh=$(grep -c "HGMMA" wgmma_tf32.sass || true)
    sed -n '1,12p' hgmma_grep.txt
    if [ "$nh" -eq 0 ]; then echo "BUILD FAILED: no HGMMA in SASS" >&2; exit 1; fi
    echo "SASS: $nh HGMMA instructions (wgmma_tf32.sass, hgmma_grep.txt)"
else
    echo "WARNING: no cuobjdump found; SASS not checked"
fi
echo "BUILD OK: ./wgmma_tf32"
