# Sourced by the probes' build scripts: sets NVCC and CUDA_ROOT. nvcc is $NVCC if set,
# else the project's pip-wheel CUDA 13.0 (`cargo xtask install-nvcc` installs it), else
# the one on PATH (the GPU host's); the script stops if none is there.
NVCC=${NVCC:-$(git rev-parse --show-toplevel 2>/dev/null)/target/nvcc/nvidia/cu13/bin/nvcc}
if [ ! -x "$NVCC" ] && command -v nvcc >/dev/null 2>&1; then NVCC=$(command -v nvcc); fi
[ -x "$NVCC" ] || { echo "nvcc not found at $NVCC (cargo xtask install-nvcc installs the project's)" >&2; exit 1; }
CUDA_ROOT=$(cd "$(dirname "$NVCC")/.." && pwd)
