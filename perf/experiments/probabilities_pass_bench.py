"""Frozen experiment: variants of the probabilities pass at W075 sizes, each config timed by
CUDA-graph replay. Output of one run: perf/results/nvidia-h200/runs/profiles/
probabilities_pass_variants.txt. Variants: m1 = stats pass; m2 = probabilities pass (plain store,
row-major V); _vt = K-major V; _nostore / _nopv = leave the store / the P@V product out (to place
time by difference); _tma = store P through a host TMA descriptor; m3 = both passes in one launch.

    PYTHONPATH=$PWD python perf/experiments/probabilities_pass_bench.py
"""
import json, os, statistics, sys
import torch, triton
from triton.tools.tensor_descriptor import TensorDescriptor
sys.path.insert(0, os.path.dirname(__file__))
from probabilities_pass_kernel import exp_kernel
from inductor_gqa.kernels import tuning

H, HK, D = 16, 4, 64
def run(q, k, v, vt, o, p, ml, b, s, mode, vtf, store, pv, bm, bn, nw, ns):
    G = H // HK
    if vtf:
        vv, svs = vt, (HK * D * s, D * s, 0, s)
    else:
        vv, svs = v, (s * HK * D, D, HK * D, 0)
    pd = TensorDescriptor(p.view(b * H, s, s), [b * H, s, s], [s * s, s, 1], [1, bm, bn]) if store == 2 else None
    grid = (triton.cdiv(s, bm), b * H)
    exp_kernel[grid](q, k, vv, o, p, pd, ml,
                     s * H * D, D, H * D, s * HK * D, D, HK * D, *svs, s * H * D, H * D, D,
                     p.stride(0), p.stride(1), p.stride(2), H, G, s, 1.0,
                     D=D, BLOCK_M=bm, BLOCK_N=bn, MODE=mode, VT=vtf, STORE=store, PV=pv,
                     num_warps=nw, num_stages=ns)

def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=10) for _ in range(3)) * 1e3

cases = [(4096, 1), (512, 16), (2048, 1), (131, 1)]
cfgs = [(64, 64, 4, 2), (64, 128, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 2)]
variants = [  # name, mode, vt, store, pv
    ("m1", 1, 0, 0, 0),
    ("m2", 2, 0, 1, 1), ("m2_vt", 2, 1, 1, 1), ("m2_nostore", 2, 0, 0, 1), ("m2_nopv", 2, 0, 1, 0),
    ("m2_tma", 2, 0, 2, 1), ("m2_vt_tma", 2, 1, 2, 1), ("m2_vt_nostore", 2, 1, 0, 1),
    ("m2_tma_nopv", 2, 0, 2, 0), ("m3_vt_tma", 3, 1, 2, 1), ("m3_vt", 3, 1, 1, 1),
]
res = {}
for s, b in cases:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, H * D, device="cuda", generator=g) * 0.6
    k = torch.randn(b, s, HK * D, device="cuda", generator=g) * 0.6
    v = torch.randn(b, s, HK * D, device="cuda", generator=g)
    vt = v.view(b, s, HK * D).transpose(1, 2).contiguous()
    ml = torch.empty(b * H * s * 2, device="cuda")
    ref_p = torch.softmax((q.view(b, s, H, D).transpose(1, 2) @ k.view(b, s, HK, D).transpose(1, 2).repeat_interleave(4, 1).transpose(-1, -2)), -1)
    ref_o = (ref_p @ v.view(b, s, HK, D).transpose(1, 2).repeat_interleave(4, 1)).transpose(1, 2).reshape(b, s, H * D)
    for name, mode, vtf, store, pv in variants:
        if store == 2 and s % 4:
            continue
        best = None
        for cfg in cfgs:
            o = torch.zeros(b, s, H * D, device="cuda"); p = torch.full((b, H, s, s), float("nan"), device="cuda")
            def call():
                if mode == 2:
                    run(q, k, v, vt, o, p, ml, b, s, 1, vtf, 0, 0, *cfg)  # stats for pass 2
                run(q, k, v, vt, o, p, ml, b, s, mode, vtf, store, pv, *cfg)
            try:
                call(); torch.cuda.synchronize()
                if mode == 2:
                    run(q, k, v, vt, o, p, ml, b, s, 1, vtf, 0, 0, *cfg)
                    base = t_us(lambda: run(q, k, v, vt, o, p, ml, b, s, 1, vtf, 0, 0, *cfg))
                    us = t_us(lambda: run(q, k, v, vt, o, p, ml, b, s, mode, vtf, store, pv, *cfg))
                else:
                    us = t_us(call)
                err = ""
                if store and pv and mode != 1:
                    err = f"perr {(p - ref_p).abs().max().item():.1e} oerr {(o - ref_o).abs().max().item():.1e}"
            except Exception as e:
                print(name, s, b, cfg, "FAIL", repr(e)[:200], flush=True); continue
            print(f"{name:14s} {s}x{b} {cfg} {us:8.1f} us {err}", flush=True)
            if best is None or us < best[0]:
                best = (us, cfg)
        res[f"{name} {s}x{b}"] = best
        print(f"BEST {name:14s} {s}x{b} {best}", flush=True)
print(json.dumps(res, indent=0))
