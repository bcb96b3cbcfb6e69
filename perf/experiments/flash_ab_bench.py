"""Experiment: flash.py against its copy at another revision, on the same inputs in one process.

Times the stats pass (MODE 1) and the probabilities pass (MODE 2) of W075 "high" (fp16 q/k/V
copies, fp16 output, float32 probabilities) for a few configs with the kernel of this tree and
with an older module file, and checks that both write bitwise the same probabilities, output and
statistics. Same timing as gqa_pack_bench (CUDA-graph replay, median of 3).

    git show REV:inductor_gqa/kernels/flash.py > /tmp/flash_old.py
    PYTHONPATH=$PWD python perf/experiments/flash_ab_bench.py --old /tmp/flash_old.py \
        [--cases 449x16,373x8] [--out F]

Prediction for the tile-bound masking change (the sequence-bound and causal selects run only in
tiles that cross a sequence end or the diagonal, where every tile paid one select per score):
ragged S (449x16, 373x8, 541x1) stats and probabilities passes 5-15% faster, S a multiple of the
key tile (512x16: EVEN_N already drops the select) unchanged. MODE 3 (S <= 253: one key tile,
always masked) unchanged.
"""
import argparse
import importlib.util

import torch

import gqa_pack_bench    # inputs, timing and report loop (this folder is sys.path[0])
from inductor_gqa.kernels import flash

STATS = [(64, 128, 4, 3), (64, 64, 4, 2), (128, 64, 8, 3)]
PROBS = [(128, 64, 8, 4, "gp4"), (64, 64, 4, 3), (64, 64, 4, 3, "a4"), (64, 32, 4, 3, "gp4")]


def load_module(path):
    """A kernel module file of another revision, as a module (its relative imports made
    absolute)."""
    text = open(path).read().replace("from . import", "from inductor_gqa.kernels import")
    text = text.replace("from .", "from inductor_gqa.kernels.")
    name = path.rsplit("/", 1)[-1].removesuffix(".py") + "_old"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = path     # triton.jit reads the source of each kernel from its file
    exec(compile(text, path, "exec"), mod.__dict__)
    return mod


OLD = None


def bench(name):
    s, b = (int(t) for t in name.split("x"))
    c = gqa_pack_bench.Case(s, b)
    rep = {}
    single = [(16, 256, 4, 1, "gp4"), (32, 256, 4, 1)] if s <= 253 else []
    for mode, cfgs in ((1, STATS), (2, PROBS), (3, single)):
        for cfg in cfgs:
            outs = {}
            for tag, mod in (("old", OLD), ("new", flash)):
                if mode == 2:
                    c.launch(1, STATS[0])   # the same statistics for both
                c.probs.fill_(float("nan"))
                c.o.fill_(float("nan"))
                if mode == 1:
                    c.ml.fill_(float("nan"))
                c.launch(mode, cfg, mod)
                torch.cuda.synchronize()
                outs[tag] = (c.ml.clone(),) if mode == 1 else (c.probs.clone(), c.o.clone())
                rep[f"mode{mode} {cfg} {tag}"] = gqa_pack_bench.t_us(
                    lambda: c.launch(mode, cfg, mod))
            same = all(torch.equal(x, y) for x, y in zip(outs["old"], outs["new"]))
            rep[f"mode{mode} {cfg} equal"] = same
            print(name, f"mode{mode} {cfg}: old {rep[f'mode{mode} {cfg} old']:.1f} us, "
                  f"new {rep[f'mode{mode} {cfg} new']:.1f} us, bitwise equal {same}", flush=True)
    assert c.flag.item() == 0
    return rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="flash.py of the revision to compare with")
    ap.add_argument("--cases", default="449x16,373x8,541x1,211x2,512x16")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    global OLD
    OLD = load_module(a.old)
    gqa_pack_bench.run_cases(bench, a.cases, a.out, old=a.old)


if __name__ == "__main__":
    main()
