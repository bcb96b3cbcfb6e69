"""User-visible options of the pass. Everything here feeds the pass's uuid (FX graph cache key)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Options:
    # head_dim values the fused kernels are built for; other sizes are left to stock Inductor.
    head_dims: tuple = (16, 32, 64, 128, 256)
    # Fuse blocks whose core is F.scaled_dot_product_attention.
    fuse_sdpa: bool = True
    # Fuse blocks written as explicit matmul -> softmax -> matmul chains.
    fuse_explicit: bool = True
    # When cos/sin are computed in the graph from inv_freq and position_ids, hand those to the op
    # so the kernels compute the angles (exact fp32 products) instead of reading cos/sin. Off by
    # default: on the H200 the in-graph cos/sin table (one small Inductor kernel) measured ~2%
    # faster over W075's cases (perf/results/nvidia-h200/runs/), though small cases gain a launch.
    rope_from_positions: bool = False
