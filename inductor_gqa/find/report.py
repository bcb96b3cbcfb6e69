"""What the pass saw, block by block, named by the module each block was traced from.

* counters under ``torch._dynamo.utils.counters``: ``["inductor_gqa"]`` counts blocks seen,
  fused, and left by reason; ``["inductor_gqa_fused"]`` and ``["inductor_gqa_left"]`` count them
  by module path (``model.layers.3.self_attn``; ``"model.layers.3.self_attn: reason"``);
* the logger ``inductor_gqa``: one INFO line per block, and one summary per compiled graph
  ("fused 28 of 28 attention blocks; 0 left");
* ``history``: the rows of recent graphs, for ``explain``.

Under ``backend="inductor_gqa"`` the counts wait for the compile (``deferred``): a block is
counted once its graph has compiled, so a graph that fails and is retried (after a graph break,
say) is not counted twice. Only attention candidates are blocks: a softmax that no matmul reads
(a MoE router's) is logged at DEBUG as "not attention" and counted nowhere.
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


class Pending:
    """Counts and rows held back until the compile they belong to has succeeded."""

    def __init__(self):
        self.counts: list[tuple[str, str]] = []
        self.rows: list[Row] = []

    def commit(self) -> None:
        for group, key in self.counts:
            counters[group][key] += 1
        history.extend(self.rows)


_pending: Optional[Pending] = None


@contextlib.contextmanager
def deferred():
    """Hold the body's counts and rows back, and apply them only if it returns (the compile
    succeeded); yields the Pending (its ``rows``: the blocks of this compile). Nested: the
    outer one decides."""
    global _pending
    if _pending is not None:
        yield _pending
        return
    _pending = held = Pending()
    try:
        yield held
    finally:
        _pending = None
    held.commit()


def count(group: str, key: str) -> None:
    """``counters[group][key] += 1``, now or, inside ``deferred``, once the compile succeeded."""
    if _pending is not None:
        _pending.counts.append((group, key))
    else:
        counters[group][key] += 1


def count_row(row: Row, plan_name: Optional[str] = None) -> None:
    """The counts of one block."""
    count("inductor_gqa", "blocks_seen")
    if row.fused:
        count("inductor_gqa", "blocks_fused")
        count("inductor_gqa_fused", row.block)
        if plan_name is not None:
            count("inductor_gqa", f"plan: {plan_name}")
    else:
        count("inductor_gqa", f"rejected: {row.reason}")
        count("inductor_gqa_left", f"{row.block}: {row.reason}")


@contextlib.contextmanager
def undone_on_error():
    """Counters and history as they were before the body, should it fail: the fusions it
    reported did not happen."""
    saved = {k: collections.Counter(counters[k]) for k in _COUNTERS}
    rows = len(history)
    held = (len(_pending.counts), len(_pending.rows)) if _pending is not None else None
    try:
        yield
    except Exception:
        for k, c in saved.items():
            counters[k].clear()
            counters[k].update(c)
        while len(history) > rows:
            history.pop()
        if held is not None:
            del _pending.counts[held[0]:], _pending.rows[held[1]:]
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

    def fused(self, anchor: Node, spec, plan=None) -> None:
        path = module_path(anchor)
        self._add(Row(path, True, spec=spec), plan.name if plan is not None else None)
        log.info("fused attention block %s: %s%s", path, spec,
                 f"; plan {plan}" if plan is not None else "")

    def rejected(self, anchor: Node, reason: str, detail: str = "") -> None:
        path = module_path(anchor)
        self._add(Row(path, False, reason, detail))
        log.info("left attention-like block %s unfused: %s%s", path, reason,
                 f" ({detail})" if detail else "")

    def not_attention(self, anchor: Node, why: str) -> None:
        """A softmax that is no attention candidate: no row, no count, a DEBUG line."""
        log.debug("not attention: %s (%s)", module_path(anchor), why)

    def _add(self, row: Row, plan_name: Optional[str] = None) -> None:
        self.rows.append(row)
        count_row(row, plan_name)
        if _pending is not None:
            _pending.rows.append(row)
        else:
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
