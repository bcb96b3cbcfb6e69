"""The Inductor pass: find attention blocks, decide each one's kernel plan, lower it.

It runs as a joint-graph custom pass (``torch._inductor.config.joint_custom_pre_pass``): that is
before Inductor's own attention rewrite, so the graph still reads the way the user wrote it.
Per block: find (``find/``), plan (``plan/``: the kernels and their configs, or the reason none
applies, in which case the block stays as the user wrote it), rewrite into one
``inductor_gqa::attention_block`` node, and on a GPU lower that node to the plan's kernels
(``lower/``). On the CPU the node stays and runs the PyTorch reference.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx import Graph

from . import tune
from .find import report
from .find.assemble import assemble
from .find.cache_write import write_into_cache
from .find.canonical import canonicalize
from .find.rewrite import rewrite
from .lower import expand
from .lower.emit import emit_core, emit_core_backward
from .lower.splice import replace_call
from .lower.training import check_core
from .op.attention_core import (BWD_TENSORS, FWD_TENSORS, N_BWD_TENSORS, N_FWD_TENSORS,
                                spec_of_core_args)
from .options import Options
from .patterns.attention_core import anchors, is_candidate
from .patterns.graph import NotAttention, Reject
from .plan.plans import Problem, Unsupported, choose, choose_core, core_problem
from .plan.source import cached_source_hash


class AttentionBlockPass(CustomGraphPass):
    """Replaces whole attention blocks by ``inductor_gqa::attention_block``.

    ``chain`` is a pass that was configured before ours; it runs after ours, and our uuid covers it.
    """

    def __init__(self, options: Optional[Options] = None, chain=None,
                 before_autograd: bool = False):
        self.options = options or Options()
        self.chain = chain          # None, a pass, or a list/tuple of passes (newer Inductor)
        # the backend already fused this compilation's blocks before AOTAutograd (a graph with
        # inputs that require grad, before_autograd.py): in the joint graph, only lower
        # the core calls put there and their backward calls
        self.before_autograd = before_autograd
        self.ran = False            # whether Inductor called it (not on an FX graph cache hit)

    def _chained(self) -> tuple:
        if self.chain is None:
            return ()
        return tuple(self.chain) if isinstance(self.chain, (list, tuple)) else (self.chain,)

    def __call__(self, graph: Graph) -> None:
        self.ran = True
        if self.before_autograd and _requires_grad(graph):
            lower_fused_calls(graph, self.options)
        else:
            run(graph, self.options)
        for p in self._chained():
            p(graph)

    def uuid(self):
        chained = []
        for p in self._chained():
            u = p.uuid() if isinstance(p, CustomGraphPass) else None
            if u is None:
                return None   # a chained plain callable cannot be cached safely: bypass
            chained.append(u)
        # the float32 matmul precision decides plans (TF32 or not), so it keys the cache too
        return ("inductor_gqa", cached_source_hash(), repr(dataclasses.astuple(self.options)),
                self.before_autograd, torch.__version__, torch.get_float32_matmul_precision(),
                tuple(chained))


def _has_kernels(x, options: Options) -> bool:
    """Whether a block on x's device is lowered to kernels (on the CPU only in the interpreter
    tests, ``cpu_kernels``); otherwise the op stays and runs its reference."""
    return x.device.type != "cpu" or options.cpu_kernels


def _requires_grad(graph: Graph) -> bool:
    return any(n.op == "placeholder" and str(n.target).startswith("tangents") for n in graph.nodes)


def run(graph: Graph, options: Options, lower: bool = True) -> int:
    """Rewrite every attention block in ``graph``; returns how many were fused. ``lower=False``
    (a graph before autograd): blocks become op calls, not lowered, which lower/training.py
    then writes in their training form; only their core needs kernels (``check_core``)."""
    found = anchors(graph)
    if not found:
        return 0
    rep = report.GraphReport()
    if _requires_grad(graph):
        for a in found:
            if not is_candidate(a):
                rep.not_attention(a, "softmax not followed by @ v")
                continue
            rep.rejected(a, "inputs require grad", "the backward is already derived here: "
                         "compile with backend=\"inductor_gqa\" (fuse_with_grad, the default), "
                         "or call under torch.no_grad()")
        rep.summary()
        return 0
    canonicalize(graph)
    found = anchors(graph)
    fused = 0
    alive = set(graph.nodes)
    for anchor in found:
        if anchor not in alive:
            continue
        try:
            match = assemble(anchor, options)
        except NotAttention as r:
            rep.not_attention(anchor, r.reason)
            continue
        except Reject as r:
            rep.rejected(anchor, r.reason, r.detail)
            continue
        if not lower and match.spec.cache != "none":
            rep.rejected(anchor, "kv cache with gradients", "the training form attends over "
                         "its own k/v only: call under torch.no_grad()")
            continue
        values = match_values(match)
        plan = None
        if _has_kernels(values["x"], options):
            try:
                if lower:
                    plan = plan_for(match.spec, values, options)
                else:       # the training form: only its core is ours
                    check_core(match.spec, values, options)
            except Unsupported as u:
                rep.rejected(anchor, "no kernel plan", u.reason)
                continue
        call = rewrite(graph, match)
        if plan is not None and lower:
            expand(graph, call, plan, match.spec)
        elif match.spec.cache.startswith("index_put"):
            graph.eliminate_dead_code()
            write_into_cache(graph, call, match.cache)
        graph.eliminate_dead_code()
        alive = set(graph.nodes)
        rep.fused(anchor, match.spec, plan)
        fused += 1
    if fused:
        graph.lint()
    for n in graph.nodes:           # evaluated masks were kept on their nodes for this run only
        for key in [k for k in n.meta if isinstance(k, tuple) and str(k[0]).startswith(
                "inductor_gqa_mask")]:
            del n.meta[key]
    rep.summary()
    return fused


def lower_fused_calls(graph: Graph, options: Options) -> int:
    """Lower the op calls put into ``graph`` before autograd (the differentiable cores of blocks
    with gradients and their backward calls, lower/training.py) to their kernels; on the CPU,
    without ``cpu_kernels``, they stay and run the reference. Returns how many."""
    lowered = 0
    ops = ((torch.ops.inductor_gqa.attention_core.default, N_FWD_TENSORS, FWD_TENSORS,
            emit_core),
           (torch.ops.inductor_gqa.attention_core_backward.default, N_BWD_TENSORS, BWD_TENSORS,
            emit_core_backward))
    for op, n, names, emitter in ops:
        for call in list(graph.find_nodes(op="call_function", target=op)):
            spec = spec_of_core_args(call.args, n)
            values = {name: (a.meta["val"] if isinstance(a, torch.fx.Node) else a)
                      for name, a in zip(names, call.args)}
            if not _has_kernels(values["q"], options):
                continue
            try:
                plan = choose_core(spec, core_problem(values["q"], values["attn_mask"]),
                                   options, runtime_scale=values["runtime_scale"] is not None)
            except Unsupported:
                continue        # the forward and its backward refuse alike: both run the reference
            replace_call(graph, call, names,
                         lambda t, plan=plan, spec=spec, emitter=emitter: emitter(plan, spec, t))
            lowered += 1
    if lowered:
        graph.eliminate_dead_code()
        graph.lint()
    return lowered


def plan_for(spec, values: dict, options):
    """The block's kernel plan: measured for its shape while compiling under max-autotune (or
    ``Options.autotune``), else from the GPU's config table."""
    problem = Problem.of(spec, values)
    plan = choose(spec, problem, options)       # raises Unsupported first, before any tuning
    if tune.autotune_enabled(options) and spec.cache == "none":
        plan = tune.plan_block(spec, problem, values, options) or plan
    return plan


def match_values(match) -> dict:
    """The fake values of a match's op inputs by name (row slices of fused weights sliced)."""
    out = {}
    for name, value in match.tensors.items():
        if isinstance(value, tuple):        # rows of a fused weight (find/rewrite.py's _rows)
            src, start, end, *grouped = value
            v = src.meta["val"]
            if grouped:
                groups, stride = grouped
                v = v.view(groups, stride, *v.shape[1:])[:, start:end].reshape(
                    groups * (end - start), *v.shape[1:])
                value = v
            else:
                value = v[start:end]
        elif isinstance(value, torch.fx.Node):
            value = value.meta["val"]
        out[name] = value
    return out
