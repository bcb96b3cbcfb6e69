"""The decode suite: one decode step of a transformers model with a static KV cache.

    python -m perf.decode [--smoke] [--models llama,glm4moe] [--batches 1,8,32]
                          [--contexts 1024,8192,32768] [--impls eager,stock,stock_ro,ours]
                          [--tokens 128] [--out DIR]

Models: ``perf/models.py``'s Llama (Llama-3-8B's shapes, 32 / 8 heads of 128) and GLM-4-MoE
(W092's block: 96 / 8 heads, q/k norm, bias, partial RoPE; its MLPs dense here, so the step's
bytes are the attention's and the dense MLP's), 4 layers, bf16, sdpa, ``--smoke``: tiny float32
configs on the CPU. Per (model, batch, context, implementation) one row:

- the step: ``model(ids [B, 1], past_key_values=StaticCache, cache_position=[context - 1])``
  after a prefill of ``context - 1`` tokens by the eager model (the cache's first
  ``context - 1`` slots hold real keys); compiled as users compile decoding
  (``torch.compile(model.forward)``: ``stock`` stock Inductor, ``stock_ro`` with
  ``mode="reduce-overhead"``, ``ours`` ``backend="inductor_gqa"``);
- GPU time by CUDA-graph replay (not for ``stock_ro``, whose CUDA graphs are its own) and the
  plain-call time; the bytes a step must read (weights and the K/V of the context) over the GPU
  time, against the copy rate measured in the same process;
- fused blocks of the step's compilation (``counters["inductor_gqa"]``), and its next-token
  logits against the eager model's under the W092 rule;
- ``--tokens N``: tokens/s of an N-token greedy decode loop with the compiled step (a prefill of
  ``context - N`` tokens first).

Writes ``decode.json``; exits 1 when a row of ours errored, fused fewer blocks than layers or
missed the tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

from . import bench, models

MODELS = ("llama", "glm4moe")
IMPLS = ("eager", "stock", "stock_ro", "ours")


def _build(name: str, device, smoke: bool):
    cfg = models.make_config(name, smoke, models.LAYERS)
    cfg.use_cache = True
    if name == "glm4moe":
        cfg.first_k_dense_replace = cfg.num_hidden_layers      # dense MLPs: no routing noise
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    dtype = torch.float32 if smoke else torch.bfloat16
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    m = m.to(device).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _cache(model, batch: int, length: int, device):
    from transformers import StaticCache
    try:
        return StaticCache(config=model.config, max_cache_len=length)
    except TypeError:        # older signatures take the batch size and device up front
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=length,
                           device=device, dtype=model.dtype)


def _prefill(model, cache, ids):
    with torch.no_grad():
        n = ids.shape[1]
        out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                    cache_position=torch.arange(n, device=ids.device))
    return out.logits[:, -1:].argmax(-1)


def _rewind(cache, length: int) -> None:
    """Set the cache's fill back to ``length`` tokens where the cache counts them itself
    (newer transformers: a ``cumulative_length`` per layer, written at on each update), so the
    same step can be timed again; older caches write at the ``cache_position`` passed."""
    for layer in getattr(cache, "layers", ()):
        n = getattr(layer, "cumulative_length", None)
        if isinstance(n, torch.Tensor):
            n.fill_(length)
        elif isinstance(n, int):
            layer.cumulative_length = length


def _step_fn(model):
    def step(ids, cache, pos):
        return model(input_ids=ids, past_key_values=cache, cache_position=pos,
                     use_cache=True).logits
    return step


def _compiled(model, impl: str):
    import inductor_gqa  # noqa: F401  (registers the backend)
    if impl == "eager":
        return _step_fn(model)
    kw = {"backend": "inductor_gqa" if impl == "ours" else "inductor"}
    if impl == "stock_ro":
        kw["mode"] = "reduce-overhead"
    return torch.compile(_step_fn(model), **kw)


def _bytes(model, batch: int, context: int) -> int:
    c = model.config
    kv = 2 * c.num_hidden_layers * batch * context * c.num_key_value_heads * c.head_dim
    return sum(p.numel() * p.element_size() for p in model.parameters()) \
        + kv * model.dtype.itemsize


def run_row(name, model, b, ctx, impl, device, a, ref_logits=None) -> dict:
    from torch._dynamo.utils import counters
    row = {"model": name, "batch": b, "context": ctx, "impl": impl, "status": "error"}
    torch._dynamo.reset()
    counters.clear()
    vocab = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(b * 131 + ctx)
    ids = torch.randint(0, vocab, (b, ctx), generator=g).to(device)
    cache = _cache(model, b, ctx, device)
    nxt = _prefill(model, cache, ids[:, :ctx - 1])
    pos = torch.tensor([ctx - 1], device=device)
    step = _compiled(model, impl)
    with torch.no_grad():
        t = time.perf_counter()
        logits = step(nxt, cache, pos)
        bench.sync(device)
        row["first_s"] = round(time.perf_counter() - t, 2)
        row["fused_blocks"] = int(counters["inductor_gqa"]["blocks_fused"])
        row["rejected"] = {k: v for k, v in counters["inductor_gqa"].items()
                           if k.startswith("rejected")}
        if ref_logits is not None:
            ok, frac = models.check_logits(logits.float(), ref_logits.float(), ctx, b)
            row["passed"], row["frac"] = bool(ok), round(float(frac), 5)
        row["finite"] = bool(torch.isfinite(logits).all())
        def call():
            _rewind(cache, ctx - 1)
            return step(nxt, cache, pos)
        row["plain_us"] = round(bench.plain_time_us(call, a.plain_runs, device)[0], 1)
        if bench.is_cuda(device) and impl != "stock_ro":
            row["gpu_us"] = round(bench.graph_time_us(call, a.replays, 3)[0], 1)
            row["bytes"] = _bytes(model, b, ctx)
            row["tbps"] = round(row["bytes"] / (row["gpu_us"] * 1e-6) / 1e12, 3)
        if a.tokens and ctx > a.tokens:
            row["tokens_per_s"] = _loop(model, step, ids, ctx, a.tokens, device)
    row["status"] = "ok"
    return row, logits


def _loop(model, step, ids, ctx, n, device) -> float:
    """Tokens/s of an n-token greedy decode with the compiled step."""
    b = ids.shape[0]
    cache = _cache(model, b, ctx, device)
    tok = _prefill(model, cache, ids[:, :ctx - n])
    bench.sync(device)
    t = time.perf_counter()
    with torch.no_grad():
        for i in range(ctx - n, ctx):
            tok = step(tok, cache, torch.tensor([i], device=device))[:, -1:].argmax(-1)
    bench.sync(device)
    return round(b * n / (time.perf_counter() - t), 1)


def _ok(row) -> bool:
    if row["impl"] != "ours":
        return True
    layers = models.LAYERS
    return (row["status"] == "ok" and row.get("fused_blocks", 0) >= layers
            and row.get("passed", True) and row.get("finite", False))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny float32 configs, CPU is enough")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--contexts", default="1024,8192,32768")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--plain-runs", type=int, default=10)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    names = [m for m in a.models.split(",") if m]
    impls = [i for i in a.impls.split(",") if i]
    for n in names:
        if n not in MODELS:
            raise SystemExit(f"unknown model {n!r} (choose from {MODELS})")
    for i in impls:
        if i not in IMPLS:
            raise SystemExit(f"unknown implementation {i!r} (choose from {IMPLS})")
    if a.smoke:
        device, batches, contexts = "cpu", (2,), (24,)
        a.tokens, a.replays, a.plain_runs = min(a.tokens, 4), 2, 2
        impls = [i for i in impls if i != "stock_ro"]
    elif torch.cuda.is_available():
        device = "cuda"
        batches = tuple(int(v) for v in a.batches.split(","))
        contexts = tuple(int(v) for v in a.contexts.split(","))
    else:
        print("perf.decode needs a CUDA GPU (or --smoke)")
        return 2
    torch._inductor.config.fx_graph_cache = False      # a cache hit leaves the counters empty
    out = a.out or os.environ.get("OUT") or ("out/smoke" if a.smoke else ".")
    os.makedirs(out, exist_ok=True)
    doc = {"env": {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "torch": torch.__version__, "commit": os.environ.get("PERF_GIT_COMMIT")},
           "rows": []}
    if device == "cuda":
        doc["copy_tbps"] = round(_copy_tbps() / 1e12, 3)
    for name in names:
        model = _build(name, device, a.smoke)
        for b in batches:
            for ctx in contexts:
                ref = None
                for impl in ["eager"] + [i for i in impls if i != "eager"]:
                    try:
                        row, logits = run_row(name, model, b, ctx, impl, device, a, ref)
                        ref = logits if impl == "eager" else ref
                    except Exception as e:  # noqa: BLE001  one row's failure hides no other
                        row = {"model": name, "batch": b, "context": ctx, "impl": impl,
                               "status": "error", "error": f"{type(e).__name__}: {e}"[:1500]}
                        traceback.print_exc()
                    if impl in impls:
                        doc["rows"].append(row)
                        print(json.dumps(row), flush=True)
                    with open(os.path.join(out, "decode.json"), "w") as f:
                        json.dump(doc, f, indent=1)
        del model
    bad = [r for r in doc["rows"] if not _ok(r)]
    print(f"decode: {len(doc['rows']) - len(bad)} of {len(doc['rows'])} rows ok")
    return 1 if bad else 0


def _copy_tbps() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = bench.graph_time_us(lambda: y.copy_(x), 10, 2)[0]
    return 2 * x.numel() / (t * 1e-6)


if __name__ == "__main__":
    sys.exit(main())
