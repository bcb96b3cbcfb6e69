#!/usr/bin/env bash
# One device call: install, the write analysis of the planned launches on this torch, then
# perf.modes (stock and ours in every mode) on the two smallest seed cases. Writes under $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())" | tee $OUT/env.txt
export PERF_GIT_COMMIT=${PERF_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
timeout 90 python3 tests/kernels/sm90_compile.py --jobs 8 --only "W075 high 131x1" 2>&1 | tail -5 | tee $OUT/writes.txt
TORCH_LOGS=perf_hints timeout 470 python3 -m perf.modes --cases W075:131x1,W092:128x1 \
  --modes reduce-overhead,aoti,cpp_wrapper,default,dynamic,max-autotune --out $OUT \
  > $OUT/modes.log 2>&1
echo "modes rc=$?"
grep -v "^{" $OUT/modes.log | grep -i "skipping cudagraphs\|ours/stock\|modes:\|  W0" | head -40
