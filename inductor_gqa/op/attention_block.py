"""The fused op ``inductor_gqa::attention_block``: schema, fake (meta) implementation, dispatch.

One call computes a whole attention block: Q/K/V projections (+bias), optional per-head RMSNorm,
optional RoPE, grouped-query attention, optional o_proj. With a K/V cache (``cache`` not "none")
the new k/v join ``past_key``/``past_value`` (a concatenation, or a write at ``cache_position``
into a copy of the buffer) and the queries attend over all of them; this op mutates nothing.
``inductor_gqa::attention_block_write_cache`` is the same block writing a static cache's buffers
in place (a declared mutation). Every static variation is a scalar argument (see
``plan/spec.py``), so one schema covers every variant the matcher accepts.

A float that is a runtime value in the graph (Dynamo keeps float arguments and attributes as 0-d
tensors under ``dynamic=True``) comes in as ``runtime_scale`` / ``runtime_eps`` (and
``runtime_k_eps`` when k's norm has its own, else k uses ``runtime_eps``); the float
``scale`` / ``eps`` are then unused (the matcher sets them to 0.0).

The op's own implementation is the PyTorch reference: on the CPU the pass leaves the op in the
graph and the reference runs; on a GPU the pass lowers each op node to its kernel plan while
Inductor compiles (``lower/``), so no Python of this package runs per call.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..plan.spec import BlockSpec
from .reference import attention_block_reference

OP_NAME = "inductor_gqa::attention_block"

TENSOR_ARGS = ("x", "wq", "wk", "wv", "bq", "bk", "bv", "q_norm_weight", "k_norm_weight", "cos",
                "sin", "inv_freq", "position_ids", "attn_mask", "wo", "bo", "runtime_scale",
                "runtime_eps", "runtime_k_eps", "past_key", "past_value", "cache_position")
_TENSOR_ARGS = TENSOR_ARGS


def _no_probs(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((0,))


@torch.library.custom_op(OP_NAME, mutates_args=())
def attention_block(
    x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
    bq: Optional[torch.Tensor], bk: Optional[torch.Tensor], bv: Optional[torch.Tensor],
    q_norm_weight: Optional[torch.Tensor], k_norm_weight: Optional[torch.Tensor],
    cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],
    inv_freq: Optional[torch.Tensor], position_ids: Optional[torch.Tensor],
    attn_mask: Optional[torch.Tensor], wo: Optional[torch.Tensor], bo: Optional[torch.Tensor],
    runtime_scale: Optional[torch.Tensor], runtime_eps: Optional[torch.Tensor],
    runtime_k_eps: Optional[torch.Tensor], past_key: Optional[torch.Tensor],
    past_value: Optional[torch.Tensor], cache_position: Optional[torch.Tensor],
    num_heads: int, num_kv_heads: int, head_dim: int, norm: str, eps: float, norm_scope: str,
    rope: str, rotary_dim: int, rope_fp32: bool, core: str, scale: float, scale_op: str,
    causal: bool, window: int, softcap: float, mask: str, mask_fill: float, return_probs: bool,
    cache: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    spec = BlockSpec(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, norm=norm,
                     eps=eps, norm_scope=norm_scope, rope=rope, rotary_dim=rotary_dim,
                     rope_fp32=rope_fp32, core=core,
                     scale=scale, scale_op=scale_op, causal=causal, window=window,
                     softcap=softcap, mask=mask, mask_fill=mask_fill, return_probs=return_probs,
                     cache=cache)
    tensors = dict(zip(TENSOR_ARGS, (x, wq, wk, wv, bq, bk, bv, q_norm_weight, k_norm_weight, cos,
                                     sin, inv_freq, position_ids, attn_mask, wo, bo,
                                     runtime_scale, runtime_eps, runtime_k_eps, past_key,
                                     past_value, cache_position)))
    with torch.no_grad():
        out, probs = attention_block_reference(**tensors, spec=spec)
    return out.contiguous(), (probs.contiguous() if return_probs else _no_probs(x))


@attention_block.register_fake
def _fake(x, wq, wk, wv, bq, bk, bv, q_norm_weight, k_norm_weight, cos, sin, inv_freq, position_ids,
      attn_mask, wo, bo, runtime_scale, runtime_eps, runtime_k_eps, past_key, past_value,
      cache_position, num_heads, num_kv_heads, head_dim, norm, eps, norm_scope, rope, rotary_dim,
      rope_fp32, core, scale, scale_op, causal, window, softcap, mask, mask_fill, return_probs,
      cache):
    b, s, _ = x.shape
    width = wo.shape[0] if wo is not None else num_heads * head_dim
    out = x.new_empty((b, s, width))
    keys = s
    if cache == "concat":
        keys = past_key.shape[2] + s
    elif cache == "index_put":
        keys = past_key.shape[2]
    probs = x.new_empty((b, num_heads, s, keys)) if return_probs else _no_probs(x)
    return out, probs


WRITE_OP_NAME = "inductor_gqa::attention_block_write_cache"


def _write_schema() -> str:
    """attention_block's schema with the cache buffers declared as written in place."""
    schema = str(torch.ops.inductor_gqa.attention_block.default._schema)
    schema = schema[schema.index("("):]
    for name, alias in (("past_key", "a"), ("past_value", "b")):
        schema = schema.replace(f"Tensor? {name}", f"Tensor({alias}!) {name}")
    return schema.replace("Tensor? cache_position", "Tensor cache_position")


def _write_cache(*args, **kwargs):
    names = [a.name for a in torch.ops.inductor_gqa.attention_block.default._schema.arguments]
    values = dict(zip(names, args), **kwargs)
    spec = BlockSpec(**{k: values[k] for k in names[len(TENSOR_ARGS):]})
    with torch.no_grad():
        out, probs = attention_block_reference(**{k: values[k] for k in TENSOR_ARGS}, spec=spec,
                                               write_cache=True)
    x = values["x"]
    return out.contiguous(), (probs.contiguous() if spec.return_probs else _no_probs(x))


# The block of a static K/V cache (``cache`` "index_put" or "index_put_prefix") that writes its
# new k/v into the buffers ``past_key``/``past_value`` at ``cache_position`` itself, declared as
# an in-place mutation (functionalization wraps it in ``auto_functionalized``, which Inductor
# reinplaces), then attends over them as ``attention_block`` does.
attention_block_write_cache = torch.library.custom_op(
    WRITE_OP_NAME, _write_cache, mutates_args=("past_key", "past_value"), schema=_write_schema())
attention_block_write_cache.register_fake(_fake)


# the BlockSpec fields, in the schema's order after the tensors
_SCALAR_ARGS = tuple(a.name for a in torch.ops.inductor_gqa.attention_block.default._schema
                     .arguments[len(TENSOR_ARGS):])


def spec_of_args(args) -> BlockSpec:
    """The BlockSpec of the op's full positional argument list (tensors, then its fields)."""
    return BlockSpec(**dict(zip(_SCALAR_ARGS, args[len(TENSOR_ARGS):])))


def call_attention_block(spec: BlockSpec, **tensors):
    """Eager convenience: run the op from a BlockSpec and named tensors (missing ones are None)."""
    unknown = set(tensors) - set(_TENSOR_ARGS)
    if unknown:
        raise TypeError(f"attention_block got unknown tensors {sorted(unknown)}")
    args = [tensors.get(name) for name in _TENSOR_ARGS]
    return torch.ops.inductor_gqa.attention_block(*args, **spec.op_kwargs())
