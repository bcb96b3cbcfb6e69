"""Kernel configs and the compile-time choice of one per kernel launch.

Each kernel family has a typed config and a list of candidates. ``choose_*`` picks one from a
problem's static facts: the measured table for this GPU (``tables/<gpu>.json``, written by
``python -m inductor_gqa.tune``) where it has an entry for the shape bucket, else the
family's default (the candidate that measured best most often on the H200). Nothing here runs
on the per-call path: the choice is baked into the code Inductor generates.

Shape buckets: S and the GEMM row count (B*S) by powers of two. Under dynamic shapes the bucket
of the size hint is used; a choice never changes results, only speed, except the one-launch
probabilities (MODE 3), which needs S <= its key tile and is guarded (``plans.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Optional

from ..kernels.launch import interpreting, next_pow2
from ..kernels.proj_rope import config_fits

TABLES_DIR = pathlib.Path(__file__).parent / "tables"


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """flash.py's tile: BLOCK_M query rows (GP query heads of one KV head, BLOCK_M // GP
    positions each) x BLOCK_N keys, warps, pipeline stages; PIPELINE and ALIGN4 switches."""
    block_m: int
    block_n: int
    warps: int
    stages: int
    pipeline: bool = False
    gp: int = 1
    align4: bool = False


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """linear.py's tile (the 3xTF32 GEMMs and the guarded float32 twins)."""
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    warps: int
    stages: int


@dataclasses.dataclass(frozen=True)
class ProjectionConfig:
    """proj_rope.py's tile (the fused fp16 projection with its norm/RoPE epilogue)."""
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    persistent: bool = False
    tma: bool = True        # operands through the copy engine (host-built tensor descriptors)


# ---- candidates (H200 measurements; the first of each list is the family default) ----------
A = AttentionConfig
# fp16 operand copies of float32 blocks, probabilities pass (MODE 2) and stats pass (MODE 1)
F16_PROBS = [A(64, 64, 4, 3), A(128, 32, 8, 3), A(64, 32, 4, 3), A(128, 32, 8, 4),
             A(128, 64, 8, 4), A(64, 64, 4, 3, pipeline=True), A(64, 64, 4, 3, gp=4),
             A(128, 64, 8, 3, gp=4), A(64, 64, 4, 3, align4=True), A(64, 32, 4, 3, align4=True)]
F16_STATS = [A(64, 128, 4, 2), A(128, 64, 8, 3), A(64, 128, 4, 3), A(128, 128, 8, 3),
             A(128, 128, 8, 2), A(64, 64, 4, 2)]
# float32 operands (TF32 or 3xTF32): K-major V; the probabilities pass likes narrow key tiles
F32_PROBS = [A(128, 32, 8, 3), A(128, 32, 8, 4), A(128, 32, 8, 2), A(128, 64, 8, 3),
             A(64, 32, 4, 3), A(64, 64, 4, 2), A(128, 32, 8, 3, pipeline=True)]
F32_STATS = [A(128, 128, 8, 2), A(128, 64, 8, 3), A(64, 128, 4, 2), A(64, 64, 4, 2)]
F32_ONLINE = [A(64, 64, 4, 2), A(128, 64, 8, 2), A(128, 128, 8, 2), A(64, 128, 4, 2)]
# 16-bit models (bf16/fp16 activations), no probabilities
B16_ONLINE_64 = [A(128, 64, 4, 3), A(128, 128, 8, 3), A(64, 64, 4, 3)]
B16_ONLINE = [A(128, 64, 8, 3), A(128, 128, 8, 3), A(64, 64, 4, 3), A(128, 32, 4, 3),
              A(64, 64, 4, 2), A(64, 32, 4, 3)]
# the guarded float32 fallback behind fp16 copies: runs only when a value left fp16's range,
# so it is only required to run (small tiles fit any head size)
FALLBACK_ATTENTION = A(64, 64, 4, 2)
FALLBACK_GEMM = GemmConfig(128, 128, 32, 8, 8, 3)
P = ProjectionConfig
PROJECTION = [P(64, 64, 64, 4, 4), P(64, 128, 64, 4, 4), P(64, 128, 64, 4, 3),
              P(64, 64, 128, 4, 4), P(64, 64, 128, 4, 3), P(128, 128, 64, 8, 4, True),
              P(128, 128, 64, 8, 3, True), P(128, 128, 64, 8, 4)]
G = GemmConfig
GEMM_TF32X3 = [G(128, 128, 32, 8, 8, 3), G(128, 64, 32, 8, 4, 3), G(64, 128, 32, 8, 4, 3),
               G(64, 64, 32, 8, 4, 4), G(64, 64, 64, 8, 4, 3)]

# the Triton interpreter (CPU tests): one small config per family, fast to interpret
_INTERP_ATTENTION = A(32, 32, 4, 1)
_INTERP_GEMM = G(32, 32, 32, 8, 4, 1)


def bucket(n) -> int:
    """A size's power-of-two bucket."""
    return next_pow2(int(n))


@functools.lru_cache(maxsize=None)
def _table(gpu: str) -> dict:
    path = TABLES_DIR / f"{gpu_slug(gpu)}.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200' (the tables' and the perf results' file names)."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def table_key(family: str, *parts) -> str:
    return "|".join([family, *map(str, parts)])


def committed_table(gpu: Optional[str]) -> dict:
    """The measured table shipped for this GPU ({} for none)."""
    return _table(gpu) if gpu else {}


def lookup(tables, family: str, parts: tuple, cls, default):
    """The config for (family, parts) from the first of ``tables`` (dicts of table entries)
    that has one, else ``default``."""
    key = table_key(family, *parts)
    for table in tables:
        entry = table.get(key)
        if entry is not None:
            return cls(**entry)
    return default


def attention_candidates(kind: str, operands: str, head_dim: int, mode: int, groups: int,
                         seq_static: Optional[int], causal: bool) -> list:
    """The configs a launch of MODE ``mode`` may take. ``operands``: "f16" (fp16 copies of a
    float32 block), "f32" (float32, TF32 or 3xTF32) or "b16" (bf16/fp16 model). ``kind``:
    "online", "pair" or "single"."""
    if interpreting():
        if kind == "single":
            return [A(32, max(16, next_pow2(seq_static or 16)), 4, 1)]
        return [_INTERP_ATTENTION]
    if kind == "single":
        bn = max(16, next_pow2(seq_static))
        cfgs = [A(bm, bn, nw, 1) for bm, nw in ((64, 4), (16, 4), (32, 4), (64, 8), (128, 8))]
        if operands == "f16":
            cfgs = [A(64, bn, 4, 1, gp=4)] + cfgs if groups % 4 == 0 else cfgs
        return cfgs
    if operands == "f16":
        cands = {0: F32_ONLINE, 1: F16_STATS, 2: F16_PROBS}[mode]
    elif operands == "f32":
        cands = {0: F32_ONLINE, 1: F32_STATS, 2: F32_PROBS}[mode]
    else:
        cands = B16_ONLINE_64 if head_dim <= 64 else B16_ONLINE
    elem = 4 if operands == "f32" else 2
    out = []
    for c in cands:
        if c.gp > 1 and (groups % c.gp or c.block_m % c.gp):
            continue
        if c.align4 and (causal or seq_static is None or seq_static % 4 == 0):
            continue
        if _smem_bytes(c, head_dim, elem) > _SMEM_BUDGET:
            continue
        out.append(c)
    return out or [A(32, 32, 4, 1)]


_SMEM_BUDGET = 160 * 1024      # of the H200's 227 KB per block: Triton's own buffers on top


def _smem_bytes(c: AttentionConfig, head_dim: int, elem: int) -> int:
    """A rough footprint of a tile: q, and K and V for every pipeline stage (wide heads in
    float32 need small tiles: head_dim 256 at 128 x 128 asks for 384 KB)."""
    d = next_pow2(head_dim)
    return (c.block_m * d + 2 * max(1, c.stages) * c.block_n * d) * elem


def attention_key(kind, operands, head_dim, mode, groups, seq_hint, causal, mask_kind) -> tuple:
    """The table key of an attention launch: its switches and S's power-of-two bucket."""
    return (kind, operands, head_dim, mode, groups, int(causal), mask_kind, bucket(seq_hint))


def choose_attention(tables, kind, operands, head_dim, mode, groups, seq_static, seq_hint, rows,
                     causal, mask_kind) -> AttentionConfig:
    cands = attention_candidates(kind, operands, head_dim, mode, groups, seq_static, causal)
    key = attention_key(kind, operands, head_dim, mode, groups, seq_hint, causal, mask_kind)
    found = lookup(tables, "attention", key, AttentionConfig, None)
    if found in cands:
        return found
    if kind == "single" and rows < 16384 and not interpreting():
        # a short row tile where the grid would be small (131x1: 144 programs, not 36)
        small = A(16, cands[-1].block_n, 4, 1)
        return small if small in cands else cands[0]
    return cands[0]


def projection_key(rows_hint, parts, head_dim) -> tuple:
    return (bucket(rows_hint), *parts, head_dim)


def projection_candidates(parts, head_dim, rows_static, tma=True) -> list:
    if interpreting():
        return [P(32, head_dim, 32, 4, 1, tma=tma)]
    return [dataclasses.replace(c, tma=tma) for c in PROJECTION if config_fits(c, parts, head_dim)
            and (not c.persistent or rows_static is not None)]


def choose_projection(tables, rows_hint, parts, head_dim, rows_static,
                      tma=True) -> Optional[ProjectionConfig]:
    """proj_rope's config, or None where no candidate covers the part widths."""
    cands = projection_candidates(parts, head_dim, rows_static, tma)
    if not cands:
        return None
    if interpreting():
        return cands[0]
    found = lookup(tables, "projection", projection_key(rows_hint, parts, head_dim),
                   ProjectionConfig, None)
    if found is not None and dataclasses.replace(found, tma=tma) in cands:
        return dataclasses.replace(found, tma=tma)
    # the H200 defaults by row count (W075's shapes): 128-deep K steps for a few hundred rows,
    # 64x128 tiles up to ~2k rows, persistent 128x128 beyond
    if rows_hint <= 384:
        pref = P(64, 64, 128, 4, 4, tma=tma)
    elif rows_hint <= 2048:
        pref = P(64, 128, 64, 4, 3, tma=tma)
    else:
        pref = P(128, 128, 64, 8, 4, True, tma=tma)
    return pref if pref in cands else cands[0]


def gemm_key(which, rows_hint, n, k) -> tuple:
    """``which``: "qkv" (the three projections in one launch) or "o" (o_proj)."""
    return (which, bucket(rows_hint), bucket(n), k)


def choose_gemm(tables, which, rows_hint, n, k) -> Optional[GemmConfig]:
    """The 3xTF32 Triton GEMM's config for float32 under "highest", or None where the table says
    the library's IEEE GEMM wins."""
    if interpreting():
        return _INTERP_GEMM
    found = lookup(tables, "gemm_tf32x3", gemm_key(which, rows_hint, n, k), GemmConfig, None)
    if found is None:
        # H200 (tune.py): ours beat the library's IEEE GEMM at every W075 size, 64x64x64
        # tiles up to ~2k rows, 128-row tiles beyond
        if rows_hint <= 2048:
            return G(64, 64, 64, 8, 4, 3)
        return G(128, 128, 32, 8, 8, 3) if which == "qkv" else G(128, 64, 32, 8, 4, 3)
    return None if found.block_m == 0 else found


LIBRARY_GEMM = GemmConfig(0, 0, 0, 0, 0, 0)     # the table's entry for "the library GEMM wins"


def fallback_gemm() -> GemmConfig:
    return _INTERP_GEMM if interpreting() else FALLBACK_GEMM


def fallback_attention() -> AttentionConfig:
    return _INTERP_ATTENTION if interpreting() else FALLBACK_ATTENTION
