"""Masks built inside the graph: recognized exactly, or left to the op as a tensor.

A mask that depends on no tensor input (built from sizes: iota/arange, comparisons, triu, full,
the index arithmetic of transformers' mask functions) is evaluated on the CPU. If its value is the
causal pattern, a sliding window of size w on top of it, or no mask at all, the op is told so
(``causal``, ``window``); any other value, or a mask computed from tensor inputs (padding from an
attention_mask, packed sequences from position_ids), is handed to the op as the tensor the graph
computes, which is always exact. A mask is never guessed:

* at a static sequence length the graph runs only at the traced length, where the evaluation is
  the value;
* at a symbolic length it is evaluated at several lengths, and only masks whose integer constants
  are -1, 0 or 1 may be called structured: a window width (a constant or a runtime value) could
  only show beyond the lengths tried, so such a mask stays a tensor input.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Optional

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Node

from .graph import CASTS, VIEWS, is_op, val

aten, prims = torch.ops.aten, torch.ops.prims

_COMPARE = {
    aten.ge.Scalar, aten.gt.Scalar, aten.le.Scalar, aten.lt.Scalar, aten.eq.Scalar, aten.ne.Scalar,
    aten.ge.Tensor, aten.gt.Tensor, aten.le.Tensor, aten.lt.Tensor, aten.eq.Tensor, aten.ne.Tensor,
}
_ARITH = {
    aten.sub.Tensor, aten.add.Tensor, aten.mul.Tensor, aten.sub.Scalar, aten.add.Scalar,
    aten.mul.Scalar, aten.remainder.Scalar, aten.remainder.Tensor, aten.floor_divide.default,
    aten.div.Tensor_mode, aten.neg.default, aten.abs.default, aten.cumsum.default,
}
# Ops a constant mask may be built from (deterministic, size- and index-only).
_BUILDERS = {
    prims.iota.default, aten.arange.default, aten.arange.start, aten.arange.start_step,
    aten.full.default, aten.ones.default, aten.zeros.default, aten.scalar_tensor.default,
    aten.lift_fresh_copy.default, aten.full_like.default, aten.ones_like.default,
    aten.zeros_like.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default,
    aten.expand.default, aten.permute.default, aten.slice.Tensor, aten.select.int,
    aten.index.Tensor, aten.cat.default, aten.clone.default, aten.alias.default,
    aten.where.self, aten.logical_and.default, aten.logical_or.default, aten.logical_not.default,
    aten.bitwise_not.default, aten.bitwise_and.Tensor, aten.bitwise_or.Tensor,
    aten.bitwise_and.Scalar, aten.bitwise_or.Scalar, aten.triu.default, aten.tril.default,
    aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.diff.default,
    *_COMPARE, *_ARITH, *VIEWS, *CASTS,
}
_SYM_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.neg}


@dataclasses.dataclass(frozen=True)
class Pattern:
    """What a constant mask does: causal, a sliding window (0 = none), or nothing; ``finite``:
    its masked scores become a huge finite value (finfo.min), not -inf."""
    causal: bool = False
    window: int = 0
    finite: bool = False

    @property
    def masks_anything(self) -> bool:
        return self.causal or self.window > 0


def _ancestors(node: Node):
    """The node and everything it is computed from, once each."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            yield n
            stack.extend(n.all_input_nodes)


def is_constant_mask(node: Node) -> bool:
    """True when the node's value depends on no tensor input (only sizes and constants)."""
    for n in _ancestors(node):
        if n.op == "placeholder" and isinstance(val(n), torch.Tensor):
            return False
        if n.op not in ("placeholder", "call_function", "get_attr"):
            return False
    return True


_SHAPE_ONLY = {
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.expand.default,
    aten.permute.default, aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
    aten.cat.default, aten.cumsum.default, aten.diff.default, aten.index.Tensor,
    aten.logical_and.default, aten.logical_or.default, aten.logical_not.default,
    aten.bitwise_not.default, aten.bitwise_and.Tensor, aten.bitwise_or.Tensor,
    *VIEWS, *CASTS,
}


def _literals(n: Node) -> list:
    """The numbers an op of a mask computes with (not its dims or the sizes it reshapes to)."""
    if n.target in _SHAPE_ONLY:
        return []
    if n.target is aten.slice.Tensor:
        return list(n.args[2:4])
    if n.target is aten.select.int:
        return list(n.args[2:3])
    if n.target in (aten.full.default, aten.full_like.default):
        return list(n.args[1:2])
    if n.target in (prims.iota.default, aten.arange.default, aten.arange.start,
                    aten.arange.start_step):
        return [v for k, v in n.kwargs.items() if k in ("start", "step")] + list(
            n.args[:-1] if n.target is not aten.arange.default else [])
    return list(n.args) + list(n.kwargs.values())


def _window_like(x) -> bool:
    """An integer literal that could be a window width: beyond -1, 0, 1 (fill values such as
    -inf or finfo.min are not)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return math.isfinite(x) and x == int(x) and 1 < abs(x) < 2 ** 31


def _structure_ok(node: Node, placeholders: set) -> tuple[bool, bool]:
    """(every op is a mask builder, no integer literal could be a window width)."""
    small = True
    for n in _ancestors(node):
        if n.op == "placeholder":
            placeholders.add(n)
            continue
        if n.op == "get_attr":
            continue
        if n.target not in _BUILDERS and n.target not in _SYM_OPS:
            return False, small
        if any(_window_like(a) for a in _literals(n)):
            small = False
    return True, small


def _evaluate(node: Node, env: dict):
    if node in env:
        return env[node]

    def conv(a):
        if isinstance(a, Node):
            return _evaluate(a, env)
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        return a

    if node.op == "get_attr":
        out = node.graph.owning_module
        for part in node.target.split("."):
            out = getattr(out, part)
        out = out.detach().cpu()
    else:
        args = conv(node.args)
        kwargs = {k: (torch.device("cpu") if k == "device" else conv(v))
                  for k, v in node.kwargs.items()}
        out = node.target(*args, **kwargs)
    env[node] = out
    return out


def _values(nodes: list, seq_len):
    """[(S, [value of each node])] at the traced length and, for a symbolic one, a few more.
    None when the masks cannot be called structured (see the module docstring)."""
    placeholders: set = set()
    for node in nodes:
        builders_only, small = _structure_ok(node, placeholders)
        if not builders_only:
            return None
    hint = seq_len if isinstance(seq_len, int) else seq_len.node.hint
    sym_inputs = [p for p in placeholders if isinstance(val(p), torch.SymInt)]
    hints = {p: val(p).node.hint for p in sym_inputs}
    # Vary the sizes that stand for the sequence length; hold the others (batch, say) at their
    # traced value (an unbacked size has none: any positive value will do).
    varying = [p for p in sym_inputs if hint is not None and hints[p] == hint]
    if varying and not all(_structure_ok(node, set())[1] for node in nodes):
        return None
    tries = [hint] + ([1, 2, 3, 5, 17, 64] if varying else [])
    outs = []
    for s in tries:
        env = {p: (s if p in varying else (hints[p] or 2)) for p in sym_inputs}
        try:
            outs.append((s, [torch.as_tensor(_evaluate(n, env)) for n in nodes]))
        except Exception:  # noqa: BLE001 - anything odd: not structured, the tensor goes in
            return None
    return outs


def _keep_matrix(kind: str, value: torch.Tensor, fill, s: int):
    """(keep [S, S] bool, finite) or None: keep is True where a key stays visible."""
    if value.dim() < 2 or value.shape[-1] != s or value.shape[-2] != s:
        return None
    value = value.reshape(-1, s, s)
    if not bool((value == value[:1]).all()):
        return None                         # varies over batch/heads
    value = value[0]
    if kind in ("keep", "fill"):
        if value.dtype != torch.bool or fill is not None and not fill <= -1e30:
            return None
        keep = value if kind == "keep" else ~value
        return keep, fill is not None and fill != float("-inf")
    if not value.dtype.is_floating_point:
        return None
    v = value.float()
    masked = v <= -1e30
    if not bool((v[~masked] == 0).all()):
        return None                         # a bias, not a mask
    return ~masked, bool((v[masked] > float("-inf")).any()) if masked.any() else False


def _window_of(keep: torch.Tensor) -> Optional[int]:
    """-1 when everything is visible, 0 for causal, w for causal with a window w < S, else None."""
    s = keep.shape[-1]
    if bool(keep.all()):
        return -1
    i = torch.arange(s)[:, None]
    j = torch.arange(s)[None, :]
    causal = j <= i
    if torch.equal(keep, causal):
        return 0
    w = int(keep.sum(-1).max())
    if 0 < w < s and torch.equal(keep, causal & (i - j < w)):
        return w
    return None


def _pattern(kind: str, fill, values) -> Optional[Pattern]:
    """The one Pattern that every (S, value) agrees with, else None."""
    seen, finite = [], False
    for s, value in values:
        km = _keep_matrix(kind, value, fill, s)
        if km is None:
            return None
        keep, fin = km
        finite = finite or fin
        w = _window_of(keep)
        if w is None:
            return None
        if s > 1 or len(values) == 1:        # at S=1 causal and no mask look alike
            seen.append((s, w))
    if all(w == -1 for _, w in seen):
        return Pattern()
    if any(w == -1 for _, w in seen):
        return None
    windows = {w for _, w in seen if w > 0}
    if len(windows) > 1:
        return None
    if windows:
        (w,) = windows
        if any(w_s == 0 and s > w for s, w_s in seen):
            return None
        return Pattern(causal=True, window=w, finite=finite)
    return Pattern(causal=True, finite=finite)


def constant_pattern(kind: str, mask: Node, fill, seq_len) -> Optional[Pattern]:
    """The Pattern of a constant mask, or None when the op must take it as a tensor.

    kind: 'keep' (bool, True = attend; ``fill`` the value masked scores get, None for SDPA),
    'fill' (bool, True = score replaced by ``fill``), 'additive' (float, added to the scores).
    """
    if not is_constant_mask(mask):
        return None
    # Every layer of a model reads the same mask node: evaluate it once (at a long sequence the
    # value is large).
    key = ("inductor_gqa_mask_pattern", kind, fill, str(seq_len))
    if key in mask.meta:
        return mask.meta[key]
    with unset_fake_temporarily():   # passes run under a fake mode; we want real values
        values = _values([mask], seq_len)
        pattern = None if values is None else _pattern(kind, fill, [(s, v[0]) for s, v in values])
    mask.meta[key] = pattern
    return pattern


def and_factors(mask: Node) -> list[Node]:
    """The operands of an AND tree (bitwise/logical and, through expand and views), each a node."""
    n = mask
    while is_op(n, aten.expand.default, *VIEWS):
        n = n.args[0]
    if is_op(n, aten.bitwise_and.Tensor, aten.logical_and.default):
        return [f for a in n.args[:2] if isinstance(a, Node) for f in and_factors(a)]
    return [n]


def split_keep_mask(mask: Node, seq_len) -> tuple[Optional[Pattern], Optional[Node]]:
    """A bool keep-mask (True = attend) as (structured part, tensor part).

    The whole mask when constant; otherwise the AND of its constant factors (causal, window)
    and its one factor computed from tensors (padding from a [B, S] attention_mask, say), whose
    AND the op computes exactly. With several tensor factors the whole mask is the tensor part
    (the structured part is kept: the mask implies it); when the constant factors are not
    structured, the whole mask is the tensor part and nothing else."""
    if is_constant_mask(mask):
        p = constant_pattern("keep", mask, None, seq_len)
        return (p, None) if p is not None else (None, mask)
    factors = and_factors(mask)
    const = [f for f in factors if is_constant_mask(f)]
    data = [f for f in factors if not is_constant_mask(f)]
    if not const:
        return None, mask
    key = ("inductor_gqa_mask_factors", str(seq_len))
    if key not in mask.meta:
        with unset_fake_temporarily():
            values = _values(const, seq_len)
            mask.meta[key] = None if values is None else _pattern("keep", None, [
                (s, functools.reduce(torch.logical_and, torch.broadcast_tensors(*vs)))
                for s, vs in values])
    pattern = mask.meta[key]
    if pattern is None:
        return None, mask
    if len(data) == 1 and val(data[0]).dtype == torch.bool and val(data[0]).dim() <= 4:
        return pattern, data[0]
    return pattern, mask
