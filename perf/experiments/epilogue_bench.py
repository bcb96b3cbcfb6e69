"""Experiment: the f16proj plan's norm/RoPE launch (``qk_norm_rope_`` with scales, fp16 copies and
Wo's copy) at W075 "high" sizes, by CUDA-graph replay, against the bytes it must move.

The launch measured ~40 us at 512x16 in profile_block (about 2 TB/s for ~85 MB). Variants: rows
per program and warps of the current kernel, and optionally the kernel of another revision (its
module file given with --old, e.g. ``git show REV:inductor_gqa/kernels/qk_epilogue.py``), so that
a kernel change is timed against its predecessor in one process. Results also check that every
variant writes the same copies. Also timed: fewer programs that loop over the row blocks (``programs``;
measured no steady gain, runs/profiles/epilogue_loop_*.txt).

    git show REV:inductor_gqa/kernels/qk_epilogue.py > /tmp/qk_epilogue_old.py
    PYTHONPATH=$PWD python perf/experiments/epilogue_bench.py [--old /tmp/qk_epilogue_old.py]
"""
import argparse
import statistics

import torch

import flash_ab_bench    # this folder is sys.path[0]
from inductor_gqa.kernels import qk_epilogue, tuning
from inductor_gqa.kernels.fp16_rows import scale_rows
from inductor_gqa.kernels.rope_table import rope_tables

CASES = [(512, 16), (449, 16), (4096, 1), (2048, 1), (131, 1)]
H, HK, D, E = 16, 4, 64, 1024


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=10) for _ in range(5)) * 1e3


def setup(s, b, g):
    m = b * s
    x = torch.randn(m, E, device="cuda", generator=g)
    ws = [torch.randn(n, E, device="cuda", generator=g) * 0.02 for n in (H * D, HK * D, HK * D)]
    wo = torch.randn(E, H * D, device="cuda", generator=g) * 0.02
    (x16, x_inv), = scale_rows([x])
    w16, w_inv = zip(*scale_rows(ws))
    qkv = torch.mm(x16, torch.cat(w16).t(), out_dtype=torch.float32)
    cuts = [(0, H * D), (H * D, (H + HK) * D), ((H + HK) * D, (H + 2 * HK) * D)]
    q, k, v = (qkv[:, a:z] for a, z in cuts)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
    pos = torch.arange(s, device="cuda")[None].expand(b, s)
    cos, sin = rope_tables(inv_freq, pos, D, False, torch.float32)
    copies = tuple(torch.empty(a.shape, device="cuda", dtype=torch.float16) for a in (q, k, v))
    flag = torch.zeros(1, device="cuda", dtype=torch.int32)
    wo16 = torch.empty_like(wo, dtype=torch.float16)
    moved = (q.numel() + k.numel() + v.numel()) * 6 + wo.numel() * 6 + cos.numel() * 8
    return dict(q=q, k=k, v=v, cos=cos, sin=sin, copies=copies, flag=flag, wo=wo, wo16=wo16,
                scales=(x_inv, *w_inv), b=b, s=s, moved=moved)


def call(mod, a, **kw):
    mod.qk_norm_rope_(a["q"], a["k"], None, None, a["cos"], a["sin"], a["b"], a["s"], H, HK, D,
                      "none", 1e-6, "half", D, v=a["v"], copies=a["copies"], flag=a["flag"],
                      scales=a["scales"], store32=False, wo=(a["wo"], a["wo16"]), **kw)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--old", default="", help="a qk_epilogue.py of another revision")
    args = p.parse_args()
    old = None
    if args.old:
        old = flash_ab_bench.load_module(args.old)     # relative imports made absolute
    g = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    variants = [("new (default)", qk_epilogue, {}),
                ("new rows=32 w4", qk_epilogue, dict(rows=32)),
                ("new rows=8 w4", qk_epilogue, dict(rows=8)),
                ("new rows=16 w2", qk_epilogue, dict(num_warps=2))]
    # fewer programs that loop over the row blocks (the guarded launch's form)
    variants += [(f"new rows={r} loop {n}xSMs", qk_epilogue, dict(rows=r, programs=n * sms))
                 for r in (16, 32) for n in (4, 8, 16)]
    if old is not None:
        variants.insert(0, ("old (default)", old, {}))
    for s, b in CASES:
        a = setup(s, b, g)
        ref = None
        line = [f"{s}x{b}: {a['moved'] / 1e6:.1f} MB"]
        for name, mod, kw in variants:
            try:
                call(mod, a, **kw)
            except Exception as e:  # noqa: BLE001
                line.append(f"{name}: failed {type(e).__name__}")
                continue
            got = torch.cat([c.float().flatten() for c in a["copies"] + (a["wo16"],)])
            same = "" if ref is None else ("" if torch.equal(got, ref) else " DIFFERS")
            ref = got if ref is None else ref
            us = t_us(lambda: call(mod, a, **kw))
            line.append(f"{name}: {us:.1f} us ({a['moved'] / us / 1e6:.2f} TB/s){same}")
        print("\n  ".join(line), flush=True)
        assert a["flag"].item() == 0


if __name__ == "__main__":
    main()
