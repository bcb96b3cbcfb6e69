#!/usr/bin/env bash
# Device call 2: the decode kernel against the library's attention; W075's small cases in plain
# calls; the library-attention threshold; the AOTInductor runner (stock and ours). Under $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1
timeout 190 python3 -m perf.decode_kernel --configs --out $OUT > $OUT/decode.log 2>&1
echo "decode rc=$?"; grep -v "^{" $OUT/decode.log | tail -22
timeout 120 python3 -m perf.plain_small --out $OUT > $OUT/plain_small.log 2>&1
echo "plain_small rc=$?"; grep "^{" $OUT/plain_small.log | cut -c1-200
timeout 110 python3 -m perf.sdpa_threshold --out $OUT > $OUT/sdpa_threshold.log 2>&1
echo "sdpa_threshold rc=$?"; grep "^{" $OUT/sdpa_threshold.log
timeout 140 python3 -m perf.modes --cases W075:131x1,W092:128x1 --modes aoti --out $OUT/aoti > $OUT/aoti.log 2>&1
echo "aoti rc=$?"; grep -v "^{" $OUT/aoti.log | grep -v "^\s*$" | tail -8
