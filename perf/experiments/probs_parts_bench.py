"""Experiment: what holds flash.py's probabilities pass (MODE 2) ~50 us above its own store
pattern at 4096x1? The pass, rebuilt in parts with the tuned tile (128 rows = 32 positions x 4
query heads of one KV head, 64-key tiles, 8 warps, 3 stages) and the same program layout:

* ``stores``: only the probability stores (store_pattern_bench.py's kernel: ~254 us);
* ``loads``: the stores, plus each key tile's K and V loads and both MMAs (q @ k^T, then the
  stored tile @ V), no exponential: the pass's memory traffic and tensor work;
* ``exp``: ``loads`` plus the exponential of each score against a row offset (one FMA and one
  MUFU per score, as the pass's exp2(s * scale - lse)): the pass's instruction mix;
* ``pass``: flash.py's MODE 2 itself (after MODE 1 for the statistics).

Prediction (before any GPU run): ncu put the pass at 80% of L2 throughput with 99% L2 hits
(runs/profiles/ncu_attention_4096x1_52ebb51.txt), but packing four query heads per program
cut its K/V reads ~4x for only 326 -> 307 us (docs note 18), so the K/V traffic is not the
whole story. If ``loads`` is near ``stores`` (<= ~265 us) and ``exp`` near ``pass``, the
exponentials' instructions are what the stores wait behind (more warps per SM, or fewer
instructions per score, is then the lever); if ``loads`` is already near ``pass``, the memory
system is (K/V tiles sharing L2 with the stores: larger row tiles or copy-engine multicast).

    PYTHONPATH=$PWD python perf/experiments/probs_parts_bench.py [--cases 4096x1,2048x1] [--out F]
    TRITON_INTERPRET=1 PYTHONPATH=$PWD python perf/experiments/probs_parts_bench.py --device cpu

Compiled for sm_90 on the CPU (triton 3.6, pointers and S divisible by 16 as the launcher marks
them): ``exp`` has the pass's structure, 8 HGMMA, LDGSTS K/V loads, 16-byte evict-first stores,
98,304 B of shared memory, 125 registers (the pass: 128).

Outcome (H200, runs/profiles/probs_parts_da74332.json): 4096x1 stores 262.5 us, loads 297.4,
exp 315.2, pass 300.2; 2048x1 65.6 / 76.9 / 83.1 / 77.2. ``loads`` is already at ``pass``: the
K/V traffic and tensor work, not the exponentials, hold the pass above its store pattern
(docs note 50).
"""
import argparse
import json

import torch
import triton
import triton.language as tl

H, HK, D = 16, 4, 64
CFG = (128, 64, 8, 3, 4)        # BLOCK_M, BLOCK_N, warps, stages, query heads per program


@triton.jit
def parts_kernel(Q, K, V, P, O, S, lse, PART: tl.constexpr, H: tl.constexpr, HK: tl.constexpr,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 UPCAST: tl.constexpr):
    """One batch row (B = 1). PART 0: stores only; 1: + K/V loads and both MMAs; 2: + the
    exponentials. q [S, H*D], k/v [S, HK*D] fp16 row-major; P [H, S, S] float32; O [S, H*D]
    fp16. A program: BLOCK_M // GP positions of the GP = H // HK query heads of KV head
    program_id(1), head-major (flash.py's GP). The stored values are not probabilities (no
    statistics are read); the work per score is the pass's."""
    GP: tl.constexpr = H // HK
    MR: tl.constexpr = BLOCK_M // GP
    kvh = tl.program_id(1)
    r = tl.arange(0, BLOCK_M)
    pos = tl.program_id(0) * MR + r % MR
    head = kvh * GP + r // MR
    cols = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    p_row = P + head.to(tl.int64) * S * S + pos.to(tl.int64) * S
    q = tl.load(Q + pos[:, None].to(tl.int64) * (H * D) + head[:, None] * D + d[None, :])
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(0, S, BLOCK_N):
        keys = n0 + cols
        if PART == 0:
            t = (r[:, None] + keys[None, :]).to(tl.float32)
        else:
            k = tl.load(K + keys[:, None].to(tl.int64) * (HK * D) + kvh * D + d[None, :])
            if UPCAST:      # the interpreter's 16-bit dot is not exact
                t = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
            else:
                t = tl.dot(q, tl.trans(k))
            if PART == 2:
                t = tl.exp2(t * 1.4426950408889634 - lse)
        tl.store(p_row[:, None] + keys[None, :], t, eviction_policy="evict_first")
        if PART > 0:
            v = tl.load(V + keys[:, None].to(tl.int64) * (HK * D) + kvh * D + d[None, :])
            if UPCAST:
                acc += tl.dot(t, v.to(tl.float32))
            else:
                acc += tl.dot(t.to(tl.float16), v)
    tl.store(O + pos[:, None].to(tl.int64) * (H * D) + head[:, None] * D + d[None, :],
             acc.to(tl.float16))


def launch(part, q, k, v, p, o, s, cfg=CFG):
    bm, bn, nw, ns, gp = cfg
    interp = q.device.type == "cpu"
    parts_kernel[(s // (bm // gp), HK)](q, k, v, p, o, s, 3.0, PART=part, H=H, HK=HK, D=D,
                                        BLOCK_M=bm, BLOCK_N=bn, UPCAST=interp, num_warps=nw,
                                        num_stages=ns)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1")
    ap.add_argument("--out", default="")
    ap.add_argument("--device", default="cuda", help="cpu: an interpreter smoke run at S=128")
    ap.add_argument("--ncu", default="", help="a B = 1 case: each part and the pass launched "
                    "once inside the profiler's range (ncu --profile-from-start off)")
    a = ap.parse_args()
    if a.device == "cpu":
        s = 128
        q, k, v = (torch.randn(s, n * D).half() * 0.1 for n in (H, HK, HK))
        p = torch.full((H, s, s), float("nan"))
        o = torch.empty(s, H * D, dtype=torch.float16)
        for part in (0, 1, 2):
            launch(part, q, k, v, p, o, s, (32, 32, 4, 1, 4))
            assert not p.isnan().any()
        sc = torch.einsum("shd,khd->hsk", q.float().view(s, H, D),
                          k.float().view(s, HK, D).repeat_interleave(H // HK, 1))
        torch.testing.assert_close(p, torch.exp2(sc * 1.4426950408889634 - 3.0))
        print("cpu smoke: ok")
        return
    import gqa_pack_bench       # timing and the real pass (this folder is sys.path[0])
    if a.ncu:
        with_stats = set()

        def run(c, part, _cfg):
            if part != "pass":
                launch(part, c.q, c.k, c.v, c.probs.view(H, c.s, c.s), c.o.view(c.s, H * D), c.s)
                return
            if id(c) not in with_stats:     # on the warm-up call, outside the profiled range
                c.launch(1, gqa_pack_bench.STATS_CFG)
                with_stats.add(id(c))
            c.launch(2, CFG[:4] + ("gp4",))

        gqa_pack_bench.ncu(a.ncu, [(0, None), (1, None), (2, None), ("pass", None)], launch=run)
        return
    rep = {"device": torch.cuda.get_device_name()}
    for case in a.cases.split(","):
        s, b = (int(x) for x in case.split("x"))
        if b != 1:
            raise SystemExit("probs_parts_bench: B = 1 cases only")
        c = gqa_pack_bench.Case(s, b)
        p = c.probs.view(H, s, s)
        o = c.o.view(s, H * D)
        row = {}
        for part, name in ((0, "stores"), (1, "loads"), (2, "exp")):
            row[name] = gqa_pack_bench.t_us(lambda part=part: launch(part, c.q, c.k, c.v, p, o,
                                                                       s))
        c.launch(1, gqa_pack_bench.STATS_CFG)
        row["pass"] = gqa_pack_bench.t_us(lambda: c.launch(2, CFG[:4] + ("gp4",)))
        rep[case] = {k: round(v, 1) for k, v in row.items()}
        print(case, json.dumps(rep[case]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
