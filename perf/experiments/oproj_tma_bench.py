"""Experiment: o_proj (fp16 o [M, 1024] @ fp16 Wo [1024, 1024]^T, float32 out) as a Triton GEMM on
the copy engine, one or two programs per SM, against cuBLAS (``torch.mm(out_dtype=float32)``,
today's o_proj: 4.3 us at 131 rows, 16.9 at 4096, 30.0 at 8192 in the block's profile).

Prediction (before the run): cuBLAS's 8192-row GEMM runs at ~570 TFLOP/s with a float32 tile
epilogue of 64 KB per 128x128 tile; two persistent programs per SM overlap one's epilogue with
the other's main loop, so a Triton kernel may reach 24-27 us at 8192 rows and 13-15 at 4096;
at <= 1024 rows cuBLAS stays ahead by ~0.5 us (note: the block would still save the guard
launch and gain a PDL edge with a Triton o_proj, which this bench does not see).

    PYTHONPATH=$PWD python perf/experiments/oproj_tma_bench.py [--rows 8192] [--out F]
"""
import argparse
import json
import statistics

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from inductor_gqa.kernels import tuning

K = N = 1024


@triton.jit
def _tile_of(t, num_m, num_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * num_n
    first_m = (t // per_group) * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    return first_m + (t % per_group) % group_m, (t % per_group) // group_m


@triton.jit
def _one(a_desc, b_desc, c_desc, c_ptr, M, N, K, pid_m, pid_n, BM: tl.constexpr,
         BN: tl.constexpr, BK: tl.constexpr, TMA_STORE: tl.constexpr, SPLIT: tl.constexpr):
    acc = tl.zeros((BM, BN), tl.float32)
    for ki in range(tl.cdiv(K, BK)):
        a = a_desc.load([pid_m * BM, ki * BK])
        b = b_desc.load([pid_n * BN, ki * BK])
        acc = tl.dot(a, b.T, acc)
    if TMA_STORE:
        if SPLIT:
            c0, c1 = tl.split(tl.permute(tl.reshape(acc, [BM, 2, BN // 2]), [0, 2, 1]))
            c_desc.store([pid_m * BM, pid_n * BN], c0)
            c_desc.store([pid_m * BM, pid_n * BN + BN // 2], c1)
        else:
            c_desc.store([pid_m * BM, pid_n * BN], acc)
    else:
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        tl.store(c_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], acc,
                 mask=(rows < M)[:, None])


@triton.jit
def gemm_kernel(a_desc, b_desc, c_desc, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, PERSISTENT: tl.constexpr, PROGS: tl.constexpr,
                TMA_STORE: tl.constexpr, SPLIT: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    if PERSISTENT:
        for t in tl.range(tl.program_id(0), num_m * num_n, PROGS, flatten=True):
            pid_m, pid_n = _tile_of(t, num_m, num_n, 8)
            _one(a_desc, b_desc, c_desc, c_ptr, M, N, K, pid_m, pid_n, BM, BN, BK, TMA_STORE,
                 SPLIT)
    else:
        pid_m, pid_n = _tile_of(tl.program_id(0), num_m, num_n, 8)
        _one(a_desc, b_desc, c_desc, c_ptr, M, N, K, pid_m, pid_n, BM, BN, BK, TMA_STORE, SPLIT)


# (BM, BN, BK, warps, stages, persistent programs per SM (0: one tile per program), store)
CONFIGS = [(64, 64, 64, 4, 4, 0, "tma"), (64, 128, 64, 4, 3, 0, "tma"),
           (64, 128, 64, 4, 3, 0, "ptr"), (128, 128, 64, 8, 3, 1, "tma"),
           (128, 128, 64, 8, 4, 1, "split"), (128, 128, 32, 8, 4, 2, "split"),
           (128, 128, 32, 8, 4, 2, "ptr"), (128, 128, 64, 8, 2, 2, "ptr"),
           (128, 128, 32, 8, 4, 0, "ptr"), (128, 128, 32, 8, 4, 0, "split"),
           (128, 256, 64, 8, 3, 1, "ptr"), (128, 128, 64, 4, 3, 0, "ptr")]


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=5) for _ in range(3)) * 1e3


def bench(m, sms):
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, K, device="cuda", generator=g).half()
    b = (torch.randn(N, K, device="cuda", generator=g) * 0.02).half()
    ref = torch.mm(a, b.t(), out_dtype=torch.float32)
    c = torch.empty(m, N, device="cuda")
    rows = {"cublas": t_us(lambda: torch.mm(a, b.t(), out_dtype=torch.float32))}
    for cfg in CONFIGS:
        bm, bn, bk, nw, ns, per_sm, store = cfg
        a_d = TensorDescriptor.from_tensor(a, [bm, bk])
        b_d = TensorDescriptor.from_tensor(b, [bn, bk])
        c_d = TensorDescriptor.from_tensor(c, [bm, bn // 2 if store == "split" else bn])
        tiles = triton.cdiv(m, bm) * triton.cdiv(N, bn)
        progs = max(per_sm, 1) * sms
        grid = (min(tiles, progs),) if per_sm else (tiles,)
        extra = {"maxnreg": 128} if per_sm == 2 else {}

        def run():
            gemm_kernel[grid](a_d, b_d, c_d, c, m, N, K, BM=bm, BN=bn, BK=bk,
                              PERSISTENT=bool(per_sm), PROGS=progs, TMA_STORE=store != "ptr",
                              SPLIT=store == "split", num_warps=nw, num_stages=ns, **extra)
        try:
            c.zero_()
            run()
            torch.cuda.synchronize()
        except Exception as e:
            rows[str(cfg)] = str(e)[:100]
            continue
        rows[str(cfg)] = dict(us=t_us(run), maxdiff=(c - ref).abs().max().item())
    ok = {k: v for k, v in rows.items() if isinstance(v, dict)}
    best = min(ok, key=lambda k: ok[k]["us"])
    print(f"M={m:5d} cuBLAS {rows['cublas']:6.1f}  best {best} {ok[best]['us']:6.1f}", flush=True)
    for k, v in ok.items():
        print(f"    {k:40s} {v['us']:7.1f} us  maxdiff {v['maxdiff']:.1e}")
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="131,512,1024,2048,2984,4096,7184,8192")
    p.add_argument("--out", default="")
    a = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    report = {m: bench(int(m), sms) for m in a.rows.split(",")}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
