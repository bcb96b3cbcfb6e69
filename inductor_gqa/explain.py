"""``explain``: which attention blocks of a model are fused, and why the others are not.

    from inductor_gqa.explain import explain
    print(explain(model, input_ids, attention_mask=mask))      # or: python -m inductor_gqa explain

The model is compiled on the CPU with ``light_backend``: Dynamo and AOTAutograd produce the same
graph that Inductor's joint-graph passes see, our pass rewrites it, and the result runs eagerly
(the fused op runs its reference). The pass sees exactly what it sees under
``backend="inductor_gqa"``, in a fraction of the compile time.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from . import before_autograd
from .find import report
from .graph_pass import lower_fused_calls, run
from .options import Options, as_options


def light_backend(options=None):
    """A torch.compile backend: AOTAutograd with Inductor's decompositions, our pass on the
    forward graph, then eager execution of the rewritten graph. Inputs that require grad: the
    blocks are fused before AOTAutograd as by the real backend (before_autograd.py)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    opts = as_options(options) or Options()

    def compile_inference(gm: torch.fx.GraphModule, example_inputs):
        if run(gm.graph, opts):
            gm.recompile()
        return gm

    def compile_forward(gm: torch.fx.GraphModule, example_inputs):
        # a training forward or backward: only the core calls put there before autograd are
        # lowered, as in the real backend's joint graph
        if lower_fused_calls(gm.graph, opts):
            gm.recompile()
        return gm

    aot = aot_autograd(fw_compiler=compile_forward, bw_compiler=compile_forward,
                       inference_compiler=compile_inference, decompositions=select_decomp_table())

    def backend(gm: torch.fx.GraphModule, example_inputs):
        # counted once compiled, as by the real backend: a graph that fails here (and which
        # Dynamo splits at a graph break and retries) counts nothing
        with report.deferred():
            fused = (before_autograd.fuse_before_autograd(gm, example_inputs, opts)
                     if before_autograd.applies(gm, example_inputs, opts) else None)
            return aot(fused if fused is not None else gm, example_inputs)

    return backend


@dataclasses.dataclass
class Explanation:
    rows: list                 # report.Row, one per attention-like block, in graph order
    output: object = None      # what the compiled call returned

    @property
    def fused(self) -> int:
        return sum(r.fused for r in self.rows)

    @property
    def left(self) -> list:
        return [r for r in self.rows if not r.fused]

    def table(self) -> str:
        width = max([len(r.block) for r in self.rows] + [5])
        lines = [f"{'block':<{width}}  result  details"]
        for r in self.rows:
            if r.fused:
                lines.append(f"{r.block:<{width}}  fused   {_spec_summary(r.spec)}")
            else:
                why = r.reason + (f" ({r.detail})" if r.detail else "")
                lines.append(f"{r.block:<{width}}  left    {why}")
        lines.append(f"fused {self.fused} of {len(self.rows)} attention blocks; "
                     f"{len(self.left)} left")
        return "\n".join(lines)

    __str__ = table


def _spec_summary(spec) -> str:
    """The facts of a BlockSpec that tell blocks apart, in a few words."""
    if spec is None:
        return ""
    parts = [spec.core, f"{spec.num_heads}/{spec.num_kv_heads} heads x {spec.head_dim}"]
    if spec.norm != "none":
        parts.append(f"norm {spec.norm}" + (" over the projection" if spec.norm_scope == "proj"
                                             else ""))
    if spec.rope != "none":
        parts.append(f"rope {spec.rope}/{spec.rotary_dim}")
    if spec.causal:
        parts.append("causal")
    if spec.window:
        parts.append(f"window {spec.window}")
    if spec.softcap:
        parts.append(f"softcap {spec.softcap:g}")
    if spec.mask != "none":
        parts.append(f"mask {spec.mask}")
    if spec.return_probs:
        parts.append("returns probabilities")
    return ", ".join(parts)


def explain(fn, *args, options=None, dynamic: Optional[bool] = None, **kwargs) -> Explanation:
    """Compile ``fn`` (a module or function) on the CPU, call it once with the given arguments
    under ``torch.no_grad()``, and report every attention-like block: fused, or left with the
    reason. Dynamo's caches are reset first, so the pass sees every graph."""
    torch._dynamo.reset()
    report.history.clear()
    with torch._inductor.config.patch(fx_graph_cache=False), torch.no_grad():
        compiled = torch.compile(fn, backend=light_backend(options), dynamic=dynamic)
        out = compiled(*args, **kwargs)
    rows = list(report.history)
    report.history.clear()
    return Explanation(rows, out)
