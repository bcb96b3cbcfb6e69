"""Tiny random-weight models of real ``transformers`` families (no downloads), for the tests that
compile whole models: 2 decoder layers, hidden 64, 4 query heads over 2 KV heads of 16 (GPT-NeoX:
4 heads, no grouping), vocabulary 128. Windows are 4 keys wide, so at the tests' length (9) they
mask something.
"""

from __future__ import annotations

import torch
import transformers as tf

VOCAB, SEQ, BATCH, PAD = 128, 9, 2, 3
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _config(family: str):
    c = _COMMON
    if family == "llama":
        return tf.LlamaConfig(**c)
    if family == "mistral":
        return tf.MistralConfig(**c, sliding_window=4)
    if family == "qwen2":          # layer 1 slides (layers from max_window_layers on)
        return tf.Qwen2Config(**c, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    if family == "qwen3":
        return tf.Qwen3Config(**c, head_dim=16)
    if family == "gemma2":
        return tf.Gemma2Config(**c, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                               attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    if family == "gemma3":
        return tf.Gemma3TextConfig(**c, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                                   layer_types=["sliding_attention", "full_attention"])
    if family == "phi3":
        return tf.Phi3Config(**c)
    if family == "gpt_neox":       # partial rotary 0.25: 4 of 16 features
        return tf.GPTNeoXConfig(**{k: v for k, v in c.items() if k != "num_key_value_heads"})
    if family == "glm4_moe":       # layer 0 dense, layer 1 mixture of experts
        return tf.Glm4MoeConfig(**c, attention_bias=True, use_qk_norm=True, n_routed_experts=4,
                                num_experts_per_tok=2, moe_intermediate_size=32,
                                first_k_dense_replace=1, n_shared_experts=1)
    if family == "olmo2":
        return tf.Olmo2Config(**c)
    if family == "mixtral":        # its MoE router's softmax is no attention block
        return tf.MixtralConfig(**c, num_local_experts=4, num_experts_per_tok=2)
    raise KeyError(family)


# family -> what its attention needed (the model table in docs/pipeline.md)
FAMILIES = {
    "llama": "transformers' in-graph masks (causal, padding, packed-sequence check), no-op "
             "dropout, eager finfo.min masks",
    "mistral": "sliding window",
    "qwen2": "bias, sliding window on some layers",
    "qwen3": "per-head QK norm",
    "gemma2": "logit softcapping (eager), sliding window, query_pre_attn_scalar",
    "gemma3": "(1 + w) QK norm after the transpose, sliding window, two RoPE tables",
    "phi3": "fused qkv_proj sliced; partial-rotary code at full rotary (alias, empty cat)",
    "gpt_neox": "fused QKV laid out head by head (chunk after the transpose), partial rotary, "
                "bias, MHA",
    "glm4_moe": "bias, per-head QK norm, partial rotary, MoE MLP",
    "olmo2": "QK norm over the whole projection before the head split, type promotion",
}


# The first transformers release whose GLM-4-MoE training step Dynamo hands over as one graph:
# before it (5.17.0-5.22.2 tried) the MoE layer's backward-enabled graph reads a tensor's value
# (aten._local_scalar_dense), which AOTAutograd cannot trace, stock backend="inductor" and
# "aot_eager" alike, so Dynamo splits the model at graph breaks into 9-10 graphs and the blocks
# land in frames of their own (module paths relative to them).
MOE_TRAINING_WHOLE_GRAPH = (5, 23)


def require_whole_moe_training_graph(family: str) -> None:
    """Skip a GLM-4-MoE training test where stock Inductor itself cannot take the graph whole."""
    import pytest

    version = tuple(int(x) for x in tf.__version__.split(".")[:2])
    if family == "glm4_moe" and version < MOE_TRAINING_WHOLE_GRAPH:
        pytest.skip(f"transformers {tf.__version__}: GLM-4-MoE's training graph reads a tensor "
                    f"value that AOTAutograd cannot trace (stock Inductor alike; whole from "
                    f"{'.'.join(map(str, MOE_TRAINING_WHOLE_GRAPH))})")


class Unsupported(Exception):
    """This transformers version does not offer the attention implementation for the family
    (5.2x dropped sdpa for Gemma 2, whose sdpa path ignored the softcapping)."""


def build(family: str, impl: str = "sdpa", dtype=torch.float32, seed: int = 0):
    """An eval-mode CausalLM of ``family`` with random weights and the given attention
    implementation ("sdpa" or "eager")."""
    torch.manual_seed(seed)
    try:
        model = tf.AutoModelForCausalLM.from_config(_config(family), attn_implementation=impl)
    except ValueError as e:
        if "does not support an attention implementation" in str(e):
            raise Unsupported(f"{family} has no {impl} attention in transformers "
                              f"{tf.__version__}") from e
        raise
    return model.to(dtype).eval()


def inputs(padded: bool, seed: int = 0, batch: int = BATCH, seq: int = SEQ):
    """(input_ids, attention_mask or None); padded: batch row 1 is left-padded by PAD tokens,
    so its first PAD query rows see no key at all."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    if not padded:
        return ids, None
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, :PAD] = 0
    ids[1, :PAD] = 0
    return ids, mask


def attention_paths(model) -> set:
    """Module paths of the model's attention modules (``model.layers.0.self_attn``, ...)."""
    return {name for name, m in model.named_modules()
            if type(m).__name__.endswith("Attention") and name}


def call_kwargs(mask) -> dict:
    kw = dict(use_cache=False)
    if mask is not None:
        kw["attention_mask"] = mask
    return kw


def tiny_llama_padded():
    """A factory for ``python -m inductor_gqa explain hf_models:tiny_llama_padded``."""
    model = build("llama", "sdpa")
    ids, mask = inputs(padded=True)
    return model, (ids,), call_kwargs(mask)
