"""Measure the plans' candidate configs on this GPU.

Offline, for the reference workloads, writing the committed table ``plan/tables/<gpu>.json``:

    python -m inductor_gqa.tune [--workloads W075,W092] [--deadline 300] [--out FILE]

and while a block compiles, under ``mode="max-autotune"`` or ``Options(autotune=True)``
(``plan_block``): the block's own shape, measured once and kept in Inductor's cache directory
(keyed by GPU, torch, Triton and this package's sources), so a second process tunes nothing.

Either way the whole block of the plan is timed under CUDA-graph replay, then with each
candidate config of one kernel family in place of the current one, family after family
(attention passes, the fused projection, the 3xTF32 GEMMs against the library's), keeping each
family's winner before the next: every choice is measured in its block (L2 state, neighbours),
not alone. The winners are table entries under the keys ``plan/configs.py`` looks up.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import time

import torch

from . import workloads as wl
from .kernels.launch import direct_launches, interpreting
from .lower.emit import emit
from .op.attention_block import TENSOR_ARGS
from .options import Options
from .plan import configs as cfgs
from .plan.plans import Fp16CopiesPlan, NativePlan, Problem, choose
from .plan.source import source_hash
from .plan.spec import BlockSpec

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
    full = dict.fromkeys(TENSOR_ARGS)
    full.update(t)
    return spec, full


log = logging.getLogger("inductor_gqa")


def _time_us(plan, spec, t) -> float:
    """GPU time of the plan's block: CUDA-graph replay median (on the CPU, under the Triton
    interpreter, wall time of a few runs: the tests)."""
    with direct_launches():
        emit(plan, spec, t)
        if t["x"].device.type != "cuda":
            t0 = time.perf_counter()
            for _ in range(2):
                emit(plan, spec, t)
            return (time.perf_counter() - t0) / 2 * 1e6
        import triton.testing
        torch.cuda.synchronize()
        return triton.testing.do_bench_cudagraph(lambda: emit(plan, spec, t), rep=30,
                                                 return_mode="median") * 1e3


def _descend(plan, spec, p, t, say=None) -> tuple:
    """Coordinate descent over the plan's families: (tuned plan, table entries, (base us, best
    us))."""
    base = best = _time_us(plan, spec, t)
    entries = {}
    families = _families(plan, spec, p)
    for i, (family, key, setter, cands) in enumerate(families):
        if say:
            say(f"{family} {i + 1}/{len(families)}: {len(cands)} candidates")
        times = []
        for c in cands:
            try:
                times.append((_time_us(setter(plan, c), spec, t), c))
            except Exception as e:  # noqa: BLE001 - a candidate that fails is skipped
                log.info("tuning: %s %s failed (%s: %s)", family, c, type(e).__name__,
                         str(e)[:120])
        if not times:
            continue
        us, c = min(times, key=lambda tc: tc[0])
        plan, best = setter(plan, c), us
        entries[cfgs.table_key(family, *key)] = dataclasses.asdict(c)
    return plan, entries, (base, best)


# ------------------------------------------------------------- compile-time tuning (one block)
def autotune_enabled(options) -> bool:
    """``Options.autotune``, or (None) Inductor's max-autotune setting of this compile."""
    if options.autotune is not None:
        return bool(options.autotune)
    from torch._inductor import config as inductor_config
    return bool(inductor_config.max_autotune)


def cache_path(gpu: str) -> str:
    """The block tunings' file: Inductor's cache directory, keyed by GPU, torch, Triton and this
    package's sources (a new version of any re-tunes)."""
    import triton
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    key = hashlib.sha256(f"{torch.__version__}|{triton.__version__}|{source_hash()}".encode())
    return os.path.join(cache_dir(), "inductor_gqa",
                        f"{cfgs.gpu_slug(gpu)}-{key.hexdigest()[:16]}.json")


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _store(path: str, entries: dict) -> None:
    """Merge ``entries`` into the file (write a temporary file, then rename: concurrent
    compiles never read half a file)."""
    merged = {**_load(path), **entries}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(merged, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _real_inputs(p: Problem, fake: dict) -> dict:
    """Random tensors with the block's shapes (symbolic sizes at their hints, an unbacked batch
    as 1), dtypes and device, to time candidates on."""
    def size(d):
        if isinstance(d, torch.SymInt):
            return int(d.node.hint) if d.node.hint is not None else 1
        return int(d)

    g = torch.Generator(device=p.device).manual_seed(0)
    out = {}
    for name, v in fake.items():
        if v is None:
            out[name] = None
            continue
        shape = [size(d) for d in v.shape]
        if name.startswith("runtime_"):                 # 0-d CPU values
            out[name] = torch.full((), 1e-5 if "eps" in name else 1.0, dtype=v.dtype)
        elif name == "position_ids":
            out[name] = torch.arange(shape[-1], device=p.device).expand(shape).contiguous()
        elif name == "inv_freq":
            r = v.numel() * 2
            out[name] = 1.0 / 10000 ** (torch.arange(0, r, 2, device=p.device) / r)
        elif v.dtype == torch.bool:
            out[name] = torch.rand(shape, device=p.device, generator=g) > 0.2
        elif v.dtype.is_floating_point:
            scale = shape[-1] ** -0.5 if name.startswith("w") else 1.0
            out[name] = (torch.randn(shape, device=p.device, generator=g) * scale).to(v.dtype)
        else:
            out[name] = torch.zeros(shape, device=p.device, dtype=v.dtype)
    return out


def plan_block(spec, p: Problem, fake: dict, options):
    """The block's plan with configs measured for its own shape at compile time (cached on
    disk), or None where tuning does not apply (no GPU)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if p.gpu is None and not interpreting():
        return None
    path = cache_path(p.gpu or "cpu-interpreter")
    committed = cfgs.committed_table(p.gpu) if options.tuned_tables else {}
    cached = _load(path)
    plan = choose(spec, p, options, tables=(cached, committed))
    keys = [cfgs.table_key(f, *k) for f, k, _, _ in _families(plan, spec, p)]
    if all(k in cached for k in keys):
        return plan
    t0 = time.time()

    def say(msg):
        if time.time() - t0 > 3.0:      # progress once tuning takes more than a few seconds
            print(f"inductor_gqa: tuning a block (S {p.seq_hint}, {type(plan).__name__}): "
                  f"{msg}, {time.time() - t0:.0f}s so far", flush=True)
    with unset_fake_temporarily(), torch.no_grad():
        t = _real_inputs(p, fake)
        plan, entries, (base, best) = _descend(plan, spec, p, t, say)
    _store(path, entries)
    log.info("tuned a block in %.1fs: %.1f -> %.1f us (%s)", time.time() - t0, base, best, path)
    return plan


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


def tune(cases, deadline: float, log_=print) -> tuple[dict, list]:
    t0 = time.time()
    table, summary = {}, []
    for name, prec, s, b in cases:
        if time.time() - t0 > deadline:
            log_(f"deadline reached before {name} {prec} {s}x{b}")
            break
        torch.set_float32_matmul_precision(prec)
        w = wl.WORKLOADS[name]
        inputs = wl.make_inputs(w, s, b, device="cuda", seed=0)
        spec, t = workload_block(name, inputs)
        p = Problem.of(spec, t)
        plan = choose(spec, p, Options(tuned_tables=False))
        _, entries, (base, best) = _descend(
            plan, spec, p, t, lambda m: log_(f"  {name} {prec} {s}x{b} {m}"))
        table.update(entries)
        summary.append(dict(case=f"{name} {prec} {s}x{b}", default_us=round(base, 1),
                            tuned_us=round(best, 1)))
        log_(f"{name} {prec} {s}x{b}: {base:.1f} -> {best:.1f} us")
    return table, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inductor_gqa.tune")
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
    table, summary = tune(cases, a.deadline, log_=lambda m: print(m, flush=True))
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
