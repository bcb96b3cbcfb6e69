"""What the pass saw: counters under torch._dynamo.utils.counters["inductor_gqa"] and a logger
named ``inductor_gqa`` that explains each near miss."""

from __future__ import annotations

import logging

from torch._dynamo.utils import counters

log = logging.getLogger("inductor_gqa")


def seen(anchor) -> None:
    counters["inductor_gqa"]["blocks_seen"] += 1


def fused(anchor, spec, plan=None) -> None:
    counters["inductor_gqa"]["blocks_fused"] += 1
    if plan is not None:
        counters["inductor_gqa"][f"plan: {plan.name}"] += 1
    log.info("fused attention block at %s: %s%s", anchor.name, spec,
             f"; plan {plan}" if plan is not None else "")


def rejected(anchor, reason: str, detail: str = "") -> None:
    counters["inductor_gqa"][f"rejected: {reason}"] += 1
    log.info("left attention-like block at %s unfused: %s%s", anchor.name, reason,
             f" ({detail})" if detail else "")

