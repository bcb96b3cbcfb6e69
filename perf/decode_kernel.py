"""The decode attention kernel on a GPU: correctness and time against the library's attention.

    python -m perf.decode_kernel [--out DIR] [--quick] [--configs]

Per (shape, batch, context): our split-KV decode launch (``kernels/decode.py``, run directly,
timed by CUDA-graph replay) against (a) what a stock static-cache decode step runs for its
attention: ``repeat_kv`` of the whole cache to the query heads and SDPA with the cache's mask
(transformers passes ``enable_gqa`` only without a mask, and a static cache always has one), and
(b) SDPA with ``enable_gqa=True`` and no mask, the library's best case (every slot valid). The
bytes a step must read (K and V of the valid context, once) over our time give the achieved
bandwidth, reported against the copy bandwidth measured in the same process. Correctness: the
output against a float32 reference over the valid keys, |out - ref| / |ref| (fresh random
inputs, positions differing per row). Writes ``decode_kernel.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from inductor_gqa.kernels import decode
from inductor_gqa.kernels.launch import direct_launches
from perf import bench

SHAPES = {"llama3-8b": (32, 8, 128), "glm4.5-air": (96, 8, 128)}
BATCHES = (1, 8, 32)
CONTEXTS = (1024, 8192, 32768)
MAX_BYTES = 24 << 30          # skip a baseline whose repeated cache would not fit


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t, _, _ = bench.graph_time_us(lambda: y.copy_(x), 10, 2)
    return 2 * x.numel() / (t * 1e-6)


def _inputs(b, hq, hkv, d, ctx, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16, generator=g)
    # every row but the first ends somewhere in the last quarter of the cache
    pos = torch.randint(3 * ctx // 4, ctx, (b, 1), device="cuda", generator=g)
    pos[0, 0] = ctx - 1
    return q, k, v, pos


def _reference(q, k, v, pos, scale):
    b, _, hq, d = q.shape
    hkv, ctx = k.shape[1], k.shape[2]
    kr = k.float().repeat_interleave(hq // hkv, 1)
    vr = v.float().repeat_interleave(hq // hkv, 1)
    s = torch.einsum("bqhd,bhkd->bhqk", q.float(), kr) * scale
    keep = torch.arange(ctx, device="cuda")[None, None, None, :] <= pos[:, None, :, None]
    s = s.masked_fill(~keep, float("-inf"))
    o = torch.einsum("bhqk,bhkd->bqhd", s.softmax(-1), vr)
    return o.reshape(b, 1, hq * d)


def _stock_step(q, k, v, pos):
    """What the stock static-cache step runs: repeat_kv, then SDPA with the mask."""
    b, _, hq, d = q.shape
    hkv, ctx = k.shape[1], k.shape[2]
    g = hq // hkv
    keep = (torch.arange(ctx, device="cuda")[None, None, None, :] <= pos[:, None, :, None])

    def call():
        kr = k[:, :, None].expand(b, hkv, g, ctx, d).reshape(b, hq, ctx, d)
        vr = v[:, :, None].expand(b, hkv, g, ctx, d).reshape(b, hq, ctx, d)
        return F.scaled_dot_product_attention(q.transpose(1, 2), kr, vr, attn_mask=keep)
    return call


def run_case(name, b, ctx, cfg=None, check=True) -> dict:
    hq, hkv, d = SHAPES[name]
    scale = d ** -0.5
    q, k, v, pos = _inputs(b, hq, hkv, d, ctx, seed=b * 7 + ctx)
    row = {"shape": name, "batch": b, "context": ctx, "heads": [hq, hkv, d]}
    with direct_launches():
        ours = lambda: decode.launch(q, k, v, scale=scale, positions=pos, cfg=cfg)  # noqa: E731
        if check:
            out = ours()
            n = max(1, min(b, (4 << 30) // max(1, 8 * k[0].numel() * (hq // hkv))))
            ref = _reference(q[:n], k[:n], v[:n], pos[:n], scale)   # float32 copies: bounded
            out = out[:n]
            row["rel_err"] = float((out.float() - ref).norm() / ref.norm())
            row["finite"] = bool(torch.isfinite(out).all())
        row["ours_us"] = round(bench.graph_time_us(ours, 20, 3)[0], 2)
    valid = int((pos + 1).sum())                       # keys read, summed over the rows
    row["bytes"] = 2 * valid * hkv * d * 2 + q.numel() * 2 * 2
    row["ours_tbps"] = round(row["bytes"] / (row["ours_us"] * 1e-6) / 1e12, 3)
    if cfg is None:
        if 2 * k.numel() * 2 * (hq // hkv) < MAX_BYTES:
            row["stock_us"] = round(bench.graph_time_us(_stock_step(q, k, v, pos), 20, 3)[0], 2)
        gqa = lambda: F.scaled_dot_product_attention(  # noqa: E731
            q.transpose(1, 2), k, v, enable_gqa=True)
        row["sdpa_gqa_nomask_us"] = round(bench.graph_time_us(gqa, 20, 3)[0], 2)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.decode_kernel")
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="batch 1 and 8, contexts 1024, 8192")
    p.add_argument("--configs", action="store_true",
                   help="also time every bf16 candidate config at a few cases")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("perf.decode_kernel needs a CUDA GPU")
        return 2
    out = a.out or os.environ.get("OUT") or "."
    os.makedirs(out, exist_ok=True)
    doc = {"env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "commit": os.environ.get("PERF_GIT_COMMIT")}, "rows": [], "configs": []}
    doc["copy_tbps"] = round(copy_bandwidth() / 1e12, 3)
    print(f"copy bandwidth {doc['copy_tbps']} TB/s", flush=True)
    batches, contexts = ((1, 8), (1024, 8192)) if a.quick else (BATCHES, CONTEXTS)
    bad = 0
    for name in SHAPES:
        for b in batches:
            for ctx in contexts:
                t = time.perf_counter()
                try:
                    row = run_case(name, b, ctx)
                except Exception as e:  # noqa: BLE001  one case's failure must not hide others
                    row = {"shape": name, "batch": b, "context": ctx, "error": repr(e)[:500]}
                row["frac_copy"] = round(row.get("ours_tbps", 0) / doc["copy_tbps"], 3)
                ok = "error" not in row and row["finite"] and row["rel_err"] < 1e-2
                bad += not ok
                doc["rows"].append(row)
                print(json.dumps(row), f"{time.perf_counter() - t:.1f}s", flush=True)
                with open(os.path.join(out, "decode_kernel.json"), "w") as f:
                    json.dump(doc, f, indent=1)
    if a.configs:
        for name, b, ctx in (("llama3-8b", 1, 8192), ("llama3-8b", 8, 8192),
                             ("glm4.5-air", 1, 8192), ("glm4.5-air", 8, 32768)):
            for c in decode.B16_CONFIGS:
                try:
                    r = run_case(name, b, ctx, cfg=c, check=False)
                    doc["configs"].append({**r, "cfg": [c.block_n, c.warps, c.stages, c.max_m]})
                except Exception as e:  # noqa: BLE001
                    doc["configs"].append({"shape": name, "batch": b, "context": ctx,
                                           "cfg": [c.block_n, c.warps, c.stages], "error":
                                           repr(e)[:300]})
                print(json.dumps(doc["configs"][-1]), flush=True)
            with open(os.path.join(out, "decode_kernel.json"), "w") as f:
                json.dump(doc, f, indent=1)
    print(f"{len(doc['rows']) - bad} of {len(doc['rows'])} cases correct")
    for r in doc["rows"]:
        if "ours_us" in r:
            st = r.get("stock_us")
            print(f"  {r['shape']:11s} b{r['batch']:<3d} ctx{r['context']:<6d} ours "
                  f"{r['ours_us']:8.1f} us ({r['frac_copy']:.0%} of copy)  stock-step "
                  f"{st if st is not None else '-':>8} us  sdpa-gqa {r['sdpa_gqa_nomask_us']:8.1f}"
                  f"  x stock {st / r['ours_us'] if st else float('nan'):.2f}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
