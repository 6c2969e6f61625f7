"""The verdict logic on synthetic timings, and the interleaved order on real calls."""

import itertools

import pytest

from diagnostics.measure import compare
from diagnostics.measure.compare import interleaved, median_interval, ratio_summary, verdict


def test_verdict_reads_the_interval_only():
    assert verdict(1.05, 1.30) == "faster"
    assert verdict(0.70, 0.95) == "slower"
    assert verdict(0.95, 1.30) == "within noise"
    assert verdict(1.0, 1.2) == "within noise"  # low must be above 1, not at it
    assert verdict(None, None) == "within noise"


def test_a_clear_two_times_speed_up_is_faster_with_an_interval_around_two():
    base = [10.0, 10.4, 9.8, 10.1, 10.3, 9.9, 10.2, 10.0]
    cand = [5.0, 5.1, 4.9, 5.2, 5.0, 4.9, 5.1, 5.0]
    r = ratio_summary(base, cand)
    low, high = r["speedup_ci"]
    assert r["verdict"] == "faster" and low > 1.9 and high < 2.1 and low <= r["speedup"] <= high
    assert r["speedup"] == pytest.approx(sorted(b / c for b, c in zip(base, cand))[3:5][0], rel=0.05)


def test_noise_around_one_is_within_noise_and_slower_is_slower():
    base = [10, 12, 9, 11, 10, 13, 9, 10]
    cand = [11, 10, 10, 12, 9, 11, 10, 12]
    assert ratio_summary(base, cand)["verdict"] == "within noise"
    assert ratio_summary(base, [2 * b for b in base])["verdict"] == "slower"


def test_one_round_gives_no_interval_and_no_verdict_beyond_noise():
    r = ratio_summary([10.0], [1.0])
    assert r["speedup"] == 10.0 and r["speedup_ci"] is None and r["verdict"] == "within noise"


def test_the_bootstrap_interval_holds_the_median_and_is_reproducible():
    values = [1.0, 1.1, 0.9, 1.05, 0.95, 1.2, 0.8]
    low, high = median_interval(values)
    assert low <= 1.0 <= high and (low, high) == median_interval(values)
    assert median_interval([1.0]) == (None, None)


def test_rounds_are_palindromes_so_drift_hits_baseline_and_candidate_alike(monkeypatch):
    """Each round times every key twice, mirrored (A B B A), alternating the starting end; with a
    clock that drifts linearly, equal calls come out equal."""
    order = []
    clock = itertools.count()

    def fake_time_once(fn, device):
        fn()
        return 10.0 + next(clock)  # every call costs 1 ms more than the one before: linear drift

    monkeypatch.setattr(compare, "time_once", fake_time_once)
    monkeypatch.setattr(compare, "time_calls", lambda fn, device, iters, warmup=0: [])
    r = interleaved({"base": lambda: order.append("A"), "cand": lambda: order.append("B")}, "cpu", rounds=4,
                    warmup=0, control=True)
    # keys: base (A), cand (B), control (the baseline's call again: A); each round mirrored
    assert "".join(order[:12]) == "ABAABA" * 2 and len(order) == 4 * 6
    assert r["cand"]["speedup"] == pytest.approx(1.0) and r["control"]["speedup"] == pytest.approx(1.0)
    assert r["cand"]["verdict"] == "within noise" and r["base"]["verdict"] is None
    assert all(len(v["round_ms"]) == 4 for v in r.values())
