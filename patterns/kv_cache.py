"""The K/V cache a block writes its new keys and values into before attending ([B, Hkv, *, D]).

Recognized, on k and on v alike (each after RoPE/norm, as the attention reads them):

* ``cat((past, new), dim=-2)``: transformers' DynamicCache (and its sliding-window layers, which
  attend over the whole concatenation and keep a slice of it);
* ``index_put(buffer, [None, None, positions], new)``: a StaticCache's ``index_copy_(2,
  positions, new)`` as Inductor's decompositions write it (``index_copy`` itself too), and the
  sliding-window StaticCache's ``buffer.roll(-1, -2)[:, :, index] = new`` (its buffer is then the
  rolled copy, copied back into the buffer); also its first S slots only, S the query length
  (``index_put_prefix``: a StaticCache's prefill without a mask, where transformers' SDPA path
  attends causally over the slots the prompt fills).

The fused op computes the same keys from ``past`` and the block's own new k/v. The concatenation
the model keeps stays computed by the graph; a static buffer is written by the op itself
(``find/cache_write.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch.fx import Node

from .graph import Reject, is_op, same, shape

aten = torch.ops.aten


@dataclasses.dataclass
class Cache:
    kind: str                    # "concat" | "index_put" | "index_put_prefix" (BlockSpec.cache)
    past: Node                   # [B, Hkv, P, D]: the keys before this block's, or the buffer
    new: Node                    # [B, Hkv, S, D]: the block's own keys
    positions: Optional[Node]    # index_put: the positions [S] the new keys are written at
    written: Optional[Node] = None   # index_put: the whole buffer after the write


def match_cache(node: Node, queries=None) -> Optional[Cache]:
    """The cache form of the keys (or values) ``node`` attends over, None when it is not one;
    ``queries``: the query length (a slice of the written buffer to it is recognized)."""
    written = node
    if is_op(node, aten.copy.default) and shape(node) == shape(node.args[1]) and (
            node.meta["val"].dtype == node.args[1].meta["val"].dtype):
        # the functional form of ``buffer.copy_(written)``: its value is ``written``
        node = node.args[1]
    if is_op(node, aten.slice.Tensor) and queries is not None:
        src, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
        start = node.args[2] if len(node.args) > 2 else 0
        end = node.args[3] if len(node.args) > 3 else None
        step = node.args[4] if len(node.args) > 4 else 1
        if dim in (2, -2) and start == 0 and step == 1 and len(shape(node)) == 4 and same(
                shape(node)[2], queries) and not same(shape(src)[2], queries):
            inner = match_cache(src)
            if inner is not None and inner.kind == "index_put":
                return Cache("index_put_prefix", inner.past, inner.new, inner.positions,
                             inner.written)
        return None
    if is_op(node, aten.cat.default):
        parts = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if len(parts) != 2 or len(shape(node)) != 4 or dim not in (-2, 2):
            return None
        past, new = parts
        if len(shape(past)) != 4:
            return None
        _check(past, new)
        return Cache("concat", past, new, None)
    if is_op(node, aten.index_put.default):
        buf, indices, new = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if accumulate or len(shape(buf)) != 4 or len(indices) != 3 or indices[0] is not None \
                or indices[1] is not None or not isinstance(indices[2], Node):
            return None
        positions = indices[2]
        if len(shape(positions)) != 1 or positions.meta["val"].dtype not in (torch.int64,
                                                                              torch.int32):
            return None
        if len(shape(new)) != 4 or not same(shape(new)[2], shape(positions)[0]):
            raise Reject("kv cache not recognized", "values written at positions of another "
                         "shape")
        _check(buf, new)
        return Cache("index_put", buf, new, positions, written)
    if is_op(node, aten.index_copy.default):
        buf, dim, positions, new = node.args[:4]
        if dim not in (2, -2) or len(shape(buf)) != 4 or len(shape(positions)) != 1:
            return None
        _check(buf, new)
        return Cache("index_put", buf, new, positions, written)
    return None


def _check(past: Node, new: Node) -> None:
    ps, ns = shape(past), shape(new)
    if len(ns) != 4 or not (same(ps[0], ns[0]) and same(ps[1], ns[1]) and same(ps[3], ns[3])):
        raise Reject("kv cache not recognized", f"cache {ps} and new keys {ns} disagree")
    if past.meta["val"].dtype != new.meta["val"].dtype:
        raise Reject("mixed dtypes", "the K/V cache and the new keys differ in dtype")
