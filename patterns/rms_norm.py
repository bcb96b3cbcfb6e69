"""Per-head RMSNorm on q or k (over head_dim), in the float32-upcast form.

Recognized (x of a low-precision dtype is upcast; for float32 the casts are absent; a weight of
x's dtype multiplied with the float32 value by type promotion reads as ``w.float()``, which the
canonicalization writes out; rsqrt may be 1/sqrt and the mean sum/n, equal up to rounding):
  fp32_weight:          (xf * rsqrt(mean(xf^2) + eps) * w.float()).to(dtype)
  fp32_one_plus_weight: (xf * rsqrt(mean(xf^2) + eps) * (1 + w.float())).to(dtype)
  cast_weight:          w * (xf * rsqrt(mean(xf^2) + eps)).to(dtype)
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch.fx import Node

from .graph import CASTS, Reject, dtype, is_op, runtime_scalar, scalar, shape

aten = torch.ops.aten


@dataclasses.dataclass
class Norm:
    x: Node
    weight: Node
    style: str
    eps: float
    eps_node: Optional[Node] = None    # a runtime eps (0-d tensor); ``eps`` is then unused


def _inv_sqrt_arg(r: Node) -> Optional[Node]:
    """a if r == rsqrt(a) (or 1 / sqrt(a), equal up to rounding)."""
    if is_op(r, aten.rsqrt.default):
        return r.args[0]
    if is_op(r, aten.reciprocal.default) and is_op(r.args[0], aten.sqrt.default):
        return r.args[0].args[0]
    if is_op(r, aten.div.Tensor) and scalar(r.args[0]) == 1.0 and is_op(r.args[1],
                                                                          aten.sqrt.default):
        return r.args[1].args[0]
    return None


def _last_dim_keepdim(n: Node, dims_at: int = 1) -> bool:
    dims = n.args[dims_at] if len(n.args) > dims_at else None
    keep = n.args[dims_at + 1] if len(n.args) > dims_at + 1 else n.kwargs.get("keepdim", False)
    return dims is not None and list(dims) in ([-1], [len(shape(n.args[0])) - 1]) and bool(keep)


def _mean_of(m: Node) -> Optional[Node]:
    """t if m == t.mean(-1, keepdim=True) (or t.sum(-1, keepdim=True) / n, equal up to
    rounding)."""
    if is_op(m, aten.mean.dim) and _last_dim_keepdim(m):
        return m.args[0]
    if is_op(m, aten.div.Tensor, aten.mul.Tensor) and is_op(m.args[0], aten.sum.dim_IntList):
        sm = m.args[0]
        c = scalar(m.args[1])
        n = shape(sm.args[0])[-1]
        if c is None or not _last_dim_keepdim(sm) or not isinstance(n, int):
            return None
        if (c == n) if is_op(m, aten.div.Tensor) else abs(c * n - 1.0) < 1e-6:
            return sm.args[0]
    return None


def _normalized(n: Node) -> Optional[tuple[Node, float, Optional[Node]]]:
    """(x, eps, eps_node) if n == xf * rsqrt(mean(xf^2, -1, keepdim) + eps), xf = x upcast (or x).
    eps_node is the graph's 0-d tensor when eps is a runtime value, else None."""
    if is_op(n, aten.mul.Tensor):
        pairs = [(xf, _inv_sqrt_arg(r)) for xf, r in (n.args, n.args[::-1])
                 if isinstance(r, Node)]
    elif is_op(n, aten.div.Tensor) and is_op(n.args[1], aten.sqrt.default):
        pairs = [(n.args[0], n.args[1].args[0])]       # xf / sqrt(mean + eps)
    else:
        return None
    for xf, add in pairs:
        if add is None or not is_op(add, aten.add.Tensor, aten.add.Scalar):
            continue
        for mean, eps in (add.args, add.args[::-1]):
            if not isinstance(mean, Node):
                continue
            sq = _mean_of(mean)
            if sq is None:
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
