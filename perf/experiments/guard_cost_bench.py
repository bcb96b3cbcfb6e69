"""Experiment: what the guarded float32 fallback launches cost W075 "high" under graph replay.

Every fp16 launch of the block has a guarded float32 twin that exits at once unless the range
flag is raised (docs/kernels.md notes 12-16): the Q/K/V GEMM's, the norm/RoPE launch's and the
attention's (on a side stream beside the fp16 o_proj while a graph is captured), and o_proj's
own after it. Each is a launch of GUARDED_PROGRAMS (128) programs. Timed per case, as graph
replays of the whole block, interleaved over rounds:

* ``as_is``: the block as it runs;
* ``programs=16``: the guarded launches with 16 programs (fewer blocks to place and retire,
  a slower fallback when the flag is raised);
* ``no_guards`` (measurement only, wrong whenever the flag is raised): the twins not launched,
  the upper bound of anything that makes them cheaper;
* ``inline_before`` / ``inline_after``: the attention's guarded launches on the main stream (no
  side stream, no fork and join in the graph), before or after the fp16 o_proj GEMM (both
  orders are correct: that GEMM reads only o16 and Wo16, which the fallback does not write);
* (measured at d818315 and removed with the kernel form it compared) ``two_launch_fallback``:
  the f16tma plan's fallback q, k, v by the guarded GEMM and the guarded norm/RoPE launch, as
  now, against one guarded ``proj_rope.launch_fallback`` (float32 tiles, persistent programs).

Prediction: ``no_guards`` 1-2 us below ``as_is`` per case (the o_proj twin's ~1 us on the chain,
the side stream's blocks beside the o_proj GEMM); ``programs=16`` between the two. If
``no_guards`` saves under ~1 us on average, the twins are not worth restructuring.
Outcome of the first three (runs/profiles/guard_cost_ed4f734.json): ``no_guards`` 1.8-3.0 us below
``as_is`` at 131-1024 rows and 512x16, 0.2 at 4096x1; ``programs=16`` within 0.7 of ``as_is``.
Since 16 programs change nothing and 4096x1 (whose o_proj hides the side chain) saves nothing,
the cost looks like the graph's fork and join rather than the launches' blocks: prediction for
the in-line variants, with programmatic dependent launch making each early-exit launch ~0.3 us
on the chain, ``inline_after`` within ~1 us of ``no_guards``. Outcome (an H100, runs/profiles/
guard_cost2_b5a5661.json): both in-line orders 2.0-4.5 us *slower* than ``as_is`` (131x1 24.5
vs 22.6, 512x16 238.5 vs 234.4); ``no_guards`` 1.4-3.4 below it. The side stream is the better
place; what costs is the launches themselves, so the next step is fewer of them: prediction for
``as_is`` with the one-launch fallback against ``two_launch_fallback``: 0.3-1 us less per case
(one of the side stream's three launches gone), the largest share at the small cases where the
side stream's launches outlast the fp16 o_proj. Outcome (an H100 again, runs/profiles/
guard_cost3_d818315.json; both forms pass the plain and the overflow checks in graph replay):
the one launch is no faster, and slower at 1024x2 (106.2 vs 103.1 us; 131x1 22.9 vs 22.4,
512x16 235.4 vs 234.4). Its guarded programs reserve a GEMM's shared memory (90 KB) even to
exit (the likely cost: they are placed beside the fp16 o_proj), and one launch fewer on the
side stream does not shorten the chain. Removed; the guarded launches' ~2-3 us
(``no_guards``) stay. A conditional graph node instead (a ``branch`` setting at e9fe0de,
docs/kernels.md note 61): ~5 us *slower* than ``as_is`` (131x1 26.0 vs 21.0 us). The guarded
GEMMs with small tiles (a ``small_guard`` setting at 09fb16c: 16 or 4 KB of shared memory and 128
threads a program instead of 96 KB and 256 threads at 255 registers, so they could be placed
beside the fp16 o_proj's blocks): within 0.5 us of ``as_is`` in all five cases (note 62).

    PYTHONPATH=$PWD python perf/experiments/guard_cost_bench.py [--cases 131x1,...] [--out F]
"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from inductor_gqa.kernels import tuning          # noqa: E402
from inductor_gqa.lower import attention as lower_attention   # noqa: E402
from inductor_gqa.lower import block, fp16_plans  # noqa: E402
from inductor_gqa.workloads import W075, atol, check, make_inputs   # noqa: E402
from perf.bench import graph_time_us             # noqa: E402
from perf.kernels_check import w075_block        # noqa: E402
from perf.sanitize_block import _replayed as replayed   # noqa: E402

import gqa_pack_bench    # noqa: E402  the report loop (this folder is sys.path[0])

CASES = "131x1,128x4,256x1,541x1,512x4,1024x2,512x16,4096x1"
_ORIG = (fp16_plans._guarded_gemm, fp16_plans.qk_norm_rope_, lower_attention._fallbacks,
         tuning.GUARDED_PROGRAMS)


def _unguarded_qk(*args, **kw):
    if kw.get("guard") == 2:
        return None
    return _ORIG[1](*args, **kw)


def _o_proj16_inline(after):
    """fp16_plans._o_proj16 with the pending fallbacks on the main stream."""
    def o_proj16(o, o16, wo, wo16, flag, pending=(), wo16_ready=None):
        b, s, hd = o.shape
        if wo16_ready is not None:
            torch.cuda.current_stream(o.device).wait_event(wo16_ready)
        if not after:
            for run in pending:
                run()
        out = fp16_plans._mm16(o16.view(b * s, hd), wo16.t())
        if after:
            for run in pending:
                run()
        fp16_plans._guarded_gemm(o.view(b * s, hd), wo, out, "tf32x3", flag)
        return out.view(b, s, -1)
    return o_proj16


_O_PROJ16 = fp16_plans._o_proj16


def setting(name):
    gg, qk, fb, progs = _ORIG
    fp16_plans._o_proj16 = (_o_proj16_inline(name == "inline_after")
                            if name.startswith("inline") else _O_PROJ16)
    tuning.GUARDED_PROGRAMS = 16 if name == "programs=16" else progs
    if name == "no_guards":
        fp16_plans._guarded_gemm = lambda *a, **k: None
        fp16_plans.qk_norm_rope_ = _unguarded_qk
        lower_attention._fallbacks = lambda before, launch, deferred: None
    else:
        fp16_plans._guarded_gemm, fp16_plans.qk_norm_rope_ = gg, qk
        lower_attention._fallbacks = fb


def bench(case, names, rounds):
    s, b = (int(v) for v in case.split("x"))
    torch.manual_seed(s * 7 + b)
    inp = make_inputs(W075, s, b, device="cuda")
    torch.set_float32_matmul_precision("highest")
    with torch.no_grad():
        ref = W075.fn(**inp)
    torch.set_float32_matmul_precision("high")
    t, spec = w075_block(inp, False)
    setting("as_is")
    with torch.no_grad():
        block.run_block(dict(t), spec)      # the choices, timed once
    rep = {n: [] for n in names}
    for _ in range(rounds):
        for n in names:
            setting(n)
            with torch.no_grad():
                rep[n].append(graph_time_us(lambda: block.run_block(dict(t), spec),
                                            replays=20, blocks=1)[0])
    out = {n: round(statistics.median(v), 2) for n, v in rep.items()}
    # k beyond fp16's range with the same scores (sanitize_block --overflow): the fallback
    # runs, in the variant's order, inside a graph replay
    big = dict(t, wq=t["wq"] * 2.0 ** -18, wk=t["wk"] * 2.0 ** 18)
    for n in [n for n in names if n not in ("no_guards", "programs=16")]:
        setting(n)
        for tag, tt in (("", t), (" overflow", big)):
            with torch.no_grad():
                got = replayed(lambda: block.run_block(dict(tt), spec))
            out[n + tag + " check"] = [round(check(o, r, atol(W075, s, b), W075.rtol)[1], 5)
                                       for o, r in zip(got, ref)]
    setting("as_is")
    print(case, json.dumps(out), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("--settings", default="as_is,no_guards,inline_before,inline_after",
                    help="comma-separated, from: as_is, programs=16, no_guards, inline_before, "
                         "inline_after (every one but no_guards and programs=16 is also "
                         "checked, plain and with k beyond fp16's range)")
    a = ap.parse_args()
    names = tuple(a.settings.split(","))
    gqa_pack_bench.run_cases(lambda c: bench(c, names, a.rounds), a.cases, a.out)


if __name__ == "__main__":
    main()
