#!/usr/bin/env bash
# A/B of the trunk's backward split over two streams: the PyTorch check of the new step,
# and (c) with the bounds for the old and new binaries, alternating.
set -u -o pipefail
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib
L=/tmp/ab; rm -rf $L /tmp/chk; mkdir -p $L
( ./dqn_new --check /tmp/chk && python3 ../../examples/dqn/reference.py check /tmp/chk --device cuda ) > $L/check.log 2>&1; echo "check rc=$?"; grep "reference check:" $L/check.log
for r in 1 2; do for b in dqn_old dqn_new; do
  OUT=$L timeout 60 ./$b --steps 20 > $L/$b.$r.log 2>&1
  echo "$b run $r: $(grep -E '^\| \(c\) |^\| \(w.?\) |^\| trunk_backward' $L/$b.$r.log | tr '\n' ' ')"
done; done | tee $OUT/summary.txt
tar czf $OUT/ab.tgz -C $L .
