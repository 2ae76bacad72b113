# bench/lib.sh: what bench/cycle.sh and bench/ab.sh share. Sourced, not run.
#
# - the options both scripts take (bench_common_option) and their defaults;
# - the parts a run is made of (part_run, part_check, ...), each writing its logs under
#   $logs and ending each log with a line `NAME rc=STATUS`;
# - bench_to, the one way a part runs a command: an external command (optionally
#   preceded by env's `-C DIR` and VAR=VALUE words), its stdout and stderr appended to
#   one log after a `$ COMMAND` line; with --dry-run it prints the command instead;
# - the device record (device.txt, build-info.json) and the summary (summary.txt).
#
# The paths in the defaults are relative to the repository root, where the scripts run.

# Shared options and their defaults.
bundle=.device/bundle           # --bundle: from `cargo xtask bundle --gpu-tests`
dqn=                            # --dqn: default $bundle/bin/dqn
py=examples/dqn                 # --py: reference.py, combine.py, dram_bound.py, test_*.py
sac=                            # --sac: default $bundle/bin/sac
sac_py=examples/sac             # --sac-py: the SAC example's reference.py and test_*.py
sac_check_sizes=default,b1000-h200-a6
sac_torch_limit=300             # --sac-torch-limit: seconds per variant of part sac-torch
wheels=.device/wheels           # --wheels: pytest's wheels, if the host lacks pytest
check_sizes=default,fallback,b1024-glu48
check_dtypes=tf32
gpu_args=""                     # --gpu-args: more arguments for the GPU test binaries
gpu_memcheck=""                 # --gpu-memcheck FILTER: those GPU tests under memcheck too
gpus1_steps=50
memcheck_tools=memcheck
memcheck_args="--batch 512 --steps 3"
memcheck_timeout=300
torch_steps=200
torch_warmup=30
torch_variants=eager,graph,compile
torch_modes=reduce-overhead
inject_step=17
inject_steps=30
tar=0
dry=0

# The check's named sizes (--check-sizes), as dqn flags. `fallback` takes every fallback
# path since 0890e63 (IQN's, the branch heads' and the IQL heads' GEMM paths);
# `fallback-hidden` is the fallback set of the runs before it (IQN and attention only).
declare -A size_flags=(
    [default]=""
    [fallback]="--batch 1024 --hidden 320 --width 48 --heads 4 --glu 72 --actions 9"
    [fallback-hidden]="--batch 1024 --hidden 320 --width 48 --heads 4"
    [b1024-glu32]="--batch 1024 --glu 32"
    [b1024-glu48]="--batch 1024 --glu 48"
)

# The SAC check's named sizes (--sac-check-sizes), as sac flags; -share plans the
# critics' matmuls for their share of the GPU.
declare -A sac_size_flags=(
    [default]=""
    [b1000-h200-a6]="--batch 1000 --hidden 200 --action 6"
    [default-share]="--critic-sms share"
    [b1000-h200-a6-share]="--batch 1000 --hidden 200 --action 6 --critic-sms share"
)

# The options both scripts take, for their --help.
# shellcheck disable=SC2016 # literal text
BENCH_COMMON_USAGE='Options of every bench script:
  --bundle DIR          the GPU-test bundle (default .device/bundle)
  --dqn PATH            the dqn binary the parts run (default BUNDLE/bin/dqn)
  --py DIR              the DQN example'"'"'s Python (default examples/dqn)
  --sac PATH            the sac binary of parts sac-check (default BUNDLE/bin/sac)
  --sac-py DIR          the SAC example'"'"'s Python (default examples/sac)
  --sac-check-sizes LIST sizes of part sac-check (default default,b1000-h200-a6)
  --sac-torch-limit S   seconds each variant of part sac-torch may take (default 300)
  --wheels DIR          wheels to install for pytest (default .device/wheels; none: skipped)
  --check-sizes LIST    sizes of part check (default default,fallback,b1024-glu48); names:
                        default, fallback, fallback-hidden, b1024-glu32, b1024-glu48, or
                        one defined with --check-size
  --check-size NAME FLAGS   define (or redefine) a size: --check-size b2048 "--batch 2048"
  --check-dtypes LIST   tf32 (PyTorch with TF32 GEMMs, the gate) and/or float64 (an oracle
                        in double, for drift studies); default tf32
  --gpu-args "ARGS"     more arguments for the GPU test binaries (e.g. "--nocapture trunk")
  --gpu-memcheck FILTER part gpu also runs the GPU tests matching FILTER under memcheck
  --gpus1-steps N       steps of part gpus1 (default 50)
  --memcheck-tools LIST compute-sanitizer tools of part memcheck (default memcheck; also
                        racecheck, synccheck, initcheck)
  --memcheck-args "ARGS" dqn arguments under the sanitizer (default "--batch 512 --steps 3")
  --memcheck-timeout S  seconds each sanitizer run may take (default 300)
  --torch-steps N --torch-warmup N --torch-variants LIST --torch-compile-modes LIST
                        part torch (default 200, 30, eager,graph,compile, reduce-overhead)
  --inject-nan STEP --inject-nan-steps N   part inject-nan (default 17 of 30)
  --tar                 logs into $OUT/logs.tgz, with the JSON files and summary.txt beside
                        it (for a device tool that returns few files)
  --dry-run             print what would run, run nothing, write nothing
  -h, --help            this text

Output: $OUT (default ${TMPDIR:-/tmp}/stepgraph-bench/<UTC time>), which must be new or
empty. Each part writes NAME.log there (see the parts), device.txt, build-info.json (the
bundle'"'"'s: git revision and whether the tree was dirty) and summary.txt.'

bench_die() {
    echo "$(basename "$0"): $*" >&2
    exit 2
}

# bench_usage: the script's header comment, then the shared options.
bench_usage() {
    sed -n '2,${/^#/!q;s/^# \{0,1\}//;p}' "$0"
    echo "$BENCH_COMMON_USAGE"
}

# bench_common_option "$@": if $1 is a shared option, sets it and sets `shift_by` to the
# number of words it took; otherwise shift_by=0.
# shellcheck disable=SC2034 # shift_by is the caller's
bench_common_option() {
    shift_by=0
    local opt="$1"
    case "$opt" in
        --tar) tar=1; shift_by=1; return ;;
        --dry-run) dry=1; shift_by=1; return ;;
        -h | --help) bench_usage; exit 0 ;;
        --check-size)
            [ $# -ge 3 ] || bench_die "$opt expects a name and its dqn flags"
            size_flags[$2]="$3"
            shift_by=3
            return
            ;;
        --bundle | --dqn | --py | --sac | --sac-py | --sac-check-sizes | --sac-torch-limit | \
            --wheels | --check-sizes | --check-dtypes | --gpu-args | \
            --gpu-memcheck | --gpus1-steps | --memcheck-tools | --memcheck-args | \
            --memcheck-timeout | --torch-steps | --torch-warmup | --torch-variants | \
            --torch-compile-modes | --inject-nan | --inject-nan-steps) ;;
        *) return ;;
    esac
    [ $# -ge 2 ] || bench_die "$opt expects a value"
    local v="$2"
    shift_by=2
    case "$opt" in
        --bundle) bundle="$v" ;;
        --dqn) dqn="$v" ;;
        --py) py="$v" ;;
        --sac) sac="$v" ;;
        --sac-py) sac_py="$v" ;;
        --sac-check-sizes) sac_check_sizes="$v" ;;
        --sac-torch-limit) bench_number "$opt" "$v"; sac_torch_limit="$v" ;;
        --wheels) wheels="$v" ;;
        --check-sizes) check_sizes="$v" ;;
        --check-dtypes) check_dtypes="$v" ;;
        --gpu-args) gpu_args="$v" ;;
        --gpu-memcheck) gpu_memcheck="$v" ;;
        --gpus1-steps) bench_number "$opt" "$v"; gpus1_steps="$v" ;;
        --memcheck-tools) memcheck_tools="$v" ;;
        --memcheck-args) memcheck_args="$v" ;;
        --memcheck-timeout) bench_number "$opt" "$v"; memcheck_timeout="$v" ;;
        --torch-steps) bench_number "$opt" "$v"; torch_steps="$v" ;;
        --torch-warmup) bench_number "$opt" "$v"; torch_warmup="$v" ;;
        --torch-variants) torch_variants="$v" ;;
        --torch-compile-modes) torch_modes="$v" ;;
        --inject-nan) bench_number "$opt" "$v"; inject_step="$v" ;;
        --inject-nan-steps) bench_number "$opt" "$v"; inject_steps="$v" ;;
    esac
}

bench_number() {
    [[ "$2" =~ ^[0-9]+$ ]] || bench_die "$1 expects a whole number, found '$2'"
}

# bench_setup: checks the options, makes the paths absolute (runs may change folder),
# and creates $out, $logs (where the logs go: $out, or a scratch folder with --tar) and
# $work (the check's dumps, pytest's packages; removed at exit).
bench_setup() {
    local s d
    for s in ${check_sizes//,/ }; do
        [ -n "${size_flags[$s]+set}" ] ||
            bench_die "unknown check size '$s': expected one of ${!size_flags[*]} (or --check-size NAME FLAGS)"
    done
    for s in ${sac_check_sizes//,/ }; do
        [ -n "${sac_size_flags[$s]+set}" ] ||
            bench_die "unknown SAC check size '$s': expected one of ${!sac_size_flags[*]}"
    done
    for d in ${check_dtypes//,/ }; do
        case "$d" in
            tf32 | float64) ;;
            *) bench_die "unknown check dtype '$d': expected tf32 or float64" ;;
        esac
    done
    for s in ${memcheck_tools//,/ }; do
        case "$s" in
            memcheck | racecheck | synccheck | initcheck) ;;
            *) bench_die "unknown compute-sanitizer tool '$s'" ;;
        esac
    done
    [ -n "$dqn" ] || dqn="$bundle/bin/dqn"
    [ -n "$sac" ] || sac="$bundle/bin/sac"
    bundle="$(realpath -m "$bundle")"
    dqn="$(realpath -m "$dqn")"
    py="$(realpath -m "$py")"
    sac="$(realpath -m "$sac")"
    sac_py="$(realpath -m "$sac_py")"
    wheels="$(realpath -m "$wheels")"
    out="$(realpath -m "${OUT:-${TMPDIR:-/tmp}/stepgraph-bench/$(date -u +%Y%m%dT%H%M%SZ)}")"
    if [ "$dry" = 1 ]; then
        logs="$out"
        work="${TMPDIR:-/tmp}/stepgraph-bench-work"
        echo "# dry run: logs in $out$([ "$tar" = 1 ] && echo ' (as logs.tgz)')"
        return
    fi
    if [ -d "$out" ] && [ -n "$(ls -A "$out")" ]; then
        bench_die "expected a new or empty output folder, found $out holding files (set OUT)"
    fi
    mkdir -p "$out"
    if [ "$tar" = 1 ]; then logs="$(mktemp -d)"; else logs="$out"; fi
    work="$(mktemp -d)"
    trap bench_cleanup EXIT
    bench_libpath
}

bench_cleanup() {
    rm -rf "$work"
    if [ "$tar" = 1 ] && [ "$logs" != "$out" ]; then rm -rf "$logs"; fi
}

# bench_libpath: LD_LIBRARY_PATH for the binaries run directly (run.sh sets its own):
# the toolkit's folders, and NCCL under the name cudarc loads (`libnccl.so`) when the
# host has only PyTorch's wheel (`libnccl.so.2`).
bench_libpath() {
    local d nccl2
    for d in /usr/local/nvidia/lib64 /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/extras/CUPTI/lib64; do
        [ -d "$d" ] || continue
        case ":${LD_LIBRARY_PATH:-}:" in
            *":$d:"*) ;;
            *) LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d" ;;
        esac
    done
    if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
        nccl2="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
        if [ -n "$nccl2" ] && [ -f "$nccl2" ]; then
            mkdir -p "$work/nccl" && ln -sf "$nccl2" "$work/nccl/libnccl.so"
            LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$work/nccl"
        fi
    fi
    export LD_LIBRARY_PATH
}

# bench_words WORD...: the words as one line a shell would read back.
bench_words() {
    local w line=""
    for w in "$@"; do
        if [[ "$w" =~ ^[A-Za-z0-9_@%+=:,./{}-]+$ ]]; then line+="$w "; else line+="$(printf '%q' "$w") "; fi
    done
    printf '%s' "$line"
}

# bench_to LOG [-C DIR] [VAR=VALUE...] COMMAND...: runs COMMAND through env, its output
# appended to $logs/LOG; returns its status.
bench_to() {
    local log="$logs/$1"
    shift
    if [ "$dry" = 1 ]; then
        echo "  $([ "$1" = -C ] && echo "env ")$(bench_words "$@")>> ${log#"$logs"/}"
        return 0
    fi
    mkdir -p "$(dirname "$log")"
    echo "\$ $([ "$1" = -C ] && echo "env ")$(bench_words "$@")" >> "$log"
    env "$@" >> "$log" 2>&1
}

# bench_rc LOG NAME STATUS: the line the summary collects.
bench_rc() {
    [ "$dry" = 1 ] && return 0
    echo "$2 rc=$3" >> "$logs/$1"
}

# bench_dir PATH...: creates folders (not in a dry run).
bench_dir() {
    [ "$dry" = 1 ] && return 0
    mkdir -p "$@"
}

# bench_tool NAME: the path of a CUDA tool (PATH, then /usr/local/cuda/bin).
bench_tool() {
    if command -v "$1" >/dev/null 2>&1; then
        command -v "$1"
    elif [ -x "/usr/local/cuda/bin/$1" ]; then
        echo "/usr/local/cuda/bin/$1"
    else
        echo "$1"
    fi
}

# bench_part NAME ARGS...: runs part_NAME, announcing it and its time.
bench_part() {
    local name="$1" start=$SECONDS
    shift
    echo "== part $name"
    "part_${name//-/_}" "$@"
    [ "$dry" = 1 ] || echo "   ($((SECONDS - start)) s)"
}

# The device and the build the logs are of.
bench_device() {
    [ "$dry" = 1 ] && { echo "  (device.txt, build-info.json, nvidia-smi.txt and env.txt)"; return 0; }
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$logs/device.txt" 2>&1
    if [ "$(wc -l < "$logs/device.txt")" -gt 1 ]; then
        { nvidia-smi; nvidia-smi topo -m; } > "$logs/nvidia-smi.txt" 2>&1
    fi
    env | grep -E '^(NCCL|CUDA_|STEPGRAPH_)' > "$logs/env.txt" || true
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >> "$logs/env.txt"
    [ -f "$bundle/build-info.json" ] && cp "$bundle/build-info.json" "$logs/build-info.json"
    return 0
}

# ---- the parts ----------------------------------------------------------------------

# run: the bundle's run.sh, every GPU test binary and then every example, each logged in
# run/ (gpu.log, capture_cost.log, dqn.log with dqn_bench.json and dqn.profile.json,
# fork_join.log ...); run.log has its whole output.
part_run() {
    bench_dir "$logs/run"
    bench_to run.log OUT="$logs/run" timeout 400 bash "$bundle/run.sh"
    bench_rc run.log run.sh $?
}

# gpu: only the GPU test binaries (bin/gpu*), one test at a time, ignored tests included:
# NAME.log; with --gpu-memcheck FILTER also memcheck-NAME.log.
part_gpu() {
    local t name more
    read -ra more <<< "$gpu_args"
    local bins=("$bundle"/bin/gpu*)
    [ -e "${bins[0]}" ] || [ "$dry" = 1 ] || { echo "   no GPU test binaries in $bundle/bin"; return; }
    for t in "${bins[@]}"; do
        name="$(basename "$t")"
        bench_to "$name.log" timeout 300 "$t" --include-ignored --test-threads=1 "${more[@]}"
        bench_rc "$name.log" "$name" $?
        if [ -n "$gpu_memcheck" ]; then
            # compute-sanitizer holds CUPTI, which the capture guard needs: off here.
            bench_to "memcheck-$name.log" STEPGRAPH_CAPTURE_GUARD=0 \
                timeout "$memcheck_timeout" "$(bench_tool compute-sanitizer)" \
                --tool memcheck --error-exitcode 1 "$t" --include-ignored --test-threads=1 "$gpu_memcheck"
            bench_rc "memcheck-$name.log" memcheck $?
        fi
    done
}

# pytest: reference.py's, combine.py's and dram_bound.py's own tests (CPU): pytest.log;
# the SAC reference's in a run of their own (both examples have a test_reference.py and a
# reference.py): pytest-sac.log.
part_pytest() {
    local path=()
    if compgen -G "$wheels/*.whl" >/dev/null || [ "$dry" = 1 ]; then
        bench_to pip.log python3 -m pip install -q --no-deps --target "$work/pyt" "$wheels"/*.whl
        path=(PYTHONPATH="$work/pyt")
    fi
    bench_to pytest.log "${path[@]}" timeout 300 python3 -m pytest -q -p no:cacheprovider "$py"/test_*.py
    bench_rc pytest.log pytest $?
    bench_to pytest-sac.log "${path[@]}" timeout 300 python3 -m pytest -q -p no:cacheprovider \
        "$sac_py"/test_*.py
    bench_rc pytest-sac.log pytest-sac $?
}

# check [DQN LABEL]: the DQN check against PyTorch at each size of --check-sizes: dqn
# --check writes three steps, reference.py recomputes each from the Rust state.
# check-[LABEL-]SIZE.log and reference_check-[LABEL-]SIZE.json; with float64,
# check-[LABEL-]SIZE-f64.log too.
part_check() {
    local bin="${1:-$dqn}" label="${2:+$2-}" size dir log dtype dlog flags rc
    for size in ${check_sizes//,/ }; do
        read -ra flags <<< "${size_flags[$size]}"
        dir="$work/check-$label$size"
        log="check-$label$size.log"
        [ "$dry" = 1 ] || rm -rf "$dir"
        bench_to "$log" timeout 120 "$bin" --check "$dir" "${flags[@]}"
        rc=$?
        for dtype in ${check_dtypes//,/ }; do
            local oracle=() suffix=""
            if [ "$dtype" = float64 ]; then oracle=(--dtype float64); suffix=-f64; fi
            dlog="check-$label$size$suffix.log"
            bench_dir "$dir/out$suffix"
            if [ "$rc" -eq 0 ]; then
                bench_to "$dlog" OUT="$dir/out$suffix" timeout 300 python3 "$py/reference.py" check "$dir" \
                    --device cuda "${oracle[@]}"
                bench_rc "$dlog" check $?
            else
                bench_rc "$dlog" check "$rc"
            fi
            [ "$dry" = 1 ] || cp "$dir/out$suffix/reference_check.json" \
                "$logs/reference_check-$label$size$suffix.json" 2>/dev/null
        done
    done
}

# sac-check: the SAC check against PyTorch at each --sac-check-sizes: sac --check writes
# three steps, reference.py recomputes each from the Rust state (TF32 on both sides):
# sac-check-SIZE.log and sac_reference_check-SIZE.json.
part_sac_check() {
    local size dir log flags rc
    for size in ${sac_check_sizes//,/ }; do
        read -ra flags <<< "${sac_size_flags[$size]}"
        dir="$work/sac-check-$size"
        log="sac-check-$size.log"
        [ "$dry" = 1 ] || rm -rf "$dir"
        bench_to "$log" timeout 300 "$sac" --check "$dir" "${flags[@]}"
        rc=$?
        if [ "$rc" -eq 0 ]; then
            bench_to "$log" timeout 300 python3 "$sac_py/reference.py" check "$dir" --device cuda
            rc=$?
        fi
        bench_rc "$log" sac-check "$rc"
        [ "$dry" = 1 ] || cp "$dir/reference_check.json" "$logs/sac_reference_check-$size.json" \
            2>/dev/null
    done
}

# sac-bench: the SAC step's variants and bounds (`sac --bench`: eager, the one-stream graph,
# the planned graph with and without its stream priorities, the critical-path and work
# bounds, each op alone and in the graph) at each --sac-check-sizes:
# sac-bench-SIZE.log and the records in sac-bench-SIZE/.
part_sac_bench() {
    local size flags
    for size in ${sac_check_sizes//,/ }; do
        read -ra flags <<< "${sac_size_flags[$size]}"
        bench_dir "$logs/sac-bench-$size"
        bench_to "sac-bench-$size.log" timeout 300 "$sac" --bench "$logs/sac-bench-$size" "${flags[@]}"
        bench_rc "sac-bench-$size.log" sac-bench $?
    done
}

# sac-torch: the SAC update in PyTorch at MODEL.md's sizes (eager, CUDA graph,
# torch.compile in three modes, each under --sac-torch-limit seconds):
# sac_pytorch_bench.{log,json}.
part_sac_torch() {
    bench_to sac_pytorch_bench.log timeout 1800 python3 "$sac_py/reference.py" bench --device cuda \
        --iters "$torch_steps" --warmup "$torch_warmup" --limit "$sac_torch_limit" \
        --json "$logs/sac_pytorch_bench.json"
    bench_rc sac_pytorch_bench.log sac-bench $?
}

# inject-nan: a NaN in one step's batch; the trainer must stop there, name the tensors
# and keep the previous step's state (exit status 1 is the expected outcome).
part_inject_nan() {
    bench_dir "$logs/inject-nan"
    bench_to inject-nan.log OUT="$logs/inject-nan" timeout 120 "$dqn" --steps "$inject_steps" \
        --inject-nan "$inject_step"
    bench_rc inject-nan.log "inject-nan (1 expected)" $?
}

# torch: the same model in PyTorch (eager, CUDA graph, torch.compile):
# pytorch_bench.log and pytorch_bench.json.
part_torch() {
    bench_to pytorch_bench.log OUT="$logs" timeout 600 python3 "$py/reference.py" bench --device cuda \
        --steps "$torch_steps" --warmup "$torch_warmup" --variants "$torch_variants" \
        --compile-modes "$torch_modes"
    bench_rc pytorch_bench.log bench $?
}

# combine: one table of (a) to (w') and PyTorch's variants with the ratios: combine.log
# and dqn_results.json. The step's figures come from part run's dqn_bench.json, or from a
# dqn run of its own (combine-dqn/) when part run did not run.
part_combine() {
    local bench_json="$logs/run/dqn_bench.json"
    # shellcheck disable=SC2154 # selected: the parts the calling script runs
    if [[ ",$selected," != *,run,* ]]; then
        bench_dir "$logs/combine-dqn"
        bench_to combine-dqn.log OUT="$logs/combine-dqn" timeout 200 "$dqn"
        bench_rc combine-dqn.log dqn $?
        bench_json="$logs/combine-dqn/dqn_bench.json"
    fi
    bench_to combine.log OUT="$logs" python3 "$py/combine.py" "$bench_json" "$logs/pytorch_bench.json"
    bench_rc combine.log combine $?
}

# dram: the work bound with each kernel's DRAM share: Nsight Compute's bytes of one
# one-stream replay (--serial-replay), charged by dram_bound.py: dram-bound/.
part_dram() {
    local d="$logs/dram-bound"
    bench_dir "$d"
    bench_to dram-bound/dqn.log OUT="$d" timeout 200 "$dqn" --steps 50
    if [ "$dry" = 1 ]; then
        echo "  ncu --csv ... $(bench_words "$dqn")--serial-replay > dram-bound/ncu.csv 2>> dram-bound/ncu.err.log"
    else
        echo "\$ ncu ... --serial-replay" >> "$d/ncu.err.log"
        # Nsight Compute holds CUPTI, which the capture guard needs: off here.
        STEPGRAPH_CAPTURE_GUARD=0 timeout 600 "$(bench_tool ncu)" --csv --print-units base \
            --print-kernel-base mangled \
            --graph-profiling node --clock-control none \
            --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
            "$dqn" --serial-replay > "$d/ncu.csv" 2>> "$d/ncu.err.log"
        bench_rc dram-bound/ncu.err.log ncu $?
    fi
    bench_to dram-bound/dram_bound.log OUT="$d" python3 "$py/dram_bound.py" "$d/dqn_bench.json" "$d/ncu.csv"
    bench_rc dram-bound/dram_bound.log dram_bound $?
    [ "$dry" = 1 ] || gzip -f "$d/ncu.csv"
}

# gpus1: the data-parallel path on one GPU (one-rank NCCL all-reduces in the graph),
# checked bit for bit against the step without NCCL: gpus1.log.
part_gpus1() {
    bench_dir "$logs/gpus1"
    bench_to gpus1.log OUT="$logs/gpus1" timeout 200 "$dqn" --gpus 1 --steps "$gpus1_steps"
    bench_rc gpus1.log gpus1 $?
}

# memcheck: the DQN step under compute-sanitizer, one log per tool (memcheck.log ...).
part_memcheck() {
    local tool words
    read -ra words <<< "$memcheck_args"
    for tool in ${memcheck_tools//,/ }; do
        bench_dir "$logs/$tool"
        bench_to "$tool.log" OUT="$logs/$tool" STEPGRAPH_CAPTURE_GUARD=0 timeout "$memcheck_timeout" \
            "$(bench_tool compute-sanitizer)" --tool "$tool" --error-exitcode 1 "$dqn" "${words[@]}"
        bench_rc "$tool.log" "$tool" $?
    done
}

# sanitize: the bundle's `run.sh sanitize` (memcheck, racecheck and synccheck on the
# bundle's sanitize example, fork_join): sanitize.log and sanitize/sanitize-TOOL.log.
part_sanitize() {
    bench_dir "$logs/sanitize"
    bench_to sanitize.log OUT="$logs/sanitize" timeout 900 bash "$bundle/run.sh" sanitize
    bench_rc sanitize.log "run.sh sanitize" $?
}

# ---- the summary --------------------------------------------------------------------

# bench_figures LOG: the step's figures of a dqn log on one line ("(c) 1.246 ...").
bench_figures() {
    sed -nE "s/^\| (\([a-z]'?\)) [^|]*\| ([0-9.]+) \|.*/\1 \2/p" "$1" | tr '\n' ' '
    grep -hE '^step time:' "$1" | head -1
}

# bench_summary [GREP]: the run's outcome on stdout and in summary.txt. GREP (a regex)
# adds those lines of the A/B logs of round 1.
bench_summary() {
    [ "$dry" = 1 ] && return 0
    local f extra="${1:-}"
    {
        echo "device: $(tr '\n' ';' < "$logs/device.txt")"
        [ -f "$logs/build-info.json" ] &&
            echo "bundle: $(grep -hoE '"git_(revision|dirty)": *[^,}]*' "$logs/build-info.json" | tr '\n' ' ')"
        find "$logs" -name '*.log' | sort | while read -r f; do
            grep -hE "test result|reference check:|data-parallel check|ERROR SUMMARY|RACECHECK SUMMARY| rc=[0-9]|FAILED|panicked|^  passed|^[0-9]+ passed" "$f" |
                sed "s|^|${f#"$logs"/}: |"
        done | head -80
        grep -hE '^dqn failed|^--inject-nan' "$logs/inject-nan.log" 2>/dev/null
        [ -f "$logs/combine.log" ] && head -20 "$logs/combine.log"
        [ -f "$logs/dram-bound/dram_bound.log" ] && head -20 "$logs/dram-bound/dram_bound.log"
        for f in "$logs"/run/dqn.log "$logs"/bench-*.log "$logs"/ab/*.log; do
            [ -f "$f" ] || continue
            printf '%-24s %s\n' "${f#"$logs"/}" "$(bench_figures "$f")"
        done
        if [ -n "$extra" ]; then
            for f in "$logs"/ab/*-1.log; do
                [ -f "$f" ] || continue
                echo "-- ${f#"$logs"/}"
                grep -hE -- "$extra" "$f"
            done
        fi
    } 2>/dev/null | tee "$logs/summary.txt"
}

# bench_finish: with --tar, the logs as $out/logs.tgz and the small files beside it.
bench_finish() {
    [ "$dry" = 1 ] && return 0
    if [ "$tar" = 1 ]; then
        tar czf "$out/logs.tgz" -C "$logs" .
        cp "$logs"/*.json "$logs"/*.txt "$out"/ 2>/dev/null
        [ -f "$logs/run/dqn_bench.json" ] && cp "$logs/run/dqn_bench.json" "$out/"
    fi
    echo "logs: $out$([ "$tar" = 1 ] && echo /logs.tgz)"
}
