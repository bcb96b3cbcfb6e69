"""Measured-once config choice per shape bucket.

``pick(key, candidates, run)`` times every candidate the first time a key is seen (CUDA events,
a few replays) and caches the winner; later calls are a dict lookup. The GPU is kept busy for a
moment first (after a compile it idles at a low clock), and the candidates within CLOSE of the
best are timed once more, interleaved, each keeping its faster reading: one slow reading must not
decide a choice that every later call lives with. No timing ever happens while a
CUDA graph is being captured or under the Triton interpreter: then the first candidate is used
(and not cached, so a later eager call can still measure; under capture the key is recorded in
UNTIMED, which the perf job reports). ``first_runnable`` is the untimed
twin, for launches that are only checked to run (the guarded fallbacks).
"""

from __future__ import annotations

import logging
import math
import os

import torch

from .host import next_pow2

_CACHE: dict = {}
TIMINGS: dict = {}   # key -> [(candidate, ms)], for the perf script's report
FAILURES: dict = {}  # key -> [(candidate, error)]: candidates that failed other than for resources
# key -> candidate: choices first met while a CUDA graph was captured, so the first candidate ran
# untimed (a key the eager call before the capture did not reach; the perf job reports them)
UNTIMED: dict = {}
log = logging.getLogger("inductor_gqa")

# programs of a guarded float32 fallback launch (GUARD 2 in flash.py, linear.py, qk_epilogue.py):
# about one per H200 SM, each looping over the work, so the launch is cheap when the flag is clear
# (read at launch time: tests lower it to make the loops iterate)
GUARDED_PROGRAMS = 128

# candidates within this factor of the first round's best are timed again (H200, W075 "highest":
# one perf run was 7-10% slower at 256x1 and 256x4 than a profile of the same commit, with one
# kernel more at 256x1: other choices)
CLOSE = 1.25
WARM_MS = 20.0


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def bucket(n: int) -> int:
    """A size's power-of-two bucket (the smallest power of two >= n)."""
    return next_pow2(n)


def gemm_rows_bucket(m: int) -> int:
    """A GEMM's row count bucket in steps of 2^k and 1.5 * 2^k: a GEMM of few rows runs few
    row tiles, so 131 and 256 rows (one power-of-two bucket) may want different configs, and the
    first one measured would decide for both."""
    p = bucket(m)
    return p * 3 // 4 if p >= 4 and m <= p * 3 // 4 else p


def shape_key(s: int, rows: int) -> tuple:
    """The shape part of a choice's key: S's and the row count's power-of-two buckets, and S's
    alignment (gcd with 128). Alignment matters: Triton specializes on S % 16 (vector stores of
    the probabilities' rows; a choice measured at a ragged S was 9% slow at S=512 on the H200),
    and flash.py's EVEN_N on S % BLOCK_N (key tiles up to 128)."""
    return bucket(s), bucket(rows), math.gcd(s, 128)


def _capturing() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return True


def time_ms(fn, reps: int = 5) -> float:
    """GPU time of one call: replay of a CUDA graph of ``reps`` calls (launch overhead excluded),
    falling back to back-to-back launches where capture is not possible."""
    fn()
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.cuda.graph(g, stream=side):
                for _ in range(reps):
                    fn()
        torch.cuda.current_stream().wait_stream(side)
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(3):      # median of three replays: one replay let choices vary by run
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / reps)
        del g
        return sorted(times)[1]
    except Exception:  # noqa: BLE001
        torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def warm(fn, ms: float = WARM_MS):
    """Run ``fn`` back to back for about ``ms`` milliseconds (at least once), so the GPU's clocks
    are up before anything is timed."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    for _ in range(min(int(ms / one), 1000)):
        fn()
    torch.cuda.synchronize()


def pick(key, candidates, run):
    """run(candidate) executes it once; returns the chosen candidate."""
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if len(candidates) == 1 or interpreting():
        return candidates[0]
    if _capturing():
        UNTIMED.setdefault(key, candidates[0])
        return candidates[0]
    results = []
    warmed = False
    for i, c in enumerate(candidates):
        try:
            if not warmed:
                warm(lambda: run(c))
                warmed = True
            results.append((time_ms(lambda: run(c)), i))
        except Exception as e:  # noqa: BLE001
            _failed(key, c, e)
            continue
    if not results:
        raise RuntimeError(f"inductor_gqa kernels: no config ran for {key}")
    best = min(ms for ms, _ in results)
    results = [(min(ms, time_ms(lambda: run(candidates[i]))) if ms <= best * CLOSE else ms, i)
               for ms, i in results]
    results.sort(key=lambda r: r[0])
    TIMINGS[key] = [(candidates[i], ms) for ms, i in results]
    _CACHE[key] = candidates[results[0][1]]
    return _CACHE[key]


def _failed(key, candidate, e):
    # a config that does not fit (shared memory, registers) is just not a candidate; anything
    # else is a bug that would otherwise hide as a missing candidate
    if type(e).__name__ != "OutOfResources":
        FAILURES.setdefault(key, []).append((candidate, f"{type(e).__name__}: {e}"[:300]))
        log.warning("inductor_gqa kernels: candidate %s for %s failed: %s: %s", candidate, key,
                    type(e).__name__, str(e)[:300])


def first_runnable(key, candidates, run):
    """The first candidate whose ``run`` launches (cached), for launches that are checked to run
    and not timed: the guarded fallbacks, whose trial is their own guarded launch (it exits at
    once while the flag is clear, and a config that does not fit fails at launch all the same),
    so a trial never writes the caller's outputs from inputs only the fallback would finish."""
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if len(candidates) == 1 or interpreting() or _capturing():
        return candidates[0]
    for c in candidates:
        try:
            run(c)
        except Exception as e:  # noqa: BLE001
            _failed(key, c, e)
            continue
        _CACHE[key] = c
        return c
    raise RuntimeError(f"inductor_gqa kernels: no config ran for {key}")


def failure_report() -> dict:
    """FAILURES with printable keys, for the perf scripts' JSON and exit status."""
    return {str(k): v for k, v in FAILURES.items()}


def untimed_report() -> dict:
    """UNTIMED with printable keys and candidates, for the perf scripts' JSON."""
    return {str(k): str(v) for k, v in UNTIMED.items()}


def choice_report(named_only: bool = True, top: int = 4) -> dict:
    """TIMINGS with printable keys, each choice's ``top`` fastest candidates in us, for the perf
    scripts' JSON: which plan and projection config each bucket took, and by how much (a
    choice that differs between runs is read off here). ``named_only``: the keys that start
    with a name (the whole-block plan, proj_rope, the copies epilogue's form), not the many
    kernel-config keys."""
    return {str(k): [(str(c), round(ms * 1e3, 2)) for c, ms in v[:top]]
            for k, v in TIMINGS.items() if not named_only or isinstance(k[0], str)}


def clear():
    _CACHE.clear()
    TIMINGS.clear()
    FAILURES.clear()
    UNTIMED.clear()
