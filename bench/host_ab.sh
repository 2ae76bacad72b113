#!/usr/bin/env bash
# bench/host_ab.sh: an A/B of the host-side costs of capture_cost and fork_join (the
# capture of a 500-op step, the host cost of a replay, fork_join's graphs) between
# builds, in one call on the GPU host: each variant's two programs one after the other,
# --rounds times, so that the variants share the machine. Host costs vary more between
# calls than most changes move them; compare only within one call.
#
#   bash bench/host_ab.sh [--rounds N] NAME=DIR [NAME=DIR...]
#
# A variant is a name and a folder holding its `capture_cost` and `fork_join` binaries
# (a GPU-test bundle's bin/, or stripped copies of an older build's examples). Output: the
# figure lines of each run, to stdout.
set -u -o pipefail

rounds=3
variants=()
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds)
            [ $# -ge 2 ] && [[ "$2" =~ ^[0-9]+$ ]] || { echo "--rounds expects a number" >&2; exit 2; }
            rounds="$2"; shift 2 ;;
        -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
        *=*) variants+=("$1"); shift ;;
        *) echo "unknown argument '$1': expected --rounds N or NAME=DIR" >&2; exit 2 ;;
    esac
done
[ "${#variants[@]}" -gt 0 ] || { echo "expected at least one NAME=DIR" >&2; exit 2; }
for v in "${variants[@]}"; do
    dir="${v#*=}"
    for prog in capture_cost fork_join; do
        [ -x "$dir/$prog" ] || { echo "${v%%=*}: no executable $dir/$prog" >&2; exit 2; }
    done
done

export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work="$(mktemp -d)"
for r in $(seq 1 "$rounds"); do
    for v in "${variants[@]}"; do
        name="${v%%=*}" dir="$(cd "${v#*=}" && pwd)"
        echo "== $name, round $r"
        "$dir/capture_cost" 2>&1 | grep -E "dry pass|host cost|device time"
        # fork_join writes its profile into the working folder: keep it out of the tree.
        (cd "$work" && "$dir/fork_join" 2>&1 | grep -E "one-stream graph :|stepgraph graph  :|host cost")
    done
done
rm -rf "$work"
