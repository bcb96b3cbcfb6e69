"""What the models and training suites share: a row opened per implementation, the fusion
figures of a compilation, the random token ids fed to the model."""

from __future__ import annotations

import torch


def open_row(rows: list, variants: list, base: dict, extra: dict, impl: str, s: int, b: int,
             over_deadline, compile_s: float, row_s: float):
    """A model row (and its variant) for one implementation at (B, S), appended: (row, variant),
    or (row, None) with the row ``skipped`` when its compilation and timings would not fit
    before the deadline (they must fit, not only start)."""
    row = dict(base, impl=impl, seq=s, batch=b, status="error", **extra)
    rows.append(row)
    if over_deadline(compile_s + row_s if impl != "eager" else row_s):
        row["status"] = "skipped"
        return row, None
    v = {"model": base["model"], "attn": base["attn"], "task": base["task"], "impl": impl,
         "seq": s, "batch": b, "status": "ok", "compile_s": None, "graphs": None, "error": None}
    variants.append(v)
    return row, v


def fusion_counts(c) -> dict:
    """A model row's fusion figures from the pass's counters of its compilation."""
    return {"fused_layers": int(c.get("blocks_fused", 0)),
            "blocks_seen": int(c.get("blocks_seen", 0)),
            "rejected": {k[len("rejected: "):]: int(n) for k, n in c.items()
                         if k.startswith("rejected")}}


def token_ids(vocab: int, b: int, s: int, device, seed: int) -> torch.Tensor:
    """Random token ids [b, s] below ``vocab``, the same for a seed on every device."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return torch.randint(0, vocab, (b, s), generator=g).to(device)
