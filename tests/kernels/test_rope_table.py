"""RoPE tables from inv_freq and position_ids vs the eager model's code (interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

from inductor_gqa.kernels.rope_table import rope_tables


def _eager(inv_freq, position_ids, interleaved, dtype):
    # the Hugging Face rotary embedding: float32 outer product, duplicated, cos/sin, cast
    b = position_ids.shape[0]
    f = (inv_freq[None, :, None].expand(b, -1, 1) @ position_ids[:, None, :].float())
    f = f.transpose(1, 2)
    emb = f.repeat_interleave(2, dim=-1) if interleaved else torch.cat((f, f), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r,b,s", [(64, 2, 37), (24, 1, 5), (8, 3, 1)])
def test_matches_eager(interleaved, dtype, r, b, s):
    inv = 1.0 / 10000 ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
    pos = torch.arange(s)[None] + 100 * torch.arange(b)[:, None]
    cos, sin = rope_tables(inv, pos, r, interleaved, dtype, interpret=True)
    ref_c, ref_s = _eager(inv, pos, interleaved, dtype)
    assert cos.shape == (b, s, r) and cos.dtype == dtype
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=8e-3, rtol=8e-3)
    torch.testing.assert_close(cos, ref_c, **tol)
    torch.testing.assert_close(sin, ref_s, **tol)


def test_broadcast_positions():
    inv = 1.0 / 10000 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    pos = torch.broadcast_to(torch.arange(9)[None], (3, 9))     # batch stride 0
    cos, sin = rope_tables(inv, pos, 16, False, torch.float32, interpret=True)
    ref_c, ref_s = _eager(inv, pos.contiguous(), False, torch.float32)
    torch.testing.assert_close(cos, ref_c)
    torch.testing.assert_close(sin, ref_s)


def test_bad_inputs_are_errors():
    inv = torch.ones(8)
    with pytest.raises(ValueError, match="inv_freq"):
        rope_tables(inv.double(), torch.zeros(1, 4, dtype=torch.long), 16, False, torch.float32)
    with pytest.raises(ValueError, match="inv_freq"):
        rope_tables(inv, torch.zeros(1, 4, dtype=torch.long), 12, False, torch.float32)
    with pytest.raises(ValueError, match="position_ids"):
        rope_tables(inv, torch.zeros(1, 4), 16, False, torch.float32)


@pytest.mark.parametrize("interleaved", [False, True])
def test_tables_built_inside_scale_rows(interleaved):
    """fp16_rows.scale_rows hosts the tables' programs after its own (one launch fewer): the
    same tables as the standalone launch, the same scaled copies as without them, exact
    power-of-two row scales, and the range flag cleared."""
    from inductor_gqa.kernels.fp16_rows import scale_rows
    from inductor_gqa.kernels.launch import direct_launches
    from inductor_gqa.kernels.rope_table import TableSpec
    g = torch.Generator().manual_seed(0)
    inv = 1.0 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    pos = torch.arange(37)[None] + 5 * torch.arange(2)[:, None]
    x = torch.randn(74, 96, generator=g)
    ws = [torch.randn(n, 96, generator=g) * 10.0 ** -e for n, e in ((40, 3), (24, 0), (8, 6))]
    ws[1][3] = 0.0                                       # a zero row keeps scale 1
    table = TableSpec(inv, pos, 64, interleaved, torch.float32, interpret=True)
    with direct_launches():
        flag = torch.ones(1, dtype=torch.int32)
        x16, xi, w16, wi, flag, cos, sin = scale_rows(x, ws, flag, table=table)
        ref_c, ref_s = rope_tables(inv, pos, 64, interleaved, torch.float32, interpret=True)
        assert torch.equal(cos, ref_c) and torch.equal(sin, ref_s) and flag.item() == 0
        x16b, xib, w16b, wib, _, nc, ns = scale_rows(x, ws, torch.ones(1, dtype=torch.int32))
    assert nc is None and ns is None
    assert torch.equal(x16, x16b) and torch.equal(w16, w16b)
    assert torch.equal(xi, xib) and torch.equal(wi, wib)
    w = torch.cat(ws)
    for m, m16, inv_s in ((x, x16, xi), (w, w16, wi)):
        e = torch.log2(inv_s)
        assert torch.equal(e, e.round())                 # powers of two
        big = m16.float().abs().amax(1)
        nz = big > 0
        assert ((big[nz] >= 2 ** 13) & (big[nz] < 2 ** 14)).all()
        torch.testing.assert_close(m16.float() * inv_s[:, None], m, rtol=1e-3, atol=0)
