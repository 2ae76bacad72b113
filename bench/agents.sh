#!/usr/bin/env bash
# bench/agents.sh: the whole-loop agents against rejax in one call on the GPU host, run
# from the repository root (a copy of the working tree with the bundle and the peers'
# wheels in it):
#
#   cargo xtask bundle --gpu-tests                          # here: .device/bundle
#   OUT=/path/to/logs bash bench/agents.sh [--tar] [BUNDLE] # there (a device tool's $OUT)
#
# Runs, in this order, each result written to $OUT as soon as it exists (a run cut short
# keeps what finished):
#   1. the CartPole DQN and Pendulum SAC trainers with 1 and 8 agents (their logs, with
#      the training step's profile, and their JSON summaries), then one agent of each in
#      the portable mode (STEPGRAPH_PORTABLE=1: one block an update, no clusters);
#   2. the agents' GPU tests;
#   3. rejax's DQN and SAC with 8 vmapped seeds (bench/peers/rejax_peers.py; wheels from
#      .whl/, see bench/peers/README.md);
#   4. learning over many seeds, LEARNING_SEEDS of them (default 64; 0 skips): both
#      trainers with that many agents from seed 1000, and rejax's DQN with that many
#      vmapped seeds from seed 1000. Eight seeds tell little about how often CartPole's
#      DQN ends above 475 (the same code ends 4, 7 or 8 of 8 there from run to run).
# A summary goes to summary.txt; --tar packs everything into $OUT/agents.tgz at the end
# (for hosts that return few files).
set -u
tar=0
if [ "${1:-}" = "--tar" ]; then
    tar=1
    shift
fi
BUNDLE="${1:-.device/bundle}"
R="${OUT:?set OUT to the folder for the logs}"
SEEDS="${LEARNING_SEEDS:-64}"
T0=$(date +%s)
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/device.txt" 2>&1
[ -f "$BUNDLE/build-info.json" ] && cp "$BUNDLE/build-info.json" "$R/"
if [ -z "${LD_LIBRARY_PATH:-}" ] && python3 -c 'import nvidia' 2>/dev/null; then
    # cuBLAS and CUPTI of the host's PyTorch wheels, for the runtime's dynamic loading.
    LD_LIBRARY_PATH=$(python3 -c 'import nvidia,os;print(":".join(os.path.join(p,s) for p in nvidia.__path__ for s in ("cu13/lib","cublas/lib","cuda_cupti/lib")))')
    export LD_LIBRARY_PATH
fi
status() { echo "$1 rc=$2 t=$(( $(date +%s) - T0 ))s" | tee -a "$R/summary.txt"; }
# trainer TASK AGENTS SEED NAME [ARGS...]: one run of a trainer, its log and JSON kept.
trainer() {
    local task=$1 agents=$2 seed=$3 name=$4
    shift 4
    timeout 90 "$BUNDLE/bin/$task" --agents "$agents" --seed "$seed" --out "/tmp/agents-$name" \
        --quiet "$@" > "$R/$name.log" 2>&1
    status "$name" $?
    cp "/tmp/agents-$name/"*.json "$R/" 2>/dev/null
}
for a in 1 8; do
    for task in cartpole pendulum; do
        trainer "$task" "$a" 0 "$task-$a" --time-launches 40 --profile 20
    done
done
for task in cartpole pendulum; do
    STEPGRAPH_PORTABLE=1 trainer "$task" 1 0 "$task-1-portable" --time-launches 40 --profile 20
done
for t in gpu_agents gpu_cartpole gpu_pendulum gpu_envs; do
    timeout 120 "$BUNDLE/bin/$t" --include-ignored --test-threads=1 > "$R/$t.log" 2>&1
    status "$t" $?
done
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/peers-site .whl/*.whl
    export PYTHONPATH=/tmp/peers-site
fi
for algo in dqn sac; do
    timeout 200 python3 bench/peers/rejax_peers.py --algo "$algo" --seeds 8 --out "$R" \
        > "$R/peers-$algo.log" 2>&1
    status "peers-$algo" $?
done
if [ "$SEEDS" -gt 0 ]; then
    for task in cartpole pendulum; do
        trainer "$task" "$SEEDS" 1000 "$task-$SEEDS"
    done
    timeout 300 python3 bench/peers/rejax_peers.py --algo dqn --seeds "$SEEDS" --seed 1000 \
        --out "$R/dqn-$SEEDS" > "$R/peers-dqn-$SEEDS.log" 2>&1
    status "peers-dqn-$SEEDS" $?
fi
grep -h "solved\|environment steps\|final mean\|training alone" "$R"/cartpole-[18].log "$R"/pendulum-[18].log
grep -h "at or above" "$R"/cartpole-*.log "$R"/pendulum-*.log | sed 's/.*\]; //'
grep -h "rejax\|one agent\|vmapped" "$R"/peers-*.log
if [ "$tar" = 1 ]; then
    tar czf "/tmp/agents.tgz" -C "$R" . && mv /tmp/agents.tgz "$R/agents.tgz"
fi
