"""The models suite: whole-model prefill forward of Hugging Face transformers models.

Five architectures as 4-layer bf16 configs with random weights (built from configs, nothing
downloaded), head_dim 128 and grouped-query attention, each under attn_implementation "sdpa"
and "eager", at (B, S) = (4, 512) and (1, 2048), under ``torch.no_grad()``:

| model | config | hidden | heads / KV heads | what is particular |
| --- | --- | --- | --- | --- |
| llama | LlamaConfig | 4096 | 32 / 8 | Llama-3-8B's shapes |
| qwen3 | Qwen3Config | 2560 | 32 / 8 | per-head q/k RMSNorm (Qwen3-4B's shapes) |
| mistral | MistralConfig | 4096 | 32 / 8 | sliding window 1024 (active at S = 2048) |
| gemma2 | Gemma2Config | 2304 | 16 / 8 | logit softcapping, alternating sliding layers |
| glm4moe | Glm4MoeConfig | 4096 | 96 / 8 | W092's block (GLM-4.5-Air): q/k norm, bias, partial RoPE; MoE MLPs (32 experts) |

Vocabulary 32000 for all (the logits GEMM stays a modest part of the time). Every compiled model
is compiled once per shape with ``dynamic=False`` after ``torch._dynamo.reset()``, stock and ours
alike (what a user's first compilation at a shape gives). Per (model, attn, shape, impl) one
``kind: "model"``, ``task: "prefill"`` row: GPU time (CUDA-graph replay), plain-call time, peak
memory of a plain call above what the process held before it (``held_mib``: weights, inputs,
earlier rows' leftovers), fused layers (``counters["inductor_gqa"]["blocks_fused"]`` of that
compilation, against the config's layer count), and the logits against the eager model's under
the W092 rule (bf16: |out - ref| <= atol + 0.05 |ref| for 99% of elements).

``--model-tasks train`` adds training steps (perf/train.py): rows of the same kind and key with
``task: "train"``, the model's own LM loss differentiated against every parameter.
"""

from __future__ import annotations

import traceback
from typing import Callable, Optional

import torch

from . import bench, stats, train
from .rows import fusion_counts, open_row, token_ids

LAYERS = 4
VOCAB = 32000
SHAPES = ((4, 512), (1, 2048))                  # (B, S)
SMOKE_SHAPES = ((2, 32), (1, 48))
ATTNS = ("sdpa", "eager")
IMPLS = ("eager", "stock_static", "backend")
# rough per-step costs on an H200 (seconds): the run's printed estimate, and what must fit before
# the deadline for a step to start
EST_BUILD_S = 6.0
EST_COMPILE_S = 20.0      # a 4-layer model compiled at one shape (Dynamo, AOT, Inductor, Triton)
EST_ROW_S = 4.0           # checks, replays, plain calls, profile

SPECS = {
    "llama": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336,
                                  num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                  rope_theta=500000.0)),
    "qwen3": ("Qwen3Config", dict(hidden_size=2560, intermediate_size=9728,
                                  num_attention_heads=32, num_key_value_heads=8, head_dim=128)),
    "mistral": ("MistralConfig", dict(hidden_size=4096, intermediate_size=14336,
                                      num_attention_heads=32, num_key_value_heads=8,
                                      head_dim=128, sliding_window=1024)),
    "gemma2": ("Gemma2Config", dict(hidden_size=2304, intermediate_size=9216,
                                    num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                    query_pre_attn_scalar=128)),
    "glm4moe": ("Glm4MoeConfig", dict(hidden_size=4096, intermediate_size=10944,
                                      num_attention_heads=96, num_key_value_heads=8,
                                      head_dim=128, moe_intermediate_size=1408,
                                      n_routed_experts=32, num_experts_per_tok=8,
                                      first_k_dense_replace=1, use_qk_norm=True,
                                      attention_bias=True)),
}
MODELS = tuple(SPECS)

# the smoke run's tiny configs: the same architectures and features at toy sizes
TINY = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, vocab_size=512)
TINY_EXTRA = {"mistral": dict(sliding_window=16), "gemma2": dict(sliding_window=16,
                                                                  query_pre_attn_scalar=32),
              "glm4moe": dict(moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2)}


def make_config(name: str, smoke: bool = False, layers: int = LAYERS):
    import transformers
    cls_name, kw = SPECS[name]
    kw = dict(kw, num_hidden_layers=layers, vocab_size=VOCAB, max_position_embeddings=4096,
              use_cache=False)
    if smoke:
        kw.update(TINY, **TINY_EXTRA.get(name, {}))
    return getattr(transformers, cls_name)(**kw)


def build(name: str, attn: str, device, smoke: bool = False, layers: int = LAYERS):
    """The model with random weights, bf16, eval, on the device (initialized there)."""
    from transformers import AutoModelForCausalLM
    cfg = make_config(name, smoke, layers)
    torch.manual_seed(0)
    with torch.device(device):
        try:
            m = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn,
                                                 dtype=torch.bfloat16)
        except TypeError:
            m = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn,
                                                 torch_dtype=torch.bfloat16)
    m = m.to(device=device).eval()     # parameters bf16 from the init; RoPE buffers as built
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def check_logits(out: torch.Tensor, ref: torch.Tensor, seq: int, batch: int) -> tuple[bool, float]:
    from inductor_gqa import workloads as wl
    return wl.check(out, ref, wl.atol(wl.W092, seq, batch), wl.W092.rtol)


def run_suite(args, rows: list, variants: list, device, over_deadline: Callable[..., bool],
              log: Callable[[str], None], write: Callable[[], None]) -> None:
    """Every selected (model, attn, shape, impl): one row each, appended to ``rows``."""
    from torch._dynamo.utils import counters
    smoke = args.smoke
    names = [n for n in args.models_list]
    shapes = args.model_shapes_list
    impls = args.model_impls_list
    for name in names:
        for attn in args.model_attn_list:
            base = {"kind": "model", "model": name, "attn": attn, "task": "prefill"}
            if over_deadline(EST_BUILD_S):
                rows.extend(dict(base, impl=i, seq=s, batch=b, status="skipped")
                            for b, s in shapes for i in impls)
                continue
            try:
                model = build(name, attn, device, smoke, args.model_layers)
            except Exception as e:  # noqa: BLE001  (e.g. an attn_implementation the model lacks)
                msg = f"{type(e).__name__}: {e}"[:500]
                log(f"model {name}/{attn}: unavailable: {msg}")
                rows.extend(dict(base, impl=i, seq=s, batch=b, status="unavailable", error=msg)
                            for b, s in shapes for i in impls)
                continue
            cfg = model.config
            layers = cfg.num_hidden_layers
            extra = {"layers": layers,
                     "experts_implementation": getattr(cfg, "_experts_implementation", None)}
            for task in args.model_tasks_list:
                base = dict(base, task=task)
                for b, s in shapes:
                    if task == "train":
                        with torch.enable_grad():
                            train.run_model_shape(args, model, base, extra, b, s, impls, rows,
                                                  variants, device, over_deadline, log)
                    else:
                        _run_shape(args, model, base, extra, b, s, impls, rows, variants,
                                   device, over_deadline, log, counters)
                    write()
            del model
            if bench.is_cuda(device):
                torch.cuda.empty_cache()


def _run_shape(args, model, base, extra, b, s, impls, rows, variants, device, over_deadline,
               log, counters) -> None:
    vocab = model.config.vocab_size
    seed0 = args.seed * 100003 + 7919 * s + b
    ids = token_ids(vocab, b, s, device, seed0)
    check_ids = [token_ids(vocab, b, s, device, seed0 + 1000 * (r + 1))
                 for r in range(args.check_rounds)]
    refs: Optional[list] = None
    for impl in impls:
        row, v = open_row(rows, variants, base, extra, impl, s, b, over_deadline,
                          EST_COMPILE_S, EST_ROW_S)
        if v is None:
            continue
        torch._dynamo.reset()
        counters["inductor_gqa"].clear()
        graphs0 = counters["stats"]["unique_graphs"]
        try:
            with bench.implementation(impl, args.mode, "static") as compile_:
                target = compile_(model)

                def call(x=ids):
                    return target(input_ids=x, use_cache=False).logits

                with torch.no_grad():
                    _, v["compile_s"] = bench.wall(call, device)
                    row["inproc_first_s"] = v["compile_s"]
                    if impl != "eager":
                        row.update(fusion_counts(counters["inductor_gqa"]))
                    v["graphs"] = counters["stats"]["unique_graphs"] - graphs0
                    row["graphs"] = v["graphs"]
                    if impl != "eager" and args.check_rounds:
                        if refs is None:        # the eager model's logits, once per shape
                            refs = [model(input_ids=x, use_cache=False).logits
                                    for x in check_ids]
                        fracs, passed, finite = [], True, True
                        for x, ref in zip(check_ids, refs):
                            logits = call(x)
                            ok, frac = check_logits(logits, ref, s, b)
                            finite &= bool(torch.isfinite(logits).all())
                            fracs.append(frac)
                            passed &= ok
                        from inductor_gqa import workloads as wl
                        row["check"] = {"passed": bool(passed), "min_frac": min(fracs),
                                        "finite": finite,
                                        "rounds": args.check_rounds,
                                        "atol": wl.atol(wl.W092, s, b), "rtol": wl.W092.rtol}
                    try:
                        info = {}
                        gpu, meds, spread = bench.device_time_us(call, device, args.replays,
                                                                 args.blocks, info=info)
                        row.update(gpu_us=gpu, block_medians=meds, spread=spread, **info)
                    except Exception as e:  # noqa: BLE001  (e.g. not capturable)
                        row["graph_error"] = f"{type(e).__name__}: {e}"[:500]
                        if bench.is_cuda(device):
                            torch.cuda.synchronize()
                    with bench.peak_memory(row, device):
                        row["plain_us"], row["plain_spread"] = bench.plain_time_us(
                            call, args.plain_runs, device)
                    if not args.no_profile:
                        row.update(bench.profile_call(call, device, calls=1))
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:1000]
            v["status"], v["error"] = "error", row["error"]
            traceback.print_exc()
        finally:
            torch._dynamo.reset()
        log(f"model {base['model']}/{base['attn']} {stats.case_label(s, b)} {impl}: "
            f"{row['status']} gpu {row.get('gpu_us', float('nan')):.1f} us plain "
            f"{row.get('plain_us', float('nan')):.1f} us fused "
            f"{row.get('fused_layers', '-')}/{row['layers']} check {stats.check_cell(row)} "
            f"first call {row.get('inproc_first_s') or 0:.1f}s"
            + (f" rejected {row['rejected']}" if row.get("rejected") else "")
            + (f" ERROR {row['error'][:200]}" if row.get("error") else "")
            + (f" (no graph replay: {row['graph_error'][:160]})" if row.get("graph_error")
               else ""))
    del refs



def estimate_s(n_models: int, n_attn: int, n_shapes: int, impls) -> float:
    compiled = sum(1 for i in impls if i != "eager")
    return n_models * n_attn * (EST_BUILD_S + n_shapes * (compiled * EST_COMPILE_S
                                                          + len(impls) * EST_ROW_S))
