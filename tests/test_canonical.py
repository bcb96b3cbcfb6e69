"""Canonicalization keeps every value bit for bit, and the graph runs as before."""

import collections

import torch
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.decomposition import select_decomp_table

from inductor_gqa.find.canonical import canonicalize


def _compile_canonical(fn):
    seen = {}

    def compiler(gm, example_inputs):
        seen["before"] = _ops(gm.graph)
        seen["count"] = canonicalize(gm.graph)
        gm.graph.lint()
        gm.recompile()
        seen["after"] = _ops(gm.graph)
        return gm

    backend = aot_autograd(fw_compiler=compiler, inference_compiler=compiler,
                           decompositions=select_decomp_table())
    return torch.compile(fn, backend=backend), seen


def _ops(graph):
    return collections.Counter(str(n.target) for n in graph.nodes if n.op == "call_function")


def forms(x, w, wb):
    qkv = F.linear(x, w)                                   # [2, 5, 96]
    a, b, c = qkv.chunk(3, dim=-1)                         # split -> slices
    q, k, v = qkv.view(2, 5, 3, 4, 8).unbind(2)            # unbind -> select
    h = qkv.view(2, 5, 4, 24).transpose(1, 2)
    hq, hk, hv = h.chunk(3, dim=-1)                        # split of a permute -> permute(slice)
    p = F.dropout(x, p=0.0, training=True) * 1             # clone of a dense tensor, x * 1
    f = (wb * k.float())                                   # bf16 * f32: explicit upcast
    r = a.view(2, 5, 32) + b.expand(2, 5, 32)              # same-shape view/expand
    return p.sum() + (q + v).sum() + f.sum() + r.sum() + c.sum() + (hq * hk + hv).sum()


def test_canonical_forms_keep_values_exactly():
    torch.manual_seed(0)
    args = (torch.randn(2, 5, 32), torch.randn(96, 32), torch.randn(8).bfloat16())
    compiled, seen = _compile_canonical(forms)
    with torch.no_grad():
        out = compiled(*args)
    assert torch.equal(out, forms(*args))
    assert seen["count"] >= 8
    before, after = seen["before"], seen["after"]
    for gone in ("aten.split.Tensor", "aten.unbind.int", "aten.clone.default"):
        assert before[gone] and not after[gone], (gone, before, after)
    assert after["aten.select.int"] == 3 and after["aten.slice.Tensor"] >= 6
    assert after["prims.convert_element_type.default"] == before[
        "prims.convert_element_type.default"] + 1


def test_graph_outputs_keep_their_own_tensors():
    """A clone that is returned stays: the output must not alias the input."""
    def fn(x):
        return x.clone(), torch.softmax(x, -1)

    compiled, seen = _compile_canonical(fn)
    x = torch.randn(3, 4)
    with torch.no_grad():
        y, _ = compiled(x)
    y.add_(1)
    assert not torch.equal(x, y)
