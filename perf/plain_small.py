"""Plain calls at W075's small cases: where host time, not the GPU, decides.

    python -m perf.plain_small [--out DIR]

Per case (W075 "high", B=1 and the smallest B=4): stock ``torch.compile`` (static shapes),
ours as planned, and ours without the fp16-copies plan (``fp16_operands=False``: no guarded
fallback launches); plain call (median of 30 from an idle device), GPU time (CUDA-graph
replay), kernels per call and the host span of the launches (profiler). Writes
``plain_small.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from inductor_gqa import workloads as wl
from perf import bench

CASES = ((131, 1), (256, 1), (512, 1), (541, 1), (128, 4))
IMPLS = (("stock", "inductor", None), ("ours", "inductor_gqa", None),
         ("ours_native", "inductor_gqa", {"fp16_operands": False}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.plain_small")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("perf.plain_small needs a CUDA GPU")
        return 2
    import inductor_gqa  # noqa: F401
    torch._inductor.config.fx_graph_cache = False
    torch.set_float32_matmul_precision("high")
    out = a.out or os.environ.get("OUT") or "."
    os.makedirs(out, exist_ok=True)
    rows = []
    for s, b in CASES:
        inputs = bench.make_inputs(wl.W075, s, b, "cuda", 0)
        for name, backend, options in IMPLS:
            torch._dynamo.reset()
            kw = {"options": options} if options else {}
            c = torch.compile(wl.W075.fn, backend=backend, dynamic=False, **kw)
            row = {"case": f"{s}x{b}", "impl": name}
            try:
                with torch.no_grad():
                    c(**inputs)
                    row["plain_us"] = round(bench.plain_time_us(lambda: c(**inputs), 30)[0], 1)
                    row["gpu_us"] = round(bench.graph_time_us(lambda: c(**inputs), 20, 3)[0], 1)
                    prof = bench.profile_call(lambda: c(**inputs))
                row["kernels"], row["launch_span_us"] = prof["kernels"], prof["launch_span_us"]
            except Exception as e:  # noqa: BLE001
                row["error"] = repr(e)[:400]
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(os.path.join(out, "plain_small.json"), "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
