"""BlockSpec: every static fact the fused attention op needs, in one place.

The matcher fills a BlockSpec from the graph; the op's schema carries exactly these fields as its
scalar arguments; kernels and the reference read them back. Keep the three in step by going through
``BlockSpec.op_kwargs``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

NORMS = ("none", "fp32_weight", "cast_weight", "fp32_one_plus_weight")
ROPES = ("none", "half", "interleaved")
CORES = ("sdpa", "explicit")
SCALE_OPS = ("mul", "div")
MASKS = ("none", "bool_keep", "bool_fill", "additive")
NORM_SCOPES = ("head", "proj")
CACHES = ("none", "concat", "index_put", "index_put_prefix")


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # RMSNorm on q and k (both or neither), computed in float32:
    #   fp32_weight:          (x.float() * rsqrt(mean(x^2) + eps) * w.float()).to(dtype)
    #   cast_weight:          (x.float() * rsqrt(mean(x^2) + eps)).to(dtype) * w
    #   fp32_one_plus_weight: (x.float() * rsqrt(mean(x^2) + eps) * (1 + w.float())).to(dtype)
    norm: str = "none"
    eps: float = 1e-6
    # What the norm is taken over (weights shaped to match):
    #   head: each head's head_dim features, weight [head_dim], q and k of [B, S, heads, D]
    #   proj: the whole projection row before the head split (OLMo-2), weights [H*D] for q and
    #         [Hkv*D] for k: q = norm(x @ Wq^T + bq).view(B, S, H, D)
    norm_scope: str = "head"
    # RoPE on the first rotary_dim features of q and k, after the norm.
    #   half:        x * cos + cat(-x2, x1) * sin          (x1, x2 = halves)
    #   interleaved: x * cos + stack(-x[1::2], x[::2]).flatten(-2) * sin   (GPT-J)
    rope: str = "none"
    rotary_dim: int = 0
    # RoPE of a bfloat16/float16 q and k computed in float32 (OLMo): float32 cos/sin,
    #   (x.float() * cos + rotate(x).float() * sin).to(x.dtype)    (one rounding, at the end)
    # on the first rotary_dim features (the rest pass through). Off: every step in x's dtype
    # with cos/sin of x's dtype, as eager rounds it. Irrelevant for float32 q/k (never set).
    rope_fp32: bool = False
    # Attention core.
    #   sdpa:     F.scaled_dot_product_attention semantics (scale = its scale argument)
    #   explicit: s = q @ k^T; s = s * scale (scale_op mul) or s / scale (div); mask; softmax in
    #             float32; cast to v's dtype; @ v
    core: str = "sdpa"
    scale: float = 1.0
    scale_op: str = "mul"
    causal: bool = False
    # Sliding window (0 = none): key j is visible from query i only when i - j < window
    # (transformers' sliding_window: kv_idx > q_idx - window), positions aligned at the end as
    # for causal; combined with causal it keeps the last ``window`` keys up to the query. Applied
    # like causal: -inf before the mask tensor.
    window: int = 0
    # Logit softcapping (0 = off), explicit core only, after the scale and before any mask:
    #   s = tanh(s / softcap) * softcap
    softcap: float = 0.0
    # Mask tensor passed in (broadcastable to [B, H, S, S]):
    #   bool_keep: True = attend (SDPA convention);  bool_fill: True = replaced by mask_fill
    #   additive:  added to the scores
    mask: str = "none"
    mask_fill: float = float("-inf")
    return_probs: bool = False
    # The K/V cache the block writes its new keys/values into, attending over all of it (the
    # op then takes ``past_key``/``past_value`` [B, Hkv, P, D], after RoPE):
    #   none:      the block attends over its own new k/v only
    #   concat:    keys = cat(past_key, k, dim=2) (transformers' DynamicCache): P + S keys
    #   index_put: keys = past_key with k written at ``cache_position`` along dim 2
    #              (StaticCache's index_copy_ as Inductor decomposes it): P keys, the whole
    #              buffer; its unfilled slots are masked by the block's mask tensor
    #   index_put_prefix: the same buffer's first S slots only (S = the query length: a static
    #              cache's prefill, causal over the prompt's slots)
    # Queries are aligned at the end of the keys for causal/window (see ``_structure_keep``).
    cache: str = "none"

    def __post_init__(self):
        def need(cond, what):
            if not cond:
                raise ValueError(f"inductor_gqa BlockSpec: {what} (got {self})")

        need(self.num_heads > 0 and self.num_kv_heads > 0, "head counts must be positive")
        need(self.num_heads % self.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads")
        need(self.head_dim > 0, "head_dim must be positive")
        need(self.norm in NORMS, f"norm must be one of {NORMS}")
        need(self.rope in ROPES, f"rope must be one of {ROPES}")
        need(self.core in CORES, f"core must be one of {CORES}")
        need(self.scale_op in SCALE_OPS, f"scale_op must be one of {SCALE_OPS}")
        need(self.mask in MASKS, f"mask must be one of {MASKS}")
        need(self.norm_scope in NORM_SCOPES, f"norm_scope must be one of {NORM_SCOPES}")
        need(self.cache in CACHES, f"cache must be one of {CACHES}")
        need(self.window >= 0, "window must be >= 0")
        need(self.softcap >= 0.0, "softcap must be >= 0")
        need(not (self.softcap and self.core == "sdpa"), "sdpa core has no softcapping")
        need(not (self.rope_fp32 and self.rope == "none"), "rope_fp32 without RoPE")
        if self.rope != "none":
            need(0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0,
                 "rotary_dim must be even and in (0, head_dim]")
        need(not (self.return_probs and self.core == "sdpa"), "sdpa core cannot return probabilities")
        need(not (self.core == "sdpa" and self.mask == "bool_fill"), "sdpa takes bool_keep masks")

    @property
    def groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    def effective_scale(self, value: Optional[float] = None) -> float:
        """The multiplier of the scores: ``value`` (a runtime scale) or ``scale``, inverted for
        the explicit chain's division. SDPA's scale is always a multiplier."""
        v = self.scale if value is None else value
        return 1.0 / v if self.core == "explicit" and self.scale_op == "div" else v

    def op_kwargs(self) -> dict:
        return dataclasses.asdict(self)

