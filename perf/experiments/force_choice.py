"""Run a perf script with the tuner forced to candidates of one tag wherever a choice offers one,
to check a kernel on the GPU where measurement alone would not pick it.

    PYTHONPATH=$PWD python perf/experiments/force_choice.py --tag overlap perf/kernels_check.py \
        --only W075-high,W075c-high --rounds 10 --no-time --no-compile --out $OUT/kc.json

A candidate is taken when it is a tuple whose first item is the tag (e.g. ("overlap", 64, 128,
4, 2)) or one of whose flags equals it (e.g. "roll2" for (64, 64, 4, 3, "roll2", "gp4")); the
first such candidate of each choice is used, the others are timed as usual. A named candidate
(a plan: ``--tag f16tma``) is taken when it equals the tag. Tags joined by "+"
must all match (``--tag staged+pp+gp4``: the packed ping-pong, not the packed flash.py configs);
tags joined by "," are alternatives, each forcing the choices it matches (``--tag f16tma,ws``:
the f16tma plan and, inside it, the warp-specialized fused projection).
"""
import argparse
import runpy
import sys

from inductor_gqa.kernels import tuning


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", required=True)
    ap.add_argument("script")
    a, rest = ap.parse_known_args()
    pick = tuning.pick
    forced = set()
    groups = [g.split("+") for g in a.tag.split(",")]

    def matches(c):
        if isinstance(c, str):      # a named candidate (e.g. the plan "f16tma")
            return any(g == [c] for g in groups)
        return bool(isinstance(c, tuple) and c
                    and any(all(t == c[0] or t in c[4:] for t in g) for g in groups))

    def forced_pick(key, candidates, run):
        for c in candidates:
            if matches(c):
                if key not in forced:
                    forced.add(key)
                    print(f"force_choice: {c} for {key}", flush=True)
                return c
        return pick(key, candidates, run)

    tuning.pick = forced_pick
    sys.argv = [a.script] + rest
    runpy.run_path(a.script, run_name="__main__")
    print(f"force_choice: {len(forced)} choices forced to {a.tag!r}", flush=True)


if __name__ == "__main__":
    main()
