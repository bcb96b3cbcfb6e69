"""The differentiable attention core of a block with gradients: ``inductor_gqa::attention_core``
and its backward ``inductor_gqa::attention_core_backward``.

A block whose inputs require grad is not one fused call: its projections, norm and RoPE stay
ATen ops (AOTAutograd differentiates them, Inductor generates their kernels and the weight
gradients' GEMMs), and only the attention between them is ours (``lower/training.py``). The
core's forward returns, beside the output, the row statistics of its softmax; the backward reads
them with q, k, v and o (FlashAttention-2: the probabilities are recomputed tile by tile, no
S x S tensor is saved, and dK/dV are summed over each KV head's query heads without forming
repeat_kv). On a GPU both ops are lowered to flash.py / flash_bwd.py launches; elsewhere their
implementations are the PyTorch reference (the backward: the reference's own vector-Jacobian
product, so eager's numerics and NaN patterns exactly).

Layouts: q [B, S, H*D], k and v [B, S, Hkv*D] (the projections' rows), o [B, S, H*D] (o_proj's
operand), probs [B, H, S, S] (only with ``return_probs``, else an empty tensor), stats
[B*H*S*2] float32: per (b, h, i) row the maximum and the sum of exp2 of the scaled scores in
log2 units (flash.py's ``ml``).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..plan.spec import BlockSpec
from . import reference

FWD_NAME = "inductor_gqa::attention_core"
BWD_NAME = "inductor_gqa::attention_core_backward"

# the BlockSpec fields the core reads; the op schemas carry exactly these, in this order
CORE_FIELDS = ("num_heads", "num_kv_heads", "head_dim", "core", "scale", "scale_op", "causal",
               "window", "softcap", "mask", "mask_fill", "return_probs")


def core_spec(spec: BlockSpec) -> BlockSpec:
    """The block's spec without what happens before the core (norm, RoPE)."""
    return BlockSpec(**{f: getattr(spec, f) for f in CORE_FIELDS})


def core_kwargs(spec: BlockSpec) -> dict:
    return {f: getattr(spec, f) for f in CORE_FIELDS}


def spec_of_core_args(args, n_tensors: int) -> BlockSpec:
    """The spec of a core op node's positional arguments (``n_tensors`` tensors first)."""
    return BlockSpec(**dict(zip(CORE_FIELDS, args[n_tensors:])))


def _heads(t: torch.Tensor, n: int, d: int) -> torch.Tensor:
    b, s, _ = t.shape
    return t.view(b, s, n, d).transpose(1, 2)


def _rows(t: torch.Tensor) -> torch.Tensor:
    b, n, s, d = t.shape
    return t.transpose(1, 2).reshape(b, s, n * d)


def _forward(q, k, v, attn_mask, runtime_scale, spec: BlockSpec):
    """(o rows, probs [B, H, S, S] or None) by the reference."""
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    o, p = reference.attention_core(_heads(q, h, d), _heads(k, hk, d), _heads(v, hk, d),
                                    attn_mask, spec, runtime_scale)
    return _rows(o), p


def row_stats(q, k, attn_mask, runtime_scale, spec: BlockSpec) -> torch.Tensor:
    """flash.py's ``ml`` for these inputs, computed in float32 by PyTorch: scores scaled (and
    capped) in log2 units, masks in the eager order, then per row the max and sum of exp2."""
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    qh = _heads(q, h, d).float()
    kh = reference._repeat_kv(_heads(k, hk, d).float(), spec.groups)
    s = qh @ kh.transpose(2, 3)
    scale = spec.effective_scale(None if runtime_scale is None else float(runtime_scale))
    s = s * scale
    if spec.softcap:
        s = torch.tanh(s / spec.softcap) * spec.softcap
    if spec.causal or spec.window:
        keep = reference._structure_keep(s.shape[-2], s.shape[-1], spec, s.device)
        s = s.masked_fill(~keep, float("-inf"))
    if spec.mask == "bool_fill":
        s = s.masked_fill(attn_mask, spec.mask_fill)
    elif spec.mask == "bool_keep":
        s = s.masked_fill(~attn_mask, float("-inf"))
    elif spec.mask == "additive":
        s = s + attn_mask.float()
    fmax = torch.finfo(torch.float32).max
    t = torch.where(s.isinf(), s, (s * math.log2(math.e)).clamp(-fmax, fmax))
    m = t.amax(-1)
    m_use = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    total = torch.exp2(t - m_use[..., None]).sum(-1)
    return torch.stack((m, total), -1).reshape(-1)


def ml_of_lse(lse: torch.Tensor) -> torch.Tensor:
    """The statistics of a forward that gives the natural log-sum-exp of its scaled scores
    ([B, H, S] float32, the library's fused attention): per row the base-2 log-sum-exp as the
    maximum and 1 as the sum, which the backward reads as exp2(t - lse) exactly as from
    (max, sum). Only for rows that keep a key (the library's cores here have no mask tensor)."""
    lse2 = lse.reshape(-1).float() * math.log2(math.e)
    return torch.stack((lse2, torch.ones_like(lse2)), -1).reshape(-1)


@torch.library.custom_op(FWD_NAME, mutates_args=())
def attention_core(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Optional[torch.Tensor],
    runtime_scale: Optional[torch.Tensor], num_heads: int, num_kv_heads: int, head_dim: int,
    core: str, scale: float, scale_op: str, causal: bool, window: int, softcap: float, mask: str,
    mask_fill: float, return_probs: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    spec = BlockSpec(**{f: v for f, v in locals().items() if f in CORE_FIELDS})  # the scalars
    with torch.no_grad():
        o, p = _forward(q, k, v, attn_mask, runtime_scale, spec)
        stats = row_stats(q, k, attn_mask, runtime_scale, spec)
    probs = p.contiguous() if return_probs else q.new_empty((0,))
    return o.contiguous(), probs, stats


@attention_core.register_fake
def _(q, k, v, attn_mask, runtime_scale, num_heads, num_kv_heads, head_dim, core, scale,
      scale_op, causal, window, softcap, mask, mask_fill, return_probs):
    b, s, _ = q.shape
    o = q.new_empty((b, s, num_heads * head_dim))
    probs = q.new_empty((b, num_heads, s, s)) if return_probs else q.new_empty((0,))
    return o, probs, q.new_empty((b * num_heads * s * 2,), dtype=torch.float32)


@torch.library.custom_op(BWD_NAME, mutates_args=())
def attention_core_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, stats: torch.Tensor,
    grad_o: torch.Tensor, probs: Optional[torch.Tensor], grad_probs: Optional[torch.Tensor],
    attn_mask: Optional[torch.Tensor], runtime_scale: Optional[torch.Tensor], num_heads: int,
    num_kv_heads: int, head_dim: int, core: str, scale: float, scale_op: str, causal: bool,
    window: int, softcap: float, mask: str, mask_fill: float, return_probs: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in q's, k's and v's layouts. The reference: the vector-Jacobian product of
    the reference forward (``o``, ``stats`` and ``probs`` are the kernels' inputs, unused
    here)."""
    spec = BlockSpec(**{f: v for f, v in locals().items() if f in CORE_FIELDS})  # the scalars

    def fwd(q_, k_, v_):
        o_, p_ = _forward(q_, k_, v_, attn_mask, runtime_scale, spec)
        return (o_, p_) if grad_probs is not None else (o_,)

    _, vjp = torch.func.vjp(fwd, q, k, v)
    seeds = (grad_o, grad_probs) if grad_probs is not None else (grad_o,)
    dq, dk, dv = vjp(seeds)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@attention_core_backward.register_fake
def _(q, k, v, o, stats, grad_o, probs, grad_probs, attn_mask, runtime_scale, *scalars):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


FWD_TENSORS = ("q", "k", "v", "attn_mask", "runtime_scale")
BWD_TENSORS = ("q", "k", "v", "o", "stats", "grad_o", "probs", "grad_probs", "attn_mask",
               "runtime_scale")
N_FWD_TENSORS = len(FWD_TENSORS)
N_BWD_TENSORS = len(BWD_TENSORS)


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, runtime_scale = inputs[:N_FWD_TENSORS]
    o, probs, stats = output
    ctx.spec = spec_of_core_args(inputs, N_FWD_TENSORS)
    keep_probs = probs if ctx.spec.return_probs else None
    ctx.save_for_backward(q, k, v, attn_mask, runtime_scale, o, stats, keep_probs)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_o, grad_probs, grad_stats):
    q, k, v, attn_mask, runtime_scale, o, stats, probs = ctx.saved_tensors
    spec = ctx.spec
    nig = ctx.needs_input_grad
    grads: list = [None] * (N_FWD_TENSORS + len(CORE_FIELDS))
    if not any(nig[:3]) and not any(nig[3:N_FWD_TENSORS]):
        return tuple(grads)
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    if any(nig[3:N_FWD_TENSORS]):
        # a mask or a runtime scale that needs a gradient: the kernels give none, so the
        # reference is differentiated whole (recomputed, S x S tensors included)
        return _reference_backward(ctx, q, k, v, attn_mask, runtime_scale, grad_o, grad_probs)
    dq, dk, dv = torch.ops.inductor_gqa.attention_core_backward(
        q, k, v, o, stats, grad_o, probs if grad_probs is not None else None, grad_probs,
        attn_mask, runtime_scale, **core_kwargs(spec))
    grads[:3] = [dq if nig[0] else None, dk if nig[1] else None, dv if nig[2] else None]
    return tuple(grads)


def _reference_backward(ctx, q, k, v, attn_mask, runtime_scale, grad_o, grad_probs):
    spec = ctx.spec
    nig = ctx.needs_input_grad
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(nig[i]) if t is not None else None
                  for i, t in enumerate((q, k, v, attn_mask, runtime_scale))]
        o, p = _forward(*leaves, spec)
        outs, seeds = [o], [grad_o]
        if grad_probs is not None:
            outs.append(p)
            seeds.append(grad_probs)
        want = [i for i, t in enumerate(leaves) if t is not None and nig[i]]
        got = torch.autograd.grad(outs, [leaves[i] for i in want], seeds, allow_unused=True)
    grads: list = [None] * (N_FWD_TENSORS + len(CORE_FIELDS))
    for i, g in zip(want, got):
        grads[i] = g
    return tuple(grads)


attention_core.register_autograd(_backward, setup_context=_setup_context)


def call_attention_core(q, k, v, attn_mask, runtime_scale, spec: BlockSpec):
    """(o, probs or an empty tensor, stats) for the core of ``spec``."""
    return torch.ops.inductor_gqa.attention_core(q, k, v, attn_mask, runtime_scale,
                                                 **core_kwargs(spec))
