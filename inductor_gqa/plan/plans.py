"""The block's kernel plans: what runs, with which configs, decided once while Inductor compiles.

Two plans cover every block the GPU path takes:

* ``NativePlan``: projections as GEMMs in the activation dtype (the library's, or Triton 3xTF32
  for float32 under "highest"), RoPE tables from the positions when the block computes them, the
  norm/RoPE epilogue on q and k, flash attention (one pass, or the probabilities pair, or one
  launch when a row fits one key tile), o_proj.
* ``Fp16CopiesPlan``: float32 blocks where TF32 is allowed, on fp16 copies of the operands
  (fp16 has TF32's 10-bit significand, rounds to nearest and runs at twice the rate): operand
  copies with exact power-of-two row scales, the Q/K/V GEMM with the norm/RoPE epilogue in one
  launch, attention and o_proj on fp16 copies, each copy range-checked into one flag, and the
  float32 fallback launches guarded by it (they exit at once unless a value left fp16's range).

A block over a DynamicCache (``cache="concat"``) takes ``CachedSdpaPlan``: the library's GEMMs
and attention around our norm/RoPE kernel. Static caches have no plan yet.

``choose(spec, problem, options)`` returns the plan, or raises ``Unsupported`` with the reason,
in which case the pass leaves the block to stock Inductor. A plan lists what it supports; a
BlockSpec field it does not know is unsupported by default (``_KNOWN_FIELDS``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import torch

from ..kernels import proj_rope
from ..kernels.flash import MASK_CODES
from ..kernels.launch import interpreting, static_int
from . import configs as cfgs
from ..kernels.flash_bwd import BackwardConfig, choose_config as choose_backward
from .configs import AttentionConfig, GemmConfig, ProjectionConfig
from .spec import BlockSpec


class Unsupported(Exception):
    """No kernel plan covers the block: ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# BlockSpec fields whose every value the plans below implement; a field added to BlockSpec
# later (with a value other than its default) is unsupported until a plan learns it
_KNOWN_FIELDS = {"num_heads", "num_kv_heads", "head_dim", "norm", "eps", "rope", "rotary_dim",
                 "core", "scale", "scale_op", "causal", "mask", "mask_fill", "return_probs",
                 "window", "softcap"}


@dataclasses.dataclass(frozen=True)
class Problem:
    """The static facts of one block's call site, from the traced (fake) inputs."""
    dtype: torch.dtype
    device: torch.device
    gpu: Optional[str]              # device name, None on the CPU (interpreter)
    capability: tuple
    num_sms: int
    precision: str                  # torch.get_float32_matmul_precision() at compile time
    batch: object                   # int or SymInt
    seq: object
    embed: int
    qkv_bias: bool
    o_proj: bool
    o_bias: bool
    rope_source: str                # "none", "tables" (cos/sin inputs), "positions"
    runtime_floats: bool
    tables_dtype: Optional[torch.dtype]
    mask_rank_ok: bool
    # S's power-of-two bucket (lo, hi], lo < S <= hi, when S is symbolic: the plan is made for
    # it and guarded on it (another bucket compiles its own plan; see ``seq_bucket``)
    seq_range: Optional[tuple] = None

    @property
    def seq_static(self) -> Optional[int]:
        return static_int(self.seq)

    @property
    def seq_hint(self) -> int:
        return _hint(self.seq, 1024)

    @property
    def seq_max(self) -> Optional[int]:
        """S's upper bound: its value, or its guarded bucket's top."""
        return self.seq_static if self.seq_static is not None else (
            self.seq_range[1] if self.seq_range else None)

    @property
    def rows_hint(self) -> int:
        # an unbacked batch (no hint) counts as 1: its rows are unknown, S's are not
        return _hint(self.batch, 1) * _hint(self.seq, 1024)

    @property
    def rows_static(self) -> Optional[int]:
        b, s = static_int(self.batch), static_int(self.seq)
        return b * s if b is not None and s is not None else None

    @staticmethod
    def of(spec: BlockSpec, t: dict) -> "Problem":
        """From the op's tensor arguments (fake tensors or real ones) by name."""
        x = t["x"]
        b, s, e = x.shape
        dev = x.device
        gpu, cap, sms = None, (0, 0), 4
        if dev.type == "cuda":
            props = torch.cuda.get_device_properties(dev)
            gpu, cap, sms = props.name, (props.major, props.minor), props.multi_processor_count
        if spec.rope == "none":
            source = "none"
        elif t.get("cos") is not None:
            source = "tables"
        else:
            source = "positions"
        mask = t.get("attn_mask")
        return Problem(
            dtype=x.dtype, device=dev, gpu=gpu, capability=cap, num_sms=sms,
            precision=torch.get_float32_matmul_precision(), batch=b, seq=s,
            embed=static_int(e) or 0,
            qkv_bias=any(t.get(n) is not None for n in ("bq", "bk", "bv")),
            o_proj=t.get("wo") is not None, o_bias=t.get("bo") is not None,
            rope_source=source,
            runtime_floats=any(t.get(n) is not None
                               for n in ("runtime_scale", "runtime_eps", "runtime_k_eps")),
            tables_dtype=t["cos"].dtype if source == "tables" else None,
            mask_rank_ok=mask is None or mask.dim() <= 4, seq_range=seq_bucket(s))


def _hint(v, fallback: int) -> int:
    if isinstance(v, torch.SymInt):
        return int(v.node.hint) if v.node.hint is not None else fallback
    return int(v)


def seq_bucket(s) -> Optional[tuple]:
    """For a symbolic S with a hint: its power-of-two bucket (lo, hi], with guards that S stays
    in it. Configs are chosen per bucket (``configs.py``), so a graph compiled for one bucket
    must not run another: Dynamo compiles the next bucket's graph when S leaves this one (a few
    specializations, not one per S). None for a static S or one without a hint."""
    if not isinstance(s, torch.SymInt) or s.node.expr.is_number or s.node.hint is None:
        return None
    hi = cfgs.bucket(int(s.node.hint))
    lo = hi // 2
    if not (bool(s > lo) and bool(s <= hi)):      # evaluating installs the guards
        raise AssertionError("S outside the bucket of its own hint")
    return lo, hi


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
    """How the attention core runs: "online" (MODE 0, no probabilities), "pair" (MODE 1 stats +
    MODE 2 probabilities), "single" (MODE 3: a row in one key tile, S <= 256), or "sdpa" (the
    library's fused attention, for 16-bit blocks without probabilities or masks at large
    sizes)."""
    kind: str
    main: Optional[AttentionConfig] = None
    stats: Optional[AttentionConfig] = None


@dataclasses.dataclass(frozen=True)
class NativePlan:
    prec: str                       # the dots' precision: "ieee" (16-bit), "tf32" or "tf32x3"
    qkv_gemm: Optional[GemmConfig]  # 3xTF32 Triton GEMMs (float32 "highest"), None: library
    o_gemm: Optional[GemmConfig]
    v_kmajor: bool                  # float32 V as V^T (the K-major operand of TF32 P @ V)
    attention: AttentionPlan

    name = "native"


@dataclasses.dataclass(frozen=True)
class Fp16CopiesPlan:
    projection: ProjectionConfig
    fused_angles: bool              # cos/sin computed in the projection launch from positions
    o16: bool                       # o_proj on fp16 copies (no o_proj bias)
    attention: AttentionPlan
    num_sms: int

    name = "fp16_copies"


@dataclasses.dataclass(frozen=True)
class CachedSdpaPlan:
    """A block over a DynamicCache (``cache="concat"``, a decode step): the projections as the
    library's GEMMs, our norm/RoPE epilogue on q and k, the new k/v joined to the cache, then the
    library's ``F.scaled_dot_product_attention`` over all of it with an explicit mask (causal
    aligned at the end, the block's mask tensor; grouped heads as they are without a mask,
    repeated as stock passes them with one), o_proj. A first plan: the split-KV decode kernel
    replaces its attention."""
    name = "cached_sdpa"


Plan = Union[NativePlan, Fp16CopiesPlan, CachedSdpaPlan]


@dataclasses.dataclass(frozen=True)
class CorePlan:
    """The attention core of a block with gradients (op/attention_core.py): the forward as
    "online" (MODE 0 storing its row statistics) or "pair" (MODE 1 statistics, MODE 2 with the
    probabilities), and flash_bwd's config for the backward."""
    prec: str
    attention: AttentionPlan
    backward: BackwardConfig
    name = "core"


def _check_common(spec: BlockSpec, p: Problem, options) -> None:
    if spec.cache != "none":
        # the kernels attend over the block's own k/v: a query shorter than its keys, keys from
        # a cache, the end-aligned causal and the cache's masks are not theirs yet
        raise Unsupported(f"no kernel for a K/V cache (cache={spec.cache!r}) yet")
    for f in dataclasses.fields(spec):
        if f.name not in _KNOWN_FIELDS and getattr(spec, f.name) != f.default:
            raise Unsupported(f"no kernel for {f.name}={getattr(spec, f.name)!r} yet")
    if p.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise Unsupported(f"dtype {p.dtype}")
    if not 16 <= spec.head_dim <= 256:
        raise Unsupported(f"head_dim {spec.head_dim} (kernels cover 16-256)")
    if p.tables_dtype is not None and p.tables_dtype != p.dtype:
        raise Unsupported(f"cos/sin in {p.tables_dtype}, activations in {p.dtype}")
    if not p.mask_rank_ok:
        raise Unsupported("a mask of more than 4 dims")
    if p.device.type == "cpu" and not interpreting():
        raise Unsupported("CPU tensors (the kernels run on CPU only in Triton's interpreter)")


SDPA_MIN_ROWS = 131072      # B * H * S from which the training core takes the library's forward
# B * H * S from which inference plans the library's attention (docs/decisions.md, "Compile
# modes": on an H100 it was as fast or faster at every size measured down to this one)
SDPA_INFERENCE_MIN_ROWS = 49152


def _attention_plan(spec: BlockSpec, p: Problem, operands: str, tables) -> AttentionPlan:
    rows = p.rows_hint * spec.num_heads
    mk = MASK_CODES[spec.mask]
    common = dict(tables=tables, operands=operands, head_dim=spec.head_dim, groups=spec.groups,
                  seq_static=p.seq_max, seq_hint=p.seq_hint, rows=rows, causal=spec.causal,
                  mask_kind=mk)
    if not spec.return_probs:
        # the library's attention (cuDNN / FlashAttention with GQA) for 16-bit blocks; ours
        # where the grid is small
        if (operands == "b16" and spec.mask == "none" and rows >= SDPA_INFERENCE_MIN_ROWS
                and not p.runtime_floats
                and not getattr(spec, "window", 0) and not getattr(spec, "softcap", 0.0)
                and spec.head_dim in (64, 128) and not interpreting()):
            return AttentionPlan("sdpa")
        return AttentionPlan("online", cfgs.choose_attention(kind="online", mode=0, **common))
    s = p.seq_max
    # one launch for the probabilities where a row fits one key tile: measured faster than the
    # pair up to S = 256 on the H200 (131x1: 8.2 vs 10.3 us; the pair wins at 256x8)
    if s is not None and s <= 256 and p.rows_hint <= 1024:
        return AttentionPlan("single", cfgs.choose_attention(kind="single", mode=3, **common))
    return AttentionPlan("pair", cfgs.choose_attention(kind="pair", mode=2, **common),
                         cfgs.choose_attention(kind="pair", mode=1, **common))


def _fp16_copies(spec: BlockSpec, p: Problem, options, tables) -> Optional[Fp16CopiesPlan]:
    """The fp16-copies plan where it applies, else None."""
    if not (options.fp16_operands and p.dtype == torch.float32 and p.precision != "highest"):
        return None
    if p.qkv_bias or not proj_rope.covers(spec.head_dim, spec.rope, spec.rotary_dim):
        return None
    if p.device.type == "cuda" and p.capability < (9, 0):
        return None     # the projection reads its operands through the Hopper copy engine
    if p.embed == 0 or p.embed > 16384:
        return None
    parts = (spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
             spec.num_kv_heads * spec.head_dim)
    # pointer loads, not host-built tensor descriptors: on torch 2.11 Inductor fails on those
    # in both wrappers (C++: at launch; Python: while lowering the kernel call, "KeyError:
    # 'a_desc STRIDE PLACEHOLDER 0'", W075 131x1 on an H100 at 82fd618), while the
    # pointer-load form passes in both (docs/decisions.md)
    tma = False
    proj = cfgs.choose_projection(tables, p.rows_hint, parts, spec.head_dim, p.rows_static,
                                  tma)
    if proj is None:
        return None
    return Fp16CopiesPlan(
        projection=proj,
        fused_angles=(p.rope_source == "positions" and spec.rope == "half"
                      and spec.rotary_dim == spec.head_dim),
        o16=p.o_proj and not p.o_bias and spec.head_dim >= 2,
        attention=_attention_plan(spec, p, "f16", tables), num_sms=p.num_sms)


def choose(spec: BlockSpec, p: Problem, options, tables=None) -> Plan:
    """The plan for this block, or ``Unsupported``. ``tables``: the config tables to consult,
    first hit wins (default: the GPU's committed table, unless ``options.tuned_tables`` is off;
    ``tune.plan_block`` adds the block's own compile-time measurements in front)."""
    if spec.cache != "none":
        return _cached_plan(spec, p, options)
    _check_common(spec, p, options)
    if tables is None:
        tables = (cfgs.committed_table(p.gpu),) if options.tuned_tables else ()
    plan = _fp16_copies(spec, p, options, tables)
    if plan is not None:
        return plan
    if p.dtype == torch.float32:
        prec = "tf32x3" if p.precision == "highest" else "tf32"
        operands = "f32"
    else:
        prec, operands = "ieee", "b16"
    triton_gemms = prec == "tf32x3"
    nq = spec.num_heads * spec.head_dim
    return NativePlan(
        prec=prec,
        qkv_gemm=(cfgs.choose_gemm(tables, "qkv", p.rows_hint, nq, p.embed) if triton_gemms
                  else None),
        o_gemm=cfgs.choose_gemm(tables, "o", p.rows_hint, p.embed, nq) if triton_gemms else None,
        v_kmajor=p.dtype == torch.float32,
        attention=_attention_plan(spec, p, operands, tables))


def core_problem(q, attn_mask) -> Problem:
    """The static facts of a differentiable core's call site (``q`` [B, S, H*D])."""
    b, s, _ = q.shape
    gpu, cap, sms = None, (0, 0), 4
    if q.device.type == "cuda":
        props = torch.cuda.get_device_properties(q.device)
        gpu, cap, sms = props.name, (props.major, props.minor), props.multi_processor_count
    return Problem(dtype=q.dtype, device=q.device, gpu=gpu, capability=cap, num_sms=sms,
                   precision=torch.get_float32_matmul_precision(), batch=b, seq=s, embed=0,
                   qkv_bias=False, o_proj=False, o_bias=False, rope_source="none",
                   runtime_floats=False, tables_dtype=None,
                   mask_rank_ok=attn_mask is None or attn_mask.dim() <= 4)


def _cached_plan(spec: BlockSpec, p: Problem, options) -> CachedSdpaPlan:
    """The plan of a block with a K/V cache, or ``Unsupported``."""
    if spec.cache != "concat":
        # a static cache's buffers are written by the block itself (find/cache_write.py)
        raise Unsupported(f"no kernel for a K/V cache (cache={spec.cache!r}) yet")
    _check_common(dataclasses.replace(spec, cache="none"), p, options)
    if spec.core != "sdpa":
        raise Unsupported("a K/V cache with the explicit core (the library's SDPA would not "
                          "give its fully masked rows)")
    if p.runtime_floats:
        raise Unsupported("a K/V cache with runtime scale or eps")
    if spec.norm_scope != "head" or spec.rope_fp32:
        raise Unsupported("a K/V cache with norm_scope='proj' or rope_fp32")
    return CachedSdpaPlan()


def choose_core(spec: BlockSpec, p: Problem, options, runtime_scale: bool = False,
                tables=None) -> CorePlan:
    """The kernels of a differentiable core (``spec``: its core fields; ``p``:
    ``core_problem``), or ``Unsupported``."""
    if runtime_scale:
        raise Unsupported("a runtime scale (the backward kernels take a static one)")
    _check_common(spec, p, options)
    if tables is None:
        tables = (cfgs.committed_table(p.gpu),) if options.tuned_tables else ()
    if p.dtype == torch.float32:
        prec = "tf32x3" if p.precision == "highest" else "tf32"
        operands = "f32"
    else:
        prec, operands = "ieee", "b16"
    rows = p.rows_hint * spec.num_heads
    common = dict(tables=tables, operands=operands, head_dim=spec.head_dim, groups=spec.groups,
                  seq_static=p.seq_max, seq_hint=p.seq_hint, rows=rows, causal=spec.causal,
                  mask_kind=MASK_CODES[spec.mask])
    if spec.return_probs:
        attention = AttentionPlan("pair", cfgs.choose_attention(kind="pair", mode=2, **common),
                                  cfgs.choose_attention(kind="pair", mode=1, **common))
    elif (rows >= SDPA_MIN_ROWS and p.capability >= (8, 0)
          and library_attention(spec, p.dtype, p.device, p.seq, options)):
        # the library's forward (its log-sum-exp turned into our statistics), our backward:
        # at a large grid ours is slower forward (H100, W092 128x16: 99 us against cuDNN's
        # 41), and our backward needs no scratch. Its
        # FlashAttention-2 runs from sm_80 on.
        attention = AttentionPlan("sdpa")
    else:
        attention = AttentionPlan("online", cfgs.choose_attention(kind="online", mode=0,
                                                                  **common))
    return CorePlan(prec=prec, attention=attention,
                    backward=choose_backward(spec.head_dim, p.dtype, prec))


# Sequences this short train on our core even where the library's computes the same: its GQA
# backward takes scratch of 8 bytes per query element (a float32 dQ accumulator, dK/dV expanded
# to the query heads: 193 MiB at W092 128x16, which put the step's peak 16 MiB above stock's;
# ours 108 MiB lower), and ours is as fast there (H100, x stock at 128x16 / 128x4 / 128x1:
# ours 1.15 / 1.06 / 1.04, the library's 1.08 / 1.09 / 1.06). From 256 tokens on the library's
# is faster (256x2 1.13 against 1.10, 512x1 1.23 against 1.17). Our backward, that is: at a
# large grid the forward is the library's (``choose_core``).
SHORT_SEQ = 128


def library_attention(spec: BlockSpec, dtype, device, seq, options) -> bool:
    """Whether the library's fused attention computes this core exactly as ours would, and
    ``options.training_core`` lets it: 16-bit, no mask tensor, softcap or returned
    probabilities, head_dim 64 or 128, on a GPU. ``seq``: the sequence length; a sliding
    window at least that long hides nothing (Gemma 2's 4096 at 2048 tokens)."""
    s = static_int(seq)
    window_inert = not spec.window or (s is not None and s <= spec.window)
    return (options.training_core == "auto" and device.type == "cuda"
            and dtype in (torch.bfloat16, torch.float16) and spec.mask == "none"
            and not spec.return_probs and window_inert and not spec.softcap
            and spec.head_dim in (64, 128))


def library_core(spec: BlockSpec, q, options, seq) -> bool:
    """Whether a differentiable core runs as the library's fused attention
    (F.scaled_dot_product_attention with its own backward) instead of our op: where it
    computes the same (``library_attention``) and the sequence is longer than ``SHORT_SEQ``
    (or symbolic). At ``SHORT_SEQ`` or fewer tokens our op's backward runs, after the
    library's forward where the grid is large (``choose_core``)."""
    s = static_int(seq)
    return (library_attention(spec, q.dtype, q.device, seq, options)
            and (s is None or s > SHORT_SEQ))
