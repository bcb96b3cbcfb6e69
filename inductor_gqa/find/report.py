"""What the pass saw, block by block, named by the module each block was traced from.

* counters under ``torch._dynamo.utils.counters``: ``["inductor_gqa"]`` counts blocks seen,
  fused, and left by reason; ``["inductor_gqa_fused"]`` and ``["inductor_gqa_left"]`` count them
  by module path (``model.layers.3.self_attn``; ``"model.layers.3.self_attn: reason"``);
* the logger ``inductor_gqa``: one INFO line per block, and one summary per compiled graph
  ("fused 28 of 28 attention blocks; 0 left");
* ``history``: the rows of recent graphs, for ``explain``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import re
from typing import Optional

from torch._dynamo.utils import counters
from torch.fx import Node

log = logging.getLogger("inductor_gqa")


@dataclasses.dataclass
class Row:
    block: str                 # module path, or the anchor's node name outside any module
    fused: bool
    reason: str = ""           # why it was left
    detail: str = ""
    spec: object = None        # the BlockSpec when fused


# Rows of the most recent graphs (oldest dropped first); ``explain`` reads and clears it.
history: collections.deque = collections.deque(maxlen=10000)


_COUNTERS = ("inductor_gqa", "inductor_gqa_fused", "inductor_gqa_left")


@contextlib.contextmanager
def undone_on_error():
    """Counters and history as they were before the body, should it fail: the fusions it
    reported did not happen."""
    saved = {k: collections.Counter(counters[k]) for k in _COUNTERS}
    rows = len(history)
    try:
        yield
    except Exception:
        for k, c in saved.items():
            counters[k].clear()
            counters[k].update(c)
        while len(history) > rows:
            history.pop()
        raise


def module_path(anchor: Node) -> str:
    """``model.layers.3.self_attn`` for a node traced inside that module, from its
    ``nn_module_stack``; the node's name when it was traced outside any module."""
    stack = anchor.meta.get("nn_module_stack") or {}
    if not stack:
        return anchor.name
    path = str(list(stack.values())[-1][0])
    # the compiled root, however Dynamo reached it: L['self'], L['args'][0], G['model'], ...
    path = re.sub(r"^[LG]\['[^']*'\](\[\d+\])*\.?", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\['([^']*)'\]", r".\1", path)
    path = re.sub(r"^self\.", "", path)
    return path.strip(".") or anchor.name


class GraphReport:
    """The rows of one pass over one graph; ``summary()`` logs the one line per compile."""

    def __init__(self):
        self.rows: list[Row] = []

    def seen(self, anchor: Node) -> None:
        counters["inductor_gqa"]["blocks_seen"] += 1

    def fused(self, anchor: Node, spec, plan=None) -> None:
        path = module_path(anchor)
        counters["inductor_gqa"]["blocks_fused"] += 1
        counters["inductor_gqa_fused"][path] += 1
        if plan is not None:
            counters["inductor_gqa"][f"plan: {plan.name}"] += 1
        self._add(Row(path, True, spec=spec))
        log.info("fused attention block %s: %s%s", path, spec,
                 f"; plan {plan}" if plan is not None else "")

    def rejected(self, anchor: Node, reason: str, detail: str = "") -> None:
        path = module_path(anchor)
        counters["inductor_gqa"][f"rejected: {reason}"] += 1
        counters["inductor_gqa_left"][f"{path}: {reason}"] += 1
        self._add(Row(path, False, reason, detail))
        log.info("left attention-like block %s unfused: %s%s", path, reason,
                 f" ({detail})" if detail else "")

    def _add(self, row: Row) -> None:
        self.rows.append(row)
        history.append(row)

    def summary(self) -> Optional[str]:
        if not self.rows:
            return None
        fused = sum(r.fused for r in self.rows)
        left = [r for r in self.rows if not r.fused]
        line = f"fused {fused} of {len(self.rows)} attention blocks; {len(left)} left"
        if left:
            line += ": " + "; ".join(f"{r.block} ({r.reason})" for r in left)
        log.info("%s", line)
        return line
