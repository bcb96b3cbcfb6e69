"""Experiment: the probabilities pass (MODE 2) of W075 "high" writing its tiles through a tensor
descriptor (flash.py TMA_P) instead of 16-byte stores from registers.

Calibration (store_peak_bench.py): the H200 writes 4.66 TB/s (1.07 GB in 230 us at 4096x1, 268 MB
in 60 us at 512x16), while the pass writes 3.55 TB/s at 4096x1 (302 us) and 2.9 TB/s at 512x16
(93 us) with its compute (the stats pass's work plus P @ V) only about half of that time. The
stores are issued by the same warps between a tile's exponentials and its P @ V, in bursts. With
TMA_P a tile goes to shared memory and the copy engine writes it out while the warps go on.
Prediction: the pass -10 to -20% where S % 4 == 0 (4096x1 302 -> 250-270 us, 512x16 93 -> 75-85);
if no config gains 5% over the tuned one, the idea is dead. Probabilities must be bitwise those of
the pointer stores; o exactly equal (same arithmetic).

    PYTHONPATH=$PWD python perf/experiments/probs_tma_bench.py [--cases 4096x1,512x16] [--out F]
"""
import argparse

import torch

import gqa_pack_bench    # inputs, timing and report loop (this folder is sys.path[0])
from inductor_gqa.kernels import flash
from inductor_gqa.lower import attention as lower_attention

H, HK, D = 16, 4, 64
STATS = (64, 128, 4, 3)
CFGS = [(128, 64, 8, 4, "gp4"), (128, 64, 8, 3, "gp4"), (128, 64, 8, 4, "gp4", "pipeline"),
        (128, 32, 8, 3, "gp4"), (64, 64, 4, 3, "gp4"), (64, 64, 4, 3), (128, 64, 8, 2, "gp4"),
        (128, 128, 8, 2, "gp4"), (64, 128, 4, 2, "gp4")]


def launch(c, cfg, tma):
    s, b = c.s, c.b
    bm, bn, nw, ns = cfg[:4]
    flash.launch((c.q, (s * H * D, D, H * D)), (c.k, (s * HK * D, D, HK * D)),
                 (c.v, (s * HK * D, D, HK * D, 1)), c.o, c.probs, None, c.ml, b, s, H, H // HK,
                 D, 1.0, 0.0, False, 0, 2, "tf32", False, bm, bn, nw, ns,
                 pipeline="pipeline" in cfg, flag=c.flag, guard=1,
                 gp=lower_attention.heads_per_program(cfg), tma_p=tma)


def bench(name):
    s, b = (int(t) for t in name.split("x"))
    c = gqa_pack_bench.Case(s, b)
    c.launch(1, STATS)
    rep = {}
    for cfg in CFGS:
        ref = None
        for tma in (False, True):
            tag = f"{cfg} {'tma' if tma else 'stg'}"
            try:
                c.probs.fill_(float("nan"))
                c.o.fill_(float("nan"))
                launch(c, cfg, tma)
                torch.cuda.synchronize()
                got = (c.probs.clone(), c.o.clone())
                if ref is None:
                    ref = got
                same = all(torch.equal(x, y) for x, y in zip(got, ref))
                us = gqa_pack_bench.t_us(lambda: launch(c, cfg, tma))
                gbs = b * H * s * s * 4 / us / 1e3
                rep[tag] = dict(us=us, bitwise_equal=same, store_gbs=gbs)
                print(name, tag, f"{us:.1f} us ({gbs:.0f} GB/s), bitwise {same}", flush=True)
            except Exception as e:  # noqa: BLE001
                rep[tag] = dict(error=f"{type(e).__name__}: {str(e)[:160]}")
                print(name, tag, rep[tag]["error"], flush=True)
    assert c.flag.item() == 0
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,512x16,2048x1,1024x2,512x8,512x4,256x8")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    gqa_pack_bench.run_cases(bench, a.cases, a.out)


if __name__ == "__main__":
    main()
