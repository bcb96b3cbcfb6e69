"""Compile, for Hopper (sm_90) and without a GPU, every kernel launch the plans make.

The interpreter runs a kernel's Python body, so it cannot see front-end or lowering failures that
only the compiler hits (a statement after a ``return`` in a constexpr branch is compiled too, a
tile shape that does not broadcast, a float argument Inductor's launcher passes as fp64). Here the
plans of a set of blocks (the reference workloads at full size, every candidate config of their
kernel families, and one block per remaining switch: masks, causal, head sizes, norm and RoPE
styles, SDPA's empty rows) are emitted with fake tensors while ``kernels.launch.recording`` keeps
their launches; each distinct launch is compiled to a cubin with the ptxas that ships with Triton,
with the argument types Inductor's launcher gives (ints i32/i64, floats fp64, ints equal to 1
constant), and failures and kernels that need more shared memory than an H200 block has are
reported.

    python tests/kernels/sm90_compile.py [--jobs 2] [--list] [--candidates]
                                                   (with TRITON_INTERPRET unset)
    python tests/kernels/sm90_compile.py --inspect TEXT            SASS statistics of some jobs
    python tests/kernels/sm90_compile.py --only bwd --shared       the backward's shared memory

The backward kernels (flash_bwd, norm_rope_bwd) are recorded from their launchers directly
(``_backward_cases``), with their default configs, or every candidate with --candidates; the
training core's forward and backward from its plan (``_core_launches``); the decode attention
(kernels/decode.py) from its launcher (``_decode_launches``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import math
import os
import re
import sys
import time

SMEM_PER_BLOCK = 232448   # bytes of shared memory one block may use on an H100/H200
_TY = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int32": "i32",
       "int64": "i64", "uint8": "u8", "bool": "i1"}


def _blocks():
    """(name, BlockSpec, dtype, precision, (B, S, E), extras) of the blocks whose plans are
    compiled; extras: which optional tensors the block has."""
    from inductor_gqa.plan.spec import BlockSpec

    w075 = dict(num_heads=16, num_kv_heads=4, head_dim=64, rope="half", rotary_dim=64,
                core="explicit", scale=1.0, return_probs=True)
    w092 = dict(num_heads=96, num_kv_heads=8, head_dim=128, norm="fp32_weight", eps=1e-5,
                rope="half", rotary_dim=128, core="explicit", scale=128 ** -0.5, causal=True)
    f32, bf16 = "float32", "bfloat16"
    pos = dict(positions=True)
    tables = dict(tables=True)
    out = []
    for prec in ("high", "highest"):
        for s, b in ((131, 1), (512, 16), (4096, 1), (449, 16)):
            for causal in (False, True):
                out.append((f"W075 {prec} {s}x{b} causal={causal}",
                            BlockSpec(**w075, causal=causal), f32, prec, (b, s, 1024), pos))
    for s, b in ((128, 1), (1024, 4), (293, 4)):
        out.append((f"W092 {s}x{b}", BlockSpec(**w092), bf16, "high", (b, s, 4096),
                    dict(tables=True, bias=True)))
    # sliding windows (Mistral), logit softcapping (Gemma 2), with a padding mask and without
    for extra, mask in ((dict(window=256), "none"), (dict(window=128), "bool_keep"),
                        (dict(softcap=50.0, core="explicit"), "none"),
                        (dict(softcap=50.0, core="explicit", window=64, return_probs=True),
                         "additive")):
        fields = {**dict(num_heads=8, num_kv_heads=2, head_dim=128, core="sdpa",
                         scale=128 ** -0.5, causal=True, rope="half", rotary_dim=128), **extra}
        for dt in (bf16, f32):
            out.append((f"window/softcap {extra} {mask} {dt}",
                        BlockSpec(**fields, mask=mask), dt, "high", (2, 700, 1024),
                        dict(tables=True, mask=mask)))
    # runtime floats (dynamic=True): eps and a divisor scale read from device scalars
    for dt, prec in ((f32, "high"), (bf16, "high")):
        out.append((f"runtime floats {dt}", BlockSpec(**{**w092, "scale": 0.0,
                                                         "scale_op": "div"}), dt, prec,
                    (2, 128, 1024), dict(runtime=True)))
    small = dict(num_heads=8, num_kv_heads=2, core="sdpa", scale=0.125)
    for mask in ("bool_keep", "additive"):
        for dt in (f32, bf16):
            out.append((f"mask {mask} {dt}", BlockSpec(head_dim=64, mask=mask, **small), dt,
                        "high", (2, 200, 512), dict(mask=mask)))
    for fill in (-1e9, float("-inf")):
        out.append((f"mask bool_fill {fill} explicit", BlockSpec(
            num_heads=8, num_kv_heads=2, head_dim=64, core="explicit", mask="bool_fill",
            mask_fill=fill, return_probs=True), f32, "high", (2, 200, 512),
            dict(mask="bool_fill")))
    for norm in ("cast_weight", "fp32_one_plus_weight"):
        out.append((f"norm {norm}", BlockSpec(head_dim=128, norm=norm, eps=1e-6, rope="half",
                                              rotary_dim=128, causal=True, **small), bf16,
                    "high", (1, 300, 1024), tables))
    for rope, r in (("interleaved", 64), ("half", 32)):
        for dt in (f32, bf16):
            out.append((f"rope {rope} r{r} {dt}", BlockSpec(
                head_dim=64, rope=rope, rotary_dim=r, causal=True, **small), dt, "high",
                (2, 256, 512), pos))
    for d in (16, 32, 256):
        for dt in (f32, bf16):
            out.append((f"head_dim {d} {dt}", BlockSpec(
                num_heads=4, num_kv_heads=4, head_dim=d, core="explicit", scale=d ** -0.5,
                causal=True, return_probs=True), dt, "high", (2, 300, 512), {}))
    return out


def _problem(spec, dtype, precision, shape, extras):
    import torch

    from inductor_gqa.plan.plans import Problem

    b, s, e = shape
    return Problem(dtype=getattr(torch, dtype), device=torch.device("cuda"), gpu="NVIDIA H200",
                   capability=(9, 0), num_sms=132, precision=precision, batch=b, seq=s, embed=e,
                   qkv_bias=bool(extras.get("bias")), o_proj=True, o_bias=False,
                   rope_source=("none" if spec.rope == "none" else
                                "tables" if extras.get("tables") else "positions"),
                   runtime_floats=bool(extras.get("runtime")),
                   tables_dtype=getattr(torch, dtype) if extras.get("tables") else None,
                   mask_rank_ok=True)


def _tensors(spec, dtype, shape, extras):
    """Fake tensors of the op's arguments (CPU fakes: only their metadata is read)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from inductor_gqa.op.attention_block import TENSOR_ARGS

    b, s, e = shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    dt = getattr(torch, dtype)
    mode = FakeTensorMode()
    with mode:
        t = dict.fromkeys(TENSOR_ARGS)
        t.update(x=torch.empty(b, s, e, dtype=dt), wq=torch.empty(h * d, e, dtype=dt),
                 wk=torch.empty(hk * d, e, dtype=dt), wv=torch.empty(hk * d, e, dtype=dt),
                 wo=torch.empty(e, h * d, dtype=dt))
        if extras.get("bias"):
            t.update(bq=torch.empty(h * d, dtype=dt), bk=torch.empty(hk * d, dtype=dt),
                     bv=torch.empty(hk * d, dtype=dt))
        if spec.norm != "none":
            t.update(q_norm_weight=torch.empty(d, dtype=dt), k_norm_weight=torch.empty(d, dtype=dt))
        if spec.rope != "none":
            if extras.get("tables"):
                t.update(cos=torch.empty(b, s, spec.rotary_dim, dtype=dt),
                         sin=torch.empty(b, s, spec.rotary_dim, dtype=dt))
            else:
                t.update(inv_freq=torch.empty(spec.rotary_dim // 2),
                         position_ids=torch.empty(b, s, dtype=torch.int64))
        if extras.get("runtime"):
            t.update(runtime_scale=torch.empty((), dtype=torch.float64),
                     runtime_eps=torch.empty((), dtype=torch.float64))
        if spec.mask != "none":
            t["attn_mask"] = (torch.empty(b, 1, s, s, dtype=torch.bool)
                              if spec.mask.startswith("bool") else torch.empty(b, 1, s, s, dtype=dt))
    return mode, t


def _variants(plan, spec):
    """The plan, and the plan with each candidate config of its kernel families in turn."""
    from inductor_gqa.plan import configs as cfgs
    from inductor_gqa.plan.plans import Fp16CopiesPlan, NativePlan

    yield plan
    ap = plan.attention
    if ap.kind in ("pair", "online"):
        pools = {("pair", "main"): cfgs.F16_PROBS if isinstance(plan, Fp16CopiesPlan)
                 else cfgs.F32_PROBS,
                 ("pair", "stats"): cfgs.F16_STATS if isinstance(plan, Fp16CopiesPlan)
                 else cfgs.F32_STATS,
                 ("online", "main"): cfgs.F32_ONLINE + cfgs.B16_ONLINE + cfgs.B16_ONLINE_64}
        for (kind, field), pool in pools.items():
            if kind != ap.kind:
                continue
            for c in pool:
                if spec.groups % c.gp:
                    continue
                yield dataclasses.replace(plan, attention=dataclasses.replace(ap, **{field: c}))
    if isinstance(plan, Fp16CopiesPlan):
        for c in cfgs.PROJECTION:
            yield dataclasses.replace(plan, projection=c)
        # Inductor's C++ wrapper's form: pointer loads instead of tensor descriptors
        yield dataclasses.replace(plan, projection=dataclasses.replace(plan.projection, tma=False))
    if isinstance(plan, NativePlan) and plan.prec == "tf32x3":
        for c in cfgs.GEMM_TF32X3:
            yield dataclasses.replace(plan, qkv_gemm=c, o_gemm=c)


def _arg_type(value, name, tma):
    import torch

    if isinstance(value, torch.Tensor):
        ty = _TY[str(value.dtype).split(".")[-1]]
        if name in tma:
            return f"tensordesc<{ty}[{', '.join(map(str, tma[name]))}]>"
        return "*" + ty
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
    if isinstance(value, float):
        return "fp64"       # Inductor's launcher passes Python floats as fp64
    raise TypeError(f"{name}: {type(value)}")


def _add_launches(seen, name, launches):
    """Each recorded launch as a compile job, keyed so that identical launches compile once."""
    for la in launches:
        fn = la.kernel
        consts = {p.name: la.args[p.name] for p in fn.params if p.is_constexpr
                  and p.name in la.args}
        sig = {}
        for p in fn.params:
            v = la.args.get(p.name)
            if p.is_constexpr or v is None or (isinstance(v, int) and not isinstance(
                    v, bool) and v == 1):
                sig[p.name] = "constexpr"
                if not p.is_constexpr:
                    consts[p.name] = v
            else:
                sig[p.name] = _arg_type(v, p.name, la.tma)
        key = (fn.__name__, tuple(sorted(sig.items())), tuple(sorted(
            (k, repr(v)) for k, v in consts.items())), la.num_warps, la.num_stages)
        if key not in seen:
            short = ", ".join(f"{k}={v}" for k, v in consts.items()
                              if k.isupper() and k not in ("D", "BLOCK_D"))
            seen[key] = (f"{fn.__name__} [{name}] {short} w{la.num_warps} "
                         f"s{la.num_stages}", fn.__module__, fn.__name__, sig, consts,
                         dict(num_warps=la.num_warps, num_stages=la.num_stages),
                         _writes_job(la))


def _backward_cases():
    """(name, dtype, H, Hkv, D, S, B, prec, flash_bwd keywords, norm_rope_bwd keywords or None)
    of the backward launches compiled: the reference workloads' blocks in training (W075 with
    its returned probabilities' gradient, W092 with its norm and RoPE into one fused dqkv
    buffer), and one block per remaining switch."""
    f32, bf16 = "float32", "bfloat16"
    nr_w092 = dict(norm="fp32_weight", rope="half", rotary_dim=128)
    out = []
    for prec in ("tf32", "tf32x3"):
        for causal in (False, True):
            out.append((f"W075 {prec} 449x16 causal={causal}", f32, 16, 4, 64, 449, 16, prec,
                        dict(causal=causal, scale=1.0, dprobs=True, v_kmajor=True),
                        dict(norm="none", rope="half", rotary_dim=64)))
    for s, b in ((1024, 4), (293, 4)):
        out.append((f"W092 {s}x{b}", bf16, 96, 8, 128, s, b, "tf32",
                    dict(causal=True, scale=128 ** -0.5, fused=True), nr_w092))
    for kind, dt in (("bool_keep", f32), ("bool_keep", bf16), ("additive", bf16),
                     ("additive", f32)):
        out.append((f"mask {kind} {dt} sdpa", dt, 8, 2, 64, 200, 2, "tf32",
                    dict(causal=True, scale=0.125, mask=kind, empty_zero=True), None))
    out.append(("mask additive explicit (NaN rows)", f32, 8, 2, 64, 200, 2, "tf32",
                dict(causal=True, scale=0.125, mask="additive"), None))
    for fill in (-1e9, float("-inf")):
        out.append((f"mask bool_fill {fill}", f32, 8, 2, 64, 200, 2, "tf32",
                    dict(causal=True, scale=0.125, mask="bool_fill", mask_fill=fill), None))
    out.append(("window softcap bf16", bf16, 8, 2, 64, 256, 2, "tf32",
                dict(causal=True, scale=0.125, window=64, softcap=30.0),
                dict(norm="cast_weight", rope="interleaved", rotary_dim=64)))
    out.append(("window ieee f32 MHA", f32, 4, 4, 64, 256, 2, "ieee",
                dict(causal=True, scale=0.125, window=100),
                dict(norm="fp32_one_plus_weight", rope="half", rotary_dim=32)))
    for d in (16, 32, 256):
        for dt in (f32, bf16):
            out.append((f"head_dim {d} {dt}", dt, 4, 1, d, 300, 2, "tf32",
                        dict(causal=True, scale=d ** -0.5),
                        dict(norm="fp32_weight", rope="interleaved", rotary_dim=d)))
    return out


def _backward_launches(candidates: bool = False):
    """Recorded launches of flash_bwd.launch and norm_rope_bwd.launch for ``_backward_cases``
    (fake tensors), with the default config of each case, or (``candidates``) every candidate
    config of its dtype that passes the shared-memory estimate."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from inductor_gqa.kernels import flash, flash_bwd, norm_rope_bwd
    from inductor_gqa.kernels.launch import recording

    for name, dtype, h, hk, d, s, b, prec, fa, nr in _backward_cases():
        dt = getattr(torch, dtype)
        m = b * s
        default = flash_bwd.choose_config(d, dt, prec)
        pool = ((flash_bwd.F32_CONFIGS if prec == "tf32" else flash_bwd.F32X3_CONFIGS)
                if dt == torch.float32 else flash_bwd.B16_CONFIGS)
        cfgs = [default] + ([c for c in pool if c != default and flash_bwd.smem_estimate(
            c, d, dt.itemsize) <= flash_bwd._SMEM_BUDGET] if candidates else [])
        mode = FakeTensorMode()
        with mode:
            qkv = torch.empty(m, (h + 2 * hk) * d, dtype=dt)
            q, k = qkv[:, :h * d], qkv[:, h * d:(h + hk) * d]
            if fa.get("v_kmajor"):
                vt = torch.empty(hk * d, m, dtype=dt)
                v = (vt, (s, d * m, 1, m))
            else:
                vv = qkv[:, (h + hk) * d:]
                v = (vv, (s * vv.stride(0), d, vv.stride(0), 1))
            o = torch.empty(b, s, h * d, dtype=dt)
            do = torch.empty(m, h * d, dtype=dt)
            ml = torch.empty(b * h * s * 2)
            rows = lambda t: (t, (s * t.stride(0), d, t.stride(0)))  # noqa: E731
            kind = fa.get("mask", "none")
            mask = None
            if kind != "none":
                mk = (torch.empty(b, 1, s, s, dtype=torch.uint8) if kind.startswith("bool")
                      else torch.empty(b, 1, s, s, dtype=dt))
                mask = torch.broadcast_to(mk, (b, h, s, s))
            probs = torch.empty(b, h, s, s, dtype=dt) if fa.get("dprobs") else None
            dprobs = torch.empty(b, h, s, s, dtype=dt) if fa.get("dprobs") else None
            dqkv = torch.empty(m, (h + 2 * hk) * d, dtype=dt) if fa.get("fused") else None
        for cfg in cfgs:
            with mode, recording() as launches:
                flash_bwd.launch(
                    rows(q), rows(k), v, (o, (s * h * d, d, h * d)), rows(do), batch=b, seq=s,
                    num_heads=h, groups=h // hk, head_dim=d, scale=fa["scale"],
                    causal=fa.get("causal", False), prec=prec, cfg=cfg, ml=ml, mask=mask,
                    mask_kind=flash.MASK_CODES[kind], mask_fill=fa.get("mask_fill", -math.inf),
                    window=fa.get("window", 0), softcap=fa.get("softcap", 0.0),
                    empty_zero=fa.get("empty_zero", False), probs=probs, dprobs=dprobs,
                    dqkv=dqkv)
            c = cfg
            yield (f"{name} kv{c.kv_m}x{c.kv_n} q{c.q_m}x{c.q_n} w{c.warps} s{c.stages}",
                   launches)
        if nr is None:
            continue
        with mode:
            r = nr["rotary_dim"]
            cos = torch.empty(1, s, r, dtype=dt).expand(b, s, r)
            w = torch.empty(d, dtype=dt)
            kw = dict(q=q, k=k, q_norm_weight=w, k_norm_weight=w, cos=cos, sin=cos, seq=s,
                      num_heads=h, num_kv_heads=hk, head_dim=d, eps=1e-6, **nr)
            with recording() as launches:
                if dqkv is not None:
                    norm_rope_bwd.launch(dqkv=dqkv, **kw)
                else:
                    norm_rope_bwd.launch(torch.empty(m, h * d, dtype=dt),
                                         torch.empty(m, hk * d, dtype=dt), **kw)
        yield name, launches


def jobs(candidates: bool = False):
    """Distinct recorded launches as compile jobs: (name, kernel module, kernel name,
    signature, constexprs, options). ``candidates``: also every candidate config of the
    plans' kernel families (what the tuner may pick), not only the configs planned now."""
    from inductor_gqa.kernels.launch import recording
    from inductor_gqa.lower.emit import emit
    from inductor_gqa.options import Options
    from inductor_gqa.plan.plans import Unsupported, choose, proj_rope

    seen = {}
    for name, spec, dtype, prec, shape, extras in _blocks():
        try:
            plan = choose(spec, _problem(spec, dtype, prec, shape, extras), Options())
        except Unsupported as u:
            raise AssertionError(f"{name}: no plan ({u.reason})") from u
        for variant in (_variants(plan, spec) if candidates else [plan]):
            if (getattr(variant, "projection", None) is not None
                    and not proj_rope.config_fits(variant.projection, (
                        spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                        spec.num_kv_heads * spec.head_dim), spec.head_dim)):
                continue
            mode, t = _tensors(spec, dtype, shape, extras)
            with mode, recording() as launches:
                emit(variant, spec, t)
            _add_launches(seen, name, launches)
    for name, launches in _backward_launches(candidates):
        _add_launches(seen, name, launches)
    for name, launches in _core_launches():
        _add_launches(seen, name, launches)
    for name, launches in _decode_launches(candidates):
        _add_launches(seen, name, launches)
    return list(seen.values())


def _decode_cases():
    """(name, dtype, B, Hq, Hkv, Sq, D, Smax, decode.launch keywords) of the decode attention
    launches compiled: Llama-3-8B's and W092's decode steps (one token, a few speculative ones,
    more packed rows than one program takes), each head size and dtype, windows with
    softcapping, every mask kind, a [B, Smax, Hkv, D] cache seen transposed."""
    f32, bf16, f16 = "float32", "bfloat16", "float16"
    out = [("Llama 1x8192", bf16, 1, 32, 8, 1, 128, 8192, {}),
           ("Llama 32x1024", bf16, 32, 32, 8, 1, 128, 1024, {}),
           ("W092 1x8192", bf16, 1, 96, 8, 1, 128, 8192, {}),
           ("W092 Sq=4", bf16, 2, 96, 8, 4, 128, 4096, {}),
           ("W092 Sq=16 (3 row blocks)", bf16, 1, 96, 8, 16, 128, 2048, {}),
           ("Gemma-2 window softcap", bf16, 2, 8, 4, 1, 256, 8192,
            dict(window=4096, softcap=50.0)),
           ("transposed cache seqlens", f16, 4, 16, 4, 2, 64, 1000, dict(transposed=True)),
           ("empty rows NaN additive per head", bf16, 2, 8, 2, 1, 128, 512,
            dict(mask="additive", per_head=True, empty_zero=False)),
           ("bool_keep", bf16, 2, 8, 2, 1, 128, 512, dict(mask="bool_keep")),
           ("bool_fill -1e9 f32", f32, 2, 8, 2, 1, 128, 512,
            dict(mask="bool_fill", mask_fill=-1e9)),
           ("bool_fill -inf", bf16, 2, 8, 2, 3, 64, 512,
            dict(mask="bool_fill", mask_fill=float("-inf")))]
    for d in (32, 64, 128, 256):
        for dt in (f32, bf16):
            out.append((f"head_dim {d} {dt}", dt, 2, 8, 2, 1, d, 700, dict(window=100)))
    out.append(("f32 tf32", f32, 1, 32, 8, 1, 128, 8192, dict(prec="tf32")))
    return out


def _decode_launches(candidates: bool = False):
    """Recorded launches of decode.launch (split and combine) for ``_decode_cases`` (fake
    tensors), with the default config of each case, or (``candidates``) every candidate
    config of its dtype that fits the shared-memory estimate."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from inductor_gqa.kernels import decode
    from inductor_gqa.kernels.launch import recording

    for name, dtype, b, hq, hkv, sq, d, smax, kw in _decode_cases():
        dt = getattr(torch, dtype)
        kw = dict(kw)
        kind, per_head = kw.pop("mask", "none"), kw.pop("per_head", False)
        transposed = kw.pop("transposed", False)
        default = decode.choose_config(d, dt)
        pool = decode.F32_CONFIGS if dt == torch.float32 else decode.B16_CONFIGS
        cfgs = [default] + ([c for c in pool if c != default and decode.smem_estimate(
            c, d, dt.itemsize) <= decode.SMEM_BUDGET] if candidates else [])
        mode = FakeTensorMode()
        with mode:
            q = torch.empty(b, sq, hq * d, dtype=dt).view(b, sq, hq, d)
            if transposed:
                k, v = (torch.empty(b, smax, hkv, d, dtype=dt).transpose(1, 2) for _ in "kv")
                where = dict(seqlens=torch.empty(b, dtype=torch.int32))
            else:
                k, v = (torch.empty(b, hkv, smax, d, dtype=dt) for _ in "kv")
                where = dict(positions=torch.empty(1, sq, dtype=torch.int64).expand(b, sq))
            if kind != "none":
                shape = (b, hq if per_head else 1, sq, smax)
                kw["mask"] = torch.empty(shape, dtype=torch.bool if kind.startswith("bool")
                                         else dt)
                kw["mask_kind"] = kind
        for c in cfgs:
            with mode, recording() as launches:
                decode.launch(q, k, v, scale=d ** -0.5, cfg=c, **where, **kw)
            yield (f"decode {name} n{c.block_n} m{c.max_m} w{c.warps} s{c.stages}", launches)


def _core_launches():
    """Recorded launches of the training core's plan (lower/emit.py's ``emit_core`` and
    ``emit_core_backward``, planned by ``plans.choose_core``) for the reference workloads'
    blocks in training: W092 (bf16, causal, our kernels where the library's SDPA is not taken)
    and W075 (float32 with its returned probabilities and their gradient)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from inductor_gqa.kernels.launch import recording
    from inductor_gqa.lower.emit import emit_core, emit_core_backward
    from inductor_gqa.op.attention_core import BWD_TENSORS, FWD_TENSORS
    from inductor_gqa.options import Options
    from inductor_gqa.plan.plans import choose_core, core_problem
    from inductor_gqa.plan.spec import BlockSpec

    cases = [("W092 train 1024x4", BlockSpec(num_heads=96, num_kv_heads=8, head_dim=128,
                                             core="explicit", scale=128 ** -0.5, causal=True),
              torch.bfloat16, "highest", 1024, 4),
             ("W092 train 293x4", BlockSpec(num_heads=96, num_kv_heads=8, head_dim=128,
                                            core="explicit", scale=128 ** -0.5, causal=True),
              torch.bfloat16, "highest", 293, 4)]
    for prec in ("high", "highest"):
        cases.append((f"W075 train {prec} 449x16",
                      BlockSpec(num_heads=16, num_kv_heads=4, head_dim=64, core="explicit",
                                scale=1.0, return_probs=True), torch.float32, prec, 449, 16))
    for name, spec, dt, precision, s, b in cases:
        h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            mode = FakeTensorMode()
            with mode:
                t = dict.fromkeys(BWD_TENSORS)
                t.update(q=torch.empty(b, s, h * d, dtype=dt),
                         k=torch.empty(b, s, hk * d, dtype=dt),
                         v=torch.empty(b, s, hk * d, dtype=dt),
                         o=torch.empty(b, s, h * d, dtype=dt),
                         grad_o=torch.empty(b, s, h * d, dtype=dt),
                         stats=torch.empty(b * h * s * 2, dtype=torch.float32))
                if spec.return_probs:
                    t["probs"] = torch.empty(b, h, s, s, dtype=dt)
                    t["grad_probs"] = torch.empty(b, h, s, s, dtype=dt)
                p = dataclasses.replace(core_problem(t["q"], None), device=torch.device("cuda"),
                                        gpu="NVIDIA H200", capability=(9, 0), num_sms=132)
                # our forward kernels too (by default W092's large grids take the library's)
                plan = choose_core(spec, p, Options(training_core="kernels"))
                with recording() as launches:
                    emit_core(plan, spec, {n: t[n] for n in FWD_TENSORS})
                    emit_core_backward(plan, spec, t)
        finally:
            torch.set_float32_matmul_precision(before)
        yield name, launches


def _writes_job(la):
    """What Inductor's write analysis needs of a launch, as picklable values: the kernel's
    module and name, its arguments (tensors as (dtype, shape)), the descriptor block shapes,
    the launch shape and the tensors the launch declares as written."""
    import torch

    args = {k: (("tensor", str(v.dtype).split(".")[-1], tuple(v.shape))
                if isinstance(v, torch.Tensor) else v) for k, v in la.args.items()}
    return (la.kernel.__module__, la.kernel.__name__, args,
            {k: list(v) for k, v in la.tma.items()}, la.num_warps, la.num_stages,
            tuple(la.outputs))


class _Sm90Driver:
    """Stands in for the active GPU driver where Inductor's analysis asks for the target."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)


def inductor_writes(wjob) -> set:
    """The tensors Inductor's analysis of the kernel's TTIR says the launch writes: what
    Inductor marks as mutated when it compiles the launch (a graph input among them is a
    mutated input, which makes CUDA-graph trees skip the graph). Where the analysis cannot
    tell, Inductor takes every tensor argument as written, and so does this."""
    import importlib

    import torch
    import triton
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    from inductor_gqa.kernels.launch import _configured

    module, kernel, args, tma, warps, stages, _ = wjob
    fn = _configured(getattr(importlib.import_module(module), kernel), warps, stages)
    kwargs = {k: (torch.empty(v[2], dtype=getattr(torch, v[1]), device="meta")
                  if isinstance(v, tuple) and v[:1] == ("tensor",) else v)
              for k, v in args.items()}
    meta = {n: ("stable", (shape,)) for n, shape in tma.items()}
    previous = triton.runtime.driver._active
    triton.runtime.driver.set_active(_Sm90Driver())
    try:
        if hasattr(tkw, "identify_accessed_tensors"):           # torch >= 2.12
            acc = tkw.identify_accessed_tensors(fn, kwargs, meta)
            written = {d.name for d in acc.read_writes.writes}
        else:
            written = set(tkw.identify_mutated_tensors(fn, kwargs, meta))
    finally:
        triton.runtime.driver._active = previous
    return {n for n in written if isinstance(kwargs.get(n), torch.Tensor)}


def _compile(job):
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name, module, kernel, sig, consts, options = job[:6]
    fn = getattr(importlib.import_module(module), kernel)
    return triton.compile(ASTSource(fn, sig, constexprs=consts),
                          target=GPUTarget("cuda", 90, 32), options=options)


def compile_one(job):
    try:
        k = _compile(job)
    except Exception as e:  # noqa: BLE001
        return job[0], f"{type(e).__name__}: {str(e)[-600:]}", None, None, ()
    return job[0], None, k.metadata.shared, _local_bytes(k), undeclared_writes(job[6])


def undeclared_writes(wjob) -> tuple:
    """Tensors Inductor would take as written that the launch does not declare (sorted)."""
    return tuple(sorted(inductor_writes(wjob) - set(wjob[6])))


def _local_bytes(k) -> int:
    """Bytes of local memory per thread (register spills) ptxas gave the kernel."""
    m = re.search(r"STACK:(\d+)", _cuobjdump(k, "-res-usage"))
    return int(m.group(1)) if m else -1


# the training backward's launches and the spill they may have: on an H100 the W092 dK/dV
# kernel at (64, 64) x 4 warps spilled 888 B per thread and was the fastest config measured
# (half the time of a spill-free (32, 64) x 8 warps); the 2.9 KB spill of an earlier config
# doubled the step (perf/results/nvidia-h100/history.md, 019927b and 1b7665a)
NO_SPILLS = ("bwd_dkdv_kernel [", "bwd_dq_kernel [")
MAX_SPILL = 1024


def _cuobjdump(k, flag: str) -> str:
    """cuobjdump's output (``flag``: -sass, -res-usage) for a compiled kernel's cubin."""
    import subprocess
    import tempfile

    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True).stdout


def _sass(k) -> str:
    return _cuobjdump(k, "-sass")


def inspect(job) -> str:
    """Counts of the SASS instructions that say how a kernel works."""
    k = _compile(job)
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", _sass(k), re.M)
    keys = ("HGMMA", "HMMA", "STG", "LDG", "STS", "LDS", "WARPGROUP", "LDL", "STL", "UTMALDG",
            "UTMASTG", "MUFU.EX2")
    counts = {kk: sum(1 for o in ops if o.startswith(kk)) for kk in keys}
    counts["total"] = len(ops)
    import hashlib
    stream = hashlib.sha1(" ".join(ops).encode()).hexdigest()[:12]    # compare across edits
    return f"{job[0][:60]}..: sass {stream}, shared {k.metadata.shared} B, " + ", ".join(
        f"{kk} {v}" for kk, v in counts.items() if v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--list", action="store_true", help="print the jobs and stop")
    p.add_argument("--only", default="", help="compile only the jobs whose name contains this")
    p.add_argument("--candidates", action="store_true",
                   help="every candidate config of each family, not only the planned ones")
    p.add_argument("--inspect", default="", help="print SASS statistics of matching jobs")
    p.add_argument("--shared", action="store_true",
                   help="print each compiled job's shared memory")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("unset TRITON_INTERPRET: the interpreter does not compile")
        return 2
    t0 = time.time()
    todo = [j for j in jobs(a.candidates) if a.only in j[0]]
    if a.list:
        for j in todo:
            print(j[0])
        print(f"{len(todo)} jobs")
        return 0
    if a.inspect:
        for job in todo:
            if a.inspect in job[0]:
                print(inspect(job))
        return 0
    failed, too_big, spills, writes = [], [], [], []
    with concurrent.futures.ProcessPoolExecutor(a.jobs) as pool:
        for name, err, shared, local, extra in pool.map(compile_one, todo):
            if extra:
                writes.append(f"Inductor takes {list(extra)} as written, undeclared: {name}")
            if a.shared and not err:
                print(f"{shared:7d} B  {name}")
            if err:
                failed.append(f"FAILED {name}: {err}")
            elif shared > SMEM_PER_BLOCK:
                too_big.append(f"over shared memory ({shared} B) {name}")
            elif local > MAX_SPILL and name.startswith(NO_SPILLS) and " train " in name:
                spills.append(f"spills {local} B per thread: {name}")
    for line in too_big + failed + spills + writes:
        print(line)
    print(f"{len(todo)} kernels compiled for sm_90 in {time.time() - t0:.0f}s: "
          f"{len(failed)} failed, {len(too_big)} need more shared memory than a block has, "
          f"{len(spills)} training backward kernels spill over {MAX_SPILL} B, "
          f"{len(writes)} write tensors they do not declare")
    return 1 if failed or too_big or spills or writes else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))
    sys.exit(main())
