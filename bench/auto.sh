#!/usr/bin/env bash
# bench/auto.sh: the planner's placement against the hand placement, on the GPU host:
# the suite's GPU tests (its fork_join replays the planner's placement bit for bit against
# one stream), then the DQN and SAC benches twice each. Each bench times (b), (c) and
# (c-auto), the step placed wholly by the planner (`compare(auto)`), and writes the
# measured costs file (`dqn.costs`, `sac.costs`) that `costs = ".."` reads.
#
#   here:  cargo build --release -p stepgraph-dqn -p stepgraph-sac --bins, and the suite's
#          GPU tests (`cargo build --release --test gpu --features stepgraph-suite/gpu-tests`);
#          copy `dqn`, `sac` and the test binary (as `gpu`) into DIR, stripped
#   there: OUT=/path/to/logs bash bench/auto.sh DIR
#
# Everything is packed into $OUT/all.tgz after each run, so a call cut short keeps what
# finished.
set -u
dir=${1:?usage: OUT=... bash bench/auto.sh DIR (with dqn, sac and gpu in DIR)}
: "${OUT:?set OUT to the folder for the logs}"
w=$OUT/w
mkdir -p "$w"
pack() { (cd "$w" && tar czf "$OUT/all.tgz" .); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$w/device.txt"
timeout 150 "$dir/gpu" --test-threads=1 > "$w/gpu.log" 2>&1
echo "gpu rc $?" >> "$w/rc.txt"
pack
for i in 1 2; do
    mkdir -p "$w/dqn-$i" "$w/sac-$i"
    OUT="$w/dqn-$i" timeout 200 "$dir/dqn" > "$w/dqn-$i.log" 2>&1
    echo "dqn $i rc $?" >> "$w/rc.txt"
    pack
    timeout 120 "$dir/sac" --bench "$w/sac-$i" > "$w/sac-$i.log" 2>&1
    echo "sac $i rc $?" >> "$w/rc.txt"
    pack
done
rm -rf "$w"
