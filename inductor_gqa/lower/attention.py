"""Attention core of the block: the flash kernel's candidate configs per pass and its launches
(fp16-copies launches with their guarded float32 fallback, MODE 3 or the stats/probabilities pair,
or one online-softmax pass), or the library SDPA where it measured faster.

Every choice is measured once per shape bucket (``tuning.pick``) and cached.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..kernels import flash, probs_staged, stats_overlap, tuning
from ..kernels.host import heads_per_program
from ..plan.spec import BlockSpec


def fp32_dot_precision() -> str:
    """Read at call time: torch.get_float32_matmul_precision() -> Triton input_precision."""
    if torch.get_float32_matmul_precision() == "highest":
        return os.environ.get("INDUCTOR_GQA_FP32_HIGHEST", "tf32x3")
    return "tf32"


def _attention_candidates(dtype, d, mode, f16=False, groups=1, align4=False):
    """``align4``: flash.py's ALIGN4 applies to the probabilities pass (``flash.align4_ok``)."""
    cfgs = _attention_configs(dtype, d, mode, f16)
    if mode == 2 and not tuning.interpreting():
        # flash.py's PIPELINE: measured on the H200, it wins the probabilities pass at ragged S
        # (449x16: 199 -> 176 us) and with fp16 operands at large S; never the stats pass
        aligned = [c + ("a4",) for c in _ALIGNED_F16_PROBS] if f16 and align4 else []
        return (cfgs + [c + ("pipeline",) for c in cfgs] + _packed(_PACKED_F16_PROBS, f16, groups)
                + aligned)
    return cfgs


# flash.py's ALIGN4 (rows of one residue class mod 4, key tiles shifted so the probabilities
# go out as aligned 16-byte stores at ragged S), fp16 copies: measured on the H200
# (perf/experiments/gqa_pack_bench.py) 120.4 -> 109.6 us for the probabilities pass at 449x16,
# no change at 373x8, 541x1, 211x2 and 131x1
_ALIGNED_F16_PROBS = [(64, 64, 4, 3), (64, 32, 4, 3), (128, 64, 8, 4),
                      (64, 32, 4, 3, "pipeline")]


# flash.py's GP: the probabilities-pass configs that won with 4 query heads per program on the
# H200 (perf/experiments/gqa_pack_bench.py; fp16 copies: 4096x1 326 -> 307 us, 512x16 102 -> 95,
# 512x8 51 -> 47, 2048x1 86 -> 82; never the stats pass, which is not bound by K/V traffic)
_PACKED_F16_PROBS = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 32, 4, 3),
                     (64, 64, 4, 3, "pipeline")]


def _packed(cfgs, f16, groups, gp=4):
    """cfgs with gp query heads per program, where the group allows it (fp16 copies only: what
    was measured)."""
    if not f16 or groups % gp or tuning.interpreting():
        return []
    return [c + (f"gp{gp}",) for c in cfgs if c[0] % gp == 0]


def _attention_configs(dtype, d, mode, f16=False):
    """(BLOCK_M, BLOCK_N, warps, stages) candidates of one pass (flash.py's MODE); ``f16``: fp16
    q/k/V copies of a float32 block (fp32 probabilities and output)."""
    if tuning.interpreting():
        return [(32, 32, 4, 1)]
    if f16:
        # measured on the H200 at W075 sizes (perf/experiments/fp16_scores_bench.py)
        if mode == 2:
            return [(64, 64, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3), (128, 32, 8, 4),
                    (128, 64, 8, 4), (128, 64, 8, 3), (32, 64, 4, 2)]
        if mode == 1:
            return [(64, 128, 4, 2), (128, 64, 8, 3), (64, 128, 4, 3), (128, 128, 8, 3),
                    (128, 128, 8, 2), (64, 64, 4, 2)]
    if dtype == torch.float32:
        # measured on the H200 with K-major V: the probabilities pass likes narrow N tiles
        # (store + P@V per tile), the stats pass wide ones
        # (deeper pipelines: 3 stages took the probabilities pass from 623 to 467 us at 4096x1)
        if mode == 2:
            return [(128, 32, 8, 3), (128, 32, 8, 4), (128, 32, 8, 2), (256, 32, 8, 3),
                    (128, 64, 8, 3), (128, 16, 8, 4), (64, 32, 4, 3), (64, 64, 4, 2),
                    (64, 64, 4, 3), (32, 64, 4, 2)]
        if mode == 1:
            return [(128, 128, 8, 2), (128, 64, 8, 3), (64, 128, 4, 2), (64, 64, 4, 2),
                    (128, 128, 8, 3), (64, 128, 4, 3), (32, 128, 4, 2)]
        return [(64, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 2),
                (32, 128, 4, 2), (64, 128, 4, 3), (16, 128, 4, 2)]
    if d <= 64:
        return [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)]
    return [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 2),
            (64, 32, 4, 3)]


def _single_pass_candidates(s, f16=False, groups=1):
    """For S <= 256 the probabilities in one launch (flash.py's MODE 3, one key tile per row)
    instead of the stats and probabilities passes; measured against the pair, which stays a
    candidate (H200: 8.2 vs 10.3 us at 131x1, 11.1 vs 12.4 at 211x2; the pair wins at 256x8).
    INDUCTOR_GQA_SINGLE_PASS=0 turns it off."""
    if os.environ.get("INDUCTOR_GQA_SINGLE_PASS", "1") == "0" or s > 256:
        return []
    bn = max(16, 1 << (s - 1).bit_length())
    if tuning.interpreting():
        return [(32, bn, 4, 1)]
    # one key tile per row: nothing to pipeline (one stage keeps K and V tiles single); packed
    # query heads measured with fp16 copies at 131x1: 7.6 -> 6.2 us
    cfgs = [(bm, bn, nw, 1) for bm, nw in ((16, 4), (32, 4), (64, 4), (64, 8), (128, 8))]
    return cfgs + _packed(cfgs, f16, groups)


def _rolling_candidates(f16, s, causal, mask_kind, groups):
    """flash.py's MODE 6 (the stats pass rolled into the probabilities pass, ROWS row tiles per
    program) for the fp16 copies, no mask, not causal: candidates beside the pair. On the H200
    (perf/experiments/rolling_bench.py) the stats work does not hide under the stores (4096x1
    428 vs 419 us for the pair, 2048x1 116 vs 112), but one launch wins where the grid is small:
    541x1 19.8 vs 23.1 us with one row tile per program. The configs are the best four of 60.
    INDUCTOR_GQA_ROLLING=0 turns it off."""
    if (f16 is None or causal or mask_kind != 0 or s <= 256
            or os.environ.get("INDUCTOR_GQA_ROLLING", "1") == "0"):
        return []
    if tuning.interpreting():
        return [(32, 32, 4, 1, "roll2")]
    return [(64, 64, 4, 3, "roll1")] + _packed(
        [(64, 64, 4, 3, f"roll{r}") for r in (1, 2, 4)], True, groups)


def rolling_rows(cfg) -> int:
    """MODE 6's row tiles per program from a config's "roll<R>" flag; 0 without it."""
    if not isinstance(cfg, tuple):
        return 0
    return next((int(f[4:]) for f in cfg[4:] if isinstance(f, str) and f.startswith("roll")), 0)


def _staged_candidates(f16, s, d, mask_kind, scale, groups=1):
    """kernels/probs_staged.py's one-launch probabilities (Gluon, Hopper) for the fp16 copies,
    measured against flash.py's pair and MODE 3: on the H200 it wins at S in 256..512 (512x16:
    128 -> 110 us for the attention, 449x16 147 -> 119, 373x8 54 -> 40).
    INDUCTOR_GQA_STAGED=0 turns it off."""
    if (f16 is None or os.environ.get("INDUCTOR_GQA_STAGED", "1") == "0"
            or tuning.interpreting()):
        return []
    q16, k16, v16, _ = f16
    return probs_staged.candidates(q16, k16, v16, s, d, mask_kind, scale, groups)


def _overlap_candidates(f16, d, mask_kind, scale):
    """kernels/stats_overlap.py's stats pass (each key tile's MMA under the previous tile's
    exponentials, Gluon) for the fp16 copies, beside flash.py's MODE 1 configs. H200
    (perf/experiments/stats_overlap_bench.py): causal 449x16 38.7 -> 24.5 us, 4096x1 84.5 -> 78.2;
    not causal within +-2% (4096x1 116.3 -> 113.9). INDUCTOR_GQA_STATS_OVERLAP=0 turns it off."""
    if (f16 is None or os.environ.get("INDUCTOR_GQA_STATS_OVERLAP", "1") == "0"
            or tuning.interpreting()):
        return []
    q16, k16, v16, _ = f16
    return stats_overlap.candidates(q16, k16, v16, d, mask_kind, scale)


# configs of the float32 fallback behind fp16 copies: it runs only when a value left fp16's range,
# so it is not tuned for speed, only checked to run (small tiles fit any head_dim)
_FALLBACK_CONFIGS = [(64, 64, 4, 2), (32, 64, 4, 2), (32, 32, 4, 1)]


def _sdpa_ok(spec: BlockSpec, dt):
    return (not spec.return_probs and spec.mask == "none" and dt != torch.float32
            and not tuning.interpreting())


def attention(q, k, v, mask, spec: BlockSpec, b, s, scale_value: float, v_kmajor=False,
              f16=None, out16=None, before_fallback=None, deferred=None):
    """q [B*S, H*D], k [B*S, Hkv*D] contiguous; v the same, or V^T [Hkv*D, B*S] contiguous when
    ``v_kmajor`` -> (o [B,S,H*D], probs or None). ``f16``: (q16, k16, v16, flag), fp16 copies of
    float32 q, k, v (row-major) to compute with; q, k, v are then the fallback for when ``flag``
    says a value left fp16's range. ``out16`` (with ``f16``): an fp16 [B,S,H*D] buffer the fp16
    launches write the output to instead (o is then written only by the fallback).
    ``before_fallback``: called between the fp16 launches and the fallback's. ``deferred``: a
    list that takes ``before_fallback`` and the guarded fallback launches as one callable, for
    the caller to run later (before anything reads the float32 o), instead of running them."""
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    dt = q.dtype

    def views(q, k, v, kmajor):
        # rows of q, k (and row-major v) may be further apart than heads * D: column slices of
        # one fused QKV product
        lq, lk, lv = q.stride(0), k.stride(0), v.stride(0)
        if kmajor:
            vs = (v, (s, d * b * s, 1, b * s))
        else:
            vs = (v, (s * lv, d, lv, 1))
        return (q, (s * lq, d, lq)), (k, (s * lk, d, lk)), vs, kmajor

    scale = spec.effective_scale(scale_value)
    prec = fp32_dot_precision() if dt == torch.float32 else "tf32"
    mk = flash.MASK_CODES[spec.mask]
    o = torch.empty((b, s, h * d), device=q.device, dtype=dt)
    base_key = (dt, h, hk, d, spec.causal, mk, prec, tuning.shape_key(s, b * h))
    if f16 is not None:
        q16, k16, v16, flag = f16
        main, guard = views(q16, k16, v16, False), 1
        fallback = views(q, k, v, False)
        base_key += ("f16",) + (("o16",) if out16 is not None else ())
    else:
        main, guard, flag, fallback = views(q, k, v, v_kmajor), 0, None, None
        if out16 is not None:
            raise ValueError("attention: an fp16 output needs the fp16 copies")

    def run(mode, cfg, probs=None, ml=None, ops=main, guard=guard):
        if cfg == "sdpa":
            return _sdpa(q, k, v, spec, b, s, scale)
        if cfg[0] == "overlap":
            if cfg in overlap:
                q16, k16, _, _ = f16
                stats_overlap.launch(q16, k16, ml, flag, b, s, h, spec.groups, d, scale,
                                     spec.causal, cfg, guard=1)
                return o
            # a choice cached for a call whose operands it took: flash.py's first config
            cfg = _attention_candidates(dt, d, mode, f16 is not None, spec.groups)[0]
        qs, ks, vs, kmajor = ops
        upcast = tuning.interpreting() and qs[0].dtype != torch.float32
        bm, bn, nw, ns = cfg[:4]
        dst = out16 if out16 is not None and ops is main else o
        flash.launch(qs, ks, vs, dst, probs, mask, ml, b, s, h, spec.groups, d, scale,
                     spec.mask_fill, spec.causal, mk, mode, prec, upcast, bm, bn, nw, ns,
                     v_kmajor=kmajor, pipeline="pipeline" in cfg, flag=flag, guard=guard,
                     gp=heads_per_program(cfg), align4="a4" in cfg,
                     rows=max(1, rolling_rows(cfg)))
        return o

    def run_fallback(mode, probs=None, ml=None):
        # float32 operands, launched behind the fp16 path; its programs exit unless the flag is
        # set. Its config is only checked to run, by its own guarded launch: an unguarded trial
        # (timed, as it once was) read float32 q/k/v that only the fallback finishes and wrote
        # garbage over the call's probabilities and o (H200: max error 1.0 on a bucket's first
        # call whose plan was not timed first)
        if fallback is None:
            return
        cfg = tuning.first_runnable(base_key + ("fallback", mode), _FALLBACK_CONFIGS,
                                    lambda c: run(mode, c, probs, ml, fallback, 2))
        # (after a first call's trial this launches again: it exits at once, or with the flag
        # raised writes the same results again)
        run(mode, cfg, probs, ml, fallback, 2)

    f16_cfgs = f16 is not None
    if not spec.return_probs:
        cands = list(_attention_candidates(dt, d, 0, f16_cfgs, spec.groups))
        if _sdpa_ok(spec, dt):
            cands.append("sdpa")
        cfg = tuning.pick(base_key + (0,), cands, lambda c: run(0, c))
        out = run(0, cfg)       # the SDPA candidate returns its own tensor
        _fallbacks(before_fallback, lambda: run_fallback(0), deferred)
        return out, None
    probs = torch.empty((b, h, s, s), device=q.device, dtype=dt)
    ml = torch.empty((b * h * s * 2,), device=q.device, dtype=torch.float32)

    overlap = _overlap_candidates(f16, d, mk, scale)

    def two_pass():
        c1 = tuning.pick(base_key + (1,) + (("overlap",) if overlap else ()),
                         _attention_candidates(dt, d, 1, f16_cfgs, spec.groups) + overlap,
                         lambda c: run(1, c, None, ml))
        run(1, c1, None, ml)        # pass 2 is measured on real statistics
        align4 = flash.align4_ok(s, 2, spec.causal, 1, 0)     # the pass's rule, block_n unused
        c2 = tuning.pick(base_key + (2,),
                         _attention_candidates(dt, d, 2, f16_cfgs, spec.groups, align4),
                         lambda c: run(2, c, probs, ml))
        run(2, c2, probs, ml)

    def run_staged(cfg):
        q16, k16, v16, _ = f16
        probs_staged.launch(q16, k16, v16, out16 if out16 is not None else o, probs, flag, b,
                            s, h, spec.groups, d, scale, spec.causal, cfg, guard=1)

    def one(c):
        if c == "two-pass":
            two_pass()
        elif rolling_rows(c):
            run(6, c, probs)
        elif c[0] == "staged":
            # a choice cached for another S of the bucket may not fit this one's shared memory
            # (or this call's alignment): the pair then runs
            run_staged(c) if c in staged else two_pass()
        else:
            run(3, c, probs)

    singles = _single_pass_candidates(s, f16_cfgs, spec.groups)
    staged = _staged_candidates(f16, s, d, mk, scale, spec.groups)
    rolling = _rolling_candidates(f16, s, spec.causal, mk, spec.groups)
    if singles or staged or rolling:
        one(tuning.pick(base_key + (3,), singles + ["two-pass"] + staged + rolling, one))
    else:
        two_pass()
    # the stats and probabilities passes in one launch
    _fallbacks(before_fallback, lambda: run_fallback(4, probs, ml), deferred)
    return o, probs


def _fallbacks(before, launch, deferred):
    def run():
        if before is not None:
            before()
        launch()
    if deferred is None:
        run()
    else:
        deferred.append(run)


def _sdpa(q, k, v, spec, b, s, scale):
    h, hk, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    q4 = q.view(b, s, h, d).transpose(1, 2)
    k4 = k.view(b, s, hk, d).transpose(1, 2)
    v4 = v.view(b, s, hk, d).transpose(1, 2)
    r = F.scaled_dot_product_attention(q4, k4, v4, is_causal=spec.causal, scale=scale,
                                       enable_gqa=spec.groups > 1)
    return r.transpose(1, 2).reshape(b, s, h * d)
