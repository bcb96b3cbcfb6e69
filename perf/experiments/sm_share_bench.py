"""Experiment: how the attention passes' times scale with the number of SMs they get.

Idea under test (4096x1 and 2048x1 run the stats pass, then the probabilities pass): if the
probabilities pass is bound by DRAM writes, it may keep its speed on fewer SMs, and the stats
pass of later row tiles could then run *on the other SMs at the same time* (a spatial split,
unlike the co-residency on one SM that notes 20, 42 and 51 measured and lost). The split pays
only if the probabilities pass's time on 132 - k SMs stays near its time on all of them, for
a k at which the stats pass keeps up (its time scales as 132 / k if it is compute-bound).

How SMs are taken away: a "hog" kernel on a second stream whose programs each hold 208 KB of
shared memory (so no program of either pass fits beside one) spins until released; the timed
pass starts once all k hog programs are resident (a one-program waiter spins on their
counter) and is timed by events around it alone. Every spin gives up after 50 ms of
%globaltimer, so a hog that could not place its programs cannot hang the process.

Prediction: stats pass ~ T_stats * 132 / (132 - k) (compute bound). Probabilities pass
4096x1: flat (within 5%) down to ~80-90 SMs if store bound; if it grows as 132 / (132 - k)
like the stats pass, the split idea is dead.

    PYTHONPATH=$PWD INDUCTOR_GQA_PDL=0 python perf/experiments/sm_share_bench.py \
        [--cases 4096x1,2048x1] [--hogs 0,16,32,48,64] [--out F]
"""
import argparse
import statistics

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import gqa_pack_bench    # inputs and the flash.py launch (this folder is sys.path[0])
from inductor_gqa.kernels import stats_overlap

TIMEOUT_NS = 50_000_000


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def wait_count_kernel(counter_ptr, target, TIMEOUT: tl.constexpr):
    t0 = _now()
    while (tl.load(counter_ptr, volatile=True) < target) & (_now() - t0 < TIMEOUT):
        pass


@gluon.jit
def hog_kernel(counter_ptr, release_ptr, TIMEOUT: gl.constexpr):
    lay: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    blk: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 1], [1, 0])
    a = gl.allocate_shared_memory(gl.int32, [1024, 32], lay)     # 128 KB
    b = gl.allocate_shared_memory(gl.int32, [512, 32], lay)      # 64 KB
    c = gl.allocate_shared_memory(gl.int32, [128, 32], lay)      # 16 KB
    z = gl.zeros([8, 32], gl.int32, blk)
    a.slice(0, 8).store(z)
    b.slice(0, 8).store(z)
    c.slice(0, 8).store(z)
    gl.atomic_add(counter_ptr, 1)
    t0 = _now()     # (a Triton function: Gluon calls it as its own)
    while (gl.load(release_ptr, volatile=True) == 0) & (_now() - t0 < TIMEOUT):
        pass


class Sharer:
    def __init__(self):
        self.counter = torch.zeros(1, device="cuda", dtype=torch.int32)
        self.release = torch.zeros(1, device="cuda", dtype=torch.int32)
        self.side = torch.cuda.Stream()

    def time_us(self, fn, hogs, reps=7):
        """GPU time of fn() while ``hogs`` SMs are held (events around fn alone)."""
        out = []
        main = torch.cuda.current_stream()
        for _ in range(reps + 1):
            self.counter.zero_()
            self.release.zero_()
            if hogs:
                self.side.wait_stream(main)
                with torch.cuda.stream(self.side):
                    hog_kernel[(hogs,)](self.counter, self.release, TIMEOUT=TIMEOUT_NS,
                                        num_warps=1)
                wait_count_kernel[(1,)](self.counter, hogs, TIMEOUT=TIMEOUT_NS, num_warps=1)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            self.release.fill_(1)
            main.wait_stream(self.side)
            torch.cuda.synchronize()
            out.append(e0.elapsed_time(e1) * 1e3)
        return statistics.median(out[1:])


STATS = [(64, 128, 4, 3)]
OVERLAP = [("overlap", 64, 64, 4, 3), ("overlap", 64, 128, 4, 2)]
PROBS = [(128, 64, 8, 3, "gp4"), (128, 64, 8, 4, "gp4")]


def bench(name, hogs):
    s, b = (int(t) for t in name.split("x"))
    c = gqa_pack_bench.Case(s, b)
    sh = Sharer()
    c.launch(1, STATS[0])
    torch.cuda.synchronize()
    rep = {"sms": torch.cuda.get_device_properties(0).multi_processor_count}
    runs = {}
    for cfg in STATS:
        runs[f"stats {cfg}"] = lambda cfg=cfg: c.launch(1, cfg)
    for cfg in OVERLAP:
        runs[f"stats_overlap {cfg}"] = lambda cfg=cfg: stats_overlap.launch(
            c.q, c.k, c.ml, c.flag, b, s, 16, 4, 64, 1.0, False, cfg, guard=1)
    for cfg in PROBS:
        runs[f"probs {cfg}"] = lambda cfg=cfg: c.launch(2, cfg)
    for tag, fn in runs.items():
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:          # a config this Triton cannot build: reported, skipped
            rep[tag] = f"failed: {type(e).__name__}: {e}"[:300]
            continue
        rep[tag] = {k: round(sh.time_us(fn, k), 1) for k in hogs}
        print(name, tag, rep[tag], flush=True)
    # the hog must not have timed out (then the pass ran with every SM): count check
    sh.counter.zero_()
    sh.release.zero_()
    k = max(hogs)
    with torch.cuda.stream(sh.side):
        hog_kernel[(k,)](sh.counter, sh.release, TIMEOUT=TIMEOUT_NS, num_warps=1)
    wait_count_kernel[(1,)](sh.counter, k, TIMEOUT=TIMEOUT_NS, num_warps=1)
    torch.cuda.synchronize()
    rep["hog_resident_at_max"] = int(sh.counter.item())
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x1,2048x1")
    ap.add_argument("--hogs", default="0,16,32,44,52,64")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    hogs = [int(h) for h in a.hogs.split(",")]
    gqa_pack_bench.run_cases(lambda n: bench(n, hogs), a.cases, a.out, hogs=hogs)


if __name__ == "__main__":
    main()
