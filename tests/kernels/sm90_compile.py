"""Compile every kernel config the tuner may try for Hopper (sm_90), without a GPU.

The interpreter runs a kernel's Python body, so it cannot see front-end or lowering failures that
only the compiler hits (a statement after a ``return`` in a constexpr branch is compiled too, a
tile shape that does not broadcast, a layout the backend rejects); on the GPU the tuner skips a
config that fails, so such a bug would only show as a missing candidate. This compiles, to a cubin
with the ptxas that ships with Triton, the candidates of every choice in ``lower/`` for the
workloads' specializations and one config per remaining switch (masks, causal, head_dim, norm and
RoPE styles), and reports failures and configs whose shared memory exceeds an H200 block's.

    python tests/kernels/sm90_compile.py [--jobs 2]      (with TRITON_INTERPRET unset)
    python tests/kernels/sm90_compile.py --inspect "fp32 d64 mode2 (128, 32, 8, 2) tf32"
    python tests/kernels/sm90_compile.py --same-as 1b66375 [--inspect TEXT] [--ignore-param-offsets]

Unit strides are passed as the constant 1, as the launcher specializes them at run time.
``--inspect`` compiles the jobs whose name contains the text as the launcher would for sizes and
strides divisible by 16 (e.g. S=4096) and prints counts of the SASS instructions that say how a
kernel works: tensor-core MMAs and their shapes, global stores and their widths, shared-memory
traffic, warpgroup waits, local memory. ``--same-as REV`` compiles each job also from the kernel
source at a git revision and reports jobs whose instruction stream differs: a refactor that changes
no instruction keeps the GPU measurements of REV.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import inspect as inspect_module
import os
import sys
import time

SMEM_PER_BLOCK = 232448   # bytes of shared memory one block may use on an H100/H200

TY = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _job(name, module, kernel, types, consts, warps, stages=3):
    return (name, module, kernel, types, consts, {"num_warps": warps, "num_stages": stages})


def attention_jobs():
    import torch

    from inductor_gqa.lower.attention import (_FALLBACK_CONFIGS, _attention_configs,
                                              heads_per_program)

    jobs = []

    def add(tag, dt, d, mode, cfg, *, kmajor, prec="tf32", causal=False, mask=0, out=None,
            guard=0, probs=None, even=False, row4=False):
        bm, bn, nw, ns = cfg[:4]
        gp = heads_per_program(cfg)
        pipeline = "pipeline" in cfg
        t = TY[str(dt).split(".")[-1]]
        o = TY[str(out).split(".")[-1]] if out is not None else t
        p = TY[str(probs).split(".")[-1]] if probs is not None else o
        mask_t = {0: p, 1: "u8", 2: "u8", 3: p}[mask]
        types = dict(Q="*" + t, K="*" + t, V="*" + t, O="*" + o, P="*" + p, MASK="*" + mask_t,
                     ML="*fp32", FLAG="*i32", qscale="fp32", mask_fill="fp32")
        consts = dict(D=d, BLOCK_D=max(16, 1 << (d - 1).bit_length()), BLOCK_M=bm, BLOCK_N=bn,
                      CAUSAL=causal, MASK_KIND=mask, MODE=mode, PREC=prec, UPCAST=False,
                      PIPELINE=pipeline, GUARD=guard, FOLD=mask == 0, EVEN_N=even,
                      V_KMAJOR=kmajor, **({"GP": gp} if gp > 1 else {}),
                      **({"ALIGN4": True} if "a4" in cfg else {}),
                      **({"ROW4": True} if row4 else {}),
                      **({"PERSIST": True} if guard == 2 else {}),
                      **({"sv_s": 1} if kmajor else {"sv_d": 1}))
        jobs.append(_job(f"attention {tag} mode{mode} {cfg[:4]} {prec} causal={causal} "
                         f"mask={mask}" + (" pipeline" if pipeline else "")
                         + (f" guard={guard}" if guard else "")
                         + (f" gp{gp}" if gp > 1 else "")
                         + (" a4" if "a4" in cfg else "")
                         + (" row4" if row4 else "")
                         + (" even" if even else ""),
                         "inductor_gqa.kernels.flash", "gqa_attention_kernel", types, consts,
                         nw, ns))

    def with_pipeline(cfgs):      # every config also with the opt-in PIPELINE switch
        return list(cfgs) + [c + ("pipeline",) for c in cfgs]

    for prec in ("tf32", "tf32x3"):                       # W075: float32, D 64, K-major V
        for mode in (0, 1, 2):
            for cfg in with_pipeline(_attention_configs(torch.float32, 64, mode)):
                add("fp32 d64", torch.float32, 64, mode, cfg, kmajor=True, prec=prec)
    for d in (128, 64):                                   # W092 and a bf16 D=64 model
        for mode in (0, 1, 2):
            for cfg in with_pipeline(_attention_configs(torch.bfloat16, d, mode)):
                for even in (False, True) if d == 128 and mode == 0 else (False,):
                    add(f"bf16 d{d}", torch.bfloat16, d, mode, cfg, kmajor=False,
                        causal=d == 128, even=even)
    for mode in (0, 1, 2):          # W075 "high": fp16 copies of float32 q/k/V, and the fallback
        cfgs = _attention_configs(torch.float32, 64, mode, f16=True)
        for cfg in with_pipeline(cfgs) if mode == 2 else cfgs:
            # fp16 output for the fp16 o_proj (float32 probabilities); S a multiple of the key
            # tile or not
            for even in (False, True):
                add("fp16->fp16/fp32 d64", torch.float16, 64, mode, cfg, kmajor=False,
                    out=torch.float16, probs=torch.float32, guard=1, even=even)
        add("fp16->fp32 d64", torch.float16, 64, mode, cfgs[0], kmajor=False,
            out=torch.float32, guard=1)        # float32 output: no o_proj, or with a bias
    for mode in (0, 4):     # the guarded fallback: one pass, or both passes in one launch
        for d in (64, 256):
            for cfg in _FALLBACK_CONFIGS:
                add(f"fp32 fallback d{d}", torch.float32, d, mode, cfg, kmajor=False, guard=2)
    # GP (query heads of one KV head packed into the row tile): W075's fp16 copies (4 heads per
    # KV head) and W092's bf16 one-pass kernel (12, packed by 4)
    for mode in (0, 1, 2):
        for cfg in _attention_configs(torch.float32, 64, mode, f16=True):
            for c in with_pipeline([cfg + ("gp4",)]) if mode == 2 else [cfg + ("gp4",)]:
                for even in (False, True):
                    add("fp16->fp16/fp32 d64", torch.float16, 64, mode, c, kmajor=False,
                        out=torch.float16, probs=torch.float32, guard=1, even=even)
    for cfg in _attention_configs(torch.bfloat16, 128, 0):
        add("bf16 d128", torch.bfloat16, 128, 0, cfg + ("gp4",), kmajor=False, causal=True,
            even=True)
    # ALIGN4 (ragged S, aligned stores of the probabilities), and the guarded fallback's
    # persistent form (PERSIST)
    from inductor_gqa.lower.attention import _ALIGNED_F16_PROBS
    for cfg in _ALIGNED_F16_PROBS:
        add("fp16->fp16/fp32 d64", torch.float16, 64, 2, cfg + ("a4",), kmajor=False,
            out=torch.float16, probs=torch.float32, guard=1)
    from inductor_gqa.lower.attention import _single_pass_candidates
    # ROW4 (S % 4 == 0, not % 16: the probabilities' row stride stated a multiple of 4)
    for mode in (2, 3):
        cfg = (_attention_configs(torch.float32, 64, 2, f16=True) if mode == 2
               else _single_pass_candidates(256, f16=True, groups=4))[0]
        add("fp16->fp16/fp32 d64", torch.float16, 64, mode, cfg, kmajor=False,
            out=torch.float16, probs=torch.float32, guard=1, row4=True)
    # MODE 6 (the stats pass rolled into the probabilities pass), the fp16 copies
    from inductor_gqa.lower.attention import _rolling_candidates
    for cfg in _rolling_candidates((), 4096, False, 0, 4):
        for even in (False, True):
            add("fp16->fp16/fp32 d64", torch.float16, 64, 6, cfg, kmajor=False,
                out=torch.float16, probs=torch.float32, guard=1, even=even)
    for s_len in (131, 256):
        for cfg in _single_pass_candidates(s_len):
            add("fp32 d64", torch.float32, 64, 3, cfg, kmajor=True)
        for cfg in _single_pass_candidates(s_len, f16=True, groups=4):
            add("fp16->fp16/fp32 d64", torch.float16, 64, 3, cfg, kmajor=False,
                out=torch.float16, probs=torch.float32, guard=1, even=s_len == 256)
        add("bf16 d128", torch.bfloat16, 128, 3, (64, 256, 8, 1), kmajor=False, causal=True,
            mask=1)
    for mode in (0, 2):                                   # the remaining switches, one config
        for mask in (1, 2, 3):
            for causal in (False, True):
                for cfg in with_pipeline(_attention_configs(torch.float32, 64, mode)[:1]):
                    add("fp32 d64", torch.float32, 64, mode, cfg, kmajor=True, causal=causal,
                        mask=mask)
        add("fp16 d128", torch.float16, 128, mode, (64, 64, 4, 3), kmajor=False, mask=3)
        add("fp32 d24", torch.float32, 24, mode, (64, 64, 4, 2), kmajor=True)
        add("bf16 d256", torch.bfloat16, 256, mode, (64, 32, 4, 2), kmajor=False)
    return jobs


def linear_jobs():
    from inductor_gqa.lower.linear import _CONFIGS

    jobs = []
    for cfg in _CONFIGS:
        bm, bn, bk, gm, nw, ns = cfg
        tiles = dict(PREC="tf32x3", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm)
        for bias in (False, True):
            ptr = dict(X="*fp32", W="*fp32", BIAS="*fp32", Y="*fp32", FLAG="*i32")
            jobs.append(_job(f"linear {cfg} bias={bias}", "inductor_gqa.kernels.linear",
                             "linear_kernel", ptr,
                             dict(HAS_BIAS=bias, sy_n=1, GUARD=0, **tiles), nw, ns))
            ptr = {n: "*fp32" for n in ("X", "WQ", "BQ", "YQ", "WK", "BK", "YK", "WV", "BV",
                                        "YV")}
            jobs.append(_job(f"qkv {cfg} bias={bias}", "inductor_gqa.kernels.linear",
                             "qkv_kernel", ptr,
                             dict(HAS_BIAS=bias, sq_n=1, sk_n=1, sv_m=1, **tiles), nw, ns))
    from inductor_gqa.lower.fp16_plans import _GUARDED_GEMM   # behind the fp16 o_proj
    bm, bn, bk, gm, nw, ns = _GUARDED_GEMM
    jobs.append(_job(f"linear {_GUARDED_GEMM} o_proj fallback guard=2",
                     "inductor_gqa.kernels.linear", "linear_kernel",
                     dict(X="*fp32", W="*fp32", BIAS="*fp32", Y="*fp32", FLAG="*i32"),
                     dict(HAS_BIAS=False, sy_n=1, GUARD=2, PREC="tf32x3", BLOCK_M=bm,
                          BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm), nw, ns))
    # the f16proj16 plan's guarded float32 products from the scaled fp16 copies
    jobs.append(_job(f"linear {_GUARDED_GEMM} fp16 operands guard=2",
                     "inductor_gqa.kernels.linear", "linear_kernel",
                     dict(X="*fp16", W="*fp16", BIAS="*fp16", Y="*fp32", FLAG="*i32"),
                     dict(HAS_BIAS=False, sy_n=1, GUARD=2, PREC="tf32", BLOCK_M=bm,
                          BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm), nw, ns))
    return jobs


def epilogue_jobs():
    from inductor_gqa.kernels.qk_epilogue import (NORM_CODES, ROPE_CODES, TOKEN_CONFIGS,
                                                  default_rows, default_warps)

    jobs = []

    def add(dt, d, heads, kv, norm, rope, r, f16=False, scaled=False, store32=True, guard=0,
            in16=False):
        block_d = 1 << (d - 1).bit_length()
        types = {n: "*" + dt for n in ("q_ptr", "k_ptr", "qw_ptr", "kw_ptr", "cos_ptr",
                                       "sin_ptr", "v_ptr")}
        if in16:    # scaled fp16 GEMM outputs (f16proj16)
            types.update(q_ptr="*fp16", k_ptr="*fp16", v_ptr="*fp16")
        # as the launcher passes them: without copies or a flag, their pointers are dummies of
        # the activation type (a branch that used them would then fail to compile)
        dummy = "*" + dt
        flagged = f16 or guard
        types.update(eps="fp32", eps_k="fp32", q16_ptr="*fp16" if f16 else dummy,
                     k16_ptr="*fp16" if f16 else dummy, v16_ptr="*fp16" if f16 else dummy,
                     flag_ptr="*i32" if flagged else dummy,
                     tok_inv_ptr="*fp32" if scaled else dummy,
                     qf_inv_ptr="*fp32" if scaled else dummy,
                     kf_inv_ptr="*fp32" if scaled else dummy,
                     vf_inv_ptr="*fp32" if scaled else dummy,
                     wo_ptr="*fp32" if f16 else dummy, wo16_ptr="*fp16" if f16 else dummy)
        consts = dict(D=d, BLOCK_D=block_d, ROWS=default_rows(block_d),
                      NORM=NORM_CODES[norm], ROPE=ROPE_CODES[rope], R=r, cs_d=1, F16=f16,
                      SCALED=scaled, STORE32=store32, STORE_V32=store32 and scaled, GUARD=guard,
                      LOOP=guard == 2, STRIDED=scaled, WO=f16 and dt == "fp32", IN16=in16)
        jobs.append(_job(f"qk_norm_rope {dt} d{d} {heads}/{kv} {norm} {rope} r{r} f16={f16}"
                         + (f" scaled strided store32={store32} guard={guard}" if scaled else "")
                         + (" in16" if in16 else ""),
                         "inductor_gqa.kernels.qk_epilogue", "qk_norm_rope_kernel", types,
                         consts, default_warps(block_d, in16)))

    def add_table(dt, r, interleaved):
        block_h = 1 << (r // 2 - 1).bit_length()
        types = dict(inv_ptr="*fp32", pos_ptr="*i64", cos_ptr="*" + dt, sin_ptr="*" + dt)
        consts = dict(R=r, BLOCK_H=block_h, BLOCK_T=max(1, 256 // block_h),
                      INTERLEAVED=interleaved, LIBDEVICE=True)
        jobs.append(_job(f"rope_table {dt} r{r} interleaved={interleaved}",
                         "inductor_gqa.kernels.rope_table", "rope_table_kernel", types, consts, 4))

    add("fp32", 64, 16, 4, "none", "half", 64)          # W075
    add("fp32", 64, 16, 4, "none", "half", 64, True)    # W075 "high": + fp16 copies
    add("fp32", 128, 8, 2, "fp32_weight", "interleaved", 64, True)
    # the opt-in fp16-projections plan: copies only, then the guarded float32 finish
    add("fp32", 64, 16, 4, "none", "half", 64, True, scaled=True, store32=False)
    add("fp32", 64, 16, 4, "none", "half", 64, False, scaled=True, store32=True, guard=2)
    add("fp32", 128, 8, 2, "fp32_weight", "interleaved", 64, True, scaled=True, store32=False)
    add("fp32", 128, 8, 2, "fp32_weight", "interleaved", 64, False, scaled=True, guard=2)
    # f16proj16: the same launch reading scaled fp16 products
    add("fp32", 64, 16, 4, "none", "half", 64, True, scaled=True, store32=False, in16=True)
    add("fp32", 128, 8, 2, "fp32_weight", "interleaved", 64, True, scaled=True, store32=False,
        in16=True)
    for k in (1024, 4096, 16384):
        block_k = 1 << (k - 1).bit_length()
        ptrs = {f"{n}{i}": t for i in range(4) for n, t in (("x", "*fp32"), ("y", "*fp16"),
                                                             ("i", "*fp32"))}
        tables = dict(inv_ptr="*fp32", pos_ptr="*i64", cos_ptr="*fp32", sin_ptr="*fp32")
        # W075 "high" (K=1024) builds its RoPE tables in this launch
        table = dict(TABLE=True, R=64, BLOCK_H=32, BLOCK_T=8, LIBDEVICE=True) if k == 1024 else {}
        jobs.append(_job(f"scale_rows K={k}" + (" + rope tables" if table else ""),
                         "inductor_gqa.kernels.fp16_rows", "scale_rows_kernel",
                         dict(ptrs, zero_ptr="*i32", **tables),
                         dict(ROWS=max(1, 4096 // block_k), BLOCK_K=block_k,
                              TARGET=13 if k != 4096 else 0,
                              ZERO=k == 1024, **table),
                         8 if block_k >= 4096 else 4))

    def add_tokens(d, heads, kv, norm, rope, tq, warps, in16, wo):
        # the token-major form of the copies launch (qk_norm_rope_(tokens=))
        hqp, hkp = (1 << (n - 1).bit_length() for n in (heads, kv))
        src = "*fp16" if in16 else "*fp32"
        types = dict(q_ptr=src, k_ptr=src, v_ptr=src, qw_ptr="*fp32", kw_ptr="*fp32",
                     cos_ptr="*fp32", sin_ptr="*fp32", eps="fp32", eps_k="fp32",
                     q16_ptr="*fp16", k16_ptr="*fp16", v16_ptr="*fp16", flag_ptr="*i32",
                     tok_inv_ptr="*fp32", qf_inv_ptr="*fp32", kf_inv_ptr="*fp32",
                     vf_inv_ptr="*fp32", wo_ptr="*fp32", wo16_ptr="*fp16")
        consts = dict(D=d, HQP=hqp, HKP=hkp, TQ=tq, TK=tq * max(1, hqp // hkp),
                      NORM=NORM_CODES[norm], ROPE=ROPE_CODES[rope], cs_d=1, WO=wo,
                      WO_ROWS=default_rows(d), IN16=in16)
        jobs.append(_job(f"qk_tokens d{d} {heads}/{kv} {norm} {rope} T{tq} w{warps}"
                         + (" in16" if in16 else "") + (" wo" if wo else ""),
                         "inductor_gqa.kernels.qk_epilogue", "qk_tokens_kernel", types, consts,
                         warps))

    for tq, warps in TOKEN_CONFIGS:     # W075 "high" (f16proj16, f16proj)
        add_tokens(64, 16, 4, "none", "half", tq, warps, True, False)
    add_tokens(64, 16, 4, "none", "half", 4, 4, False, True)
    add_tokens(128, 8, 2, "fp32_weight", "half", 2, 4, True, False)
    for d in (64, 24):      # Wo's fp16 copy on its own (the fp16 plans, under graph capture)
        block_d = 1 << (d - 1).bit_length()
        jobs.append(_job(f"wo16 d{d}", "inductor_gqa.kernels.qk_epilogue", "wo16_kernel",
                         dict(w_ptr="*fp32", w16_ptr="*fp16", flag_ptr="*i32"),
                         dict(D=d, BLOCK_D=block_d, ROWS=default_rows(block_d)),
                         default_warps(block_d, False)))
    add("bf16", 128, 96, 8, "fp32_weight", "half", 128)  # W092
    add("bf16", 128, 96, 8, "cast_weight", "interleaved", 64)
    add("fp16", 24, 6, 3, "fp32_one_plus_weight", "half", 16)
    add_table("fp32", 64, False)                          # W075
    add_table("bf16", 24, True)
    return jobs


def _fp16_descs(d, **rows):
    """Signature types of fp16 copy-engine descriptors [rows, d] (Gluon kernels' arguments), as
    the launcher builds them: name -> block rows."""
    from triton.experimental.gluon import language as gl

    types = {}
    for name, n in rows.items():
        layout = gl.NVMMASharedLayout.get_default_for([n, d], gl.float16)
        types[name] = f"tensordesc<fp16[{n}, {d}],{layout!r}>"
    return types


def staged_jobs():
    """kernels/probs_staged.py's Gluon kernels (one row tile per program, and the ping-pong
    kernel) for every candidate config, at an aligned and a ragged S, causal and not."""
    import torch

    from inductor_gqa.kernels import host, probs_staged

    if not probs_staged.HAVE_GLUON:
        return []
    jobs = []
    d = 64
    for cfg in probs_staged.CONFIGS + probs_staged.PACKED_CONFIGS:
        bm, bn, nw, stages = cfg[:4]
        pp = "pp" in cfg
        gp = probs_staged.heads_per_program(cfg)
        for seq, causal in ((512, False), (449, False), (373, True), (452, False)):
            if probs_staged.smem_bytes(seq, d, cfg) > SMEM_PER_BLOCK:
                continue
            types = dict(_fp16_descs(d, q_desc=bm // gp, k_desc=bn, v_desc=bn), O="*fp16",
                         P="*fp32", FLAG="*i32", qscale="fp32")
            # ROW4 where the launch sets it (contiguous probabilities: row stride S)
            row4 = host.row4(torch.empty((1, 1, seq, seq), device="meta"), seq)
            consts = dict(D=d, BLOCK_M=bm, BLOCK_N=bn, N_TILES=-(-seq // bn), STAGES=stages,
                          CAUSAL=causal, GUARD=1, num_warps=nw, **({"GP": gp} if gp > 1 else {}),
                          **({"ROW4": True} if row4 else {}))
            if pp:
                consts["REGS"] = probs_staged.PINGPONG_REGS
            kernel = "probs_pingpong_kernel" if pp else "probs_staged_kernel"
            jobs.append(_job(f"staged S{seq}{' causal' if causal else ''}"
                             f"{' row4' if row4 else ''} {cfg}",
                             "inductor_gqa.kernels.probs_staged", kernel, types, consts, nw))
    return jobs


def overlap_jobs():
    """kernels/stats_overlap.py's Gluon stats pass for every candidate config, causal and not."""
    from inductor_gqa.kernels import stats_overlap

    if not stats_overlap.HAVE_GLUON:
        return []
    jobs = []
    d = 64
    for cfg in stats_overlap.CONFIGS:
        bm, bn, nw, stages = cfg
        types = dict(_fp16_descs(d, q_desc=bm, k_desc=bn), ML="*fp32", FLAG="*i32",
                     qscale="fp32")
        for causal in (False, True):
            consts = dict(D=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, CAUSAL=causal, GUARD=1,
                          num_warps=nw)
            jobs.append(_job(f"stats_overlap{' causal' if causal else ''} {cfg}",
                             "inductor_gqa.kernels.stats_overlap", "stats_overlap_kernel", types,
                             consts, nw))
    return jobs


def proj_rope_jobs():
    """kernels/proj_rope.py (the Q/K/V GEMM with the norm/RoPE epilogue) for every candidate
    config at W075's head (64, rotate-half RoPE): cos/sin from the angles (the default where the
    op gets inv_freq and positions), with a norm, and loaded from tables."""
    from inductor_gqa.kernels import proj_rope

    if proj_rope.TensorDescriptor is None:
        return []
    jobs = []
    for cfg in proj_rope.CONFIGS:
        bm, bn, bk, nw, ns, persistent = cfg
        for norm, angles in ((0, True), (1, True), (0, False)):
            types = dict(a_desc=f"tensordesc<fp16[{bm}, {bk}]>",
                         b_desc=f"tensordesc<fp16[{bn}, {bk}]>",
                         out_desc=f"tensordesc<fp16[{bm}, {bn}]>", tok_inv_ptr="*fp32",
                         feat_inv_ptr="*fp32", qw_ptr="*fp32", kw_ptr="*fp32", eps="fp32",
                         eps_k="fp32", cos_ptr="*fp32", sin_ptr="*fp32", flag_ptr="*i32",
                         pos_ptr="*i64", inv_ptr="*fp32")
            consts = dict(D=64, BM=bm, BN=bn, BK=bk, NORM=norm, ROPE=1, PERSISTENT=persistent,
                          NUM_SMS=132, cs_d=1, ANGLES=angles)
            tag = " angles" if angles else " tables"
            jobs.append(_job(f"proj_rope {cfg} norm{norm}{tag}", "inductor_gqa.kernels.proj_rope",
                             "proj_rope_kernel", types, consts, nw, ns))
    return jobs


def pdl_jobs(jobs):
    """The first job of each kernel again with programmatic dependent launch (kernels/pdl.py:
    the PDL constexpr and the launch_pdl option together)."""
    seen, out = set(), []
    for name, module, kernel, types, consts, options in jobs:
        if (module, kernel) in seen:
            continue
        seen.add((module, kernel))
        out.append((f"{name} pdl", module, kernel, types, dict(consts, PDL=1),
                    dict(options, launch_pdl=True)))
    return out


def proj_rope_ws_jobs():
    """kernels/proj_rope_ws.py (the warp-specialized fused projection, Gluon) for every
    candidate config at W075's head, with RoPE from the angles and without RoPE."""
    from inductor_gqa.kernels import proj_rope_ws

    if not proj_rope_ws.HAVE_GLUON:
        return []
    jobs = []
    for cfg in proj_rope_ws.CONFIGS:
        _, bm, bn, bk, stages = cfg
        types = dict(_fp16_descs(bk, a_desc=bm, b_desc=bn), **_fp16_descs(bn, out_desc=bm),
                     tok_inv_ptr="*fp32", feat_inv_ptr="*fp32", flag_ptr="*i32",
                     pos_ptr="*i64", inv_ptr="*fp32")
        for rope in (1, 0):
            consts = dict(D=64, BM=bm, BN=bn, BK=bk, STAGES=stages, ROPE=rope,
                          REGS=proj_rope_ws.CONSUMER_REGS, LREGS=proj_rope_ws.LOADER_REGS,
                          num_warps=4)
            jobs.append(_job(f"proj_rope_ws {cfg} rope{rope}",
                             "inductor_gqa.kernels.proj_rope_ws", "proj_rope_ws_kernel", types,
                             consts, 4))
    return jobs


def all_jobs():
    jobs = (attention_jobs() + linear_jobs() + epilogue_jobs() + staged_jobs()
            + overlap_jobs() + proj_rope_jobs() + proj_rope_ws_jobs())
    return jobs + pdl_jobs(jobs)


def _compile(job, divisible=False):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name, module, kernel, types, consts, options = job
    fn = getattr(importlib.import_module(module), kernel)
    # constexprs the job leaves out take their defaults, as in a launch
    consts = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.name not in consts
                 and p.default is not inspect_module.Parameter.empty}, **consts}
    signature = {p.name: "constexpr" if (p.is_constexpr or p.name in consts)
                 else types.get(p.name, "i32") for p in fn.params}
    attrs = {}
    if divisible:   # pointers and integers divisible by 16, as the launcher marks them
        attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params)
                 if signature[p.name] not in ("constexpr", "fp32")
                 and not signature[p.name].startswith("tensordesc")}
    source = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(fn, signature, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def compile_one(job):
    try:
        k = _compile(job)
    except Exception as e:  # noqa: BLE001
        return job[0], f"{type(e).__name__}: {str(e)[-400:]}", None
    return job[0], None, k.metadata.shared


def _sass(k, flag="-sass") -> str:
    """The SASS listing of a compiled kernel (``_compile``'s result); ``flag="-res-usage"``
    gives its resource line (registers per thread, shared and local memory) instead."""
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def _instructions(sass: str) -> list:
    """The instruction stream without addresses and encodings."""
    import re
    return [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", line).split(";")[0]
            for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", line)]


def _without_param_offsets(instructions: list) -> list:
    """The stream with kernel-parameter offsets blanked: a parameter added to a kernel moves the
    others in the constant bank (c[0x0][...]) and changes nothing else."""
    import re
    return [re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][param]", x) for x in instructions]


def _job_at(job, rev: str, tmpdir: str):
    """The same job compiled from the kernel's source at git revision ``rev``, or (None, why).
    The kernel's whole package folder at ``rev`` is written under ``tmpdir`` as a package of its
    own, so modules that import their siblings load as they were."""
    import importlib
    import subprocess

    name, module, kernel, types, consts, options = job
    package, _, leaf = module.rpartition(".")
    folder = package.replace(".", "/")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    alias = f"{package.replace('.', '_')}_at_{rev.replace('/', '_')}"
    where = os.path.join(tmpdir, alias)
    if not os.path.isdir(where):
        names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{folder}"], cwd=root,
                               capture_output=True, text=True)
        if names.returncode != 0:
            return None, f"{folder} not at {rev}"
        os.makedirs(where)
        for n in names.stdout.split():
            if n.endswith(".py"):
                got = subprocess.run(["git", "show", f"{rev}:{folder}/{n}"], cwd=root,
                                     capture_output=True, text=True)
                with open(os.path.join(where, n), "w") as f:
                    f.write(got.stdout)
        if tmpdir not in sys.path:
            sys.path.insert(0, tmpdir)
    if not os.path.exists(os.path.join(where, leaf + ".py")):
        return None, f"{module} not at {rev}"
    mod = importlib.import_module(f"{alias}.{leaf}")
    alias = mod.__name__
    fn = getattr(mod, kernel, None)
    if fn is None:
        return None, f"{kernel} not at {rev}"
    params = {p.name for p in fn.params}
    old = {}
    for key, value in consts.items():
        if key in params:
            old[key] = value
        elif value:     # a switch the old kernel does not have, turned on: nothing to compare
            return None, f"{key}={value} is new"
    return (name, alias, kernel, types, old, options), None


def same_as(rev: str, pattern: str = "", param_offsets: bool = True) -> int:
    """Compare each job's sm_90 instruction stream with the same job compiled from the kernel
    source at git revision ``rev``: a refactor that changes no instruction needs no new GPU
    run."""
    import tempfile

    same = differ = skipped = 0
    with tempfile.TemporaryDirectory() as tmpdir:
        for job in all_jobs():
            if pattern not in job[0]:
                continue
            old, why = _job_at(job, rev, tmpdir)
            if old is None:
                skipped += 1
                print(f"skipped  {job[0]}: {why}")
                continue
            a = _instructions(_sass(_compile(old, divisible=True)))
            b = _instructions(_sass(_compile(job, divisible=True)))
            if not param_offsets:
                a, b = _without_param_offsets(a), _without_param_offsets(b)
            if a == b:
                same += 1
            else:
                differ += 1
                print(f"DIFFERS  {job[0]}")
    print(f"same as {rev}: {same} identical, {differ} differ, {skipped} skipped")
    return 1 if differ else 0


def inspect(job) -> str:
    import collections
    import re

    k = _compile(job, divisible=True)
    sass = _sass(k)
    ops = collections.Counter(re.findall(r"\b((?:HGMMA|HMMA|STG|STS|LDS|LDGSTS|LDG|STL|LDL|"
                                         r"WARPGROUP|MUFU)[.\w]*)", sass))
    regs = re.search(r"REG:(\d+)", _sass(k, "-res-usage"))
    lines = [f"{job[0]}: shared {k.metadata.shared} B, "
             f"{regs.group(1) if regs else '?'} registers per thread"]
    lines += [f"  {n:5d} {op}" for op, n in sorted(ops.items())]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--inspect", default="", help="print SASS statistics of matching jobs")
    p.add_argument("--same-as", default="", metavar="REV",
                   help="compare each job's SASS with the kernel source at a git revision "
                        "(with --inspect TEXT: only jobs whose name contains it)")
    p.add_argument("--ignore-param-offsets", action="store_true",
                   help="with --same-as: streams that differ only in where kernel parameters "
                        "sit in the constant bank count as the same (a parameter was added)")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("unset TRITON_INTERPRET: the interpreter does not compile")
        return 2
    t0 = time.time()
    if a.same_as:
        return same_as(a.same_as, a.inspect, not a.ignore_param_offsets)
    jobs = all_jobs()
    if a.inspect:
        for job in jobs:
            if a.inspect in job[0]:
                print(inspect(job))
        return 0
    failed, too_big = [], []
    with concurrent.futures.ProcessPoolExecutor(a.jobs) as pool:
        for name, err, shared in pool.map(compile_one, jobs):
            if err:
                failed.append(f"FAILED {name}: {err}")
            elif shared > SMEM_PER_BLOCK:
                too_big.append(f"over shared memory ({shared} B) {name}")
    for line in too_big + failed:
        print(line)
    print(f"{len(jobs)} kernels compiled for sm_90 in {time.time() - t0:.0f}s: "
          f"{len(failed)} failed, {len(too_big)} need more shared memory than a block has")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
