"""Experiment: can the stats pass (MODE 1, bound by exponentials and instruction latency) run
under the probabilities pass (MODE 2, bound by the store of the probabilities)?

The two passes of one row depend on each other, but the passes of different (batch, KV head)
chunks do not. Schedule: the stats passes of chunk 0, 1, ... run one after another on a second
stream, each followed by an event; the probabilities pass of chunk i waits for its event on the
main stream. If the block scheduler puts both kernels' programs on the same SMs, the pair takes
about max(stats, probs) instead of their sum.

Prediction (4096x1, fp16 copies: stats ~118 us, probabilities ~301 us, 419 in series): with 4
chunks ~330 us (the first chunk's stats pass does not overlap), with both kernels fully
concurrent (no dependency, the upper bound) ~300-320 us. If the probabilities pass holds every
SM's registers, the pair stays at ~419 and this idea is dead.

    PYTHONPATH=$PWD python perf/experiments/overlap_bench.py [--cases 4096x1,512x16] [--out F]

Measured (runs/profiles/overlap_bench_25f5698.json): no overlap with the tuned configs, whose
probabilities pass holds all of an SM's shared memory (2 blocks of 112 KB). ``--pairs`` times
smaller pairs that fit one SM together (SMALL_PAIRS). Prediction for 4096x1: a pair whose
concurrent time is below the tuned serial 417 us (stats 117 + probabilities 300) would make a
fused or two-stream schedule worth building; if every pair's concurrent time is above its own
series sum minus 10%, co-residency does not help either, and the two passes stay serial.

Results of every schedule are compared with the serial launches (bitwise: same kernels, same
inputs).
"""
import argparse

import torch

import gqa_pack_bench    # the same inputs, timing and report loop (this folder is sys.path[0])
from inductor_gqa.kernels import flash

H, HK, D = 16, 4, 64
G = H // HK
STATS = (64, 128, 4, 3, 1)
PROBS = (128, 64, 8, 4, 4)


class Case(gqa_pack_bench.Case):
    """gqa_pack_bench's buffers, with q/k/v as [B, S, heads, D] views to slice pieces from."""

    def __init__(self, s, b):
        super().__init__(s, b)
        self.q, self.k, self.v = (t.view(b, s, -1, D) for t in (self.q, self.k, self.v))

    def chunks(self, n):
        """(b0, b1, kv0, kv1) pieces: whole batches when there are enough, else KV heads."""
        b = self.b
        if n <= 1:
            return [(0, b, 0, HK)]
        if b >= n and b % n == 0:
            return [(i * b // n, (i + 1) * b // n, 0, HK) for i in range(n)]
        per_b = max(1, n // b)
        per_b = min(per_b, HK)
        return [(bi, bi + 1, j * HK // per_b, (j + 1) * HK // per_b)
                for bi in range(b) for j in range(per_b)]

    def launch(self, mode, cfg, piece):
        b0, b1, k0, k1 = piece
        s = self.s
        nb, nkv = b1 - b0, k1 - k0
        bm, bn, nw, ns, gp = cfg
        q = self.q[b0:b1, :, k0 * G:k1 * G]
        k = self.k[b0:b1, :, k0:k1]
        v = self.v[b0:b1, :, k0:k1]
        o = self.o[b0:b1, :, k0 * G * D:k1 * G * D]
        p = self.probs[b0:b1, k0 * G:k1 * G]
        # ML rows are (b * H + h) * S + s: a piece is contiguous in that order
        ml = self.ml[(b0 * H + k0 * G) * s * 2:]
        flash.launch((q, (q.stride(0), q.stride(2), q.stride(1))),
                     (k, (k.stride(0), k.stride(2), k.stride(1))),
                     (v, (v.stride(0), v.stride(2), v.stride(1), 1)), o,
                     p if mode == 2 else None, None, ml, nb, s, nkv * G, G, D, 1.0, 0.0, False,
                     0, mode, "tf32", False, bm, bn, nw, ns, flag=self.flag, guard=1, gp=gp)


def schedule(c, n, side, prio_side=None):
    pieces = c.chunks(n)

    def run():
        main = torch.cuda.current_stream()
        aux = prio_side if prio_side is not None else side
        aux.wait_stream(main)
        evs = []
        with torch.cuda.stream(aux):
            for pc in pieces:
                c.launch(1, STATS, pc)
                e = torch.cuda.Event()
                e.record(aux)
                evs.append(e)
        for pc, e in zip(pieces, evs):
            main.wait_event(e)
            c.launch(2, PROBS, pc)
        main.wait_stream(aux)
    return run


def concurrent(c, side, stats=None, probs=None):
    """No dependency: the full stats pass beside the full probabilities pass (upper bound)."""
    whole = c.chunks(1)[0]

    def run():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            c.launch(1, stats or STATS, whole)
        c.launch(2, probs or PROBS, whole)
        main.wait_stream(side)
    return run


# (stats, probabilities) configs small enough to share an SM. The default pair cannot: the
# probabilities config takes 112 KB of shared memory per block (2 blocks fill an SM's 227 KB),
# the stats config 56 KB (sm_90 resource usage from tests/kernels/sm90_compile.py).
# (stats (64, 64, 4, 2): 58 registers, 24 KB; probabilities (64, 32, 4, 3, gp4): 94 registers,
# 40 KB; (32, 64, 4, 2, gp4): 106 registers, 24 KB; (128, 32, 8, 3, gp4): 110, 56 KB.)
SMALL_PAIRS = [((64, 64, 4, 2, 1), (64, 32, 4, 3, 4)), ((64, 64, 4, 2, 1), (32, 64, 4, 2, 4)),
               ((64, 128, 4, 2, 1), (128, 32, 8, 3, 4)), ((64, 64, 4, 2, 1), (64, 64, 4, 3, 4))]


t_us = gqa_pack_bench.t_us
PAIRS = False


def bench(name):
    s, b = (int(t) for t in name.split("x"))
    c = Case(s, b)
    whole = c.chunks(1)[0]
    side = torch.cuda.Stream()
    low = torch.cuda.Stream(priority=0)
    rep = {}
    rep["stats"] = t_us(lambda: c.launch(1, STATS, whole))
    rep["probs"] = t_us(lambda: c.launch(2, PROBS, whole))

    def serial():
        c.launch(1, STATS, whole)
        c.launch(2, PROBS, whole)
    c.probs.fill_(float("nan"))
    c.o.fill_(float("nan"))
    serial()
    torch.cuda.synchronize()
    ref = (c.probs.clone(), c.o.clone())
    rep["serial"] = t_us(serial)
    rep["concurrent_nodep"] = t_us(concurrent(c, side))
    if PAIRS:
        # configs that leave room for each other: alone, in series and side by side
        for st, pr in SMALL_PAIRS:
            tag = f"{st[:4]}+{pr[:4]}gp{pr[4]}"
            rep[f"pair {tag} stats"] = t_us(lambda: c.launch(1, st, whole))
            rep[f"pair {tag} probs"] = t_us(lambda: c.launch(2, pr, whole))
            rep[f"pair {tag} concurrent_nodep"] = t_us(concurrent(c, side, st, pr))
        print(name, {k: round(v, 1) for k, v in rep.items() if k.startswith("pair")},
              flush=True)
        return rep
    for n in (2, 4, 8, 16):
        if len(c.chunks(n)) != n:
            continue
        fn = schedule(c, n, side)
        c.probs.fill_(float("nan"))
        c.o.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        same = torch.equal(c.probs, ref[0]) and torch.equal(c.o, ref[1])
        rep[f"chunks{n}"] = t_us(fn)
        rep[f"chunks{n}_equal"] = same
    # the probabilities pass on a high-priority stream: its programs are placed first
    hi = torch.cuda.Stream(priority=-1)
    for n in (4, 8):
        if len(c.chunks(n)) != n:
            continue

        def run_hi(n=n):
            cur = torch.cuda.current_stream()
            hi.wait_stream(cur)
            with torch.cuda.stream(hi):
                schedule(c, n, side, prio_side=low)()
            cur.wait_stream(hi)
        rep[f"chunks{n}_probs_high_prio"] = t_us(run_hi)
    print(name, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in rep.items()},
          flush=True)
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1,512x16,449x16,512x8,1024x2")
    ap.add_argument("--out", default="")
    ap.add_argument("--pairs", action="store_true",
                    help="time SMALL_PAIRS side by side (and skip the chunked schedules)")
    a = ap.parse_args()
    global PAIRS
    PAIRS = a.pairs
    gqa_pack_bench.run_cases(bench, a.cases, a.out, stats_cfg=STATS, probs_cfg=PROBS)


if __name__ == "__main__":
    main()
