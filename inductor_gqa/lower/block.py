"""GPU path of ``inductor_gqa::attention_block``: cuBLAS projections + fused Triton kernels.

    q, k, v = qkv(x, w*, b*)               [B*S, heads*D] each: three cuBLAS GEMMs (bias in
                                           their epilogue) or, for float32 under "highest", one
                                           3xTF32 Triton launch where it measures faster than
                                           cuBLAS's IEEE GEMMs; float32 V comes transposed,
                                           [Hkv*D, B*S]
    rope_tables(inv_freq, position_ids)    one Triton launch, when the op was handed the angles'
                                           sources instead of the model's cos/sin
    qk_norm_rope_(q, k)                    one Triton launch: RMSNorm (fp32) + RoPE, in place
    attention                              Triton flash kernel (GQA-native, masks, causal skip),
                                           two-pass when probabilities are returned; or the
                                           library SDPA where it measured faster and no
                                           probabilities/masks are involved
    linear(o, wo, bo)                      the same choice

``run_block(tensors, spec)`` returns (out, probs) or None when a case is not covered (the op then
runs the eager reference). It applies to CUDA tensors; CPU tensors only with
``INDUCTOR_GQA_KERNELS_ON_CPU=1`` (interpreter tests). Nothing here syncs with the host after the
first call of a shape bucket (which measures configs once and caches the choice).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..kernels import flash, fp16_rows, qkv_fused, tuning
from ..kernels import linear as linear_kernels
from ..kernels.qk_epilogue import NORM_CODES, ROPE_CODES, copy16_checked, qk_norm_rope_
from ..kernels.rope_table import rope_tables
from .linear import linear, qkv
from ..plan.spec import BlockSpec

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _enabled_for(x: torch.Tensor) -> bool:
    if x.is_cuda:
        return os.environ.get("INDUCTOR_GQA_KERNELS", "1") != "0"
    return os.environ.get("INDUCTOR_GQA_KERNELS_ON_CPU", "0") == "1"


def fp32_dot_precision() -> str:
    """Read at call time: torch.get_float32_matmul_precision() -> Triton input_precision."""
    if torch.get_float32_matmul_precision() == "highest":
        return os.environ.get("INDUCTOR_GQA_FP32_HIGHEST", "tf32x3")
    return "tf32"


def _rope_tables(t, spec, b, s):
    cos, sin = t["cos"], t["sin"]
    if spec.rope == "none":
        return None, None
    r = spec.rotary_dim
    if cos is not None:
        if sin is None or cos.dtype != t["x"].dtype or sin.dtype != cos.dtype:
            raise _NotCovered
        c3 = cos if cos.dim() == 3 else cos.reshape(-1, cos.shape[-2], cos.shape[-1])
        s3 = sin if sin.dim() == 3 else sin.reshape(-1, sin.shape[-2], sin.shape[-1])
        if c3.shape[-1] != r or s3.shape[-1] != r:
            raise _NotCovered
        return torch.broadcast_to(c3, (b, s, r)), torch.broadcast_to(s3, (b, s, r))
    inv, pos = t["inv_freq"], t["position_ids"]
    if inv is None or pos is None or inv.numel() * 2 != r or pos.dim() != 2:
        raise _NotCovered
    if inv.dtype != torch.float32 or pos.dtype.is_floating_point:
        raise _NotCovered
    return rope_tables(inv, torch.broadcast_to(pos, (b, s)), r, spec.rope == "interleaved",
                       t["x"].dtype, interpret=tuning.interpreting())


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


def _attention_candidates(dtype, d, mode, f16=False):
    cfgs = _attention_configs(dtype, d, mode, f16)
    if mode == 2 and not tuning.interpreting():
        # flash.py's PIPELINE: measured on the H200, it wins the probabilities pass at ragged S
        # (449x16: 199 -> 176 us) and with fp16 operands at large S; never the stats pass
        return cfgs + [c + ("pipeline",) for c in cfgs]
    if mode == 1 and fma_exp_offered():
        return cfgs + [c + ("fma_exp",) for c in cfgs]
    return cfgs


def fma_exp_offered() -> bool:
    """Opt-in (INDUCTOR_GQA_FMA_EXP=1), not yet measured on a GPU: the stats pass's configs also
    with flash.py's FMA_EXP (half of the exponentials as a polynomial on the FMA pipe)."""
    return os.environ.get("INDUCTOR_GQA_FMA_EXP", "0") == "1"


def _attention_configs(dtype, d, mode, f16=False):
    """(BLOCK_M, BLOCK_N, warps, stages) candidates of one pass (flash.py's MODE); ``f16``: fp16
    q/k/V copies of a float32 block (fp32 probabilities and output)."""
    if tuning.interpreting():
        return [(32, 32, 4, 1)]
    if f16:
        # measured on the H200 at W075 sizes (perf/experiments/fp16_scores_bench.py)
        if mode == 2:
            return [(64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3), (128, 32, 8, 4),
                    (128, 64, 8, 4), (128, 64, 8, 3), (32, 64, 4, 2)]
        if mode == 1:
            return [(64, 128, 4, 2), (128, 64, 8, 3), (64, 128, 4, 3), (128, 128, 8, 3),
                    (128, 128, 8, 2), (64, 64, 4, 2)]
    if dtype == torch.float32:
        # measured on the H200 with K-major V: the probabilities pass likes narrow N tiles
        # (store + P@V per tile), the stats pass wide ones
        # (deeper pipelines: 3 stages took the probabilities pass from 623 to 467 us at 4096x1)
        if mode == 2:
            return [(128, 32, 8, 3), (128, 32, 8, 4), (128, 32, 8, 2), (256, 32, 8, 3),
                    (128, 64, 8, 3), (128, 16, 8, 4), (64, 32, 4, 3), (64, 64, 4, 2),
                    (64, 64, 4, 3), (32, 64, 4, 2)]
        if mode == 1:
            return [(128, 128, 8, 2), (128, 64, 8, 3), (64, 128, 4, 2), (64, 64, 4, 2),
                    (128, 128, 8, 3), (64, 128, 4, 3), (32, 128, 4, 2)]
        return [(64, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 2),
                (32, 128, 4, 2), (64, 128, 4, 3), (16, 128, 4, 2)]
    if d <= 64:
        return [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)]
    return [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 2),
            (64, 32, 4, 3)]


def _single_pass_candidates(s):
    """For S <= 256 the probabilities in one launch (flash.py's MODE 3, one key tile per row)
    instead of the stats and probabilities passes; measured against the pair, which stays a
    candidate (H200: 8.2 vs 10.3 us at 131x1, 11.1 vs 12.4 at 211x2; the pair wins at 256x8).
    INDUCTOR_GQA_SINGLE_PASS=0 turns it off."""
    if os.environ.get("INDUCTOR_GQA_SINGLE_PASS", "1") == "0" or s > 256:
        return []
    bn = max(16, 1 << (s - 1).bit_length())
    if tuning.interpreting():
        return [(32, bn, 4, 1)]
    # one key tile per row: nothing to pipeline (one stage keeps K and V tiles single)
    return [(bm, bn, nw, 1) for bm, nw in ((16, 4), (32, 4), (64, 4), (64, 8), (128, 8))]


# configs of the float32 fallback behind fp16 copies: it runs only when a value overflowed fp16,
# so it is not tuned for speed, only checked to run (small tiles fit any head_dim)
_FALLBACK_CONFIGS = [(64, 64, 4, 2), (32, 64, 4, 2), (32, 32, 4, 1)]


def f16_projections_offered(t, x) -> bool:
    """The fp16-copies plan with the Q/K/V GEMMs on fp16 copies too (``fp16_rows``: exact per-row
    power-of-two scales, cuBLAS fp16 with float32 output, measured 74 vs 133 us at M=7184 for the
    GEMMs alone) and the norm/RoPE launch writing only the copies (a guarded launch finishes the
    float32 tensors for the fallback). Whole block on the H200: 46 -> 38 us at 131x1, 337 -> 310
    at 449x16, 550 -> 527 at 4096x1. Needs no projection biases (the scales are undone before
    the bias would be added) and rows of at most 16384. INDUCTOR_GQA_FP16_PROJECTIONS=0 turns it
    off."""
    if os.environ.get("INDUCTOR_GQA_FP16_PROJECTIONS", "1") == "0":
        return False
    if any(t[n] is not None for n in ("bq", "bk", "bv")) or x.shape[-1] > fp16_rows.MAX_COLS:
        return False
    return not x.is_cuda or _mm_fp32_out_ok(x.device)


def f16_fused_offered(t, x, spec) -> bool:
    """Opt-in (INDUCTOR_GQA_FUSED_PROJECTIONS=1), not yet measured on a GPU: the ``f16fused``
    plan, f16proj with the GEMM and the norm/RoPE epilogue in one Triton launch
    (``kernels/qkv_fused.py``). Needs what f16proj needs, a power-of-two head_dim of at least 16
    and rotary_dim == head_dim."""
    d = spec.head_dim
    return (os.environ.get("INDUCTOR_GQA_FUSED_PROJECTIONS", "0") == "1"
            and f16_projections_offered(t, x) and d >= 16 and d & (d - 1) == 0
            and (spec.rope == "none" or spec.rotary_dim == d))


# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages) of the fused projection; BLOCK_N whole heads
_QKV16_CONFIGS = [(128, 64, 64, 8, 4, 3), (128, 128, 64, 8, 8, 3), (64, 64, 64, 8, 4, 4),
                  (128, 128, 64, 8, 8, 4), (64, 128, 64, 8, 4, 3), (128, 256, 64, 8, 8, 3)]


def _qkv16_configs(d, nq, nk, nv):
    if tuning.interpreting():
        return [(32, d, 32, 8, 4, 1)]
    return [c for c in _QKV16_CONFIGS if c[1] % d == 0 and not (nq % c[1] or nk % c[1]
                                                                 or nv % c[1])] \
        or [(64, d, 64, 8, 4, 3)]


_MM_OK: dict = {}


def _mm_fp32_out_ok(device) -> bool:
    """Whether this torch multiplies fp16 into a float32 result (``torch.mm(out_dtype=)``)."""
    if device not in _MM_OK:
        if tuning._capturing():
            return False
        a = torch.ones((16, 16), device=device, dtype=torch.float16)
        try:
            _MM_OK[device] = torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            _MM_OK[device] = False
    return _MM_OK[device]


def _mm16(a, b):
    """fp16 operands, float32 result with float32 accumulation (exact products)."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()        # the interpreter tests: same products, on the CPU


def f16_operands_allowed(dt, prec) -> bool:
    """float32 blocks whose dots may use TF32 may run them on fp16 copies instead: the same
    10-bit significand, rounded to nearest, at twice the tensor-core rate (the copies fall back
    to float32 on overflow). INDUCTOR_GQA_FP16_OPERANDS=0 turns the candidate off."""
    return (dt == torch.float32 and prec == "tf32"
            and os.environ.get("INDUCTOR_GQA_FP16_OPERANDS", "1") != "0")


def run_block(t: dict, spec: BlockSpec):
    x = t["x"]
    if x is None or x.dim() != 3 or x.dtype not in _DTYPES or not _enabled_for(x):
        return None
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
    cos, sin = _rope_tables(t, spec, b, s)
    mask = _mask_view(t, spec, b, h, s)

    eps_value = _host_float(t, "runtime_eps", spec.eps)
    eps_k_value = _host_float(t, "runtime_k_eps", eps_value)
    scale_value = _host_float(t, "runtime_scale", spec.scale)

    prec = fp32_dot_precision() if dt == torch.float32 else "tf32"
    args = (cos, sin, mask, eps_value, eps_k_value, scale_value, prec)
    if not f16_operands_allowed(dt, prec):
        return _run_plan(t, spec, "native", *args)
    # fp16 copies or TF32 on float32: the whole block measured each way, once per bucket
    key = ("plan", dt, h, hk, d, spec.causal, spec.mask, spec.return_probs, spec.norm,
           spec.rope, prec, tuning.bucket(s), tuning.bucket(b * h), s % 16 == 0)
    plans = ["f16", "native"]
    if f16_projections_offered(t, x):
        plans.insert(0, "f16proj")
    if f16_fused_offered(t, x, spec):
        plans.insert(0, "f16fused")
    plan = tuning.pick(key + (tuple(plans),), plans, lambda p: _run_plan(t, spec, p, *args))
    return _run_plan(t, spec, plan, *args)


def _run_plan(t, spec, plan, cos, sin, mask, eps_value, eps_k_value, scale_value, prec):
    x = t["x"]
    b, s, _ = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    if plan == "f16proj":
        return _run_f16proj(t, spec, cos, sin, mask, eps_value, eps_k_value, scale_value, prec)
    if plan == "f16fused":
        return _run_f16fused(t, spec, cos, sin, mask, eps_value, eps_k_value, scale_value, prec)
    dt = x.dtype
    f16 = plan == "f16"
    # 1. projections (cuBLAS, bias fused; one 3xTF32 Triton launch for fp32 "highest" where it
    #    measures faster), q and k [B*S, heads*D] contiguous; float32 V as V^T [Hkv*D, B*S], the
    #    K-major operand Hopper's TF32 MMA needs for P @ V (row-major when fp16 copies are made)
    v_kmajor = dt == torch.float32 and not f16
    q, k, v = qkv(x, (t["wq"], t["bq"]), (t["wk"], t["bk"]), (t["wv"], t["bv"]), prec,
                  v_transposed=v_kmajor)
    # 2. norm + rope in place (+ the fp16 copies of q, k, v, and of Wo for an fp16 o_proj)
    copies = _fp16_copies(q, k, v) if f16 else None
    o16 = _fp16_o_proj(t, spec, x) if f16 else None
    if spec.norm != "none" or spec.rope != "none" or f16:
        qk_norm_rope_(q, k, t["q_norm_weight"], t["k_norm_weight"], cos, sin, b, s, h, hk, d,
                      spec.norm, eps_value, spec.rope, spec.rotary_dim, eps_k=eps_k_value,
                      v=v, copies=copies[:3] if f16 else None,
                      flag=copies[3] if f16 else None, wo=o16[1:] if o16 else None)
    # 3. attention -> o [B, S, H*D]
    o, probs = attention(q, k, v, mask, spec, b, s, scale_value, v_kmajor, f16=copies,
                         out16=o16[0] if o16 else None)
    return _o_proj(t, spec, o, probs, prec, o16, copies)


def _o_proj(t, spec, o, probs, prec, o16=None, copies=None):
    # 4. o_proj: on the fp16 copies (o16, Wo16) with a guarded float32 fallback, or float32
    if o16 is not None:
        out = _o_proj16(o, *o16, copies[3])
    else:
        out = linear(o, t["wo"], t["bo"], prec) if t["wo"] is not None else o
    return out.contiguous(), (probs if spec.return_probs else o.new_empty((0,)))


# the float32 o_proj behind the fp16 one (3xTF32: Triton's TF32 truncates; it runs only when a
# value left fp16's range, so it is checked to run, not tuned)
_O_PROJ_FALLBACK = (128, 128, 32, 8, 8, 3)   # few programs: each exits at once when unused


def _fp16_o_proj(t, spec, x):
    """(o16 [B, S, H*D], Wo [E, H*D] contiguous, Wo16): buffers for o_proj on fp16 copies, or
    None where it does not apply (no o_proj, an o_proj bias, no fp16 GEMM with float32 output).
    The attention kernel writes o16 and raises the range flag for rows outside fp16's useful
    range (flash.py), the epilogue launch writes Wo16 and checks it the same way; when the flag
    is raised a guarded float32 GEMM redoes o_proj from the fallback's float32 o.
    INDUCTOR_GQA_FP16_OPROJ=0 turns it off."""
    wo = t["wo"]
    if (wo is None or t["bo"] is not None or wo.dtype != torch.float32
            or os.environ.get("INDUCTOR_GQA_FP16_OPROJ", "1") == "0"
            or (x.is_cuda and not _mm_fp32_out_ok(x.device))):
        return None
    b, s, _ = x.shape
    wo = wo.contiguous()
    return (torch.empty((b, s, spec.num_heads * spec.head_dim), device=x.device,
                        dtype=torch.float16), wo, torch.empty_like(wo, dtype=torch.float16))


def _o_proj16(o, o16, wo, wo16, flag):
    b, s, hd = o.shape
    out = _mm16(o16.view(b * s, hd), wo16.t())
    cfg = (32, 32, 32, 8, 4, 1) if tuning.interpreting() else _O_PROJ_FALLBACK
    linear_kernels.launch(o.view(b * s, hd), wo, None, out, "tf32x3", *cfg, flag=flag, guard=2)
    return out.view(b, s, -1)


def _fp16_copies(q, k, v):
    """(q16, k16, v16, flag): buffers for the epilogue's fp16 copies, and its overflow flag."""
    return tuple(torch.empty(a.shape, device=a.device, dtype=torch.float16) for a in (q, k, v)) \
        + (torch.zeros((1,), device=q.device, dtype=torch.int32),)


def _run_f16proj(t, spec, cos, sin, mask, eps_value, eps_k_value, scale_value, prec):
    """The fp16-copies plan with the Q/K/V projections on fp16 copies as well (see
    ``f16_projections_offered``)."""
    x = t["x"]
    b, s, e = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    # the three weights' copies are row blocks of one operand: one GEMM for q, k and v
    x16, x_inv, w16, w_inv, cuts = _scaled_fp16_operands(x, [t["wq"], t["wk"], t["wv"]])
    q_inv, k_inv, v_inv = (w_inv[a:z] for a, z in cuts)
    # scaled float32 products [B*S, Nq+Nk+Nv]: q, k, v are its column slices; the epilogue
    # multiplies by x_inv (per token) and w_inv (per feature)
    qkv = _mm16(x16, w16.t())
    q, k, v = (qkv[:, a:z] for a, z in cuts)
    copies = _fp16_copies(q, k, v)
    o16 = _fp16_o_proj(t, spec, x)
    common = (q, k, t["q_norm_weight"], t["k_norm_weight"], cos, sin, b, s, h, hk, d, spec.norm,
              eps_value, spec.rope, spec.rotary_dim)
    scales = (x_inv, q_inv, k_inv, v_inv)
    qk_norm_rope_(*common, eps_k=eps_k_value, v=v, copies=copies[:3], flag=copies[3],
                  scales=scales, store32=False, wo=o16[1:] if o16 else None)

    def finish_fp32():
        # the float32 fallback's q, k, v: finished in place only if the flag was raised (by a
        # copy, or by the fp16-operand attention's output: hence after its launches)
        qk_norm_rope_(*common, eps_k=eps_k_value, scales=scales, store32=True, guard=2, v=v,
                      flag=copies[3])

    o, probs = attention(q, k, v, mask, spec, b, s, scale_value, False, f16=copies,
                         out16=o16[0] if o16 else None, before_fallback=finish_fp32)
    return _o_proj(t, spec, o, probs, prec, o16, copies)


def _scaled_fp16_operands(x, ws):
    """x [B, S, E] and the weights as fp16 copies with exact power-of-two row scales:
    (x16 [B*S, E], x_inv, w16 [sum N, E], w_inv, cuts) with the weights as row blocks of w16."""
    e = x.shape[-1]
    x2d = x.reshape(-1, e).contiguous()
    ws = [w.contiguous() for w in ws]
    n = [w.shape[0] for w in ws]
    w16 = torch.empty((sum(n), e), device=x.device, dtype=torch.float16)
    w_inv = torch.empty((sum(n),), device=x.device, dtype=torch.float32)
    cuts = ((0, n[0]), (n[0], n[0] + n[1]), (n[0] + n[1], sum(n)))
    (x16, x_inv), *_ = fp16_rows.scale_rows(
        [x2d] + ws, [None] + [(w16[a:z], w_inv[a:z]) for a, z in cuts])
    return x16, x_inv, w16, w_inv, cuts


def _run_f16fused(t, spec, cos, sin, mask, eps_value, eps_k_value, scale_value, prec):
    """f16proj with the projection GEMM and the norm/RoPE epilogue in one Triton launch writing
    the fp16 copies (``f16_fused_offered``); the float32 fallback's q, k, v come from the same
    kernel, guarded, after the fp16 attention launches."""
    x = t["x"]
    b, s, _ = x.shape
    d = spec.head_dim
    x16, x_inv, w16, w_inv, cuts = _scaled_fp16_operands(x, [t["wq"], t["wk"], t["wv"]])
    nq, nk, nv = (z - a for a, z in cuts)
    m = b * s
    copies = tuple(torch.empty((m, n), device=x.device, dtype=torch.float16)
                   for n in (nq, nk, nv)) + (torch.zeros((1,), device=x.device,
                                                         dtype=torch.int32),)
    flag = copies[3]
    o16 = _fp16_o_proj(t, spec, x)
    if o16:
        copy16_checked(o16[1], o16[2], flag, d)
    norm, rope = NORM_CODES[spec.norm], ROPE_CODES[spec.rope]

    def proj(outs, cfg, **kw):
        qkv_fused.launch(x16, x_inv, w16, w_inv, nq, nk, nv, outs, flag, t["q_norm_weight"],
                         t["k_norm_weight"], eps_value, eps_k_value, cos, sin, s, d, norm, rope,
                         cfg, upcast=tuning.interpreting(), **kw)

    key = ("qkv16", tuning.bucket(m), nq, nk, nv, x.shape[-1], d, norm, rope)
    cfg = tuning.pick(key, _qkv16_configs(d, nq, nk, nv), lambda c: proj(copies[:3], c))
    proj(copies[:3], cfg)
    q, k, v = (torch.empty((m, n), device=x.device, dtype=torch.float32) for n in (nq, nk, nv))
    o, probs = attention(q, k, v, mask, spec, b, s, scale_value, False, f16=copies,
                         out16=o16[0] if o16 else None,
                         before_fallback=lambda: proj((q, k, v), cfg, out32=True, guard=2))
    return _o_proj(t, spec, o, probs, prec, o16, copies)


def _sdpa_ok(spec: BlockSpec, dt):
    return (not spec.return_probs and spec.mask == "none" and dt != torch.float32
            and not tuning.interpreting())


def attention(q, k, v, mask, spec: BlockSpec, b, s, scale_value: float, v_kmajor=False,
              f16=None, out16=None, before_fallback=None):
    """q [B*S, H*D], k [B*S, Hkv*D] contiguous; v the same, or V^T [Hkv*D, B*S] contiguous when
    ``v_kmajor`` -> (o [B,S,H*D], probs or None). ``f16``: (q16, k16, v16, flag), fp16 copies of
    float32 q, k, v (row-major) to compute with; q, k, v are then the fallback for when ``flag``
    says a value left fp16's range. ``out16`` (with ``f16``): an fp16 [B,S,H*D] buffer the fp16
    launches write the output to instead (o is then written only by the fallback).
    ``before_fallback``: called between the fp16 launches and the fallback's."""
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    dt = q.dtype

    def views(q, k, v, kmajor):
        # rows of q, k (and row-major v) may be further apart than heads * D: column slices of
        # one fused QKV product
        lq, lk, lv = q.stride(0), k.stride(0), v.stride(0)
        if kmajor:
            vs = (v, (s, d * b * s, 1, b * s))
        else:
            vs = (v, (s * lv, d, lv, 1))
        return (q, (s * lq, d, lq)), (k, (s * lk, d, lk)), vs, kmajor

    scale = spec.effective_scale(scale_value)
    prec = fp32_dot_precision() if dt == torch.float32 else "tf32"
    mk = flash.MASK_CODES[spec.mask]
    o = torch.empty((b, s, h * d), device=q.device, dtype=dt)
    # S % 16 == 0 is part of the key: Triton specializes on it (vector stores of the
    # probabilities' rows), and a choice measured at a ragged S was 9% slow at S=512 (H200)
    bucket = (tuning.bucket(s), tuning.bucket(b * h), s % 16 == 0)
    base_key = (dt, h, hk, d, spec.causal, mk, prec, bucket)
    if f16 is not None:
        q16, k16, v16, flag = f16
        main, guard = views(q16, k16, v16, False), 1
        fallback = views(q, k, v, False)
        base_key += ("f16",) + (("o16",) if out16 is not None else ())
    else:
        main, guard, flag, fallback = views(q, k, v, v_kmajor), 0, None, None
        if out16 is not None:
            raise ValueError("attention: an fp16 output needs the fp16 copies")

    def run(mode, cfg, probs=None, ml=None, ops=main, guard=guard):
        if cfg == "sdpa":
            return _sdpa(q, k, v, spec, b, s, scale)
        qs, ks, vs, kmajor = ops
        upcast = tuning.interpreting() and qs[0].dtype != torch.float32
        bm, bn, nw, ns = cfg[:4]
        dst = out16 if out16 is not None and ops is main else o
        flash.launch(qs, ks, vs, dst, probs, mask, ml, b, s, h, spec.groups, d, scale,
                     spec.mask_fill, spec.causal, mk, mode, prec, upcast, bm, bn, nw, ns,
                     v_kmajor=kmajor, pipeline="pipeline" in cfg, flag=flag, guard=guard,
                     fma_exp="fma_exp" in cfg)
        return o

    def run_fallback(mode, probs=None, ml=None):
        # float32 operands, launched behind the fp16 path; its programs exit unless the flag is
        # set. Its config is only checked to run (launched unguarded), not tuned.
        if fallback is None:
            return
        cfg = tuning.pick(base_key + ("fallback", mode), _FALLBACK_CONFIGS,
                          lambda c: run(mode, c, probs, ml, fallback, 0))
        run(mode, cfg, probs, ml, fallback, 2)

    f16_cfgs = f16 is not None
    if not spec.return_probs:
        cands = list(_attention_candidates(dt, d, 0, f16_cfgs))
        if _sdpa_ok(spec, dt):
            cands.append("sdpa")
        cfg = tuning.pick(base_key + (0,), cands, lambda c: run(0, c))
        out = run(0, cfg)       # the SDPA candidate returns its own tensor
        if before_fallback is not None:
            before_fallback()
        run_fallback(0)
        return out, None
    probs = torch.empty((b, h, s, s), device=q.device, dtype=dt)
    ml = torch.empty((b * h * s * 2,), device=q.device, dtype=torch.float32)

    def two_pass():
        c1 = tuning.pick(base_key + (1,) + (("fma_exp",) if fma_exp_offered() else ()),
                         _attention_candidates(dt, d, 1, f16_cfgs),
                         lambda c: run(1, c, None, ml))
        run(1, c1, None, ml)        # pass 2 is measured on real statistics
        c2 = tuning.pick(base_key + (2,), _attention_candidates(dt, d, 2, f16_cfgs),
                         lambda c: run(2, c, probs, ml))
        run(2, c2, probs, ml)

    singles = _single_pass_candidates(s)
    if singles:
        c = tuning.pick(base_key + (3,), singles + ["two-pass"],
                        lambda c: two_pass() if c == "two-pass" else run(3, c, probs))
        two_pass() if c == "two-pass" else run(3, c, probs)
    else:
        two_pass()
    if before_fallback is not None:
        before_fallback()
    run_fallback(1, None, ml)
    run_fallback(2, probs, ml)
    return o, probs


def _sdpa(q, k, v, spec, b, s, scale):
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    q4 = q.view(b, s, h, d).transpose(1, 2)
    k4 = k.view(b, s, hk, d).transpose(1, 2)
    v4 = v.view(b, s, hk, d).transpose(1, 2)
    r = F.scaled_dot_product_attention(q4, k4, v4, is_causal=spec.causal, scale=scale,
                                       enable_gqa=spec.groups > 1)
    return r.transpose(1, 2).reshape(b, s, h * d)
