#!/usr/bin/env bash
# bench/ab.sh: an A/B of dqn binaries (or settings) in one call on the GPU host, run from
# the repository root: each variant's run one after the other, --rounds times, so that
# the variants share the machine and its state. Two calls are two machines, and their
# figures differ by more than most changes do.
#
#   OUT=/path/to/logs bash bench/ab.sh [OPTIONS] NAME=BINARY [NAME=BINARY...]
#
# A variant is a name and a dqn binary (the `bin/dqn` of a bundle built from that code:
# `cargo xtask bundle --gpu-tests --out .device/ab/NAME`, or a copy of one); the same
# binary may appear under several names with different settings (--env, --vargs).
# Each run writes ab/NAME-ROUND.log, with its JSON and profile in ab/NAME-ROUND/; the
# summary lists every run's figures ((a) to (w'), or the data-parallel step time).
# Options of this script:
#   --rounds N          rounds of alternation (default 2; 0 runs only --check and --parts)
#   --args "ARGS"       dqn arguments of every run (default none: 200 training steps, then
#                       the benchmark; "--steps 20" for a quick one, "--gpus 2 --steps 200"
#                       for data parallel)
#   --vargs NAME "ARGS" more arguments for one variant (e.g. "--batch 32768")
#   --env NAME VAR=VALUE    environment of one variant (repeatable), e.g.
#                       --env iqn-high STEPGRAPH_STREAM_PRIORITIES=aux_attn=high,aux_iqn=high
#   --env-all VAR=VALUE environment of every variant (e.g. NCCL_DEBUG=INFO)
#   --timeout S         seconds a run may take (default 150; it is interrupted with SIGINT,
#                       so NCCL ranks stop, and killed 10 s later)
#   --check NAME        also the DQN check against PyTorch of variant NAME at
#                       --check-sizes and --check-dtypes (repeatable), before the runs
#   --parts LIST        also these parts of bench/cycle.sh on --dqn (default the bundle's
#                       dqn) before the runs: run, gpu, pytest, check, inject-nan, torch,
#                       combine, gpus1, memcheck, sanitize
#   --grep REGEX        also print these lines of each round-1 log (op rows of the
#                       profile, e.g. '^\*? *(trunk_backward|clip_and_adam) ')
# Needs on the host: the variants' binaries, the bundle for --parts, python3 with torch
# for --check, nvidia-smi; for --gpus N runs, N GPUs and NCCL (the system's libnccl.so or
# PyTorch's wheel).
set -u -o pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

cycle_parts=(run gpu pytest check inject-nan torch combine gpus1 memcheck sanitize)
selected=""
rounds=2
args=""
timeout_s=150
grep_re=""
names=()
declare -A bins=() venv=() vargs=()
checks=()
env_all=()

while [ $# -gt 0 ]; do
    bench_common_option "$@"
    if [ "$shift_by" -gt 0 ]; then shift "$shift_by"; continue; fi
    case "$1" in
        --rounds | --args | --timeout | --check | --parts | --grep | --env-all)
            [ $# -ge 2 ] || bench_die "$1 expects a value" ;;
        --vargs | --env) [ $# -ge 3 ] || bench_die "$1 expects a variant name and a value" ;;
    esac
    case "$1" in
        --rounds) bench_number "$1" "$2"; rounds="$2"; shift 2 ;;
        --args) args="$2"; shift 2 ;;
        --timeout) bench_number "$1" "$2"; timeout_s="$2"; shift 2 ;;
        --check) checks+=("$2"); shift 2 ;;
        --parts) selected="$2"; shift 2 ;;
        --grep) grep_re="$2"; shift 2 ;;
        --env-all)
            [[ "$2" == [A-Za-z_]*=* ]] || bench_die "--env-all expects VAR=VALUE, found '$2'"
            env_all+=("$2"); shift 2 ;;
        --vargs) vargs[$2]="${vargs[$2]:-} $3"; shift 3 ;;
        --env)
            [[ "$3" == [A-Za-z_]*=* ]] || bench_die "--env $2 expects VAR=VALUE, found '$3'"
            venv[$2]="${venv[$2]:-}$3"$'\n'; shift 3 ;;
        -*) bench_die "unknown option '$1' (--help lists the options)" ;;
        *=*)
            n="${1%%=*}"
            [[ "$n" =~ ^[A-Za-z0-9._+-]+$ ]] || bench_die "a variant name is letters, digits and ._+-, found '$n'"
            [ -z "${bins[$n]+set}" ] || bench_die "variant '$n' is named twice"
            names+=("$n"); bins[$n]="$(realpath -m "${1#*=}")"; shift ;;
        *) bench_die "expected a variant NAME=BINARY, found '$1'" ;;
    esac
done

[ "${#names[@]}" -gt 0 ] || [ -n "$selected" ] || bench_die "no variant given (NAME=BINARY)"
for n in "${!venv[@]}" "${!vargs[@]}" "${checks[@]}"; do
    [ -n "${bins[$n]+set}" ] || bench_die "'$n' is not a variant (NAME=BINARY)"
done
for p in ${selected//,/ }; do
    [[ " ${cycle_parts[*]} " == *" $p "* ]] || bench_die "unknown part '$p': expected one of ${cycle_parts[*]}"
done

# ab: every variant once a round.
part_ab() {
    local r n d env_words a
    for ((r = 1; r <= rounds; r++)); do
        for n in "${names[@]}"; do
            d="$logs/ab/$n-$r"
            bench_dir "$d"
            mapfile -t env_words < <(printf '%s' "${venv[$n]:-}")
            read -ra a <<< "$args ${vargs[$n]:-}"
            bench_to "ab/$n-$r.log" -C "$d" OUT="$d" "${env_all[@]}" "${env_words[@]}" \
                timeout -s INT -k 10 "$timeout_s" "${bins[$n]}" "${a[@]}"
            bench_rc "ab/$n-$r.log" "$n" $?
        done
    done
}

bench_setup
echo "# variants: ${names[*]:-none}; rounds $rounds${selected:+; parts $selected}"
bench_device
if [ "$dry" = 0 ]; then
    for n in "${names[@]}"; do
        [ -x "${bins[$n]}" ] || bench_die "variant $n: no executable at ${bins[$n]}"
        info="$(dirname "$(dirname "${bins[$n]}")")/build-info.json"
        [ -f "$info" ] && cp "$info" "$logs/build-info-$n.json"
    done
fi
for p in "${cycle_parts[@]}"; do
    [[ ",$selected," == *",$p,"* ]] && bench_part "$p"
done
for n in "${checks[@]}"; do
    bench_part check "${bins[$n]}" "$n"
done
[ "$rounds" -gt 0 ] && [ "${#names[@]}" -gt 0 ] && bench_part ab
bench_summary "$grep_re"
bench_finish
