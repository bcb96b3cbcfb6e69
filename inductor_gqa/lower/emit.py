"""A plan as code: the block written with ATen ops and kernel launches (``kernels.launch``).

``emit(plan, spec, tensors)`` is ordinary eager code: run on CPU tensors under the Triton
interpreter it computes the block (the tests do that), and traced with fake tensors while
Inductor compiles (``splice.py``) it becomes the graph that replaces the fused op: GEMMs that
Inductor lowers to the library, our Triton kernels as user-defined kernel calls, and the small
glue (views, empty buffers) that costs nothing at run time. Every buffer a kernel writes is made
here, whole; kernels read views.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels import flash, flash_bwd, fp16_rows, linear, proj_rope, qk_epilogue
from ..kernels.launch import interpreting
from ..kernels.rope_table import TableSpec
from ..op.attention_core import ml_of_lse
from ..plan import configs
from ..op.reference import cached_attention_mask
from ..plan.plans import (AttentionPlan, CachedSdpaPlan, CorePlan, Fp16CopiesPlan, NativePlan,
                          Plan)
from ..plan.spec import BlockSpec


def emit(plan: Plan, spec: BlockSpec, t: dict):
    """(out [B, S, width], probs [B, H, S, S] or an empty tensor) for the op's tensors ``t``."""
    if isinstance(plan, Fp16CopiesPlan):
        return _fp16_copies(plan, spec, t)
    if isinstance(plan, NativePlan):
        return _native(plan, spec, t)
    if isinstance(plan, CachedSdpaPlan):
        return _cached_sdpa(spec, t)
    raise TypeError(f"no emitter for {type(plan).__name__}")


# ------------------------------------------------------------------------------------ pieces
def _tables(spec: BlockSpec, t: dict, b, s):
    """(cos, sin) as [B, S, R] views, or (None, None) without RoPE; tables the block computes
    from inv_freq and position_ids are built by one launch."""
    if spec.rope == "none":
        return None, None
    r = spec.rotary_dim
    if t["cos"] is not None:
        return (torch.broadcast_to(_bsd(t["cos"]), (b, s, r)),
                torch.broadcast_to(_bsd(t["sin"]), (b, s, r)))
    return _table_spec(spec, t, b, s).launch()


def _table_spec(spec, t, b, s) -> TableSpec:
    return TableSpec(t["inv_freq"], torch.broadcast_to(t["position_ids"], (b, s)),
                     spec.rotary_dim, spec.rope == "interleaved", t["x"].dtype,
                     interpret=interpreting())


def _norm_rope(spec: BlockSpec, t: dict, q, k, b, s, runtime):
    """The block's norm and RoPE on the q and k rows [B*S, heads*D], in place (one launch);
    q and k as they are when the block has neither."""
    if spec.norm == "none" and spec.rope == "none":
        return q, k
    cos, sin = _tables(spec, t, b, s)
    return qk_epilogue.norm_rope(
        q, k, q_norm_weight=t["q_norm_weight"], k_norm_weight=t["k_norm_weight"], cos=cos,
        sin=sin, seq=s, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, norm=spec.norm, eps=spec.eps, eps_k=spec.eps, rope=spec.rope,
        rotary_dim=spec.rotary_dim, runtime=runtime)


def _bsd(c: torch.Tensor) -> torch.Tensor:
    return c if c.dim() == 3 else c.reshape(-1, c.shape[-2], c.shape[-1])


def _runtime(spec: BlockSpec, t: dict, device):
    """[scale, eps, eps_k] as a float32 tensor on the device when any of them is a runtime
    value (``dynamic=True`` keeps float arguments and attributes as 0-d CPU tensors); None
    otherwise. Each runtime value enters through a pointwise op, which Inductor feeds a CPU
    scalar as a launch argument: no copy from the host, no sync."""
    names = ("runtime_scale", "runtime_eps", "runtime_k_eps")
    if all(t[n] is None for n in names):
        return None
    k_eps = t["runtime_k_eps"] if t["runtime_k_eps"] is not None else t["runtime_eps"]
    parts = []
    for value, static in ((t["runtime_scale"], spec.scale), (t["runtime_eps"], spec.eps),
                          (k_eps, spec.eps)):
        z = torch.zeros((1,), device=device, dtype=torch.float32)
        parts.append(z + float(static) if value is None else z + value.to(torch.float32))
    return torch.cat(parts)


def _mask(spec: BlockSpec, t: dict, b, s):
    m = t["attn_mask"]
    if spec.mask == "none":
        return None
    if m.dtype == torch.bool:
        m = m.view(torch.uint8)
    return torch.broadcast_to(m, (b, spec.num_heads, s, s))


def _rows_view(x2d: torch.Tensor, s, d):
    """[B*S, heads*D]-shaped rows (any row stride, unit column stride) as flash.py's
    (tensor, (stride b, h, s))."""
    ld = x2d.stride(0)
    return x2d, (s * ld, d, ld)


def _attention(ap: AttentionPlan, spec: BlockSpec, t, q, k, v, o, *, b, s, prec, probs=None,
               mask=None, flag=None, guard=0, v_kmajor=False, runtime=None):
    """The attention launches of ``ap``; returns (o, probs, flag) (probs/flag None when not
    written). ``runtime``: the runtime scalars (``_runtime``)."""
    h, d = spec.num_heads, spec.head_dim
    runtime = runtime if t["runtime_scale"] is not None else None
    common = dict(batch=b, seq=s, num_heads=h, groups=spec.groups, head_dim=d,
                  scale=_static_scale(spec, t), causal=spec.causal, prec=prec,
                  mask=mask, mask_kind=flash.MASK_CODES[spec.mask], mask_fill=spec.mask_fill,
                  flag=flag, guard=guard, v_kmajor=v_kmajor,
                  upcast=interpreting() and q[0].dtype != torch.float32,
                  empty_zero=spec.core == "sdpa", window=getattr(spec, "window", 0),
                  softcap=getattr(spec, "softcap", 0.0), **_scale_args(spec, runtime))
    writes_flag = guard == 1 and o.dtype == torch.float16
    if ap.kind == "sdpa":
        return _sdpa(spec, q, k, v, b, s), None, flag      # (planned for static scales only)
    if ap.kind == "online":
        res = flash.launch(q, k, v, o, mode=0, cfg=ap.main, **common)
        return res[0], None, (res[1] if writes_flag else flag)
    if ap.kind == "single":
        res = flash.launch(q, k, v, o, mode=3, cfg=ap.main, probs=probs, **common)
        return res[0], res[1], (res[2] if writes_flag else flag)
    ml = torch.empty((b * h * s * 2,), device=o.device, dtype=torch.float32)
    (ml,) = flash.launch(q, k, v, None, mode=1, cfg=ap.stats, ml=ml, **common)
    res = flash.launch(q, k, v, o, mode=2, cfg=ap.main, probs=probs, ml=ml, **common)
    return res[0], res[1], (res[2] if writes_flag else flag)


def _static_scale(spec, t) -> float:
    """The scores' multiplier when it is static (1.0 stands in for a runtime one)."""
    return 1.0 if t["runtime_scale"] is not None else spec.effective_scale()


def _scale_args(spec, runtime):
    """flash.launch's runtime-scale arguments (``runtime``: the device scalars when the scale
    is a runtime value, else None)."""
    if runtime is None:
        return {}
    return dict(runtime=runtime, scale_div=spec.core == "explicit" and spec.scale_op == "div")


def _heads(rows, b, s, n, d):
    """[B*S, n*D] (or [B, S, n*D]) rows as a [B, n, S, D] view."""
    return rows.view(b, s, n, d).transpose(1, 2)


def _sdpa(spec, q, k, v, b, s):
    """The library's attention on the [B*S, heads*D] rows as [B, heads, S, D] views."""
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim

    def heads(t, n):
        return _heads(t[0], b, s, n, d)

    o = F.scaled_dot_product_attention(heads(q, h), heads(k, hk), heads(v, hk),
                                       is_causal=spec.causal, scale=spec.effective_scale(),
                                       enable_gqa=spec.groups > 1)
    return o.transpose(1, 2).reshape(b, s, h * d)


def _library_forward(spec, q, k, v, b, s):
    """(o rows, natural log-sum-exp [B, H, S]) by the library's FlashAttention-2 forward, which
    takes grouped K/V heads as they are (no repeat_kv)."""
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    out = torch.ops.aten._scaled_dot_product_flash_attention.default(
        _heads(q, b, s, h, d), _heads(k, b, s, hk, d), _heads(v, b, s, hk, d), 0.0,
        spec.causal, False, scale=spec.effective_scale())
    return out[0].transpose(1, 2).reshape(b, s, h * d), out[1]


def _no_probs(x):
    return x.new_empty((0,))


# ------------------------------------------------------------------------------- native plan
def _native(plan: NativePlan, spec: BlockSpec, t: dict):
    x = t["x"]
    b, s, e = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    m = b * s
    nq, nk = h * d, hk * d
    x2d = x.reshape(m, e)
    # 1. projections: q, k [M, N] row-major; float32 V as V^T [Nv, M] (K-major for TF32 P @ V)
    biases = [t[n] is not None for n in ("bq", "bk", "bv")]
    if plan.qkv_gemm is not None and len(set(biases)) == 1:
        x2d = x2d.contiguous()
        q = torch.empty((m, nq), device=x.device, dtype=x.dtype)
        k = torch.empty((m, nk), device=x.device, dtype=x.dtype)
        if plan.v_kmajor:
            v = torch.empty((nk, m), device=x.device, dtype=x.dtype)
            v_strides = (1, m)
        else:
            v = torch.empty((m, nk), device=x.device, dtype=x.dtype)
            v_strides = (nk, 1)
        q, k, v = linear.launch_qkv(
            x2d, [(t["wq"].contiguous(), t["bq"], q, (nq, 1)),
                  (t["wk"].contiguous(), t["bk"], k, (nk, 1)),
                  (t["wv"].contiguous(), t["bv"], v, v_strides)], plan.prec, plan.qkv_gemm)
    else:
        q = F.linear(x2d, t["wq"], t["bq"]).contiguous()
        k = F.linear(x2d, t["wk"], t["bk"]).contiguous()
        if plan.v_kmajor:
            v = torch.mm(t["wv"], x2d.t())
            if t["bv"] is not None:
                v = v + t["bv"][:, None]
            v = v.contiguous()
        else:
            v = F.linear(x2d, t["wv"], t["bv"]).contiguous()
    # 2. norm and RoPE on q and k, in place
    rt = _runtime(spec, t, x.device)
    q, k = _norm_rope(spec, t, q, k, b, s, rt)
    # 3. attention -> o [B, S, H*D]
    if plan.v_kmajor:
        vv = (v, (s, d * m, 1, m))
    else:
        vv = (v, (s * v.stride(0), d, v.stride(0), 1))
    o = torch.empty((b, s, nq), device=x.device, dtype=x.dtype)
    probs = (torch.empty((b, h, s, s), device=x.device, dtype=x.dtype)
             if spec.return_probs else None)
    o, probs, _ = _attention(plan.attention, spec, t, _rows_view(q, s, d), _rows_view(k, s, d),
                             vv, o, b=b, s=s, prec=plan.prec, probs=probs,
                             mask=_mask(spec, t, b, s), v_kmajor=plan.v_kmajor, runtime=rt)
    # 4. o_proj
    out = _o_proj_native(plan, t, o, m)
    return out, (probs if probs is not None else _no_probs(x))


def _o_proj_native(plan: NativePlan, t, o, m):
    wo, bo = t["wo"], t["bo"]
    if wo is None:
        return o
    b, s, hd = o.shape
    if plan.o_gemm is not None:
        y = torch.empty((m, wo.shape[0]), device=o.device, dtype=o.dtype)
        y = linear.launch(o.view(m, hd), wo.contiguous(), bo, y, plan.prec, plan.o_gemm)
        return y.view(b, s, -1)
    return F.linear(o, wo, bo)


# ---------------------------------------------------------------------- cached (decode) plan
def _cached_sdpa(spec: BlockSpec, t: dict):
    """A block over a DynamicCache: library GEMMs, our norm/RoPE on q and k, the cache joined,
    the library's attention with an explicit mask."""
    x = t["x"]
    b, s, e = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    x2d = x.reshape(b * s, e)
    q = F.linear(x2d, t["wq"], t["bq"]).contiguous()
    k = F.linear(x2d, t["wk"], t["bk"]).contiguous()
    v = F.linear(x2d, t["wv"], t["bv"])
    q, k = _norm_rope(spec, t, q, k, b, s, None)
    keys = torch.cat((t["past_key"], _heads(k, b, s, hk, d)), dim=2)
    values = torch.cat((t["past_value"], _heads(v, b, s, hk, d)), dim=2)
    mask = cached_attention_mask(spec, t["attn_mask"], s, keys.shape[2], x.device)
    gqa = spec.groups > 1
    if gqa and mask is not None:
        # with a mask the library's GQA path is its math kernel: its fused kernels take the
        # heads repeated, as stock transformers passes them
        keys, values = keys.repeat_interleave(spec.groups, 1), values.repeat_interleave(
            spec.groups, 1)
        gqa = False
    o = F.scaled_dot_product_attention(_heads(q, b, s, h, d), keys, values, attn_mask=mask,
                                       scale=spec.scale, enable_gqa=gqa)
    o = o.transpose(1, 2).reshape(b, s, h * d)
    out = F.linear(o, t["wo"], t["bo"]) if t["wo"] is not None else o
    return out, _no_probs(x)


# -------------------------------------------------------------------------- fp16 copies plan
def _mm16(a, b):
    """fp16 operands, float32 result with float32 accumulation (exact products)."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()        # the interpreter tests: the same products, on the CPU


def _fp16_copies(plan: Fp16CopiesPlan, spec: BlockSpec, t: dict):
    x = t["x"]
    b, s, e = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    m = b * s
    parts = (h * d, hk * d, hk * d)
    cuts = ((0, parts[0]), (parts[0], parts[0] + parts[1]), (parts[0] + parts[1], sum(parts)))
    dev = x.device
    # 1. fp16 operand copies with exact power-of-two row scales (x and the three weights as one
    #    operand), the range flag cleared, and the RoPE tables when the block computes them
    table = _table_spec(spec, t, b, s) if spec.rope != "none" and t["cos"] is None else None
    flag = torch.empty((1,), device=dev, dtype=torch.int32)
    x16, x_inv, w16, w_inv, flag, cos, sin = fp16_rows.scale_rows(
        x.reshape(m, e).contiguous(), [t["wq"].contiguous(), t["wk"].contiguous(),
                                       t["wv"].contiguous()], flag, table=table)
    if table is None:
        cos, sin = _tables(spec, t, b, s)
    angles = (table.inv, table.positions) if plan.fused_angles and table is not None else None
    # 2. the Q/K/V GEMM with the norm/RoPE epilogue: fp16 copies of q, k, v as column slices of
    #    one [M, Nq + Nk + Nv] buffer
    rt = _runtime(spec, t, dev)
    epilogue = dict(q_norm_weight=t["q_norm_weight"], k_norm_weight=t["k_norm_weight"],
                    cos=cos, sin=sin, seq=s, head_dim=d, norm=spec.norm, eps=spec.eps,
                    eps_k=spec.eps, rope=spec.rope, runtime=rt)
    qkv16, flag = proj_rope.launch(x16, w16, x_inv, w_inv, flag, parts, cfg=plan.projection,
                                   num_sms=plan.num_sms, angles=angles, **epilogue)
    wo = t["wo"]
    if plan.o16:
        wo = wo.contiguous()
        wo16, flag = qk_epilogue.wo16(wo, flag, d)
    q16, k16, v16 = (qkv16[:, a:z] for a, z in cuts)
    # 3. attention on the copies (skipped by the kernels once the flag is raised)
    mask = _mask(spec, t, b, s)
    o = torch.empty((b, s, h * d), device=dev, dtype=torch.float16 if plan.o16 else x.dtype)
    probs = torch.empty((b, h, s, s), device=dev, dtype=x.dtype) if spec.return_probs else None
    o, probs, flag = _attention(plan.attention, spec, t, _rows_view(q16, s, d),
                                _rows_view(k16, s, d), (v16, (s * v16.stride(0), d,
                                                              v16.stride(0), 1)),
                                o, b=b, s=s, prec="tf32", probs=probs, mask=mask, flag=flag,
                                guard=1, runtime=rt)
    # 4. the float32 fallback, guarded by the flag: exact products of the fp16 operand copies
    #    (a guarded GEMM), their scales undone with norm and RoPE, attention on float32
    qkv32 = torch.empty((m, sum(parts)), device=dev, dtype=torch.float32)
    qkv32 = linear.launch(x16, w16, None, qkv32, "tf32", configs.fallback_gemm(), flag=flag,
                          guard=2)
    qkv32 = qk_epilogue.fallback_norm_rope(
        qkv32, flag=flag, tok_inv=x_inv, feat_inv=w_inv, parts=parts, num_heads=h,
        num_kv_heads=hk, rotary_dim=spec.rotary_dim, **epilogue)
    q32, k32, v32 = (qkv32[:, a:z] for a, z in cuts)
    o32 = torch.empty((b, s, h * d), device=dev, dtype=x.dtype) if plan.o16 else o
    fallback = AttentionPlan("fallback", configs.fallback_attention())
    o32, probs = _fallback_attention(fallback, spec, t, q32, k32, v32, o32, probs, mask, flag, b,
                                     s, rt)
    # 5. o_proj: fp16 GEMM with float32 output, and its guarded float32 twin
    if wo is None:
        return o32, (probs if probs is not None else _no_probs(x))
    if not plan.o16:
        return F.linear(o32, wo, t["bo"]), (probs if probs is not None else _no_probs(x))
    out = _mm16(o.view(m, h * d), wo16.t())
    out = linear.launch(o32.view(m, h * d), wo, None, out, "tf32x3", configs.fallback_gemm(),
                        flag=flag, guard=2)
    return out.view(b, s, -1), (probs if probs is not None else _no_probs(x))


def _fallback_attention(ap, spec, t, q32, k32, v32, o32, probs, mask, flag, b, s, rt):
    """The guarded float32 attention: one launch (MODE 4, the pair row tile by row tile, or
    MODE 0) of looping programs that exit at once unless the flag is raised."""
    d = spec.head_dim
    common = dict(batch=b, seq=s, num_heads=spec.num_heads, groups=spec.groups, head_dim=d,
                  scale=_static_scale(spec, t), causal=spec.causal, prec="tf32", mask=mask,
                  mask_kind=flash.MASK_CODES[spec.mask], mask_fill=spec.mask_fill, flag=flag,
                  guard=2, empty_zero=spec.core == "sdpa", cfg=ap.main,
                  window=getattr(spec, "window", 0), softcap=getattr(spec, "softcap", 0.0),
                  **_scale_args(spec, rt if t["runtime_scale"] is not None else None))
    qv, kv = _rows_view(q32, s, d), _rows_view(k32, s, d)
    vv = (v32, (s * v32.stride(0), d, v32.stride(0), 1))
    if not spec.return_probs:
        (o32,) = flash.launch(qv, kv, vv, o32, mode=0, **common)
        return o32, None
    ml = torch.empty((b * spec.num_heads * s * 2,), device=o32.device, dtype=torch.float32)
    o32, probs, _ = flash.launch(qv, kv, vv, o32, mode=4, probs=probs, ml=ml, **common)
    return o32, probs


# ------------------------------------------------------------- the differentiable core's plan
def _core_common(plan: CorePlan, spec: BlockSpec, t: dict, b, s):
    return dict(batch=b, seq=s, num_heads=spec.num_heads, groups=spec.groups,
                head_dim=spec.head_dim, scale=spec.effective_scale(), causal=spec.causal,
                prec=plan.prec, mask=_mask(spec, t, b, s), mask_kind=flash.MASK_CODES[spec.mask],
                mask_fill=spec.mask_fill, empty_zero=spec.core == "sdpa", window=spec.window,
                softcap=spec.softcap,
                upcast=interpreting() and t["q"].dtype != torch.float32)


def _rows3(x, s, d):
    """A contiguous [B, S, heads*D] tensor as flash.py's (tensor, (stride b, h, s))."""
    return x, (s * x.shape[-1], d, x.shape[-1])


def _v4(v, s, d):
    return v, (s * v.shape[-1], d, v.shape[-1], 1)


def emit_core(plan: CorePlan, spec: BlockSpec, t: dict):
    """``inductor_gqa::attention_core``'s outputs (o, probs or an empty tensor, stats) from its
    tensors ``t`` (q, k, v, attn_mask, runtime_scale)."""
    q, k, v = (t[n].contiguous() for n in ("q", "k", "v"))
    b, s, _ = q.shape
    ap = plan.attention
    if ap.kind == "sdpa":
        o, lse = _library_forward(spec, q, k, v, b, s)
        return o, _no_probs(q), ml_of_lse(lse)
    h, d = spec.num_heads, spec.head_dim
    common = _core_common(plan, spec, t, b, s)
    o = torch.empty((b, s, h * d), device=q.device, dtype=q.dtype)
    ml = torch.empty((b * h * s * 2,), device=q.device, dtype=torch.float32)
    qv, kv, vv = _rows3(q, s, d), _rows3(k, s, d), _v4(v, s, d)
    if ap.kind == "online":
        o, ml = flash.launch(qv, kv, vv, o, mode=0, cfg=ap.main, ml=ml, store_ml=True, **common)
        return o, _no_probs(q), ml
    (ml,) = flash.launch(qv, kv, vv, None, mode=1, cfg=ap.stats, ml=ml, **common)
    probs = torch.empty((b, h, s, s), device=q.device, dtype=q.dtype)
    o, probs = flash.launch(qv, kv, vv, o, mode=2, cfg=ap.main, probs=probs, ml=ml, **common)
    return o, probs, ml


def emit_core_backward(plan: CorePlan, spec: BlockSpec, t: dict):
    """``inductor_gqa::attention_core_backward``'s (dq, dk, dv) from its tensors ``t``."""
    q, k, v, o, do = (t[n].contiguous() for n in ("q", "k", "v", "o", "grad_o"))
    b, s, _ = q.shape
    d = spec.head_dim
    common = _core_common(plan, spec, t, b, s)
    probs = dprobs = None
    if t["grad_probs"] is not None:
        probs, dprobs = t["probs"].contiguous(), t["grad_probs"].contiguous()
    dq, dk, dv = flash_bwd.launch(_rows3(q, s, d), _rows3(k, s, d), _v4(v, s, d),
                                  _rows3(o, s, d), _rows3(do, s, d), cfg=plan.backward,
                                  ml=t["stats"], probs=probs, dprobs=dprobs, **common)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
