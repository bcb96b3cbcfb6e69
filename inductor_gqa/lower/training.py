"""Blocks with gradients: each fused call, before AOTAutograd, becomes the block's training form.

The training form is the block as ATen ops, except its attention core: projections (+bias),
norm and RoPE written as the reference writes them (op/reference.py), so AOTAutograd derives
their backward and Inductor generates their kernels and the weight gradients' GEMMs; then the
core as ``inductor_gqa::attention_core`` (op/attention_core.py), whose backward is one op
lowered to flash_bwd.py's kernels; then o_proj. What the forward keeps for the backward is
AOTAutograd's choice for the ATen part and, for the core, q, k, v, o and 8 bytes of row
statistics per query row and head: no S x S tensor, no repeat_kv copy.

Where the library's fused attention computes the same core (``plans.library_core``), the core
is ``F.scaled_dot_product_attention`` with ``enable_gqa``, differentiated by the library.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx import Graph

from ..op import reference
from ..op.attention_block import TENSOR_ARGS, spec_of_args
from ..op.attention_core import call_attention_core, core_spec
from ..options import Options
from ..plan.plans import choose_core, core_problem, library_core
from ..plan.spec import BlockSpec
from .splice import replace_call


def check_core(spec: BlockSpec, values: dict, options: Options) -> None:
    """Raise ``Unsupported`` where the training form's core would have no kernels: neither the
    library's attention nor ours (``values``: the block op's fake inputs). The rest of the
    block is ATen, so this is all a block with gradients needs, not the inference plan."""
    x = values["x"]
    b, s, _ = x.shape
    q = x.new_empty((b, s, spec.num_heads * spec.head_dim))
    if values["runtime_scale"] is None and library_core(spec, q, options, s):
        return
    choose_core(core_spec(spec), core_problem(q, values["attn_mask"]), options,
                runtime_scale=values["runtime_scale"] is not None)


def training_form(spec: BlockSpec, t: dict, options: Options):
    """(out, probs or an empty tensor): the block of the op's tensors ``t``, differentiable."""
    x = t["x"]
    b, s, _ = x.shape
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    q, k, v = reference.project_qkv(
        x, t["wq"], t["wk"], t["wv"], t["bq"], t["bk"], t["bv"], t["q_norm_weight"],
        t["k_norm_weight"], t["cos"], t["sin"], t["inv_freq"], t["position_ids"], spec,
        t["runtime_eps"], t["runtime_k_eps"])
    if t["runtime_scale"] is None and library_core(spec, q, options, s):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=spec.causal,
                                           scale=spec.effective_scale(),
                                           enable_gqa=spec.groups > 1)
        o = o.transpose(1, 2).reshape(b, s, h * d)
        probs = x.new_empty((0,))
    else:
        rows = [u.transpose(1, 2).reshape(b, s, n * d) for u, n in ((q, h), (k, hk), (v, hk))]
        o, probs, _ = call_attention_core(*rows, t["attn_mask"], t["runtime_scale"],
                                          core_spec(spec))
    out = F.linear(o, t["wo"], t["bo"]) if t["wo"] is not None else o
    return out, probs


def expand_for_training(graph: Graph, options: Options) -> int:
    """Replace every ``inductor_gqa::attention_block`` call in ``graph`` (a graph before
    autograd) by its training form; returns how many."""
    op = torch.ops.inductor_gqa.attention_block.default
    calls = list(graph.find_nodes(op="call_function", target=op))
    for call in calls:
        spec = spec_of_args(call.args)
        # plain ATen, every op differentiable (Inductor's decompositions would write casts
        # as prims, which have no autograd formula)
        replace_call(graph, call, TENSOR_ARGS,
                     lambda t, spec=spec: training_form(spec, t, options), decompose=False,
                     differentiable=True)
    if calls:
        graph.eliminate_dead_code()
        graph.lint()
    return len(calls)
