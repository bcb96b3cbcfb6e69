#!/usr/bin/env bash
# Device call 3, on the merged tree: the compile modes that matter most, a few W092 cases near the
# library-attention threshold with correctness, and a first decode-suite row. Under $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1
timeout 100 python3 -m perf.modes --cases W075:131x1,W092:128x1 --modes reduce-overhead,default --out $OUT/modes > $OUT/modes.log 2>&1
echo "modes rc=$?"; grep -v "^{" $OUT/modes.log | grep "ours/stock\|modes:\|  W0"
timeout 100 python3 -m perf.run --suites blocks --workloads W092 --cases 128x4,1024x1 --impls stock_static,backend --check-rounds 2 --replays 10 --blocks 2 --plain-runs 10 --first-call-cases none --deadline 100 --out $OUT/w092 > $OUT/w092.log 2>&1
echo "w092 rc=$?"; tail -25 $OUT/w092.log
timeout 100 python3 -m perf.decode --models llama --batches 1 --contexts 1024 --impls stock,ours --tokens 0 --out $OUT/decode > $OUT/decode.log 2>&1
echo "decode rc=$?"; grep "^{\|decode:" $OUT/decode.log | cut -c1-400
