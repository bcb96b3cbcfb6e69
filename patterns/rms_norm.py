"""Per-head RMSNorm on q or k (over head_dim), in the float32-upcast form.

Recognized (x of a low-precision dtype is upcast; for float32 the casts are absent):
  fp32_weight:          (xf * rsqrt(mean(xf^2) + eps) * w.float()).to(dtype)
  fp32_one_plus_weight: (xf * rsqrt(mean(xf^2) + eps) * (1 + w.float())).to(dtype)
  cast_weight:          w * (xf * rsqrt(mean(xf^2) + eps)).to(dtype)
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch.fx import Node

from inductor_gqa.find.graph import CASTS, Reject, dtype, is_op, runtime_scalar, scalar, shape

aten = torch.ops.aten


@dataclasses.dataclass
class Norm:
    x: Node
    weight: Node
    style: str
    eps: float
    eps_node: Optional[Node] = None    # a runtime eps (0-d tensor); ``eps`` is then unused


def _normalized(n: Node) -> Optional[tuple[Node, float, Optional[Node]]]:
    """(x, eps, eps_node) if n == xf * rsqrt(mean(xf^2, -1, keepdim) + eps), xf = x upcast (or x).
    eps_node is the graph's 0-d tensor when eps is a runtime value, else None."""
    if not is_op(n, aten.mul.Tensor):
        return None
    for xf, r in (n.args, n.args[::-1]):
        if not (isinstance(r, Node) and is_op(r, aten.rsqrt.default)):
            continue
        add = r.args[0]
        if not is_op(add, aten.add.Tensor, aten.add.Scalar):
            continue
        for mean, eps in (add.args, add.args[::-1]):
            if not is_op(mean, aten.mean.dim):
                continue
            sq = mean.args[0]
            if list(mean.args[1]) not in ([-1], [len(shape(sq)) - 1]) or not (
                    len(mean.args) > 2 and mean.args[2]):
                continue
            ok_sq = (is_op(sq, aten.pow.Tensor_Scalar) and sq.args[0] is xf and sq.args[1] == 2) or (
                is_op(sq, aten.mul.Tensor) and sq.args[0] is xf and sq.args[1] is xf)
            if not ok_sq:
                continue
            eps_v, eps_node = scalar(eps), None
            if eps_v is None:
                eps_node = runtime_scalar(eps)
                if eps_node is None:
                    raise Reject("rms_norm eps is a runtime value", "not a 0-d tensor")
                eps_v = 0.0                    # placeholder: the op reads eps_node
            x = xf.args[0] if is_op(xf, *CASTS) else xf
            if dtype(xf) != torch.float32:
                return None
            return x, eps_v, eps_node
    return None


def _fp32(w: Node) -> Optional[Node]:
    if is_op(w, *CASTS) and dtype(w) == torch.float32:
        return w.args[0]
    return w if dtype(w) == torch.float32 else None


def match_rms_norm(node: Node) -> Optional[Norm]:
    out_dtype = dtype(node)
    inner = node.args[0] if is_op(node, *CASTS) else node
    # fp32 weight forms: mul(normalized, w_f32) [then cast]
    if is_op(inner, aten.mul.Tensor):
        for a, b in (inner.args, inner.args[::-1]):
            if not isinstance(b, Node) or not isinstance(a, Node):
                continue
            nx = _normalized(a)
            if nx is not None and dtype(inner) == torch.float32:
                x, eps, eps_node = nx
                if dtype(x) != out_dtype:
                    raise Reject("mixed dtypes", "norm output dtype differs from its input")
                if is_op(b, aten.add.Tensor, aten.add.Scalar) and scalar(b.args[1]) == 1.0:
                    w = _fp32(b.args[0])
                    if w is not None:
                        return Norm(x, w, "fp32_one_plus_weight", eps, eps_node)
                w = _fp32(b)
                if w is not None and len(shape(w)) == 1:
                    return Norm(x, w, "fp32_weight", eps, eps_node)
            # cast_weight: w * normalized.to(dtype)
            if is_op(a, *CASTS) and node is inner:
                nx = _normalized(a.args[0])
                if nx is not None and dtype(b) == out_dtype and len(shape(b)) == 1:
                    x, eps, eps_node = nx
                    if dtype(x) != out_dtype:
                        raise Reject("mixed dtypes", "norm weight dtype differs from q/k")
                    return Norm(x, b, "cast_weight", eps, eps_node)
    return None
