"""The Inductor pass: find attention blocks, replace each by one fused op.

It runs as a joint-graph custom pass (``torch._inductor.config.joint_custom_pre_pass``): that is
before Inductor's own attention rewrite, so the graph still reads the way the user wrote it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
from typing import Optional

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx import Graph

from . import patterns
from .find import report
from .find.assemble import assemble
from .find.canonical import canonicalize
from .find.graph import Reject
from .find.rewrite import rewrite
from .options import Options
from .patterns.attention_core import anchors

_PACKAGE = pathlib.Path(__file__).parent
_PATTERNS = pathlib.Path(patterns.__file__).parent


def source_hash() -> str:
    """Hash of every source file the pass and the fused op depend on (patterns and kernels too)."""
    h = hashlib.sha256()
    files = sorted(set(_PACKAGE.rglob("*.py")) | set(_PATTERNS.rglob("*.py")))
    for f in files:
        h.update(str(f.relative_to(f.parents[1])).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


_SOURCE_HASH: Optional[str] = None


class AttentionBlockPass(CustomGraphPass):
    """Replaces whole attention blocks by ``inductor_gqa::attention_block``.

    ``chain`` is a pass that was configured before ours; it runs after ours, and our uuid covers it.
    """

    def __init__(self, options: Optional[Options] = None, chain=None):
        self.options = options or Options()
        self.chain = chain          # None, a pass, or a list/tuple of passes (newer Inductor)

    def _chained(self) -> tuple:
        if self.chain is None:
            return ()
        return tuple(self.chain) if isinstance(self.chain, (list, tuple)) else (self.chain,)

    def __call__(self, graph: Graph) -> None:
        run(graph, self.options)
        for p in self._chained():
            p(graph)

    def uuid(self):
        global _SOURCE_HASH
        if _SOURCE_HASH is None:
            _SOURCE_HASH = source_hash()
        chained = []
        for p in self._chained():
            u = p.uuid() if isinstance(p, CustomGraphPass) else None
            if u is None:
                return None   # a chained plain callable cannot be cached safely: bypass
            chained.append(u)
        return ("inductor_gqa", _SOURCE_HASH, repr(dataclasses.astuple(self.options)),
                torch.__version__, tuple(chained))


def _requires_grad(graph: Graph) -> bool:
    return any(n.op == "placeholder" and str(n.target).startswith("tangents") for n in graph.nodes)


def run(graph: Graph, options: Options) -> int:
    """Rewrite every attention block in ``graph``; returns how many were fused."""
    found = anchors(graph)
    if not found:
        return 0
    rep = report.GraphReport()
    if _requires_grad(graph):
        for a in found:
            rep.seen(a)
            rep.rejected(a, "inputs require grad", "the fused op has no backward yet")
        rep.summary()
        return 0
    canonicalize(graph)
    found = anchors(graph)
    fused = 0
    alive = set(graph.nodes)
    for anchor in found:
        if anchor not in alive:
            continue
        rep.seen(anchor)
        try:
            match = assemble(anchor, options)
        except Reject as r:
            rep.rejected(anchor, r.reason, r.detail)
            continue
        rewrite(graph, match)
        graph.eliminate_dead_code()
        alive = set(graph.nodes)
        rep.fused(anchor, match.spec)
        fused += 1
    if fused:
        graph.lint()
    for n in graph.nodes:           # evaluated masks were kept on their nodes for this run only
        for key in [k for k in n.meta if isinstance(k, tuple) and str(k[0]).startswith(
                "inductor_gqa_mask")]:
            del n.meta[key]
    rep.summary()
    return fused
