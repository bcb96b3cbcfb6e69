"""Where the library's attention beats ours inside the fused block: W092-shaped blocks timed
with the inference plan's default attention choice and with the library's forced.

    python -m perf.sdpa_threshold [--out DIR]

Per case: stock ``torch.compile`` (static shapes), ours as planned (``plans.SDPA_INFERENCE_MIN_ROWS``
decides: the library's attention from B*H*S rows up), and ours with the library's attention at
every size; GPU time by CUDA-graph replay and the plan each compile chose. Cases: W092 at the
sizes around the threshold, and a Llama-3-8B-shaped block (32 / 8 heads of 128, hidden 4096;
W092's code without its norm weights mattering) at B=4, S=512, where a single transformers layer
with sdpa measured 0.90-0.99x stock. Writes ``sdpa_threshold.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from inductor_gqa import workloads as wl
from inductor_gqa.plan import plans
from perf import bench

CASES = [("W092", 128, 4, {}), ("W092", 512, 1, {}), ("W092", 293, 4, {}),
         ("W092", 1024, 1, {}), ("W092", 512, 4, {}),
         ("llama8b", 512, 4, dict(hidden=4096, num_heads=32, num_kv_heads=8, head_dim=128)),
         ("llama8b", 2048, 1, dict(hidden=4096, num_heads=32, num_kv_heads=8, head_dim=128))]


def _time(fn, inputs, backend):
    torch._dynamo.reset()
    c = torch.compile(fn, backend=backend, dynamic=False)
    with torch.no_grad():
        c(**inputs)
        t = bench.graph_time_us(lambda: c(**inputs), 20, 3)[0]
    return round(t, 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.sdpa_threshold")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("perf.sdpa_threshold needs a CUDA GPU")
        return 2
    import inductor_gqa  # noqa: F401
    torch._inductor.config.fx_graph_cache = False
    out = a.out or os.environ.get("OUT") or "."
    os.makedirs(out, exist_ok=True)
    rows = []
    default = plans.SDPA_INFERENCE_MIN_ROWS
    for name, s, b, dims in CASES:
        h = dims.get("num_heads", wl.W092.num_heads)
        fn = wl.workload_fn(wl.W092, dims.get("num_heads"), dims.get("num_kv_heads"),
                            dims.get("head_dim"))
        inputs = bench.make_inputs(wl.W092, s, b, "cuda", 0, dims)
        row = {"case": f"{name} {s}x{b}", "rows": b * s * h}
        try:
            row["stock_us"] = _time(fn, inputs, "inductor")
            plans.SDPA_INFERENCE_MIN_ROWS = default
            row["ours_us"] = _time(fn, inputs, "inductor_gqa")
            plans.SDPA_INFERENCE_MIN_ROWS = 0
            row["ours_library_us"] = _time(fn, inputs, "inductor_gqa")
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:400]
        finally:
            plans.SDPA_INFERENCE_MIN_ROWS = default
        row["planned"] = "library" if row["rows"] >= default else "ours"
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(out, "sdpa_threshold.json"), "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "threshold": default, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
