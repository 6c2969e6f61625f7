"""Early stopping of interleaved comparisons (measure.compare: interim looks, Haybittle-Peto), on simulated
timings: A/A comparisons stopped early read "faster" / "slower" no more often than the method's 5 %, and an
early verdict is the full run's verdict on the same timings (where it is not, the full run missed a real
effect: never the other way round)."""

import math

import numpy as np
import pytest

from diagnostics.measure.compare import (CONTROL, INTERIM_ALPHA, MAX_LOOKS, MIN_ROUNDS, Rounds, looks, min_rounds,
                                         ratio_interval, run_rounds)

DISTRIBUTIONS = {  # per-call times (ms): a quiet machine, a busy one, a spiky one (as tests/measure/test_compare.py)
    "normal": lambda rng, size: 10 + rng.normal(0, 0.5, size),
    "lognormal": lambda rng, size: 10 * rng.lognormal(0, 0.1, size),
    "spiky": lambda rng, size: 10 * rng.lognormal(0, 0.03, size) * (1 + (rng.random(size) < 0.1)
                                                                     * rng.exponential(1.0, size)),
}
ROUNDS = 20  # Optimize's default


def streams(draw, speedups: dict[str, float], seed: int) -> dict:
    """One timer per key, each reading its own stream of draws (the i-th call of a key gets the i-th value
    whichever keys run beside it): a run stopped early sees a prefix of the full run's timings."""
    out = {}
    for i, (k, f) in enumerate(speedups.items()):
        values = iter(draw(np.random.default_rng([seed, i]), 4 * ROUNDS) / f)
        out[k] = lambda v=values: float(next(v))
    return out


def simulate(dist: str, speedups: dict[str, float], seed: int, early: bool):
    r = Rounds(streams(DISTRIBUTIONS[dist], speedups, seed), baseline="baseline", seed=seed)
    stop = run_rounds(r, ROUNDS, early_stop=early)
    calls = sum(len(s) for s in r.samples.values())
    return r.summary(), stop, calls


def test_the_looks_are_few_fixed_in_advance_and_each_can_reach_its_level():
    assert min_rounds(1 - INTERIM_ALPHA) == 11  # 2 / 2^11 < 0.001: the rarest sign pattern of 11 rounds
    assert looks(20) == (11, 13, 15, 17, 19)
    assert looks(11) == () and looks(MIN_ROUNDS) == () and looks(12) == (11,)
    for total in (12, 30, 100, 1000):
        at = looks(total)
        assert 1 <= len(at) <= MAX_LOOKS and at[0] == 11 and at[-1] < total and list(at) == sorted(set(at))
    # at the first look the strict interval is the range of the rounds' log ratios (k = 1 of 2^11 subsets)
    x = np.log(np.random.default_rng(0).lognormal(0, 0.1, 11))
    _, low, high = ratio_interval(np.exp(x), 1 - INTERIM_ALPHA)
    assert low == pytest.approx(math.exp(x.min())) and high == pytest.approx(math.exp(x.max()))


def test_a_clear_effect_is_decided_at_the_first_look_and_leaves_the_rounds():
    speedups = {"baseline": 1.0, CONTROL: 1.0, "fast": 2.0, "slow": 0.5, "same": 1.0}
    s, stop, _ = simulate("normal", speedups, 1, early=True)
    assert s["fast"]["decided_at"] == 11 and s["fast"]["verdict"] == "faster" and s["fast"]["rounds"] == 11
    assert s["slow"]["decided_at"] == 11 and s["slow"]["verdict"] == "slower"
    assert len(s["fast"]["round_ms"]) == 11  # timed no more after its look
    # "same" is never decided, so the rounds run to the end and it is judged as in the full run
    assert "decided_at" not in s["same"] and s["same"]["rounds"] == ROUNDS and stop.reason is None
    full, _, _ = simulate("normal", speedups, 1, early=False)
    assert s["same"]["speedup_ci"] == full["same"]["speedup_ci"] and s["same"]["verdict"] == full["same"]["verdict"]
    # the frozen row is the full run's figures over its first 11 rounds
    assert s["fast"]["round_ms"] == full["fast"]["round_ms"][:11]


def test_every_verdict_decided_stops_the_comparison():
    s, stop, calls = simulate("normal", {"baseline": 1.0, CONTROL: 1.0, "fast": 2.0, "slow": 0.5}, 2, early=True)
    assert stop.reason == "decided" and stop.run == 11 and stop.planned == ROUNDS
    assert calls == 11 * 4 * 2 and s["baseline"]["rounds"] == 11
    assert "every candidate's verdict was decided" in stop.note()


def test_a_time_budget_stops_the_rounds_but_never_before_the_fewest_that_give_an_interval():
    now = [0.0]

    def timer():  # every call takes a quarter of a "second" on a fake clock
        now[0] += 0.25
        return 1.0

    r = Rounds({"a": timer, "b": timer}, control=True)  # 3 keys, 6 calls: 1.5 s a round
    stop = run_rounds(r, ROUNDS, budget_s=2.5, clock=lambda: now[0])
    assert stop.reason == "budget" and stop.run == MIN_ROUNDS and "time budget of 2.5 s" in stop.note()
    now[0] = 0.0
    r = Rounds({"a": timer, "b": timer}, control=True)
    stop = run_rounds(r, ROUNDS, budget_s=12.0, clock=lambda: now[0])
    assert stop.reason == "budget" and stop.run == 8  # 12 s spent after the 8th round
    r = Rounds({"a": timer, "b": timer}, control=True)
    assert run_rounds(r, ROUNDS, budget_s=0, clock=lambda: now[0]).reason is None and r.done == ROUNDS  # no budget


SIMULATIONS = 600
#: The fixed run's level is at most 5 %; the looks add at most MAX_LOOKS x INTERIM_ALPHA; plus 2 standard
#: errors of a rate estimated from SIMULATIONS comparisons (the simulation's own sampling error).
FALSE_RATE_BOUND = 0.05 + 2 * math.sqrt(0.05 * 0.95 / SIMULATIONS)


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_aa_comparisons_stopped_early_rarely_read_faster_or_slower(dist):
    """A candidate that changes nothing, beside the A/A control, 20 rounds with early stopping: at most
    5 % of the comparisons read anything but "within noise", and early stopping adds none the full run on
    the same timings does not have beyond the looks' 0.5 %."""
    early_false = full_false = 0
    for seed in range(SIMULATIONS):
        speedups = {"baseline": 1.0, CONTROL: 1.0, "same": 1.0}
        early, _, _ = simulate(dist, speedups, seed, early=True)
        full, _, _ = simulate(dist, speedups, seed, early=False)
        early_false += early["same"]["verdict"] != "within noise"
        full_false += full["same"]["verdict"] != "within noise"
    assert early_false / SIMULATIONS <= FALSE_RATE_BOUND, (dist, early_false / SIMULATIONS)
    assert (early_false - full_false) / SIMULATIONS <= MAX_LOOKS * INTERIM_ALPHA + 2 / SIMULATIONS


AGREEMENT_RUNS = 200
#: Real effects: twice as fast, 1.2x, 1.05x, 0.8x (slower), and none.
EFFECTS = {"baseline": 1.0, CONTROL: 1.0, "x2": 2.0, "x1.2": 1.2, "x1.05": 1.05, "x0.8": 0.8, "same": 1.0}
TRUE = {"x2": "faster", "x1.2": "faster", "x1.05": "faster", "x0.8": "slower"}


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_early_verdicts_are_the_full_runs_verdicts_on_the_same_timings(dist):
    """Each simulated comparison runs twice on the same timings, with and without early stopping. A candidate
    never decided early runs every round, so its verdict is the full run's. A decided one agrees with the full
    run in at least 97 % of the comparisons (every one on the quiet and busy machines); where it does not,
    the early verdict is the true one and the full run's "within noise" a real effect missed (spikes in the
    rounds after the look), never a verdict the full run would not draw from a real effect."""
    disagree = {k: 0 for k in TRUE}
    decided = calls_early = calls_full = 0
    for seed in range(AGREEMENT_RUNS):
        early, _, ce = simulate(dist, EFFECTS, seed, early=True)
        full, _, cf = simulate(dist, EFFECTS, seed, early=False)
        calls_early, calls_full = calls_early + ce, calls_full + cf
        assert early["same"]["verdict"] == full["same"]["verdict"] or "decided_at" in early["same"]
        for k, truth in TRUE.items():
            decided += "decided_at" in early[k]
            if "decided_at" not in early[k]:
                assert early[k]["verdict"] == full[k]["verdict"]  # ran every round: the full run's
            elif early[k]["verdict"] != full[k]["verdict"]:
                disagree[k] += 1
                assert early[k]["verdict"] == truth and full[k]["verdict"] == "within noise", (dist, seed, k)
    worst = max(disagree.values()) / AGREEMENT_RUNS
    assert worst <= (0.0 if dist != "spiky" else 0.03), (dist, disagree)
    assert decided > 0 and calls_early < calls_full  # it does stop early
