"""Experiment (CPU only): does Triton's automatic warp specialization take a loop shaped like
flash.py's probabilities pass on sm_90?

The pass's compute (q @ k^T, exponentials, P @ V) and its stores are issued by the same warps, so
neither hides under the other (docs/kernels.md note 21). ``tl.range(..., warp_specialize=True)``
asks the compiler to split the loop into producer and consumer warps; on sm_80/90 Triton runs its
Hopper pass for that. This compiles a minimal loop of that shape (q tile, K and V through tensor
descriptors, exp2, a pointer store of P, P @ V) for sm_90 with and without the flag and reports
whether the TTGIR holds warp partitions.

    python perf/experiments/hopper_autows_compile.py [--warps 8]     (TRITON_INTERPRET unset)

Outcome with triton 3.7.1: at 8 warps no partitions (the loop compiles as without the flag), at
4 warps the pass fails (``NVGPUWarpSpecialization``).
"""
import argparse

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def probs_loop(q_desc, k_desc, v_desc, P, O, LSE, S, sp_bh, so_bh,
               BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, WS: tl.constexpr):
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1)
    q = q_desc.load([bh * S + m0, 0])
    offs_m = m0 + tl.arange(0, BM)
    lse = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
    acc = tl.zeros([BM, D], tl.float32)
    for n0 in tl.range(0, S, BN, warp_specialize=WS):
        k = k_desc.load([bh * S + n0, 0])
        v = v_desc.load([bh * S + n0, 0])
        p = tl.exp2(tl.dot(q, k.T) - lse[:, None])
        offs_n = n0 + tl.arange(0, BN)
        tl.store(P + bh * sp_bh + offs_m[:, None] * S + offs_n[None, :], p,
                 mask=(offs_m[:, None] < S) & (offs_n[None, :] < S), eviction_policy="evict_first")
        acc += tl.dot(p.to(tl.float16), v)
    tl.store(O + bh * so_bh + offs_m[:, None] * D + tl.arange(0, D)[None, :], acc.to(tl.float16),
             mask=offs_m[:, None] < S)


def compile_for_sm90(ws: bool, warps: int, bm=128, bn=64, d=64):
    sig = dict(q_desc=f"tensordesc<fp16[{bm}, {d}]>", k_desc=f"tensordesc<fp16[{bn}, {d}]>",
               v_desc=f"tensordesc<fp16[{bn}, {d}]>", P="*fp32", O="*fp16", LSE="*fp32",
               S="i32", sp_bh="i32", so_bh="i32", BM="constexpr", BN="constexpr", D="constexpr",
               WS="constexpr")
    return triton.compile(ASTSource(probs_loop, sig, constexprs=dict(BM=bm, BN=bn, D=d, WS=ws)),
                          target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warps", type=int, nargs="+", default=[8, 4])
    a = ap.parse_args()
    for warps in a.warps:
        for ws in (False, True):
            try:
                k = compile_for_sm90(ws, warps)
                parts = "ttg.warp_specialize" in k.asm["ttgir"]
                print(f"warps {warps} warp_specialize={ws}: compiled, partitions {parts}, "
                      f"shared {k.metadata.shared} B")
            except Exception as e:  # noqa: BLE001
                print(f"warps {warps} warp_specialize={ws}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:120]}")


if __name__ == "__main__":
    main()
