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
