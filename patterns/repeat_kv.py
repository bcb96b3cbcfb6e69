"""repeat_kv: K/V heads shared by groups of query heads.

Recognized: ``k[:, :, None].expand(B, Hkv, n, S, D).reshape(B, Hkv*n, S, D)`` (Hugging Face's
repeat_kv) and ``repeat_interleave(n, dim=1)``, which decompose to the same ops; or no repeat at all
(MHA, or SDPA with enable_gqa / native GQA). ``repeat`` (tiling) would pair the wrong heads and is
left alone.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from .graph import VIEWS, Reject, is_op, same, shape

aten = torch.ops.aten


def _skip_full_slices(n: Node) -> Node:
    """``k[:, :, None]`` traces to slices that keep everything around the unsqueeze."""
    while is_op(n, aten.slice.Tensor) and same(shape(n)[n.args[1]], shape(n.args[0])[n.args[1]]):
        n = n.args[0]
    return n


def strip_repeat_kv(node: Node) -> tuple[Node, int]:
    """(k before the repeat [B, Hkv, S, D], n_rep). n_rep is 1 when there is no repeat."""
    n = node
    if is_op(n, *VIEWS):
        src = n.args[0]
        if is_op(src, aten.clone.default):
            src = src.args[0]
        if is_op(src, aten.expand.default) and len(shape(src)) == 5:
            un = _skip_full_slices(src.args[0])
            b, hkv, rep, s, d = shape(src)
            if not (is_op(un, aten.unsqueeze.default) and un.args[1] in (2, -3)):
                raise Reject("repeat_kv not recognized", "expand is not over a new dim 2")
            base = _skip_full_slices(un.args[0])
            out = shape(n)
            if not (len(out) == 4 and same(out[1], hkv * rep) and same(out[2], s)):
                raise Reject("repeat_kv not recognized", f"reshape to {out}")
            return base, int(rep)
    if is_op(n, aten.repeat_interleave.self_int):
        raise Reject("repeat_kv not recognized", "repeat_interleave was not decomposed")
    return n, 1
