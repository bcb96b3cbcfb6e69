#!/usr/bin/env bash
# Device call 4 (little device time left): the two seed cases in reduce-overhead and default,
# stock and ours, on the merged tree. Under $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1
timeout 110 python3 -m perf.modes --cases W075:131x1,W092:128x1 --modes reduce-overhead,default --out $OUT/modes > $OUT/modes.log 2>&1
echo "modes rc=$?"; grep -v "^{" $OUT/modes.log | grep "ours/stock\|modes:\|  W0"
timeout 60 python3 -m perf.decode --models llama --batches 1 --contexts 1024 --impls ours --tokens 0 --replays 5 --plain-runs 3 --out $OUT/decode > $OUT/decode.log 2>&1
echo "decode rc=$?"; grep "^{\|decode:" $OUT/decode.log | cut -c1-400
