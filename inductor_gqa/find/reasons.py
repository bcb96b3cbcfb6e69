"""Every reason a block is left unfused, in one table: what the counters, the log and ``explain``
say, and what it means. The recognizers raise ``Reject(reason)`` with one of these strings
(tests/test_reasons.py finds every reason in the code and checks it is here), and the README's
"Why a block is left" table is this one (``markdown()``; the same test compares them):

    python -m inductor_gqa.find.reasons        # prints the README's table
"""

from __future__ import annotations

# reason -> what it means (and what to do), most common first
REASONS: dict[str, str] = {
    "dropout is active": "attention dropout with p > 0 (training mode): call `model.eval()`, "
                         "or p=0",
    "inputs require grad": "through `install()` or with `fuse_with_grad=False` (the backward "
                           "is derived before our joint-graph pass): compile with "
                           "`backend=\"inductor_gqa\"`, or call under `torch.no_grad()`",
    "softcapping": "a softcap other than `tanh(s / c) * c` after the scale (caps that differ, "
                   "a mask applied before it, a runtime cap)",
    "mask not recognized": "several mask tensors in one block, or a finite causal fill next to "
                           "a mask tensor or applied before the causal mask (a fully masked row "
                           "would differ)",
    "unsupported head_dim": "head_dim outside `Options.head_dims` (16, 32, 64, 128, 256)",
    "unsupported dtype": "hidden states that are not float32, bfloat16 or float16",
    "mixed dtypes": "weights, masks or cos/sin of another dtype than the hidden states (an "
                    "additive mask of another dtype than the scores)",
    "no kernel plan": "the GPU kernels do not cover the block (the detail says why, e.g. "
                      "OLMo-2's norm over the whole projection at inference)",
    "scale not recognized": "an SDPA `scale=` that `dynamic=True` turned into a runtime value, "
                            "or a scale that is not one scalar",
    "softmax not followed by @ v": "the probabilities reach a matmul, but not as `probs @ v`. "
                                   "A softmax no matmul reads (a MoE router's) is not attention: "
                                   "not counted, logged at DEBUG as `not attention`",
    "disabled by options": "`Options(fuse_sdpa=False)` or `Options(fuse_explicit=False)`",
    "projection not recognized": "q, k and v are not projections of one shared input",
    "repeat_kv not recognized": "K/V heads tiled by `repeat`, k and v grouped differently, "
                                "query heads not a multiple of K/V heads, or grouped heads "
                                "given to SDPA without `enable_gqa`",
    "rope not recognized": "RoPE on only q or k, different cos/sin for q and k, or of another "
                           "form",
    "rms_norm not recognized": "a norm on only q or k, different constant eps for q and k, or a "
                               "weight that does not cover the projection",
    "rms_norm eps is a runtime value": "an eps computed at run time that is not a 0-d tensor",
    "head layout not recognized": "q/k/v are not a `[B, S, H, D]` view transposed to "
                                  "`[B, H, S, D]`",
    "scores matmul not recognized": "the scores are not `q @ k.transpose(-2, -1)`",
    "attention matmul not recognized": "an operand of a matmul of the core is not a "
                                       "`[B, H, S, D]` tensor",
    "attention output not recognized": "`probs @ v` is not viewed back to `[B, H, S, D]`",
    "sdpa output not recognized": "an SDPA variant whose output is used other than once",
    "output not recognized": "the heads are not merged into the last dim after the core",
    "kv cache not recognized": "a K/V cache the recognizer does not take (k and v cached "
                               "differently, cache and new keys of other shapes, values written "
                               "at positions of another length)",
    "kv cache with gradients": "a block that attends over a K/V cache in a graph with gradients "
                               "(the training form attends over the new keys only)",
    "not an attention anchor": "internal: the anchor is neither a softmax nor SDPA",
    "no shape metadata": "internal: a node without shape metadata",
    "no dtype metadata": "internal: a node without dtype metadata",
}

# counted per graph, not per block: counters["inductor_gqa"]["graphs left: ..."]
GRAPH_REASONS: dict[str, str] = {
    "retrace before autograd failed": "a graph with gradients whose retrace before autograd "
                                      "failed (WARNING in the log): compiled by stock Inductor, "
                                      "its blocks not counted fused",
}


def markdown() -> str:
    """The README's table of reasons."""
    lines = ["| reason | what it means |", "| --- | --- |"]
    lines += [f"| `{r}` | {what} |" for r, what in REASONS.items()]
    lines += [f"| `graphs left: {r}` | {what} |" for r, what in GRAPH_REASONS.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
