"""The pass end to end: a block found in a compiled graph is replaced by its plan's kernel
launches (Inductor's user-defined Triton kernel nodes), on CPU through the Triton interpreter."""

from __future__ import annotations

import time

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch._inductor.decomposition import select_decomp_table

from inductor_gqa import Options, workloads as wl
from inductor_gqa.graph_pass import run

KERNEL_NODE = torch.ops.higher_order.triton_kernel_wrapper_functional
FUSED_OP = torch.ops.inductor_gqa.attention_block.default


def kernels_backend(graphs: list, **options):
    """AOTAutograd with Inductor's decompositions and our pass on the forward graph, which then
    runs eagerly: the kernels through the interpreter (what Inductor would compile)."""
    opts = Options(cpu_kernels=True, **options)

    def fw(gm, example_inputs):
        run(gm.graph, opts)
        gm.recompile()
        graphs.append(gm.graph)
        return make_boxed_func(gm)
    return aot_autograd(fw_compiler=fw, decompositions=select_decomp_table())


def small_w075(s, b, causal=False):
    fn = wl.workload_fn(wl.W075, 4, 2, 16)
    inp = wl.make_inputs(wl.W075, s, b, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16,
                         seed=s)
    return (lambda **kw: fn(is_causal=causal, **kw)), inp


def small_w092(s, b):
    fn = wl.workload_fn(wl.W092, 6, 2, 32)
    return fn, wl.make_inputs(wl.W092, s, b, hidden=64, num_heads=6, num_kv_heads=2,
                              head_dim=32, seed=s)


def _check(w, outs, refs, atol):
    for o, r in zip(outs if isinstance(outs, tuple) else (outs,),
                    refs if isinstance(refs, tuple) else (refs,)):
        ok, frac = wl.check(o, r, atol, w.rtol)
        assert ok, frac


@pytest.mark.parametrize("precision", ["high", "highest"])
@pytest.mark.parametrize("causal", [False, True])
def test_block_becomes_kernel_launches(precision, causal):
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        graphs = []
        fn, inp = small_w075(19, 2, causal)
        out = torch.compile(fn, backend=kernels_backend(graphs), dynamic=False)(**inp)
        ref = fn(**inp)
    finally:
        torch.set_float32_matmul_precision(before)
    c = counters["inductor_gqa"]
    assert c["blocks_fused"] == 1
    assert c["plan: fp16_copies" if precision == "high" else "plan: native"] == 1
    targets = [n.target for n in graphs[-1].nodes]
    assert KERNEL_NODE in targets and FUSED_OP not in targets
    _check(wl.W075, out, ref, 2e-3)


def test_w092_like_bf16():
    graphs = []
    fn, inp = small_w092(21, 2)
    out = torch.compile(fn, backend=kernels_backend(graphs), dynamic=False)(**inp)
    assert counters["inductor_gqa"]["blocks_fused"] == 1
    _check(wl.W092, out, fn(**inp), 3e-2)


def test_dynamic_shapes_one_graph_per_bucket():
    """S and B symbolic: one compiled graph serves every S of a power-of-two bucket (its plan
    guarded on the bucket) and every B >= 2 (Dynamo specializes 0 and 1); S in another bucket
    compiles that bucket's plan."""
    graphs = []
    fn, _ = small_w075(8, 2)
    compiled = torch.compile(fn, backend=kernels_backend(graphs), dynamic=True)
    for s, b in ((9, 2), (13, 3), (16, 2)):
        _, inp = small_w075(s, b)
        _check(wl.W075, compiled(**inp), fn(**inp), 2e-3)
    assert len(graphs) == 1
    _, inp = small_w075(23, 2)
    _check(wl.W075, compiled(**inp), fn(**inp), 2e-3)
    assert len(graphs) == 2
    assert counters["inductor_gqa"]["blocks_fused"] == 2


def test_unsupported_block_is_left_to_inductor(caplog, monkeypatch):
    """A block no plan covers (here: as if causal masking had no kernel) is not fused: the
    graph keeps the user's code, and the reason is counted and logged."""
    from inductor_gqa.plan import plans
    monkeypatch.setattr(plans, "_KNOWN_FIELDS", plans._KNOWN_FIELDS - {"causal"})
    graphs = []
    fn, inp = small_w092(12, 2)
    with caplog.at_level("INFO", logger="inductor_gqa"):
        out = torch.compile(fn, backend=kernels_backend(graphs), dynamic=False)(**inp)
    c = counters["inductor_gqa"]
    assert c["blocks_fused"] == 0 and c["rejected: no kernel plan"] == 1
    assert "no kernel for causal=True" in caplog.text
    assert FUSED_OP not in [n.target for n in graphs[-1].nodes]
    _check(wl.W092, out, fn(**inp), 3e-2)


@pytest.mark.parametrize("precision", ["high", "highest"])
def test_runtime_floats(precision):
    """dynamic=True keeps float arguments (the norm's eps here) as runtime values: fused, the
    kernels reading them from a device scalar."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        graphs = []
        # the form whose probabilities follow q's dtype, in float32: the fp16-copies plan
        fn = wl.workload_fn(wl.W092, 6, 2, 32, variant="cast_weight")
        inp = wl.make_inputs(wl.W092, 12, 2, hidden=64, num_heads=6, num_kv_heads=2,
                             head_dim=32, seed=1)
        inp = {k: v.float() for k, v in inp.items()}
        compiled = torch.compile(fn, backend=kernels_backend(graphs), dynamic=True)
        for eps in (1e-5, 0.5):
            out = compiled(**inp, rms_norm_eps=eps)
            torch.testing.assert_close(out, fn(**inp, rms_norm_eps=eps), atol=3e-3, rtol=1e-2)
    finally:
        torch.set_float32_matmul_precision(before)
    c = counters["inductor_gqa"]
    assert c["blocks_fused"] == 1 and len(graphs) == 1


def _mlp():
    return torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(64, 64),
                                                               torch.nn.GELU())])


def test_no_block_same_generated_code_as_stock():
    """A model without attention compiles to exactly the code stock Inductor generates."""
    from torch._inductor.utils import run_and_get_code

    model = _mlp()
    x = torch.randn(8, 64)
    with torch.no_grad():
        _, ours = run_and_get_code(torch.compile(model, backend="inductor_gqa"), x)
        torch._dynamo.reset()
        _, stock = run_and_get_code(torch.compile(model), x)

    def body(codes):   # the graph's id (a counter) aside
        return ["\n".join(ln for ln in c.splitlines() if not ln.startswith("# AOT ID"))
                for c in codes]
    assert body(ours) == body(stock)


def test_pass_cost_on_a_large_graph_without_blocks():
    """The pass adds well under a second to a large graph with no attention block."""
    model = torch.nn.Sequential(*[m for _ in range(200) for m in (torch.nn.Linear(32, 32),
                                                                  torch.nn.ReLU())])
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm)
    with torch.no_grad():
        torch.compile(model, backend=aot_autograd(fw_compiler=capture))(torch.randn(4, 32))
    graph = graphs[-1].graph
    assert len(graph.nodes) > 800
    t0 = time.perf_counter()
    assert run(graph, Options()) == 0
    assert time.perf_counter() - t0 < 0.25


def test_autotune_measures_once_and_caches_on_disk(monkeypatch, tmp_path):
    """Options(autotune=True) (or max-autotune) measures the block's configs while it compiles
    and keeps them in Inductor's cache directory: a second compile measures nothing."""
    from inductor_gqa import tune
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    calls = []
    descend = tune._descend
    monkeypatch.setattr(tune, "_descend", lambda *a, **k: calls.append(1) or descend(*a, **k))
    fn, inp = small_w092(12, 2)
    for _ in range(2):
        torch._dynamo.reset()
        out = torch.compile(fn, backend=kernels_backend([], autotune=True), dynamic=False)(**inp)
        _check(wl.W092, out, fn(**inp), 3e-2)
    assert calls == [1]
    files = list((tmp_path / "inductor_gqa").glob("*.json"))
    assert len(files) == 1 and "attention|" in files[0].read_text()
