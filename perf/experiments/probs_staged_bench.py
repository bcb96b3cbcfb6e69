"""Experiment: the one-launch probabilities kernel with each row tile staged in shared memory
(kernels/probs_staged.py, Gluon) against flash.py's stats/probabilities pair and MODE 3, on the
W075 "high" attention inputs (fp16 q/k/V copies from a real projection, fp16 output, float32
probabilities). Outputs are NaN-poisoned before every checked launch and compared with a float64
reference computed from the same fp16 copies; the pair's own error is reported beside it.

    PYTHONPATH=$PWD python perf/experiments/probs_staged_bench.py [--cases 512x16,449x16] [--out F]

Prediction (written before the first GPU run): the staged kernel computes each score's product
and exponential once and its stores overlap the other program's compute on the SM, so at S <= 512
it should take about the probabilities pass's time alone: 512x16 pair ~129 us (34 + 95) ->
75-85 us, 449x16 ~150 -> ~90, 512x8 ~64 -> ~42; at S <= 256 against MODE 3 about even.

Outcome (perf/results/nvidia-h200/runs/profiles/README.md, "Round of a9f312f..533c727"): one row
tile per program is no faster than the pair; the ping-pong kernel (two warpgroups taking turns)
takes 512x16 to 110 us, 449x16 to 119, 373x8 to 40, 512x8 to 55, limited by its score loop.

Measured and dropped (runs/profiles/README.md, "Round of d6f3097"): RECOMPUTE, the ping-pong for
rows too long to stage (loop 2 recomputing the scores as flash.py's MODE 2), 434 us at 4096x1
against 417 for the pair; PREFETCH_Q (the next row tile's q loaded under the stores), no gain;
both are in git history at d6f3097. Also measured, as uncommitted diffs described there: an
early token (the other warpgroup's loop 1 starting after N key tiles of this one's) and SPLIT
(loop 1's row reductions as two chains). ``--ncu CASE`` profiles the configs' launches
(warp-stall samples of the ping-pong at 512x16 are in that round).

PPP (config flag "ppp"; prediction written before its first GPU run): three warpgroups per
program, the loop 1 of a program's tile t waiting only for tile t - 2's, so two warpgroups
compute their loop 1s while the third stores (the ping-pong keeps one loop 1 at a time, ~half
the stats pass's rate per SM, and the sum of its loop 1s bounds it: note 27). Buffers fit up to
384 keys (64-key tiles, two K/V stages) or 256 (128-key tiles). If two loop 1s together run at
~1.5x one's rate and the stores keep pace, the attention at 373x8 ~38.6 -> 30-33 us, 256x8 and
256x4 -15 to -20%; S <= 131 (one key tile or two) within +-5%. Results bitwise equal to the
ping-pong's of the same tile shape. Run: --configs '[(64,128,4,2,"pp","gp4"),
(64,64,4,3,"pp"), (64,128,4,2,"ppp"), (64,64,4,2,"ppp"), (64,128,4,2,"ppp","gp4"),
(64,64,4,2,"ppp","gp4"), (64,128,4,2,"pp"), (64,128,4,2,"gp4")]' --cases
373x8,256x8,256x4,211x2,128x4,256x1,131x1 --causal 373x8,256x4 (at 9ece203, where the kernel
has the flag).
Outcome (runs/profiles/probs_staged_ppp_9ece203.json): bitwise equal to the ping-pong of the same
tile shape (causal too), and slower in every case: 373x8 62.3 us at best against 38.2 for the
packed ping-pong, 256x8 19.9 vs 18.4, 256x4 12.2 vs 10.9 (one-tile packed), 211x2 8.7 vs 7.7,
128x4 6.4 vs 5.7, 131x1 8.0 vs 7.2. The 384-key form fits only 64-key tiles with two K/V stages,
and at 256 keys a third warpgroup gains nothing over two. Removed (in history at 9ece203).

OVERLAP (config flag "ov"; prediction written before its first GPU run): loop 1 issues tile
j + 1's MMA before tile j's exponentials and waits after them, as kernels/stats_overlap.py (its
sm_90 SASS interleaves the HGMMAs with the MUFU.EX2s; without the flag the wait follows each MMA).
In the ping-pong, loop 1 is ~67 of 110 us at 512x16 and latency-bound on one warpgroup, so the
overlap should show there: 512x16 110 -> 90-100 us, 449x16 119 -> 100-108, 373x8 40 -> 35; the
one-tile kernel less. (The pass-level stats kernel gained nothing from it where many programs
share an SM.) Run: --configs '[(64,128,4,2,"pp","ov"), (64,128,4,2,"ov"), (64,128,4,2,"pp"),
(64,128,4,2), (64,64,4,3,"pp","ov"), (64,64,4,3,"pp")]'.
Outcome (runs/profiles/probs_staged_overlap_cfa75f4.json): the 128-key ping-pong slower with it
(512x16 115.0 vs 110.4 us, 449x16 131.3 vs 120.6, 373x8 41.3 vs 39.9; its second warpgroup, held
to 168 registers, spills with two score tiles live), the 64-key ping-pong 1-4% faster but still
behind the 128-key one, the one-tile kernel unchanged. Dead; the switch is in git history at
cfa75f4.

ALIGN4 (config flag "a4", in git history at 2b2d614; prediction written before its first GPU
run): at S % 4 != 0 the probability rows are not 16-byte aligned and the staged kernels store
32-bit words (sm_90 SASS: 64 STG.E.EF per 64 x 128 tile against 16 STG.E.EF.128 at S=512);
449x16's ping-pong takes ~120 us against 110 at 512x16 with the same tile counts. Row tiles of
one residue class mod 4 (q loaded through registers, rows 4 apart), K/V tiles shifted by the
rows' common offset, 16-byte stores, the partial groups at a row's ends stored after o.
Predicted: 449x16 ping-pong 120 -> 108-112 us, 373x8 ~40 -> 37-39, 541x1 within +-1 us.
Outcome (runs/profiles/probs_staged_align4_2b2d614.json; correct, no NaN, errors as without):
the 128-key ping-pong slower, 449x16 118.5 -> 136.7 us, 373x8 39.2 -> 53.6 (8 row tiles per
head instead of 6); the 64-key ping-pong 171.3 -> 123.2 and the one-tile kernel 137.8 -> 132.2
at 449x16, both still behind the 128-key ping-pong; 541x1 best 23.4 vs the pair's 23.5. The
end-group stores (~2x loop 2's instructions) and the synchronous q load lengthen the stores'
side of the ping-pong past loop 1; every variant that put the end groups in the loop raised
registers to 216-255 (spills in the ping-pong's second warpgroup). No case gains: removed.
GP ("gp4", prediction written before its first GPU run): each row tile 16 positions of the 4
query heads of one KV head, so one K/V tile load serves four heads (in the pair's probabilities
pass GP took 512x16 from 102 to 95 us; the ping-pong's top stall at 512x16 is long scoreboard,
its mbarrier waits on loads). Predicted: the ping-pong -5 to -10% at 512x16, 449x16, 512x8 and
373x8 (512x16 ~110 -> 100-105 us), probabilities and o bitwise equal to the same config
without it. Run: --configs '[(64,128,4,2,"pp"), (64,128,4,2), (64,64,4,3,"pp"),
(64,128,4,2,"pp","gp4"), (64,128,4,2,"gp4"), (64,64,4,3,"pp","gp4")]'
"""
import argparse
import json
import statistics

import torch

import gqa_pack_bench    # inputs and the flash.py launch helper (this folder is sys.path[0])
from inductor_gqa.kernels import probs_staged, tuning
from inductor_gqa.lower import attention as lower_attention

H, HK, D = gqa_pack_bench.H, gqa_pack_bench.HK, gqa_pack_bench.D
CONFIGS = list(probs_staged.CONFIGS)    # --configs: others (a Python list of tuples)
STATS = [(64, 128, 4, 3), (64, 128, 4, 2), (128, 64, 8, 3)]
PROBS = [(128, 64, 8, 4, "gp4"), (128, 64, 8, 3, "gp4"), (64, 64, 4, 3, "gp4"),
         (32, 64, 4, 2, "pipeline")]


def t_us(fn):
    return statistics.median(tuning.time_ms(fn, reps=5) for _ in range(3)) * 1e3


def reference(c, causal):
    s, b = c.s, c.b
    q = c.q.double().view(b, s, H, D).transpose(1, 2)
    k = c.k.double().view(b, s, HK, D).transpose(1, 2).repeat_interleave(H // HK, 1)
    v = c.v.double().view(b, s, HK, D).transpose(1, 2).repeat_interleave(H // HK, 1)
    sc = q @ k.transpose(-1, -2)
    if causal:
        sc = sc.masked_fill(torch.ones(s, s, dtype=torch.bool, device=sc.device).triu(1),
                            float("-inf"))
    p = torch.softmax(sc, -1)
    return p, (p @ v).transpose(1, 2).reshape(b, s, H * D)


def errors(c, ref):
    p_ref, o_ref = ref
    bad = int(torch.isnan(c.probs).sum() + torch.isnan(c.o).sum())
    ep = (c.probs.double() - p_ref).abs()
    eo = (c.o.double() - o_ref).abs()
    return dict(nan=bad, p_max=float(ep.max()), p_rel=float((ep / p_ref.abs().clamp_min(1e-3)).max()),
                o_max=float(eo.max()), o_rel=float((eo / o_ref.abs().clamp_min(1e-2)).max()))


def staged(c, cfg, causal=False):
    probs_staged.launch(c.q, c.k, c.v, c.o, c.probs, c.flag, c.b, c.s, H, H // HK, D, 1.0,
                        causal, cfg, guard=1)


def bench(name, causal_check):
    s, b = (int(t) for t in name.split("x"))
    c = gqa_pack_bench.Case(s, b)
    rep = dict(case=name)
    ref = reference(c, False)
    # the pair: best stats config + best probabilities config
    st = sorted((t_us(lambda cfg=cfg: c.launch(1, cfg)), cfg) for cfg in STATS)
    c.launch(1, st[0][1])
    pr = []
    for cfg in PROBS + ([(64, 64, 4, 3, "a4")] if s % 4 else []):
        pr.append((t_us(lambda cfg=cfg: c.launch(2, cfg)), cfg))
    pr.sort()
    c.probs.fill_(float("nan"))
    c.o.fill_(float("nan"))
    c.launch(1, st[0][1])
    c.launch(2, pr[0][1])
    torch.cuda.synchronize()
    rep["pair"] = dict(us=st[0][0] + pr[0][0], stats=st[0], probs=pr[0], err=errors(c, ref))
    if s <= 256:
        m3 = sorted((t_us(lambda cfg=cfg: c.launch(3, cfg)), cfg)
                    for cfg in lower_attention._single_pass_candidates(s, True, H // HK))
        rep["mode3"] = dict(us=m3[0][0], cfg=m3[0][1])
    rows, kept = [], {}
    for cfg in CONFIGS:
        if not probs_staged.supported(c.q, c.k, c.v, s, D, 0, 1.0, cfg):
            continue
        try:
            c.probs.fill_(float("nan"))
            c.o.fill_(float("nan"))
            c.flag.zero_()
            staged(c, cfg)
            torch.cuda.synchronize()
            err = errors(c, ref)
            err["flag"] = int(c.flag.item())
            # every config of one tile shape computes each row the same way (packed heads,
            # one or more warpgroups per program): results bitwise equal to the first
            shape = tuple(cfg[:2])
            if shape in kept:
                err["bitwise_equal_to"] = (str(kept[shape][2]),
                                           torch.equal(c.probs, kept[shape][0])
                                           and torch.equal(c.o, kept[shape][1]))
            else:
                kept[shape] = (c.probs.clone(), c.o.clone(), cfg)
            rows.append(dict(cfg=cfg, us=t_us(lambda cfg=cfg: staged(c, cfg)), err=err))
            print("   ", name, cfg, f"{rows[-1]['us']:.1f} us", err, flush=True)
        except Exception as e:  # noqa: BLE001
            rows.append(dict(cfg=cfg, error=f"{type(e).__name__}: {str(e)[:300]}"))
    rep["staged"] = rows
    if causal_check:
        cref = reference(c, True)
        for cfg in [x for x in CONFIGS
                    if probs_staged.supported(c.q, c.k, c.v, s, D, 0, 1.0, x)]:
            c.probs.fill_(float("nan"))
            c.o.fill_(float("nan"))
            staged(c, cfg, causal=True)
            torch.cuda.synchronize()
            rep.setdefault("causal", []).append(dict(cfg=cfg, err=errors(c, cref)))
    best = min((r["us"] for r in rows if "us" in r), default=float("inf"))
    print(name, f"pair {rep['pair']['us']:.1f}", f"mode3 {rep.get('mode3', {}).get('us', 0):.1f}",
          f"staged best {best:.1f}", flush=True)
    print("   ", json.dumps(rep, default=str), flush=True)
    return rep


def ncu(name, cfgs):
    """Each config once inside the profiled range (``ncu --profile-from-start off``), compiled
    and warmed outside it."""
    s, b = (int(t) for t in name.split("x"))
    c = gqa_pack_bench.Case(s, b)
    for cfg in cfgs:
        staged(c, cfg)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for cfg in cfgs:
        staged(c, cfg)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", default="", help="a case: profile the configs' launches once each")
    ap.add_argument("--cases", default="512x16,449x16,512x8,373x8,512x4,256x8,541x1,131x1")
    ap.add_argument("--causal", default="512x4,373x8")
    ap.add_argument("--out", default="")
    ap.add_argument("--configs", default="")
    a = ap.parse_args()
    if a.configs:
        CONFIGS[:] = [tuple(c) for c in eval(a.configs)]
    if a.ncu:
        ncu(a.ncu, CONFIGS)
        return
    causal = set(a.causal.split(",")) if a.causal else set()
    reps = [bench(n, n in causal) for n in a.cases.split(",")]
    if a.out:
        with open(a.out, "w") as f:
            json.dump(reps, f, indent=1, default=str)


if __name__ == "__main__":
    main()
