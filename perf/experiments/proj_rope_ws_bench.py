"""Experiment: the warp-specialized fused projection (kernels/proj_rope_ws.py) against
proj_rope.py's kernel and cuBLAS, at W075's Q/K/V shape (x [B*S, 1024] @ [1536, 1024]^T, RoPE from
inv_freq and the positions), per token count.

    PYTHONPATH=$PWD python perf/experiments/proj_rope_ws_bench.py [--cases 512x16,...] [--out F]

Each case: fp16 operand copies with their power-of-two scales as the f16tma plan makes them
(fp16_plans._scaled_fp16_operands on fresh float32 inputs), the output NaN-poisoned before every
checked launch; the copies of the warp-specialized kernel and of proj_rope's other configs
compared with those of proj_rope's first config (largest difference in fp16 units, any NaN
left), the range flag compared, three rounds of fresh inputs; then GPU times (CUDA-graph replay
medians) of every config of both kernels and of the cuBLAS fp16 GEMM alone.

``--rope none`` / ``--head-dim N`` / ``--no-time``: the check alone for the kernel's other forms
(no RoPE; 16 query and 4 KV heads of N), as run before ``covers`` offered them (note 60).

Prediction (written before the first GPU run): the epilogue hidden under the other warpgroup's
main loop, so the fused launch near the cuBLAS GEMM alone: 8192 rows 52 -> 42-45 us, 4096 rows
27 -> 22-24, 2048 rows ~15 -> 12-14; below ~1024 rows (fewer tiles than two per SM) no gain.
"""
import argparse
import ast
import json
import statistics

import torch
import triton

from inductor_gqa.kernels import proj_rope, proj_rope_ws, tuning
from inductor_gqa.lower import fp16_plans

E, H, HK, D = 1024, 16, 4, 64
PARTS = (H * D, HK * D, HK * D)
NO_TIME = False
EXTRA = []      # --extra: proj_rope configs timed beside its candidates
ROPE = "half"


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=5) for _ in range(3)) * 1e3


def operands(b, s, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(b, s, E, device="cuda", generator=g)
    ws = [torch.randn(n, E, device="cuda", generator=g) * 0.02 for n in PARTS]
    flag = torch.zeros(1, device="cuda", dtype=torch.int32)
    x16, x_inv, w16, w_inv, _ = fp16_plans._scaled_fp16_operands(x, ws, flag)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda").float() / D))
    pos = torch.arange(s, device="cuda").expand(b, s)
    return x16, x_inv, w16, w_inv, flag, (inv, pos)



def run_old(ops, out, s, cfg):
    x16, x_inv, w16, w_inv, flag, angles = ops
    if ROPE == "none":
        proj_rope.launch(x16, w16, x_inv, w_inv, out, flag, PARTS, None, None, None, None, s,
                         D, "none", 1e-6, None, "none", cfg)
        return
    tab = x_inv.new_ones((1, 1, D)).expand(x16.shape[0] // s, s, D)   # unread: the angles
    proj_rope.launch(x16, w16, x_inv, w_inv, out, flag, PARTS, None, None, tab, tab, s, D,
                     "none", 1e-6, None, "half", cfg, angles=angles)


def run_ws(ops, out, s, cfg):
    x16, x_inv, w16, w_inv, flag, angles = ops
    proj_rope_ws.launch(x16, w16, x_inv, w_inv, out, flag, PARTS, s, D, ROPE, cfg,
                        angles=angles if ROPE != "none" else None)



def case(b, s):
    m = b * s
    rep = {}
    old_cfgs = proj_rope.candidates(PARTS, D) + [c for c in EXTRA
                                                 if proj_rope.config_fits(c, PARTS, D)]
    ws_cfgs = proj_rope_ws.candidates(PARTS, D, torch.device("cuda"), "none", ROPE,
                                      D if ROPE != "none" else 0, ROPE != "none")
    worst = 0.0
    for rnd in range(3):
        ops = operands(b, s, 1000 * rnd + m)
        ref = torch.full((m, sum(PARTS)), float("nan"), device="cuda", dtype=torch.float16)
        run_old(ops, ref, s, old_cfgs[0])
        flag_ref = int(ops[4].item())
        for cfg in ws_cfgs + old_cfgs[1:]:
            ops[4].zero_()
            out = torch.full_like(ref, float("nan"))
            (run_ws if cfg[0] == "ws" else run_old)(ops, out, s, cfg)
            torch.cuda.synchronize()
            diff = float((out.float() - ref.float()).abs().max())
            ulp = float(((out.float() - ref.float()).abs()
                         / ref.float().abs().clamp_min(2.0 ** -14)).max()) * 1024
            nan = int(out.isnan().sum())
            worst = max(worst, ulp)
            rep.setdefault(f"check {cfg}", []).append(
                dict(max_abs=diff, max_ulps=ulp, nan_left=nan, flag=int(ops[4].item()),
                     flag_ref=flag_ref))
    if NO_TIME:
        rep["summary"] = dict(worst_ulps=worst)
        print(f"{s}x{b} ({m} rows) D={D} rope={ROPE}: worst {worst:.2f} fp16 ulps; "
              + "; ".join(f"{k}: {v}" for k, v in rep.items() if k.startswith("check"))[:900],
              flush=True)
        return rep
    ops = operands(b, s, m)
    out = torch.empty((m, sum(PARTS)), device="cuda", dtype=torch.float16)
    rep["cublas fp16 gemm"] = t_us(lambda: fp16_plans._mm16_out16(ops[0], ops[2].t()))
    for cfg in old_cfgs:
        rep[f"proj_rope {cfg}"] = t_us(lambda cfg=cfg: run_old(ops, out, s, cfg))
    for cfg in ws_cfgs:
        rep[f"ws {cfg}"] = t_us(lambda cfg=cfg: run_ws(ops, out, s, cfg))
    best_old = min(v for k, v in rep.items() if k.startswith("proj_rope"))
    best_ws = min((v for k, v in rep.items() if k.startswith("ws (")), default=None)
    rep["summary"] = dict(best_proj_rope=best_old, best_ws=best_ws,
                          cublas=rep["cublas fp16 gemm"], worst_ulps=worst)
    print(f"{s}x{b} ({m} rows): proj_rope {best_old:.1f} us, ws {best_ws}, cublas gemm "
          f"{rep['cublas fp16 gemm']:.1f}, worst {worst:.2f} fp16 ulps; "
          + "; ".join(f"{k}: {v}" for k, v in rep.items() if k.startswith("check"))[:600],
          flush=True)
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="512x16,449x16,512x8,373x8,2048x1,1024x2,512x4,256x4,"
                                        "541x1,131x1")
    ap.add_argument("--out", default="")
    ap.add_argument("--rope", default="half", choices=("half", "none"))
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--no-time", action="store_true", help="the checks only")
    ap.add_argument("--extra", default="[]",
                    help="a Python list of proj_rope configs (BM, BN, BK, warps, stages, "
                         "persistent) timed beside its candidates")
    a = ap.parse_args()
    global ROPE, D, PARTS, NO_TIME, EXTRA
    EXTRA = [tuple(c) for c in ast.literal_eval(a.extra)]
    ROPE, D, NO_TIME = a.rope, a.head_dim, a.no_time
    PARTS = (H * D, HK * D, HK * D)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "rope": ROPE, "head_dim": D}
    for c in a.cases.split(","):
        s, b = (int(v) for v in c.split("x"))
        report[c] = case(b, s)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
