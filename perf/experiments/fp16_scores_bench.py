"""Experiment: W075 "high" attention passes with 16-bit q/k (and V) operands instead of TF32.

fp16 has TF32's 10-bit significand (and rounds to nearest, where Triton's TF32 truncates), at
twice the tensor-core rate and half the bytes; its exponent range is what differs. This measures
what the two passes would gain before any range handling is built: every config of both passes,
q/k fp32 (TF32 dots, today) vs fp16, and pass 2 also with fp16 V (P rounded to fp16 for P @ V).
It also prints the probabilities' and outputs' error against float64 for each variant.

    PYTHONPATH=$PWD python perf/experiments/fp16_scores_bench.py [--cases 4096x1,512x16]
"""
import argparse
import json
import statistics

import torch

from inductor_gqa.kernels import flash, tuning
from inductor_gqa.lower import attention as lower_attention

H, HK, D = 16, 4, 64


def inputs(s, b, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(b * s, 1024, device="cuda", generator=g)
    w = torch.randn(1024 + 2 * HK * D, 1024, device="cuda", generator=g) * 0.02
    y = x.double() @ w.double().t()
    q, k, v = y[:, :H * D], y[:, H * D:H * D + HK * D], y[:, H * D + HK * D:]
    return q, k, v


def launch(q, k, v, v_kmajor, o, probs, ml, b, s, mode, cfg):
    qs = (q, (s * H * D, D, H * D))
    ks = (k, (s * HK * D, D, HK * D))
    vs = (v, (s, D * b * s, 1, b * s)) if v_kmajor else (v, (s * HK * D, D, HK * D, 1))
    bm, bn, nw, ns = cfg[:4]
    flash.launch(qs, ks, vs, o, probs, None, ml, b, s, H, H // HK, D, 1.0, 0.0, False, 0, mode,
                 "tf32", False, bm, bn, nw, ns, v_kmajor=v_kmajor, pipeline="pipeline" in cfg)


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=5) for _ in range(3)) * 1e3


def reference(q, k, v, b, s):
    q4 = q.view(b, s, H, D).transpose(1, 2)
    k4 = k.view(b, s, HK, D).transpose(1, 2).repeat_interleave(H // HK, 1)
    v4 = v.view(b, s, HK, D).transpose(1, 2).repeat_interleave(H // HK, 1)
    p = torch.softmax(q4 @ k4.transpose(-1, -2), -1)
    return p, (p @ v4).transpose(1, 2).reshape(b, s, H * D)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,512x16,449x16,2048x1")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_float32_matmul_precision("high")
    report = {}
    for case in a.cases.split(","):
        s, b = (int(t) for t in case.split("x"))
        q64, k64, v64 = inputs(s, b)
        p_ref, o_ref = reference(q64, k64, v64, b, s) if b * s * s <= 2 ** 25 else (None, None)
        q32, k32 = q64.float().contiguous(), k64.float().contiguous()
        vt32 = v64.float().t().contiguous()
        q16, k16, v16 = q64.half().contiguous(), k64.half().contiguous(), v64.half().contiguous()
        variants = {   # name: (q, k, v, v_kmajor)
            "tf32": (q32, k32, vt32, True),
            "f16qk": (q16, k16, vt32, True),
            "f16qkv": (q16, k16, v16, False),
        }
        o = torch.empty(b, s, H * D, device="cuda")
        probs = torch.empty(b, H, s, s, device="cuda")
        ml = torch.empty(b * H * s * 2, device="cuda")
        rep = report[case] = {}
        for name, (q, k, v, vk) in variants.items():
            row = rep[name] = {}
            for mode in (1, 2):
                if mode == 1 and name == "f16qkv":
                    continue
                cfgs = lower_attention._attention_configs(torch.float32, D, mode)
                if name != "tf32":
                    cfgs = cfgs + [(128, 128, 8, 3), (128, 64, 8, 4), (256, 64, 8, 2),
                                   (128, 256, 8, 2)]
                times = []
                for c in cfgs + [c + ("pipeline",) for c in cfgs]:
                    if mode == 2:   # statistics of this variant first
                        launch(q, k, v, vk, o, probs, ml, b, s, 1, (128, 128, 8, 2))
                    try:
                        times.append((t_us(lambda: launch(q, k, v, vk, o, probs, ml, b, s, mode,
                                                          c)), str(c)))
                    except Exception as e:  # noqa: BLE001
                        times.append((float("inf"), f"{c} {type(e).__name__}: {str(e)[:80]}"))
                times.sort()
                row[f"mode{mode}"] = times[:4]
                print(case, name, f"mode{mode}", times[:3], flush=True)
            if p_ref is not None:
                launch(q, k, v, vk, o, probs, ml, b, s, 1, (128, 128, 8, 2))
                o.fill_(float("nan"))
                probs.fill_(float("nan"))
                launch(q, k, v, vk, o, probs, ml, b, s, 2, (128, 32, 8, 3))
                ep = (probs.double() - p_ref).abs()
                eo = (o.double() - o_ref).abs()
                row["err"] = dict(p_max=ep.max().item(), p_frac=(ep <= 0.0022 + 1e-5 * p_ref.abs())
                                  .double().mean().item(), o_max=eo.max().item(),
                                  o_mean=eo.mean().item(), o_frac=(eo <= 0.0022 + 1e-5 *
                                  o_ref.abs()).double().mean().item())
                print(case, name, "err", row["err"], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
