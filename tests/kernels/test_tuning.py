"""tuning.pick's protocol with scripted timings (no GPU): warm once, time every candidate, time
the close ones again and keep each one's faster reading, cache the winner."""
import pytest

from inductor_gqa.kernels import tuning


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(tuning, "interpreting", lambda: False)
    monkeypatch.setattr(tuning, "_capturing", lambda: False)
    warmed = []
    monkeypatch.setattr(tuning, "warm", lambda fn, ms=tuning.WARM_MS: warmed.append(fn))
    tuning.clear()
    yield warmed
    tuning.clear()


def _script(monkeypatch, readings):
    """time_ms(fn) runs fn (which records its candidate) and returns that candidate's next
    scripted reading."""
    last = []
    left = {c: list(r) for c, r in readings.items()}
    monkeypatch.setattr(tuning, "time_ms", lambda fn, reps=5: (fn(), left[last[-1]].pop(0))[1])
    return lambda c: last.append(c)


def test_close_candidates_are_timed_again(monkeypatch, scripted):
    # "b" read slow once (a transient), within CLOSE of the best: its second reading wins;
    # "c" is far behind and is not timed again (an IndexError would say it was)
    run = _script(monkeypatch, {"a": [1.0, 1.0], "b": [1.2, 0.8], "c": [5.0]})
    assert tuning.pick("k", ["a", "b", "c"], run) == "b"
    assert [c for c, _ in tuning.TIMINGS["k"]] == ["b", "a", "c"]
    assert len(scripted) == 1                       # warmed once, before the first timing
    assert tuning.pick("k", ["a", "b", "c"], None) == "b"     # cached: nothing runs


def test_failed_candidate_is_skipped_and_warming_moves_on(monkeypatch, scripted):
    calls = []

    def run(c):
        calls.append(c)
        if c == "bad":
            raise RuntimeError("launch failed")

    monkeypatch.setattr(tuning, "time_ms", lambda fn, reps=5: (fn(), 1.0 if calls[-1] == "x"
                                                                else 2.0)[1])
    monkeypatch.setattr(tuning, "warm", lambda fn, ms=tuning.WARM_MS: fn())
    assert tuning.pick("k2", ["bad", "y", "x"], run) == "x"
    assert "k2" in tuning.FAILURES and tuning.FAILURES["k2"][0][0] == "bad"


def test_gemm_rows_bucket():
    assert [tuning.gemm_rows_bucket(m) for m in (1, 4, 5, 7, 131, 193, 256, 541, 7184)] == \
        [1, 4, 6, 8, 192, 256, 256, 768, 8192]


def test_first_runnable_takes_the_first_that_launches(scripted):
    class OutOfResources(Exception):
        pass
    ran = []

    def run(c):
        ran.append(c)
        if c == "big":
            raise OutOfResources("shared memory")
    assert tuning.first_runnable("f", ["big", "a", "b"], run) == "a"
    assert ran == ["big", "a"]                  # nothing timed, nothing after the first that ran
    assert "f" not in tuning.FAILURES           # a config that does not fit is no failure
    assert tuning.first_runnable("f", ["big", "a", "b"], None) == "a"   # cached
    with pytest.raises(RuntimeError, match="no config ran"):
        tuning.first_runnable("g", ["big", "big"], run)


def test_fallback_trial_is_its_guarded_launch(monkeypatch, scripted):
    """The guarded fallback's config trial is the guarded launch itself (GUARD 2), never an
    unguarded one: unguarded, it read float32 q/k/v that only the fallback finishes and wrote
    over the call's probabilities (seen on the H200 on a bucket's first call)."""
    import torch

    from inductor_gqa.kernels import flash
    from inductor_gqa.lower import attention as lower_attention
    from inductor_gqa.plan.spec import BlockSpec

    guards = []
    monkeypatch.setattr(flash, "launch", lambda *a, **k: guards.append(k["guard"]))
    spec = BlockSpec(num_heads=4, num_kv_heads=2, head_dim=16, rope="half", rotary_dim=16,
                     core="explicit", scale=1.0, causal=False, return_probs=True)
    b, s = 1, 8
    q = torch.zeros(b * s, 64)
    kv = torch.zeros(b * s, 32)
    f16 = (q.half(), kv.half(), kv.half(), torch.zeros(1, dtype=torch.int32))
    def pick(key, cands, run):      # as tuning.pick: a fallback key's trial runs its config
        if "fallback" in key:
            run(cands[0])
        return "two-pass" if key[-1] == 3 else cands[0]
    monkeypatch.setattr(tuning, "pick", pick)
    monkeypatch.setattr(lower_attention, "_single_pass_candidates", lambda *a: [(32, 32, 4, 1)])
    lower_attention.attention(q, kv, kv, None, spec, b, s, 1.0, f16=f16)
    assert guards[:2] == [1, 1]                 # the two passes on the fp16 copies
    assert guards[2:] and set(guards[2:]) == {2}    # the fallback: trial and launch, guarded


def test_choice_first_met_under_capture_runs_untimed_and_is_reported(monkeypatch, scripted):
    monkeypatch.setattr(tuning, "_capturing", lambda: True)
    assert tuning.pick("cap", ["a", "b"], None) == "a"       # nothing runs while capturing
    assert tuning.untimed_report() == {"cap": "a"}
    assert "cap" not in tuning._CACHE                          # an eager call may still time it
    monkeypatch.setattr(tuning, "_capturing", lambda: False)
    run = _script(monkeypatch, {"a": [2.0], "b": [1.0, 1.0]})
    assert tuning.pick("cap", ["a", "b"], run) == "b"


def test_choice_report_gives_the_named_choices_fastest_first(monkeypatch, scripted):
    """The perf job's record of which plan (and projection config) each bucket took: named
    keys only, fastest first, in microseconds."""
    run = _script(monkeypatch, {"a": [2.0, 2.0], "b": [1.0, 1.0], "c": [9.0]})
    tuning.pick(("plan", 512), ["a", "b", "c"], run)
    run = _script(monkeypatch, {"x": [3.0], "y": [1.0, 1.0]})
    tuning.pick((64, 128), ["x", "y"], run)
    report = tuning.choice_report()
    assert list(report) == [str(("plan", 512))]
    assert [c for c, _ in report[str(("plan", 512))]] == ["b", "a", "c"]
    assert report[str(("plan", 512))][0][1] == 1000.0
    assert str((64, 128)) in tuning.choice_report(named_only=False)
