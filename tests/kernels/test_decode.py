"""decode.py's split-KV GQA decode attention against a float64 PyTorch reference (CPU, Triton
interpreter): group packing and row blocks, context lengths of 1, off the key tile, at split
boundaries and per batch row, windows, softcapping, every mask kind, rows that see no key,
16-bit caches, strided views. Uninitialized memory is NaN here (the ``poisoned`` fixture), so
every output element, and every partial the combine reads, is proven written; cache slots a
row must not read are NaN too (a read would show as NaN in the output)."""

from __future__ import annotations

import pytest
import torch

from inductor_gqa.kernels import decode
from inductor_gqa.kernels.decode import DecodeConfig
from inductor_gqa.kernels.launch import direct_launches

CFG = DecodeConfig(16, 4, 1, max_m=16, min_chunk=16)


@pytest.fixture(autouse=True)
def poisoned():
    """torch.empty fills with NaN (deterministic mode's uninitialized-memory fill)."""
    before = torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(before)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def reference(q, k, v, pos, *, scale, window=0, softcap=0.0, mask=None, mask_kind="none",
              mask_fill=float("-inf"), empty_zero=True):
    """Eager attention in float64 over the keys each token sees: q [B, Sq, Hq, D], caches
    [B, Hkv, Smax, D] (repeat_kv), positions [B, Sq]; returns [B, Sq, Hq * D]."""
    b, sq, hq, d = q.shape
    g = hq // k.shape[1]
    smax = k.shape[2]
    kr, vr = (t.double().repeat_interleave(g, 1) for t in (k, v))
    s = torch.einsum("bqhd,bhkd->bhqk", q.double(), kr) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    if mask_kind == "bool_fill":
        s = s.masked_fill(mask, mask_fill)
    elif mask_kind == "bool_keep":
        s = s.masked_fill(~mask, float("-inf"))
    elif mask_kind == "additive":
        s = s + mask.double()
    p = pos.long()[:, None, :, None]
    j = torch.arange(smax)[None, None, None, :]
    seen = j <= p
    if window:
        seen &= p - j < window
    s = s.masked_fill(~seen, float("-inf"))
    empty = (s == float("-inf")).all(-1, keepdim=True)
    if empty_zero:
        w = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    else:
        w = torch.softmax(s, -1)
    o = w @ vr                                    # [B, Hq, Sq, D]
    return o.transpose(1, 2).reshape(b, sq, hq * d)


def make(b, hq, hkv, sq, d, smax, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, smax, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, smax, d, generator=g).to(dtype)
    return q, k, v


def poison_unseen(k, v, pos, window):
    """Copies of the caches with NaN in every slot no token of its row can see."""
    k, v = k.clone(), v.clone()
    for i in range(pos.shape[0]):
        live = pos[i][pos[i] >= 0]
        hi = int(live.max()) + 1 if live.numel() else 0
        lo = max(0, int(live.min()) - window + 1) if window and live.numel() else 0
        for t in (k, v):
            t[i, :, hi:] = float("nan")
            t[i, :, :lo] = float("nan")
    return k, v


def positions(lengths, sq):
    """[B, Sq] positions of the last sq tokens of rows holding ``lengths`` tokens."""
    return torch.tensor(lengths)[:, None] - sq + torch.arange(sq)[None, :]


def check(q, k, v, pos, *, tol=None, cfg=CFG, num_splits=None, **kw):
    kw.setdefault("scale", q.shape[-1] ** -0.5)
    kp, vp = poison_unseen(k, v, pos, kw.get("window", 0))
    with direct_launches():
        o = decode.launch(q, kp, vp, positions=pos, cfg=cfg, num_splits=num_splits, **kw)
    ref = reference(q, k, v, pos, **kw)
    assert o.shape == ref.shape and o.dtype == q.dtype
    atol, rtol = tol or {torch.float32: (2e-5, 1e-4), torch.bfloat16: (2e-2, 2e-2),
                         torch.float16: (3e-3, 3e-3)}[q.dtype]
    torch.testing.assert_close(o.double(), ref, atol=atol, rtol=rtol, equal_nan=True)
    return o


# (B, Hq, Hkv, Sq, D, Smax, per-row context lengths, splits)
CASES = [
    (1, 8, 2, 1, 32, 40, [1], 4),              # one key
    (2, 8, 2, 1, 32, 70, [37, 70], 3),         # off the tile; a row filling the cache
    (2, 4, 1, 3, 64, 64, [64, 48], 4),         # 3 tokens; 64 = 4 splits x 16, at boundaries
    (2, 6, 2, 2, 32, 50, [17, 33], 2),         # a key past a tile / a split boundary
    (1, 12, 1, 2, 32, 40, [40], 2),            # 24 packed rows: two row blocks of 16
    (3, 4, 4, 1, 32, 30, [5, 30, 16], 8),      # MHA, more splits than a short row fills
    (1, 4, 2, 2, 32, 20, [25], 2),             # positions past the cache: all of it, no more
]


@pytest.mark.parametrize("b,hq,hkv,sq,d,smax,lengths,splits", CASES)
def test_contexts_groups_splits(b, hq, hkv, sq, d, smax, lengths, splits):
    q, k, v = make(b, hq, hkv, sq, d, smax, seed=smax + sq)
    check(q, k, v, positions(lengths, sq), num_splits=splits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
def test_16bit(dtype, d):
    q, k, v = make(2, 4, 2, 2, d, 45, dtype, seed=d)
    check(q, k, v, positions([45, 20], 2), num_splits=2)


def test_head_dim_256_default_splits():
    q, k, v = make(1, 2, 1, 1, 256, 33, torch.bfloat16, seed=5)
    check(q, k, v, positions([33], 1))      # split count from the context and SM count


@pytest.mark.parametrize("window,softcap", [(5, 0.0), (20, 0.0), (1, 0.0), (7, 2.0), (0, 2.0)])
def test_window_softcap(window, softcap):
    q, k, v = make(2, 4, 2, 3, 32, 60, seed=window)
    check(q, k, v, positions([60, 26], 3), num_splits=3, window=window, softcap=softcap)


@pytest.mark.parametrize("kind,fill", [("bool_keep", None), ("bool_fill", -1e9),
                                       ("bool_fill", float("-inf")), ("additive", None)])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("empty_zero", [True, False])
# the interpreter's numpy warns of the empty rows' 0 / 0 and of finfo.min * log2(e) (clamped)
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning",
                            "ignore:overflow:RuntimeWarning")
def test_masks_and_empty_rows(kind, fill, per_head, empty_zero):
    b, hq, hkv, sq, d, smax = 2, 4, 2, 2, 32, 40
    q, k, v = make(b, hq, hkv, sq, d, smax, seed=3)
    g = torch.Generator().manual_seed(7)
    shape = (b, hq if per_head else 1, sq, smax)
    keep = torch.rand(shape, generator=g) > 0.3
    keep[0, :, 1, :] = False                  # a token that sees no key (masked throughout)
    pos = positions([40, 23], sq)
    pos[1, 0] = -1                            # a token before the cache: no key either
    if kind == "bool_keep":
        mask, kw = keep, {}
    elif kind == "bool_fill":
        mask, kw = ~keep, dict(mask_fill=fill)
    else:
        mask = torch.where(keep, torch.randn(shape, generator=g), float("-inf"))
        mask[1, :, 1, :] = torch.finfo(torch.float32).min      # finite fills: a uniform row
        kw = {}
    o = check(q, k, v, pos, num_splits=2, mask=mask, mask_kind=kind, empty_zero=empty_zero,
              **kw)
    assert o[1, 0].isnan().all() != empty_zero


def test_strided_views_and_seqlens():
    """q as a slice of projection rows [B, Sq, (Hq + 2 Hkv) * D]; caches [B, Smax, Hkv, D]
    transposed, within a longer buffer; lengths as cache_seqlens; a broadcast positions row."""
    b, hq, hkv, sq, d, smax = 2, 4, 2, 2, 32, 36
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(b, sq, (hq + 2 * hkv) * d, generator=g)
    q = qkv[..., :hq * d].view(b, sq, hq, d)
    buf = torch.randn(2, b, smax + 8, hkv, d, generator=g)
    k, v = (buf[i, :, :smax].transpose(1, 2) for i in range(2))
    seqlens = torch.tensor([36, 19])
    with direct_launches():
        o = decode.launch(q, k, v, seqlens=seqlens, scale=0.2, cfg=CFG, num_splits=2)
        shared = torch.tensor([30, 31]).expand(b, sq)          # one cache_position for all rows
        o2 = decode.launch(q, k, v, positions=shared, scale=0.2, cfg=CFG, num_splits=3)
    torch.testing.assert_close(o.double(), reference(q, k, v, positions([36, 19], sq),
                                                     scale=0.2), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(o2.double(), reference(q, k, v, shared, scale=0.2),
                               atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("cfg", [decode.B16_CONFIGS[0], DecodeConfig(64, 4, 3, min_chunk=64)])
def test_gpu_tiles(cfg):
    """A GPU config's tiles: 12 heads x 4 tokens in one 64-row block, 64-key steps; the split
    count from the context (one split, then three of at least 64 keys)."""
    q, k, v = make(2, 12, 1, 4, 64, 150, torch.bfloat16, seed=4)
    check(q, k, v, positions([150, 61], 4), cfg=cfg, window=100)


def test_functional_launch_and_default_config():
    """Through the functional kernel op (the traced form), with the default config and split
    count, an fp32 output from a bf16 cache."""
    q, k, v = make(1, 8, 2, 1, 64, 50, torch.bfloat16, seed=2)
    pos = positions([50], 1)
    o = decode.launch(q, k, v, positions=pos, scale=0.125, out_dtype=torch.float32)
    assert o.dtype == torch.float32
    torch.testing.assert_close(o.double(), reference(q, k, v, pos, scale=0.125), atol=2e-2,
                               rtol=2e-2)


def test_split_count():
    c = DecodeConfig(64, 4, 3, min_chunk=256)
    assert decode.split_count(8, 8192, 132, c) == 32        # batch 1, 8 KV heads: context-bound
    assert decode.split_count(8, 32768, 132, c) == 33       # ~2 programs per SM
    assert decode.split_count(8 * 64, 32768, 132, c) == 1   # a large batch fills the GPU
    assert decode.split_count(8, None, 132, c) == 33        # symbolic context
    assert decode.split_count(8, 100, 132, c) == 1


def test_bad_arguments():
    q, k, v = make(1, 4, 2, 1, 32, 8)
    with pytest.raises(ValueError, match="exactly one"):
        decode.launch(q, k, v, scale=1.0)
    with pytest.raises(ValueError, match="does not match"):
        decode.launch(q, k[:, :, :, :16], v[:, :, :, :16], scale=1.0, seqlens=torch.tensor([8]))
    with pytest.raises(ValueError, match="mask_kind"):
        decode.launch(q, k, v, scale=1.0, seqlens=torch.tensor([8]),
                      mask=torch.ones(1, 1, 1, 8, dtype=torch.bool))


def test_symbolic_batch_and_context_add_no_guards():
    """Under dynamic shapes (a symbolic batch and cache length) the launches are recorded
    without a guard on those sizes (only the equalities that tie the tensors together)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (DimDynamic, ShapeEnv,
                                                       StatelessSymbolicContext)

    from inductor_gqa.kernels.launch import recording

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    dyn, static = DimDynamic.DYNAMIC, DimDynamic.STATIC

    def fake(shape, dtype, dynamic):
        return mode.from_tensor(torch.empty(shape, dtype=dtype), symbolic_context=(
            StatelessSymbolicContext(dynamic_sizes=[dyn if i in dynamic else static
                                                    for i in range(len(shape))])))

    q = fake((3, 1, 8, 64), torch.bfloat16, (0,))
    k, v = (fake((3, 2, 100, 64), torch.bfloat16, (0, 2)) for _ in "kv")
    pos = fake((3, 1), torch.int64, (0,))
    mask = fake((3, 1, 1, 100), torch.bool, (0, 3))
    with mode, recording() as launches:
        o = decode.launch(q, k, v, positions=pos, scale=0.1, mask=mask, mask_kind="bool_keep",
                          window=7)
    assert [la.kernel.__name__ for la in launches] == ["decode_split_kernel",
                                                       "decode_combine_kernel"]
    assert o.shape[1:] == (1, 512)
    assert all("<" not in str(g.expr) and ">" not in str(g.expr) for g in env.guards), [
        g.expr for g in env.guards]
