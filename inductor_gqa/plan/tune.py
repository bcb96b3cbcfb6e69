"""Measure the plans' candidate configs on this GPU and write ``plan/tables/<gpu>.json``.

    python -m inductor_gqa.plan.tune [--workloads W075,W092] [--deadline 300] [--out FILE]

For representative cases of the reference workloads (one per S bucket), the whole block of the
default plan is timed under CUDA-graph replay, then with each candidate config of one kernel
family in place of the default, family after family (attention passes, the fused projection,
the 3xTF32 GEMMs against the library's), keeping each family's winner before the next: every
choice is measured in its block (L2 state, neighbours), not alone. The winners go into the table
under the keys ``configs.py`` looks up at compile time. Nothing here runs while a model compiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch

from . import configs as cfgs
from .plans import Fp16CopiesPlan, NativePlan, Problem, choose
from .spec import BlockSpec

# representative cases: (workload, precision, S, B), one per S bucket of each workload
CASES = [("W075", "high", s, b) for s, b in ((128, 4), (211, 2), (449, 16), (512, 8), (1024, 2),
                                             (2048, 1), (4096, 1))] + \
        [("W075", "highest", s, b) for s, b in ((128, 4), (211, 2), (512, 8), (1024, 2),
                                                (4096, 1))] + \
        [("W092", "high", s, b) for s, b in ((128, 4), (256, 2), (512, 4), (1024, 1),
                                             (2048, 1))]


def workload_block(name: str, inputs: dict):
    """The BlockSpec and the op's tensors of a reference workload's inputs."""
    if name == "W075":
        spec = BlockSpec(num_heads=16, num_kv_heads=4, head_dim=64, rope="half", rotary_dim=64,
                         core="explicit", scale=1.0, return_probs=True)
        t = dict(x=inputs["hidden_states"], wq=inputs["q_proj_weight"],
                 wk=inputs["k_proj_weight"], wv=inputs["v_proj_weight"],
                 wo=inputs["o_proj_weight"], inv_freq=inputs["inv_freq"],
                 position_ids=inputs["position_ids"])
    else:
        spec = BlockSpec(num_heads=96, num_kv_heads=8, head_dim=128, norm="fp32_weight",
                         eps=1e-5, rope="half", rotary_dim=128, core="explicit",
                         scale=128 ** -0.5, causal=True)
        t = dict(x=inputs["hidden_states"], wq=inputs["q_proj_weight"],
                 bq=inputs["q_proj_bias"], wk=inputs["k_proj_weight"], bk=inputs["k_proj_bias"],
                 wv=inputs["v_proj_weight"], bv=inputs["v_proj_bias"],
                 wo=inputs["o_proj_weight"], q_norm_weight=inputs["q_norm_weight"],
                 k_norm_weight=inputs["k_norm_weight"], cos=inputs["cos"], sin=inputs["sin"])
    from ..op.attention_block import TENSOR_ARGS
    full = dict.fromkeys(TENSOR_ARGS)
    full.update(t)
    return spec, full


def _time_us(plan, spec, t) -> float:
    import triton.testing

    from ..kernels.launch import direct_launches
    from ..lower.emit import emit
    with direct_launches():
        emit(plan, spec, t)
        torch.cuda.synchronize()
        return triton.testing.do_bench_cudagraph(lambda: emit(plan, spec, t), rep=30,
                                                 return_mode="median") * 1e3


def _families(plan, spec, p: Problem):
    """(family, table key, field setter, candidates) of the plan's tunable choices."""
    out = []
    ap = plan.attention
    operands = ("f16" if isinstance(plan, Fp16CopiesPlan) else
                "f32" if p.dtype == torch.float32 else "b16")
    mk = {"none": 0, "bool_keep": 1, "bool_fill": 2, "additive": 3}[spec.mask]

    def att(kind, mode, field):
        key = cfgs.attention_key(kind, operands, spec.head_dim, mode, spec.groups, p.seq_hint,
                                 spec.causal, mk)
        cands = cfgs.attention_candidates(kind, operands, spec.head_dim, mode, spec.groups,
                                          p.seq_static, spec.causal)

        def setter(pl, c):
            return dataclasses.replace(pl, attention=dataclasses.replace(pl.attention,
                                                                         **{field: c}))
        out.append(("attention", key, setter, cands))

    if ap.kind == "pair":
        att("pair", 2, "main")
        att("pair", 1, "stats")
    elif ap.kind in ("single", "online"):
        att(ap.kind, 3 if ap.kind == "single" else 0, "main")
    if isinstance(plan, Fp16CopiesPlan):
        parts = (spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                 spec.num_kv_heads * spec.head_dim)
        out.append(("projection", cfgs.projection_key(p.rows_hint, parts, spec.head_dim),
                    lambda pl, c: dataclasses.replace(pl, projection=c),
                    cfgs.projection_candidates(parts, spec.head_dim, p.rows_static)))
    if isinstance(plan, NativePlan) and plan.prec == "tf32x3":
        nq = spec.num_heads * spec.head_dim
        for field, which, (n, k) in (("qkv_gemm", "qkv", (nq, p.embed)),
                                     ("o_gemm", "o", (p.embed, nq))):
            out.append(("gemm_tf32x3", cfgs.gemm_key(which, p.rows_hint, n, k),
                        lambda pl, c, f=field: dataclasses.replace(
                            pl, **{f: None if c == cfgs.LIBRARY_GEMM else c}),
                        [cfgs.LIBRARY_GEMM] + cfgs.GEMM_TF32X3))
    return out


def tune(cases, deadline: float, log=print) -> tuple[dict, list]:
    from .. import workloads as wl
    from ..options import Options

    t0 = time.time()
    table, summary = {}, []
    for name, prec, s, b in cases:
        if time.time() - t0 > deadline:
            log(f"deadline reached before {name} {prec} {s}x{b}")
            break
        torch.set_float32_matmul_precision(prec)
        w = wl.WORKLOADS[name]
        inputs = wl.make_inputs(w, s, b, device="cuda", seed=0)
        spec, t = workload_block(name, inputs)
        p = Problem.of(spec, t)
        plan = choose(spec, p, Options(tuned_tables=False))
        base = best = _time_us(plan, spec, t)
        for family, key, setter, cands in _families(plan, spec, p):
            if time.time() - t0 > deadline:
                break
            times = []
            for c in cands:
                try:
                    times.append((_time_us(setter(plan, c), spec, t), c))
                except Exception as e:  # noqa: BLE001 - a candidate that fails is skipped
                    log(f"  {family} {c}: failed ({type(e).__name__}: {str(e)[:120]})")
            if not times:
                continue
            us, c = min(times, key=lambda tc: tc[0])
            plan = setter(plan, c)
            best = us
            table[cfgs.table_key(family, *key)] = dataclasses.asdict(c)
            log(f"  {name} {prec} {s}x{b} {family} {key}: {c} {us:.1f} us "
                f"(of {len(times)}; default {times[0][0]:.1f})")
        summary.append(dict(case=f"{name} {prec} {s}x{b}", default_us=round(base, 1),
                            tuned_us=round(best, 1)))
        log(f"{name} {prec} {s}x{b}: {base:.1f} -> {best:.1f} us")
    return table, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inductor_gqa.plan.tune")
    ap.add_argument("--workloads", default="W075,W092")
    ap.add_argument("--deadline", type=float, default=300.0)
    ap.add_argument("--out", default=None, help="table file (default: plan/tables/<gpu>.json)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no GPU")
        return 2
    gpu = torch.cuda.get_device_name()
    out = a.out or str(cfgs.TABLES_DIR / f"{cfgs.gpu_slug(gpu)}.json")
    cases = [c for c in CASES if c[0] in a.workloads.split(",")]
    table, summary = tune(cases, a.deadline, log=lambda m: print(m, flush=True))
    merged = json.loads(open(out).read()) if os.path.exists(out) else {}
    merged.update(table)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(dict(sorted(merged.items())), f, indent=1)
    with open(os.path.splitext(out)[0] + ".summary.json", "w") as f:
        json.dump(dict(gpu=gpu, torch=torch.__version__, summary=summary), f, indent=1)
    print(f"{len(table)} entries written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
