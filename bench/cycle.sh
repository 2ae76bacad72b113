#!/usr/bin/env bash
# bench/cycle.sh: one measurement cycle of a GPU-test bundle on the GPU host, run from the
# repository root (a copy of the working tree, with the bundle in it):
#
#   cargo xtask bundle --gpu-tests                  # here: .device/bundle
#   OUT=/path/to/logs bash bench/cycle.sh [OPTIONS] # there (a device tool's $OUT)
#
# Parts, in this order (--parts picks, --skip leaves out; the default is the full cycle
# of the current figures in bench/BENCHMARKS.md, the parts marked *):
#   run *        the bundle's run.sh: every GPU test binary, then every example (dqn's
#                benchmark and bounds, fork_join, capture_cost): run.log, run/
#   gpu          only the GPU test binaries: gpu.log (see --gpu-args, --gpu-memcheck)
#   pytest *     reference.py's, combine.py's and dram_bound.py's own tests: pytest.log,
#                and the SAC reference's: pytest-sac.log
#   check *      the DQN check against PyTorch at each --check-sizes: check-SIZE.log
#   sac-check *  the SAC check against PyTorch at each --sac-check-sizes: sac-check-SIZE.log
#   sac-bench    the SAC step's variants and bounds at each --sac-check-sizes: sac-bench-SIZE.log
#   sac-torch    the SAC update in PyTorch: sac_pytorch_bench.{log,json}
#   inject-nan * dqn --inject-nan: the non-finite guard stops and names the tensors
#   torch *      the same model in PyTorch: pytorch_bench.{log,json}
#   combine *    one table with the ratios: combine.log, dqn_results.json
#   dram         the work bound with DRAM shares (Nsight Compute, ncu): dram-bound/
#   gpus1 *      the data-parallel path on one GPU, bit for bit: gpus1.log
#   memcheck *   the DQN step under compute-sanitizer: memcheck.log (--memcheck-tools)
#   sanitize     the bundle's `run.sh sanitize` (fork_join under three tools)
#   bench *      the step's benchmark --repeat more times, for the spread: bench-N.log
# Options of this script:
#   --parts LIST        comma-separated parts (default: the starred ones)
#   --skip LIST         parts to leave out
#   --repeat N          runs of part bench (default 2)
#   --dqn-args "ARGS"   dqn arguments of part bench (default none: 200 training steps,
#                       then the benchmark at MODEL.md's sizes)
# Needs on the host: the bundle (--bundle), python3 with torch and numpy for check and
# torch, pytest (or its wheels in --wheels: `pip download pytest iniconfig pluggy
# packaging --no-deps`) for pytest, compute-sanitizer for memcheck and sanitize, ncu for
# dram, nvidia-smi. The summary (status lines, the check, the figures of every
# benchmark run) goes to stdout and to summary.txt.
set -u -o pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

all_parts=(run gpu pytest check sac-check sac-bench sac-torch inject-nan torch combine dram gpus1 memcheck
    sanitize bench)
selected=run,pytest,check,sac-check,inject-nan,torch,combine,gpus1,memcheck,bench
skip=""
repeat=2
dqn_args=""

while [ $# -gt 0 ]; do
    bench_common_option "$@"
    if [ "$shift_by" -gt 0 ]; then shift "$shift_by"; continue; fi
    case "$1" in
        --parts | --skip | --repeat | --dqn-args) [ $# -ge 2 ] || bench_die "$1 expects a value" ;;
    esac
    case "$1" in
        --parts) selected="$2"; shift 2 ;;
        --skip) skip="$2"; shift 2 ;;
        --repeat) bench_number "$1" "$2"; repeat="$2"; shift 2 ;;
        --dqn-args) dqn_args="$2"; shift 2 ;;
        *) bench_die "unknown argument '$1' (--help lists the options)" ;;
    esac
done

for p in ${selected//,/ } ${skip//,/ }; do
    [[ " ${all_parts[*]} " == *" $p "* ]] || bench_die "unknown part '$p': expected one of ${all_parts[*]}"
done
for p in ${skip//,/ }; do
    selected=",$selected,"
    selected="${selected//,$p,/,}"
    selected="${selected#,}"
    selected="${selected%,}"
done
[ -n "$selected" ] || bench_die "no part left to run"

# bench: the step's benchmark, --repeat times.
part_bench() {
    local i words
    read -ra words <<< "$dqn_args"
    for ((i = 1; i <= repeat; i++)); do
        bench_dir "$logs/bench-$i"
        bench_to "bench-$i.log" OUT="$logs/bench-$i" timeout 300 "$dqn" "${words[@]}"
        bench_rc "bench-$i.log" "bench-$i" $?
    done
}

bench_setup
echo "# parts: $selected; bundle $bundle; dqn $dqn; sac $sac"
bench_device
for p in "${all_parts[@]}"; do
    [[ ",$selected," == *",$p,"* ]] && bench_part "$p"
done
bench_summary ""
bench_finish
