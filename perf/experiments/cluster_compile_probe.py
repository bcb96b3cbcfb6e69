"""CPU-only probe: what Triton's Gluon compiles for Hopper with thread-block clusters
(``num_ctas=8``), the groundwork of a one-launch probabilities kernel for rows longer than one
program's shared memory (docs/kernels.md note 41). Compiles small kernels to sm_90 PTX and
prints the cluster-related lines, or the compiler's error.

    env -u TRITON_INTERPRET python perf/experiments/cluster_compile_probe.py

Outcome with triton 3.6.0 (the H200's) and 3.7.1, written when first run:
- ``barrier``: compiles. With every layout's ``cga_layout`` broadcast over the 8 CTAs
  ([[0], [0], [0]]), program_id(0) becomes %clusterid.x; %cluster_ctarank and
  barrier.cluster.arrive/wait go through inline assembly (one element per thread, so that each
  thread arrives once).
- ``tma``: compiles under 3.6. An mbarrier allocated as shape [1] (``.index`` of an [n, 1]
  array hits an assertion in the compiler) and a TMA load into a broadcast NVMMA layout: each
  CTA loads its own box (no multicast), as a split kernel needs. 3.7.1 emits the load with an
  expected byte count of 8 boxes: not usable as it is.
- ``tile2d``: fails in the front end of both: a 2-D index tensor built from SliceLayout
  aranges of a layout with a ``cga_layout`` ("'list' object has no attribute 'type'", in the
  layout comparison of a broadcast). Every 2-D load, store or mask in the probabilities kernels
  is built that way, so a cluster kernel needs another way to form its indices first.
"""
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def barrier_kernel(Y, num_warps: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0], [[0], [0], [0]])
    offs = gl.arange(0, 32 * num_warps, layout=layout)
    rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [offs],
                                     dtype=gl.int32, is_pure=True, pack=1)
    gl.inline_asm_elementwise("barrier.cluster.arrive.release.aligned;\n"
                              "barrier.cluster.wait.acquire.aligned;\nmov.u32 $0, 0;",
                              "=r,r", [offs], dtype=gl.int32, is_pure=False, pack=1)
    gl.store(Y + gl.program_id(0) * 32 * num_warps + offs, rank.to(gl.float32))


@gluon.jit
def tma_kernel(q_desc, Y, num_warps: gl.constexpr):
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout([[0], [0], [0]]))
    mbarrier.init(bar, count=1)
    q_s = gl.allocate_shared_memory(gl.float16, [64, 64], q_desc.layout)
    mbarrier.expect(bar, 64 * 64 * 2)
    tma.async_copy_global_to_shared(q_desc, [gl.program_id(0) * 64, 0], bar, q_s)
    mbarrier.wait(bar, 0)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0], [[0], [0], [0]])
    offs = gl.arange(0, 32 * num_warps, layout=layout)
    gl.store(Y + gl.program_id(0) * 32 * num_warps + offs, offs.to(gl.float32))


@gluon.jit
def tile2d_kernel(Y, num_warps: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [num_warps, 1], [1, 0],
                                            [[0, 0], [0, 0], [0, 0]])
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
    ptrs = Y + gl.expand_dims(r, 1) * 64 + gl.expand_dims(c, 0)
    gl.store(ptrs, gl.zeros([64, 64], gl.float32, layout))


def main() -> int:
    cga2 = [[0, 0], [0, 0], [0, 0]]
    desc = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16, cga_layout=cga2)
    probes = {
        "barrier": (barrier_kernel, {"Y": "*fp32"}),
        "tma": (tma_kernel, {"q_desc": f"tensordesc<fp16[64, 64],{desc!r}>", "Y": "*fp32"}),
        "tile2d": (tile2d_kernel, {"Y": "*fp32"}),
    }
    words = ("cluster", "cp.async.bulk", "multicast", "expect_tx")
    for name, (fn, types) in probes.items():
        sig = dict(types, num_warps="constexpr")
        try:
            k = triton.compile(GluonASTSource(fn, sig, constexprs={"num_warps": 4}),
                               target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": 4, "num_ctas": 8})
            lines = [x.strip()[:120] for x in k.asm["ptx"].splitlines()
                     if any(w in x for w in words) and not x.strip().startswith((".loc", ".file"))]
            print(f"{name}: compiled; " + " | ".join(lines))
        except Exception as e:  # noqa: BLE001 (a probe: report any compiler failure)
            print(f"{name}: FAILED: {type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
