#!/usr/bin/env bash
# bench/agents.sh: the whole-loop agents against rejax in one call on the GPU host, run
# from the repository root (a copy of the working tree with the bundle and the peers'
# wheels in it):
#
#   cargo xtask bundle --gpu-tests                 # here: .device/bundle
#   OUT=/path/to/logs bash bench/agents.sh [BUNDLE] # there (a device tool's $OUT)
#
# Runs, in this order, each result written to $OUT as soon as it exists (a run cut short
# keeps what finished): the CartPole DQN and Pendulum SAC trainers with 1 and 8 agents
# (their logs, with the training step's profile, and their JSON summaries), rejax's DQN
# and SAC with 8 vmapped seeds (bench/peers/rejax_peers.py; wheels from .whl/, see
# bench/peers/README.md), then the agents' GPU tests. A summary goes to summary.txt.
set -u
BUNDLE="${1:-.device/bundle}"
R="${OUT:?set OUT to the folder for the logs}"
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
for a in 1 8; do
    for task in cartpole pendulum; do
        timeout 60 "$BUNDLE/bin/$task" --agents "$a" --seed 0 --out "/tmp/agents-$task-$a" \
            --time-launches 40 --profile 20 --quiet > "$R/$task-$a.log" 2>&1
        status "$task-$a" $?
        cp "/tmp/agents-$task-$a/"*.json "$R/" 2>/dev/null
    done
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
for t in gpu_agents gpu_cartpole gpu_pendulum gpu_envs; do
    timeout 120 "$BUNDLE/bin/$t" --include-ignored --test-threads=1 > "$R/$t.log" 2>&1
    status "$t" $?
done
grep -h "solved\|environment steps\|final mean\|training alone" "$R"/cartpole-*.log "$R"/pendulum-*.log
grep -h "rejax\|one agent\|vmapped" "$R"/peers-*.log
