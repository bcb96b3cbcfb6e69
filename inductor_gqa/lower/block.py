"""GPU path of ``inductor_gqa::attention_block``: cuBLAS projections + fused Triton kernels.

    q, k, v = qkv(x, w*, b*)               [B*S, heads*D] each: three cuBLAS GEMMs (bias in
                                           their epilogue) or, for float32 under "highest", one
                                           3xTF32 Triton launch where it measures faster than
                                           cuBLAS's IEEE GEMMs; float32 V comes transposed,
                                           [Hkv*D, B*S]
    rope_tables(inv_freq, position_ids)    one Triton launch (inside the operand-scaling launch
                                           of the f16proj plan), when the op was handed the
                                           angles' sources instead of the model's cos/sin
    qk_norm_rope_(q, k)                    one Triton launch: RMSNorm (fp32) + RoPE, in place
    attention                              Triton flash kernel (GQA-native, masks, causal skip),
                                           two-pass when probabilities are returned; or the
                                           library SDPA where it measured faster and no
                                           probabilities/masks are involved
    linear(o, wo, bo)                      the same choice

The attention core and its configs live in ``attention.py``, the fp16-copies plans of float32
blocks under "high" in ``fp16_plans.py``; this module checks the inputs, picks the plan (timed once
per bucket) and runs the plain ("native") and "f16" plans.

``run_block(tensors, spec)`` returns (out, probs) or None when a case is not covered (the op then
runs the eager reference). It applies to CUDA tensors; CPU tensors only with
``INDUCTOR_GQA_KERNELS_ON_CPU=1`` (interpreter tests). Nothing here syncs with the host after the
first call of a shape bucket (which measures configs once and caches the choice).
"""

from __future__ import annotations

import os

import torch

from ..kernels.qk_epilogue import qk_norm_rope_
from ..kernels.rope_table import TableJob
from ..kernels import tuning
from ..plan.spec import BlockSpec
from . import fp16_plans
from .attention import attention, fp32_dot_precision
from .fp16_plans import f16_operands_allowed, f16_projections_offered, fp16_copies, \
    fp16_o_proj, o_proj
from .linear import qkv


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _enabled_for(x: torch.Tensor) -> bool:
    if x.is_cuda:
        return os.environ.get("INDUCTOR_GQA_KERNELS", "1") != "0"
    return os.environ.get("INDUCTOR_GQA_KERNELS_ON_CPU", "0") == "1"


def _rope_tables(t, spec, b, s):
    """(cos, sin, job): the [B, S, R] views the epilogue reads; ``job`` (a TableJob, not yet
    launched) when they are built from ``inv_freq`` and ``position_ids``: the plan launches it,
    alone or inside its first launch."""
    cos, sin = t["cos"], t["sin"]
    if spec.rope == "none":
        return None, None, None
    r = spec.rotary_dim
    if cos is not None:
        if sin is None or cos.dtype != t["x"].dtype or sin.dtype != cos.dtype:
            raise _NotCovered
        c3 = cos if cos.dim() == 3 else cos.reshape(-1, cos.shape[-2], cos.shape[-1])
        s3 = sin if sin.dim() == 3 else sin.reshape(-1, sin.shape[-2], sin.shape[-1])
        if c3.shape[-1] != r or s3.shape[-1] != r:
            raise _NotCovered
        return torch.broadcast_to(c3, (b, s, r)), torch.broadcast_to(s3, (b, s, r)), None
    inv, pos = t["inv_freq"], t["position_ids"]
    if inv is None or pos is None or inv.numel() * 2 != r or pos.dim() != 2:
        raise _NotCovered
    if inv.dtype != torch.float32 or pos.dtype.is_floating_point:
        raise _NotCovered
    job = TableJob(inv, torch.broadcast_to(pos, (b, s)), r, spec.rope == "interleaved",
                   t["x"].dtype, interpret=tuning.interpreting())
    return job.cos, job.sin, job


class _NotCovered(Exception):
    pass


def _mask_view(t, spec, b, h, s):
    m = t["attn_mask"]
    if spec.mask == "none":
        return None
    if m is None or m.dim() > 4:
        raise _NotCovered
    if spec.mask in ("bool_keep", "bool_fill"):
        if m.dtype != torch.bool:
            raise _NotCovered
        m = m.view(torch.uint8)
    elif not m.dtype.is_floating_point:
        raise _NotCovered
    return torch.broadcast_to(m, (b, h, s, s))


def run_block(t: dict, spec: BlockSpec):
    x = t["x"]
    if x is None or x.dim() != 3 or x.dtype not in _DTYPES or not _enabled_for(x):
        return None
    if spec.window or spec.softcap or spec.norm_scope != "head" or spec.rope_fp32:
        return None   # no kernel for these fields yet: the reference runs them
    try:
        return _run(t, spec)
    except _NotCovered:
        return None


def _host_float(t, name, traced):
    """A runtime float (0-d tensor) as a kernel argument: read on the host, so only from a CPU
    tensor (a device tensor would need a sync, which CUDA-graph capture forbids)."""
    v = t.get(name)
    if v is None:
        return traced
    if v.device.type != "cpu" or v.numel() != 1:
        raise _NotCovered
    return float(v)


def _run(t, spec):
    x = t["x"]
    b, s, e = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    dt = x.dtype
    for name in ("wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo", "q_norm_weight",
                 "k_norm_weight", "attn_mask", "cos", "sin", "inv_freq", "position_ids"):
        v = t[name]
        if v is not None and v.device != x.device:
            raise _NotCovered
    for name in ("wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo"):
        v = t[name]
        if v is not None and v.dtype != dt:
            raise _NotCovered
    if t["wq"].shape != (h * d, e) or t["wk"].shape != (hk * d, e) or t["wv"].shape != (hk * d, e):
        raise _NotCovered
    if d > 256 or d < 8 or s < 1:
        raise _NotCovered
    if spec.norm != "none":
        qn, kn = t["q_norm_weight"], t["k_norm_weight"]
        if qn is None or kn is None or qn.numel() != d or kn.numel() != d:
            raise _NotCovered
    cos, sin, table = _rope_tables(t, spec, b, s)
    mask = _mask_view(t, spec, b, h, s)

    eps_value = _host_float(t, "runtime_eps", spec.eps)
    eps_k_value = _host_float(t, "runtime_k_eps", eps_value)
    scale_value = _host_float(t, "runtime_scale", spec.scale)

    prec = fp32_dot_precision() if dt == torch.float32 else "tf32"
    args = (cos, sin, mask, eps_value, eps_k_value, scale_value, prec, table)
    if not f16_operands_allowed(dt, prec):
        return _run_plan(t, spec, "native", *args)
    # fp16 copies or TF32 on float32: the whole block measured each way, once per bucket
    key = ("plan", dt, h, hk, d, spec.causal, spec.mask, spec.return_probs, spec.norm,
           spec.rope, prec) + tuning.shape_key(s, b * h)
    plans = ["f16", "native"]
    if f16_projections_offered(t, x):
        plans.insert(0, "f16proj")
        if fp16_plans.f16_products_offered():
            plans.insert(1, "f16proj16")
        if fp16_plans.f16_fused_offered(spec, x):
            plans.insert(plans.index("f16"), "f16tma")
    plan = tuning.pick(key + (tuple(plans),), plans, lambda p: _run_plan(t, spec, p, *args))
    return _run_plan(t, spec, plan, *args)


def _run_plan(t, spec, plan, cos, sin, mask, eps_value, eps_k_value, scale_value, prec,
              table=None):
    x = t["x"]
    b, s, _ = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    if plan in ("f16proj", "f16proj16", "f16tma"):  # scale_rows also builds the tables
        return fp16_plans.run_f16proj(t, spec, cos, sin, mask, eps_value, eps_k_value,
                                      scale_value, prec, table, out16=plan == "f16proj16",
                                      fused=plan == "f16tma")
    if table is not None:
        table.launch()
    dt = x.dtype
    f16 = plan == "f16"
    # 1. projections (cuBLAS, bias fused; one 3xTF32 Triton launch for fp32 "highest" where it
    #    measures faster), q and k [B*S, heads*D] contiguous; float32 V as V^T [Hkv*D, B*S], the
    #    K-major operand Hopper's TF32 MMA needs for P @ V (row-major when fp16 copies are made)
    v_kmajor = dt == torch.float32 and not f16
    q, k, v = qkv(x, (t["wq"], t["bq"]), (t["wk"], t["bk"]), (t["wv"], t["bv"]), prec,
                  v_transposed=v_kmajor)
    # 2. norm + rope in place (+ the fp16 copies of q, k, v, and of Wo for an fp16 o_proj)
    copies = fp16_copies(q, k, v) if f16 else None
    o16 = fp16_o_proj(t, spec, x) if f16 else None
    flag = copies[3] if f16 else None
    wo_mode, wo_arg, wo16_ready = fp16_plans.wo16_before_epilogue(o16, flag, d)
    if spec.norm != "none" or spec.rope != "none" or f16:
        qk_norm_rope_(q, k, t["q_norm_weight"], t["k_norm_weight"], cos, sin, b, s, h, hk, d,
                      spec.norm, eps_value, spec.rope, spec.rotary_dim, eps_k=eps_k_value,
                      v=v, copies=copies[:3] if f16 else None, flag=flag, wo=wo_arg)
    wo16_ready = fp16_plans.wo16_after_epilogue(wo_mode, o16, flag, d, wo16_ready)
    # 3. attention -> o [B, S, H*D]
    pending = []        # the guarded fallbacks, run by o_proj before it reads the float32 o
    o, probs = attention(q, k, v, mask, spec, b, s, scale_value, v_kmajor, f16=copies,
                         out16=o16[0] if o16 else None, deferred=pending)
    return o_proj(t, spec, o, probs, prec, o16, copies, pending, wo16_ready)
