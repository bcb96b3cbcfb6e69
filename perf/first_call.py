"""First calls: the first call of a new shape in a fresh process (compile and any tuning).

The perf job (``perf.run``, suite ``first-call``) starts this module as a subprocess twice per
(case, implementation): once with an empty cache directory (Inductor's FX graph and autotune
caches and the Triton kernel cache all under it) and once more with the same, now warm,
directory. The worker prints one line ``FIRST_CALL_JSON {...}`` with its figures:

    python -m perf.first_call --workload W075 --precision high --impl backend --case 131x1

``first_call_s`` is the wall time of the first call (inputs already on the device, the device
context already up) until the device is done; ``second_call_s`` is the next call, for scale.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

if __package__ in (None, ""):                       # python perf/first_call.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    __package__ = "perf"

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "FIRST_CALL_JSON "


def smoke_config() -> None:
    """Settings of the CPU smoke run: one intra-op thread (on a 2-core machine, calls next to
    Inductor's compile workers took 100-300 ms instead of 2 ms with two) and no vectorized C++
    (its compiles take 2-3x as long; the code paths under test are the same)."""
    import torch
    import torch._inductor.config as ic
    torch.set_num_threads(1)
    ic.cpp.vec_isa_ok = False


def worker(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.first_call")
    p.add_argument("--workload", required=True)
    p.add_argument("--precision", default="high")
    p.add_argument("--impl", required=True)
    p.add_argument("--form", default="fn")
    p.add_argument("--case", required=True, help="SxB")
    p.add_argument("--dynamic", default="unbacked")
    p.add_argument("--mode", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="reduced sizes (bench.SMOKE_DIMS)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out = {"status": "error"}
    try:
        import torch
        from torch._dynamo.utils import counters

        import inductor_gqa  # noqa: F401
        from inductor_gqa import workloads as wl
        from perf import bench
        out["import_s"] = time.perf_counter() - T_START
        if a.smoke and not bench.is_cuda(a.device):
            smoke_config()
        workload = wl.WORKLOADS[a.workload]
        if workload.dtype == torch.float32:
            torch.set_float32_matmul_precision(a.precision)
        dims = bench.SMOKE_DIMS if a.smoke else None
        s, b = (int(v) for v in a.case.split("x"))
        inputs = bench.make_inputs(workload, s, b, a.device, seed=a.seed, dims=dims)
        with bench.implementation(a.impl, a.mode, a.dynamic) as compile_:
            if a.form == "fn":
                target = compile_(bench.block_fn(workload, dims))

                def call():
                    return target(**inputs)
            else:
                mod = bench.make_module(workload, a.device, dims)
                call_args = bench.load_module(mod, workload, inputs)
                target = compile_(mod)

                def call():
                    return target(*call_args)
            if a.impl != "eager" and not bench.per_case(a.impl, a.dynamic):
                bench.mark_dynamic(inputs, workload, a.dynamic)
            torch.ones(1, device=a.device).add_(1)      # the device context is up before
            bench.sync(a.device)
            with torch.no_grad():
                _, out["first_call_s"] = bench.wall(call, a.device)
                _, out["second_call_s"] = bench.wall(call, a.device)
                # fused: this process's call ran our op or kernels (a warm cache skips the pass,
                # so its counters cannot say)
                prof = bench.profile_call(call, a.device, calls=1)
                out.update({k: prof[k] for k in bench.FUSION_FIELDS})
        out["fx_cache_hits"] = int(counters["inductor"].get("fxgraph_cache_hit", 0))
        out["fx_cache_misses"] = int(counters["inductor"].get("fxgraph_cache_miss", 0))
        out["blocks_fused"] = int(counters["inductor_gqa"].get("blocks_fused", 0))
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        out["error"] = f"{type(e).__name__}: {e}"[:1000]
    out["process_s"] = time.perf_counter() - T_START
    print(MARK + json.dumps(out), flush=True)
    return 0 if out["status"] == "ok" else 1


def measure(spec: dict, cache_dir: str, timeout: float, device: str, smoke: bool,
            extra_env: dict | None = None) -> dict:
    """Run one worker process with all caches under ``cache_dir``; returns its figures (status
    "ok", "error" or "timeout") and the process's wall time as seen from here."""
    cmd = [sys.executable, "-m", "perf.first_call", "--workload", spec["workload"],
           "--precision", spec["precision"], "--impl", spec["impl"], "--form", spec["form"],
           "--case", f"{spec['seq']}x{spec['batch']}", "--dynamic", spec["dynamic"],
           "--device", device]
    if spec.get("mode"):
        cmd += ["--mode", spec["mode"]]
    if smoke:
        cmd.append("--smoke")
    env = dict(os.environ)
    env.update(extra_env or {})
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    env["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"timeout: the process ran past {timeout:.0f} s",
                "wall_s": time.perf_counter() - t}
    res = None
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            res = json.loads(line[len(MARK):])
    if res is None:
        res = {"status": "error",
               "error": f"exit {p.returncode}, no result: {(p.stderr or '')[-800:]}"}
    elif res.get("status") != "ok":
        res["error"] = (res.get("error") or "") + f" | {(p.stderr or '')[-600:]}"
    res["wall_s"] = time.perf_counter() - t
    return res


def cold_and_warm(spec: dict, timeout_left, device: str, smoke: bool) -> list[dict]:
    """The cold-cache and the warm-cache measurement of one (case, implementation), each in a
    fresh process, the second reusing the first one's cache directory. ``timeout_left()`` gives
    the seconds a process may take now (None or below 1: skipped)."""
    rows = []
    cache_dir = tempfile.mkdtemp(prefix="perf_first_call_")
    try:
        for cache in ("cold", "warm"):
            row = dict(spec, kind="first_call", cache=cache)
            row.pop("dynamic", None)
            row.pop("mode", None)
            limit = timeout_left()
            if limit is None or limit < 1:
                row["status"] = "skipped"
            elif cache == "warm" and rows and rows[0]["status"] != "ok":
                row["status"], row["error"] = "skipped", "the cold-cache process failed"
            else:
                row.update(measure(spec, cache_dir, limit, device, smoke))
            rows.append(row)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return rows


if __name__ == "__main__":
    sys.exit(worker())
