"""Experiment: how the probabilities pass writes P (W075 "high" inputs: fp16 q/k/V copies, fp16
output, float32 probabilities), on the same statistics in one process.

Prediction being tested: the pass writes 3.55 TB/s at 4096x1 against 4.66 for a pure write
kernel. Each program writes BLOCK_N * 4 = 256 bytes per row per key tile, scattered over its
128 rows, and marks them evict-first, so DRAM may see 256-byte pieces of many rows at once
rather than the long runs a pure write kernel makes. If that costs write efficiency, then
  - keeping the lines in L2 (no eviction hint) lets neighbouring pieces of a row meet there, and
  - 128-key tiles write 512 bytes per row per tile,
and either should take the pass toward ~250 us at 4096x1 (from ~298). If the pass is bound by
its own issue rate instead (its compute does not hide under the stores), neither moves it; the
streaming hint (.cs) is timed as a third policy.

The variants are flash.py with its store hint replaced (a modified copy loaded as a module), so
no production kernel changes unless one wins. Checks: probabilities bitwise equal to the default
kernel's (each is exp2 of the same product, whatever the tile width), o within 1e-3 relative.

    PYTHONPATH=$PWD python perf/experiments/probs_store_bench.py [--cases 4096x1,512x16]
"""
import argparse
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
import flash_ab_bench  # noqa: E402
import gqa_pack_bench  # noqa: E402

from inductor_gqa.kernels import flash, tuning  # noqa: E402

STATS_CFG = (64, 128, 4, 3)
CFGS = [(128, 64, 8, 4, "gp4"), (128, 64, 8, 3, "gp4"),
        (128, 128, 8, 2, "gp4"), (128, 128, 8, 3, "gp4"), (64, 128, 4, 2, "gp4"),
        (64, 128, 4, 3, "gp4"), (128, 128, 8, 2), (64, 128, 4, 2, "pipeline")]
HINTS = {"evict_first (default)": None,
         "no hint": 'eviction_policy="evict_first"',
         "streaming .cs": 'cache_modifier=".cs"'}


def variant(hint):
    if hint is None:
        return flash
    src = open(flash.__file__).read()
    new = 'eviction_policy="evict_first"'
    text = src.replace(new, "" if hint == new else hint)    # a trailing comma is left: valid
    d = tempfile.mkdtemp()
    path = os.path.join(d, "flash_variant.py")
    with open(path, "w") as f:
        f.write(text)
    return flash_ab_bench.load_module(path)


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=5) for _ in range(3)) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="4096x1,512x16,2048x1,1024x2")
    a = p.parse_args()
    mods = {name: variant(h) for name, h in HINTS.items()}
    for case in a.cases.split(","):
        s, b = (int(t) for t in case.split("x"))
        c = gqa_pack_bench.Case(s, b)
        c.launch(1, STATS_CFG)
        torch.cuda.synchronize()
        ref = None
        rows = []
        for name, mod in mods.items():
            for cfg in CFGS if name.startswith("evict_first") else CFGS[:3]:
                try:
                    c.probs.fill_(float("nan"))
                    c.o.fill_(float("nan"))
                    c.launch(2, cfg, mod)
                    torch.cuda.synchronize()
                    got = (c.probs.clone(), c.o.float())
                    if ref is None:
                        ref = got
                    same = (torch.equal(got[0], ref[0]) and torch.allclose(
                        got[1], ref[1], rtol=1e-3, atol=1e-4))
                    us = t_us(lambda: c.launch(2, cfg, mod))
                    rows.append((us, name, str(cfg), same))
                except Exception as e:  # noqa: BLE001
                    rows.append((float("inf"), name, f"{cfg} {type(e).__name__}: {e}"[:160],
                                 None))
        rows.sort()
        print(case, f"{c.probs.numel() * 4 / 1e6:.0f} MB of probabilities", flush=True)
        for us, name, cfg, same in rows:
            print(f"  {us:8.1f} us  {name:24s} {cfg}  same={same}", flush=True)


if __name__ == "__main__":
    main()
