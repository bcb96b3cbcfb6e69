"""The backend's torch.compile arguments: ``mode=`` as stock Inductor reads it, ``options=`` ours
and stock Inductor's, anything else refused (an argument that is silently dropped would look like
it worked); what it tells of the blocks it compiled (counters, ``fused_blocks``), on a warm FX
graph cache too."""

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass

import inductor_gqa
from inductor_gqa.graph_pass import AttentionBlockPass
from inductor_gqa.install import inductor_gqa_backend
from tiny_block import block, block_args


def _patches(monkeypatch, **kwargs):
    seen = {}

    def fake_compile_fx(gm, example_inputs, config_patches=None):
        seen.update(config_patches)
        return gm.forward

    monkeypatch.setattr("torch._inductor.compile_fx.compile_fx", fake_compile_fx)
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    inductor_gqa_backend(gm, [torch.ones(2)], **kwargs)
    return seen


def test_mode_patches_inductor_as_stock_does(monkeypatch):
    seen = _patches(monkeypatch, mode="reduce-overhead")
    assert seen["triton.cudagraphs"] is True
    assert isinstance(seen["joint_custom_pre_pass"], AttentionBlockPass)
    seen = _patches(monkeypatch, mode="max-autotune-no-cudagraphs")
    assert seen["max_autotune"] is True and "triton.cudagraphs" not in seen
    assert set(_patches(monkeypatch)) == {"joint_custom_pre_pass"}


def test_options_reach_the_pass(monkeypatch):
    seen = _patches(monkeypatch, options={"rope_from_positions": False})
    assert seen["joint_custom_pre_pass"].options.rope_from_positions is False


def test_stock_inductor_options_are_passed_on(monkeypatch):
    """``options={"max_autotune": True}``, as users pass to ``backend="inductor"``, reaches
    Inductor; ours keep their names, in the same dict."""
    seen = _patches(monkeypatch, options={"max_autotune": True, "triton.cudagraphs": False,
                                          "fuse_sdpa": False})
    assert seen["max_autotune"] is True and seen["triton.cudagraphs"] is False
    assert "fuse_sdpa" not in seen
    assert seen["joint_custom_pre_pass"].options.fuse_sdpa is False


def test_unknown_option_lists_both_kinds(monkeypatch):
    with pytest.raises(TypeError, match=r"neither an inductor_gqa.Options field .*fuse_sdpa.*"
                                         r"stock Inductor option") as e:
        _patches(monkeypatch, options={"max_autotun": True})
    assert "max_autotun" in str(e.value)


def test_bad_arguments_are_refused(monkeypatch):
    with pytest.raises(RuntimeError, match="Unrecognized mode"):
        _patches(monkeypatch, mode="fastest")
    with pytest.raises(TypeError, match="unexpected arguments"):
        _patches(monkeypatch, fullgraph=True)


def test_reduce_overhead_compiles_and_fuses_on_cpu():
    # CUDA graphs do not apply to CPU tensors: the mode must still compile, fuse and match
    torch.manual_seed(0)
    args = block_args()
    torch._dynamo.reset()
    from torch._dynamo.utils import counters
    counters["inductor_gqa"].clear()
    with torch.no_grad():
        out = torch.compile(block, backend="inductor_gqa", mode="reduce-overhead")(*args)
        torch.testing.assert_close(out, block(*args), rtol=1e-5, atol=1e-5)
    assert counters["inductor_gqa"]["blocks_fused"] == 1


class _FailsOnce(CustomGraphPass):
    """A joint-graph pass, chained after ours, that fails the first compile."""

    def __init__(self):
        self.calls = 0

    def __call__(self, graph):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("planted compile failure")

    def uuid(self):
        return "fails-once"


def test_a_block_is_counted_once_it_compiled():
    """Counted when the graph has compiled: a compile that fails after our pass ran counts
    nothing, its retry counts the block once."""
    args = block_args()
    chained = _FailsOnce()
    with torch._inductor.config.patch(joint_custom_pre_pass=chained), torch.no_grad():
        compiled = torch.compile(block, backend="inductor_gqa")
        with pytest.raises(Exception, match="planted compile failure"):
            compiled(*args)
        assert counters["inductor_gqa"]["blocks_fused"] == 0
        assert inductor_gqa.fused_blocks(compiled) == []
        torch._dynamo.reset()
        compiled = torch.compile(block, backend="inductor_gqa")
        compiled(*args)
    assert chained.calls == 2
    assert counters["inductor_gqa"]["blocks_fused"] == 1
    assert dict(counters["inductor_gqa_fused"]) == {"block": 1} or \
        len(counters["inductor_gqa_fused"]) == 1


def test_fused_blocks_on_a_warm_fx_graph_cache(tmp_path, monkeypatch):
    """A second compile of the same graph loads it from the FX graph cache, without running our
    pass: ``fused_blocks`` and the counters still tell the block is fused (from the record kept
    beside the cache for that output code), and so does the compiled graph's code itself."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    from inductor_gqa import fused

    monkeypatch.setattr(fused, "_memory", {})
    model = _TinyModel()
    args = block_args()[:1]
    results = []
    with torch._inductor.config.patch(fx_graph_cache=True), torch.no_grad():
        for run in ("cold", "warm"):
            torch._dynamo.reset()
            counters.clear()
            if run == "warm":
                fused._memory.clear()           # as in a new process: only the disk record
            compiled = torch.compile(model, backend="inductor_gqa")
            compiled(*args)
            results.append((counters["inductor"]["fxgraph_cache_hit"],
                            inductor_gqa.fused_blocks(compiled),
                            dict(counters["inductor_gqa_fused"])))
    (hit0, blocks0, fused0), (hit1, blocks1, fused1) = results
    assert (hit0, hit1) == (0, 1)
    assert blocks0 == blocks1 == ["attn"]
    assert fused0 == fused1 == {"attn": 1}


def test_fused_blocks_of_a_training_step():
    """A model whose parameters require grad: fused before autograd, found in the compiled
    forward and backward graphs."""
    model = _TinyModel()
    for p in model.parameters():
        p.requires_grad_(True)
    compiled = torch.compile(model, backend="inductor_gqa")
    assert inductor_gqa.fused_blocks(compiled) == []           # nothing compiled yet
    compiled(block_args()[0]).sum().backward()
    assert inductor_gqa.fused_blocks(compiled) == ["attn"]
    assert counters["inductor_gqa"]["blocks_fused"] == 1


class _TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.attn = _TinyAttention()

    def forward(self, x):
        return self.attn(x) + x


class _TinyAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        _, *ws = block_args()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(w, requires_grad=False)
                                          for w in ws])

    def forward(self, x):
        return block(x, *self.ws)
