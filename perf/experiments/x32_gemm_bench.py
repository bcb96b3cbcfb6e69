"""Experiment: W075's Q/K/V GEMM reading x as float32, converted to fp16 in shared memory by the
GEMM's own warps (Gluon, Hopper), against the fp16 copy of x made by a pass of its own.

Why: at 8192 rows, scale_rows spends ~14 of its 17.5 us on x (33.5 MB read, 16.8 MB written,
read again by the GEMM). f16tma32 (docs/kernels.md note 48) let Triton convert x in registers:
Triton then feeds the tile to the tensor cores as a register operand and the GEMM got ~40 us
slower. Here each k-step's float32 tile lands in shared memory through the copy engine, the
warps load it, round it to fp16 and store it back to a second shared buffer in the MMA's
layout, and the MMA reads both operands from shared memory (asynchronously: the conversion of
tile k + 1 runs while tile k's MMA does). Per k-step a fence and a block barrier order the fp16
stores before the MMA, and a second barrier, once every warpgroup has waited for its MMA k - 1,
frees that step's ring slot and fp16 buffer for reuse.

Question: how close does this get to the fp16 GEMM on a ready x16? If the converting GEMM at
8192 rows is within ~5 us of the plain one (42.3 us in tma_gemm_7193f03.json) while the x pass
costs ~13, the f16tma launch is worth porting to this form (its norm/RoPE epilogue as well).

Prediction (before any GPU run): per 128x128x64 step the plain GEMM moves ~80 KB through
shared memory (the copy engine's 48 KB in, the MMA's operand reads) against 512 tensor-core
cycles of MACs; the conversion adds 48 KB (32 KB read, 16 KB written) and the float32 tile's
extra 16 KB in. If the MMA's operand reads share the 128 B/cycle of the load/store path, the
converting GEMM is ~1.5-1.8x the plain one at 8192 rows (63-76 us against 42 + 13 for the
pass and the plain GEMM: a loss); if they do not, ~1.1x (~47 us: a ~8 us win). Small row
counts (131-1024) within ~1 us of the plain GEMM either way (latency).

    PYTHONPATH=$PWD python perf/experiments/x32_gemm_bench.py [--rows 131,...] [--out F]
    PYTHONPATH=$PWD python perf/experiments/x32_gemm_bench.py --compile   # sm_90 cubin on a CPU
"""
import argparse
import json

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

_block_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

E = 1024
N = 1536
# (BM, BN, BK, warps, stages): 8 warps = two warpgroups of 64 rows each
CONFIGS = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 2), (64, 128, 64, 4, 3), (64, 64, 64, 4, 4),
           (128, 128, 32, 8, 4), (128, 256, 64, 8, 2)]


@gluon.constexpr_function
def _acc_layout(BN, NW):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                     instr_shape=[16, BN, 16])


@gluon.constexpr_function
def _cvt_layout(BM, BK, NW):
    """Four consecutive floats per thread (one 16-byte load from the float32 tile)."""
    tpr = BK // 4 if BK // 4 < 32 else 32
    return gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32 // tpr, tpr],
                            warps_per_cta=[NW, 1], order=[1, 0])


@gluon.jit
def _load(t, n_k, off_m, off_n, x_desc, w_desc, x_smem, w_smem, bars, BM: gl.constexpr,
          BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    if t < n_k:
        slot = t % STAGES
        mbarrier.expect(bars.index(slot), BM * BK * 4 + BN * BK * 2)
        tma.async_copy_global_to_shared(x_desc, [off_m, t * BK], bars.index(slot),
                                        x_smem.index(slot))
        tma.async_copy_global_to_shared(w_desc, [off_n, t * BK], bars.index(slot),
                                        w_smem.index(slot))


@gluon.jit
def x32_gemm_kernel(x_desc, w_desc, c_desc, M, N, K, BM: gl.constexpr, BN: gl.constexpr,
                    BK: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """c16 [M, N] = fp16(x [M, K] float32) @ w16 [N, K]^T, float32 accumulation."""
    NW: gl.constexpr = gl.num_warps()
    acc_layout: gl.constexpr = _acc_layout(BN, NW)
    cvt_layout: gl.constexpr = _cvt_layout(BM, BK, NW)
    a16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.float16)

    # grouped tile order: a band of x rows stays in L2 while W streams
    pid = gl.program_id(0)
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    off_m = (first_m + (pid % per_group) % group_m) * BM
    off_n = ((pid % per_group) // group_m) * BN

    x_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BM, BK], x_desc.layout)
    w_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BN, BK], w_desc.layout)
    a16_smem = gl.allocate_shared_memory(gl.float16, [2, BM, BK], a16_layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)

    n_k = gl.cdiv(K, BK)
    for t in gl.static_range(STAGES - 1):
        _load(t, n_k, off_m, off_n, x_desc, w_desc, x_smem, w_smem, bars, BM, BN, BK, STAGES)

    acc = gl.zeros([BM, BN], gl.float32, acc_layout)
    for k in range(n_k):
        slot = k % STAGES
        mbarrier.wait(bars.index(slot), (k // STAGES) & 1)
        a32 = x_smem.index(slot).load(cvt_layout)
        # a16[k % 2] was last read by MMA k - 2: every warpgroup waited for it in step k - 1,
        # before that step's second barrier
        a16 = a16_smem.index(k % 2)
        a16.store(a32.to(gl.float16))
        fence_async_shared()
        _block_barrier()
        w_t = w_smem.index(slot).permute((1, 0))
        tok = warpgroup_mma(a16, w_t, acc, is_async=True)
        acc = warpgroup_mma_wait(1, deps=(tok, a16, w_t))[0]
        # every warpgroup's MMA k - 1 is complete once all warps are past their wait: its
        # x and w slot takes tile k + STAGES - 1
        _block_barrier()
        _load(k + STAGES - 1, n_k, off_m, off_n, x_desc, w_desc, x_smem, w_smem, bars, BM, BN,
              BK, STAGES)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    c_smem = gl.allocate_shared_memory(gl.float16, [BM, BN], c_desc.layout)
    c_smem.store(acc.to(gl.float16))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(0)


def _desc(t, block, dtype):
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def launch(x32, w16, c16, cfg):
    bm, bn, bk, nw, ns = cfg
    m, k = x32.shape
    n = w16.shape[0]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    x32_gemm_kernel[grid](_desc(x32, [bm, bk], gl.float32), _desc(w16, [bn, bk], gl.float16),
                          _desc(c16, [bm, bn], gl.float16), m, n, k, BM=bm, BN=bn, BK=bk,
                          STAGES=ns, GROUP_M=8, num_warps=nw)


def bench(m, sms):
    import tma_gemm_bench          # this folder is sys.path[0]
    from inductor_gqa.kernels import fp16_rows
    t_us = tma_gemm_bench.t_us     # the same timer as the plain GEMM's bench
    g = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, E, device="cuda", generator=g)
    w16 = (torch.randn(N, E, device="cuda", generator=g) * 0.02).half()
    ref = x.half().float() @ w16.float().t()
    rep = {}
    x16, _ = fp16_rows.scale_rows([x])[0]
    rep["x pass (scale_rows, x only)"] = t_us(lambda: fp16_rows.scale_rows([x]))
    rep["cublas fp16 on x16"] = t_us(lambda: torch.mm(x16, w16.t()))
    c = torch.empty(m, N, device="cuda", dtype=torch.float16)
    best16 = None
    for cfg in tma_gemm_bench.CONFIGS:
        try:
            us = t_us(lambda cfg=cfg: tma_gemm_bench.launch(x16, w16, c, cfg, sms))
        except Exception:  # noqa: BLE001
            continue
        best16 = min(best16 or (us, cfg), (us, cfg))
    rep["copy-engine fp16 GEMM on x16 (best)"] = best16
    best = None
    for cfg in CONFIGS:
        try:
            c.fill_(float("nan"))
            launch(x, w16, c, cfg)
            torch.cuda.synchronize()
            err = float((c.float() - ref).abs().max() / ref.abs().max())
            us = t_us(lambda cfg=cfg: launch(x, w16, c, cfg))
        except Exception as ex:  # noqa: BLE001
            rep[str(cfg)] = f"{type(ex).__name__}: {str(ex)[:160]}"
            continue
        rep[str(cfg)] = dict(us=us, rel_err=err)
        if err < 2e-3 and (best is None or us < best[0]):
            best = (us, cfg)
    rep["x32 converting GEMM (best)"] = best
    print(m, json.dumps(rep, default=str), flush=True)
    return rep


def compile_only():
    """Every config to an sm_90 cubin (no GPU): resources and spills."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    for bm, bn, bk, nw, ns in CONFIGS:
        lay = {n: gl.NVMMASharedLayout.get_default_for(b, dt) for n, b, dt in
               (("x", [bm, bk], gl.float32), ("w", [bn, bk], gl.float16),
                ("c", [bm, bn], gl.float16))}
        sig = dict(x_desc=f"tensordesc<fp32[{bm}, {bk}],{lay['x']!r}>",
                   w_desc=f"tensordesc<fp16[{bn}, {bk}],{lay['w']!r}>",
                   c_desc=f"tensordesc<fp16[{bm}, {bn}],{lay['c']!r}>", M="i32", N="i32",
                   K="i32", BM="constexpr", BN="constexpr", BK="constexpr",
                   STAGES="constexpr", GROUP_M="constexpr")
        consts = dict(BM=bm, BN=bn, BK=bk, STAGES=ns, GROUP_M=8)
        try:
            k = triton.compile(GluonASTSource(x32_gemm_kernel, sig, constexprs=consts),
                               target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": nw})
            import os
            import subprocess
            import tempfile
            tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                                "cuobjdump")
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(k.asm["cubin"])
                f.flush()
                res = subprocess.run([tool, "-res-usage", f.name], capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1]
            print((bm, bn, bk, nw, ns), "shared", k.metadata.shared, res.strip()[:60])
        except Exception as ex:  # noqa: BLE001
            print((bm, bn, bk, nw, ns), "FAILED", type(ex).__name__, str(ex)[-300:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="131,512,1024,2048,4096,7184,8192")
    ap.add_argument("--out", default="")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    if a.compile:
        return compile_only()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__}
    for m in (int(r) for r in a.rows.split(",")):
        report[str(m)] = bench(m, sms)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    main()
