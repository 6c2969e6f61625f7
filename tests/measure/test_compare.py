"""The comparison's statistics on synthetic timings (checked against brute-force sign-flip tests and
simulated A/A comparisons), and the rounds' order on fake clocks (drift, carry-over)."""

import itertools
import math

import numpy as np
import pytest

from diagnostics.measure import compare
from diagnostics.measure.compare import (CONTROL, MIN_ROUNDS, Rounds, interleaved, log_interval, ratio_summary,
                                         verdict)


def test_verdict_reads_the_interval_and_the_control_beside_it():
    assert verdict(1.05, 1.30) == "faster"
    assert verdict(0.70, 0.95) == "slower"
    assert verdict(0.95, 1.30) == "within noise"
    assert verdict(1.0, 1.2) == "within noise"  # low must be above 1, not at it
    assert verdict(None, None) == "within noise"
    # the A/A control's interval is the noise floor: "faster" needs the low end above its high end
    assert verdict(1.05, 1.30, noise=[0.85, 1.65]) == "within noise"
    assert verdict(1.70, 2.00, noise=[0.85, 1.65]) == "faster"
    assert verdict(0.50, 0.90, noise=[0.95, 1.05]) == "slower"
    assert verdict(0.50, 0.90, noise=[0.80, 1.20]) == "within noise"


def test_a_clear_two_times_speed_up_is_faster_and_agrees_with_the_times():
    base = [10.0, 10.4, 9.8, 10.1, 10.3, 9.9, 10.2, 10.0]
    cand = [5.0, 5.1, 4.9, 5.2, 5.0, 4.9, 5.1, 5.0]
    r = ratio_summary(base, cand)
    low, high = r["speedup_ci"]
    assert r["verdict"] == "faster" and low > 1.9 and high < 2.1 and low <= r["speedup"] <= high
    ratios = np.array(base) / np.array(cand)
    assert r["speedup"] == pytest.approx(math.exp(np.log(ratios).mean()))  # the geometric mean of the ratios
    geo = lambda xs: math.exp(np.log(xs).mean())  # noqa: E731
    assert r["speedup"] == pytest.approx(geo(base) / geo(cand))  # = the ratio of the two times shown


def test_noise_around_one_is_within_noise_and_slower_is_slower():
    base = [10, 12, 9, 11, 10, 13, 9, 10]
    cand = [11, 10, 10, 12, 9, 11, 10, 12]
    assert ratio_summary(base, cand)["verdict"] == "within noise"
    assert ratio_summary(base, [2 * b for b in base])["verdict"] == "slower"


@pytest.mark.parametrize("rounds", [1, 3, MIN_ROUNDS - 1])
def test_too_few_rounds_give_no_interval_and_say_so(rounds):
    r = ratio_summary([10.0] * rounds, [1.0] * rounds)  # ten times faster every round, but too few rounds
    assert r["speedup"] == pytest.approx(10.0) and r["speedup_ci"] is None and r["verdict"] == "within noise"
    assert f"{rounds} round" in r["ci_note"] and f"at least {MIN_ROUNDS} rounds" in r["ci_note"]
    assert "ci_note" not in ratio_summary([10.0] * MIN_ROUNDS, [1.0] * MIN_ROUNDS)


def _sign_flip_p(x: np.ndarray, shift: float) -> float:
    """Brute force: the two-sided sign-flip test of mean(x - shift) = 0 over every sign pattern."""
    d = x - shift
    flips = [abs(sum(s * v for s, v in zip(signs, d))) for signs in itertools.product((1, -1), repeat=len(d))]
    return sum(f >= abs(d.sum()) - 1e-12 for f in flips) / len(flips)


@pytest.mark.parametrize("n", [6, 7, 9])
def test_the_interval_is_the_inverted_sign_flip_test(n):
    """Every shift inside the interval is accepted by the exact sign-flip test at 5 %, every shift just
    outside rejected: the subset-means interval is that test's inversion."""
    x = np.random.default_rng(n).lognormal(0, 0.3, n) - 1.0
    low, high = log_interval(x)
    eps = 1e-7 * (x.max() - x.min())
    assert _sign_flip_p(x, low + eps) > 0.05 and _sign_flip_p(x, high - eps) > 0.05
    assert _sign_flip_p(x, low - eps) <= 0.05 and _sign_flip_p(x, high + eps) <= 0.05
    assert _sign_flip_p(x, x.mean()) == 1.0 and low < x.mean() < high


# ----------------------------------------------------------------------------- A/A simulations
#: per-call times (ms) from one distribution: what a quiet machine, a busy one and a spiky one look like
DISTRIBUTIONS = {
    "normal": lambda rng, size: 10 + rng.normal(0, 0.5, size),
    "lognormal": lambda rng, size: 10 * rng.lognormal(0, 0.1, size),
    "spiky": lambda rng, size: 10 * rng.lognormal(0, 0.03, size) * (1 + (rng.random(size) < 0.1)
                                                                     * rng.exponential(1.0, size)),
}
SIMULATIONS = 600
#: The method's level is at most 5 % by construction; the bound adds 2 standard errors of a rate
#: estimated from SIMULATIONS comparisons (the simulation's own sampling error), about 1.8 %.
FALSE_RATE_BOUND = 0.05 + 2 * math.sqrt(0.05 * 0.95 / SIMULATIONS)


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_aa_comparisons_from_one_distribution_rarely_read_faster_or_slower(dist):
    """Baseline and candidate drawn from one distribution (two calls per round, as the rounds time them):
    at 3, 5, 10 and 20 rounds at most 5 % of the comparisons may read anything but "within noise"; below
    MIN_ROUNDS none does, and each says why. (A percentile bootstrap over 3 rounds: about 25 %.)"""
    rng = np.random.default_rng(2024)
    draw = DISTRIBUTIONS[dist]
    for rounds in (3, 5, 10, 20):
        false = 0
        for _ in range(SIMULATIONS):
            base = draw(rng, (rounds, 2)).mean(axis=1)
            cand = draw(rng, (rounds, 2)).mean(axis=1)
            r = ratio_summary(base, cand)
            false += r["verdict"] != "within noise"
            assert (r["speedup_ci"] is None) == (rounds < MIN_ROUNDS)
        assert false / SIMULATIONS <= FALSE_RATE_BOUND, (dist, rounds, false / SIMULATIONS)
        if rounds < MIN_ROUNDS:
            assert false == 0


def _fake_clock(times: dict, rng, carry: float = 0.0, dirty: str | None = None, drift: float = 0.0):
    """Timers for Rounds: each call's time from ``times[key]`` (ms) with lognormal noise, ``carry`` more
    for the call right after ``dirty`` (state it left behind), and a clock drifting ``drift`` ms per call."""
    state = {"prev": None, "calls": 0}

    def timer(key):
        def t():
            v = times[key] * rng.lognormal(0, 0.05) * (1 + carry * (state["prev"] == dirty)) \
                + drift * state["calls"]
            state["prev"], state["calls"] = key, state["calls"] + 1
            return v
        return t

    return {k: timer(k) for k in times}


def test_carry_over_from_a_neighbour_does_not_bias_the_control():
    """A candidate that slows whatever runs after it by 30 % (spinning threads, a polluted cache). The old
    fixed palindrome ran the control right after the last candidate every round, so the control read
    "slower" nearly always; a fresh random order per round spreads the carry-over over every key alike."""
    runs, false = 200, 0
    for seed in range(runs):
        rng = np.random.default_rng(seed)
        clock = _fake_clock({"baseline": 10.0, "fix": 10.0, "dirty": 10.0}, rng, carry=0.3, dirty="dirty")
        r = Rounds(clock, control=True, seed=seed)
        for _ in range(10):
            r.run()
        false += r.summary()[CONTROL]["verdict"] != "within noise"
    assert false / runs <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / runs)


def test_each_round_is_a_fresh_permutation_and_its_reverse():
    r = Rounds({k: (lambda: 1.0) for k in "ABCD"}, control=True, seed=3)
    for _ in range(12):
        r.run()
    keys = ["A", "B", "C", "D", CONTROL]
    for order in r.orders:
        half = order[:len(keys)]
        assert sorted(half) == sorted(keys) and order[len(keys):] == half[::-1]
    assert len({tuple(o) for o in r.orders}) > 6  # the order changes from round to round
    before_control = {o[o.index(CONTROL) - 1] for o in r.orders if o.index(CONTROL) > 0}
    assert len(before_control) >= 3  # the control follows different neighbours
    again = Rounds({k: (lambda: 1.0) for k in "ABCD"}, control=True, seed=3)
    for _ in range(12):
        again.run()
    assert again.orders == r.orders  # the seed fixes the order: a run can be repeated


def test_linear_drift_hits_every_key_alike(monkeypatch):
    """Each round is a palindrome, so with a clock that drifts linearly equal calls come out equal."""
    calls = []
    clock = itertools.count()

    def fake_time_once(fn, device):
        fn()
        return 10.0 + next(clock)  # every call costs 1 ms more than the one before: linear drift

    monkeypatch.setattr(compare, "time_once", fake_time_once)
    monkeypatch.setattr(compare, "time_calls", lambda fn, device, iters, warmup=0: [])
    r = interleaved({"base": lambda: calls.append("A"), "cand": lambda: calls.append("B")}, "cpu", rounds=8,
                    warmup=0, control=True)
    assert len(calls) == 8 * 6 and calls.count("B") == 16 and calls.count("A") == 32  # the control calls base
    for k in ("cand", CONTROL):
        assert r[k]["speedup"] == pytest.approx(1.0, rel=0.02) and r[k]["verdict"] == "within noise"
    assert r["base"]["verdict"] is None and r["base"]["speedup"] == 1.0
    assert all(len(v["round_ms"]) == 8 for v in r.values())
    for k in ("cand", CONTROL):  # the speed-up is the ratio of the times shown
        assert r[k]["speedup"] == pytest.approx(r["base"]["time_ms"] / r[k]["time_ms"])


def test_rounds_without_the_reverse_run_each_key_once_per_round_in_a_fresh_order():
    calls = []
    r = Rounds({k: (lambda k=k: calls.append(k) or 1.0) for k in ("a", "b", "c")}, reverse=False, seed=3)
    for _ in range(8):
        r.run()
    assert all(sorted(o) == ["a", "b", "c"] for o in r.orders) and len(calls) == 24
    assert len({tuple(o) for o in r.orders}) > 1  # the order changes from round to round
    assert r.round_ms["b"] == [1.0] * 8
