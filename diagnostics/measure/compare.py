"""Interleaved timing comparisons: is the candidate faster than the baseline, beyond the noise?

A comparison runs in rounds (``Rounds``; ``interleaved`` runs them all). Each round takes a fresh
random order of the calls and times them in it and then in reverse (a palindrome: load that rises or
falls during the round lands on every call alike). The order changes from round to round so that no
call always runs after the same neighbour: a call that leaves state behind (busy threads, a warm or
polluted cache, an allocator's pools) then slows a random neighbour each round, never always the same
one, and the A/A control cannot inherit a neighbour's carry-over as a bias.

Per round, a candidate's time is the mean of its two calls and its ratio the baseline's time over
its own. The reported speed-up is the geometric mean of the rounds' ratios, which is exactly the
ratio of the two calls' ``time_ms`` (the geometric mean of their round times), so times and speed-up
shown side by side always agree. Its interval is exact without assuming a distribution
(``log_interval``: Hartigan's subset means, the inversion of a sign-flip test): under the null (the
candidate does nothing) baseline and candidate are exchangeable in a random order, so each round's
log ratio is as likely above 0 as below, whatever the noise looks like. That needs MIN_ROUNDS (6)
rounds for 95%: with fewer, no pattern of rounds is rare enough, and the row says so instead of
giving a verdict. A percentile bootstrap over 3 rounds, by contrast, is the range of 3 values: a
false verdict one time in four.

An A/A control (``control=True``) times the baseline once more as if it were a candidate: its interval
is the noise floor of the run. The verdict reads the intervals: "faster" only when the candidate's low
end is above 1 and above the control's high end, "slower" only when its high end is below 1 and below
the control's low end, "within noise" otherwise. A control that is not "within noise" itself says the
measurement is biased: callers mark every verdict of that run low-confidence.

``Rounds`` runs one round at a time and summarises whenever asked. Early stopping (``run_rounds`` with
``early_stop``) is a group-sequential design with Haybittle-Peto boundaries: at a few interim looks fixed in
advance (``looks``: at most MAX_LOOKS, the first at 11 rounds) each candidate is tested at the strict level
INTERIM_ALPHA (0.1 %, a 99.9 % interval), and one whose strict interval is clear of 1 and of the A/A control's
strict interval is decided: its row is frozen (its 95 % interval then says the same) and it leaves the later
rounds; once every candidate is decided, the comparison stops. The final look is the fixed run's own 95 %
interval, so a candidate not decided early runs every round and is judged as without early stopping, and
the looks add at most MAX_LOOKS x INTERIM_ALPHA (0.5 %) to the chance of a false verdict (tests/measure/test_early_stop.py
simulates it, and how often an early verdict differs from the full run's).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from diagnostics.measure.timer import latency_stats, sync, time_calls, time_once
from diagnostics.significance import CONFIDENCE, MIN_ROUNDS, min_rounds  # noqa: F401  (compare's names too)
from diagnostics.units import speedup_text

CONTROL = "control"
VERDICTS = ("faster", "slower", "within noise")
#: The rounds' order is drawn from this seed: a run can be repeated exactly.
SEED = 0
METHOD = ("interleaved rounds, each timing every candidate twice in a fresh random order and its reverse; a "
          "speed-up is the geometric mean of the rounds' ratios with an exact 95% interval (subset means: no "
          "distribution assumed; at least 6 rounds); 'faster' / 'slower' only when the whole interval is above / "
          "below 1 and beyond the A/A control's interval")


# ----------------------------------------------------------------------------- statistics
# CONFIDENCE, min_rounds and MIN_ROUNDS live in diagnostics.significance (torch-free: a page says them).
#: Up to this many rounds every subset of rounds is used; past it, a group of 2^SUBSET_GROUP_BITS.
SUBSET_GROUP_BITS = 12


@lru_cache(maxsize=64)
def _subsets(n: int) -> np.ndarray:
    """Rows of 0/1 over n rounds, closed under symmetric difference (a group): every subset for
    n <= SUBSET_GROUP_BITS, else every combination of SUBSET_GROUP_BITS random generators (fixed seed)."""
    bits = min(n, SUBSET_GROUP_BITS)
    combos = (np.arange(2 ** bits)[:, None] >> np.arange(bits)) & 1  # every combination of the generators
    if n == bits:
        out = combos.astype(float)
        out.flags.writeable = False
        return out
    rng = np.random.default_rng(SEED)
    while True:  # generators independent over GF(2): 2^bits distinct subsets
        gens = rng.integers(0, 2, size=(bits, n))
        rows = (combos @ gens) % 2
        if len({r.tobytes() for r in rows}) == 2 ** bits:
            out = rows.astype(float)
            out.flags.writeable = False
            return out


@lru_cache(maxsize=64)
def _mean_weights(n: int) -> np.ndarray:
    """The non-empty subsets of ``_subsets(n)`` as weights: ``_mean_weights(n) @ x`` is every subset's mean."""
    rows = _subsets(n)[1:]  # the empty subset has no mean
    out = rows / rows.sum(axis=1, keepdims=True)
    out.flags.writeable = False
    return out


def log_interval(logs, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """An exact interval for the centre of ``logs``: Hartigan's typical values. Under the null each value
    is as likely above its centre as below (a symmetric distribution: skewed, spiky or clustered timings
    give symmetric log ratios when the two sides are exchangeable); then the means of the 2^m - 1
    non-empty subsets of a group of subsets cut the line into 2^m pieces, each holding the centre with
    probability 1 / 2^m, so [k-th smallest, k-th largest subset mean] holds it with probability
    1 - 2k / 2^m (k the largest with that at least ``confidence``): the inversion of the sign-flip test.
    None below ``min_rounds(confidence)`` values, where no k >= 1 reaches the confidence."""
    x = np.asarray(logs, dtype=float)
    if x.size < min_rounds(confidence):
        return None
    means = np.sort(_mean_weights(x.size) @ x)
    k = int(math.floor((1 - confidence) / 2 * (len(means) + 1) + 1e-9))
    return float(means[k - 1]), float(means[-k])


def ratio_interval(ratios, confidence: float = CONFIDENCE) -> tuple[float | None, float | None, float | None]:
    """(geometric mean, low, high) of positive ratios, the interval from ``log_interval`` mapped back;
    (value, None, None) with fewer than MIN_ROUNDS ratios, (None, None, None) with none."""
    a = np.asarray(ratios, dtype=float)
    a = a[np.isfinite(a) & (a > 0)]
    if not a.size:
        return None, None, None
    logs = np.log(a)
    iv = log_interval(logs, confidence)
    point = math.exp(float(logs.mean()))
    return (point, None, None) if iv is None else (point, math.exp(iv[0]), math.exp(iv[1]))


def verdict(low: float | None, high: float | None, noise: list | tuple | None = None) -> str:
    """"faster" when the whole interval is above 1 (and above ``noise``, the A/A control's interval,
    when given), "slower" when below 1 (and below the control's), else "within noise"."""
    if low is None or high is None:
        return "within noise"
    noise_low, noise_high = (noise or (None, None))
    if low > 1 and (noise_high is None or low > noise_high):
        return "faster"
    if high < 1 and (noise_low is None or high < noise_low):
        return "slower"
    return "within noise"


def too_few_rounds(rounds: int) -> str | None:
    """Why a comparison of ``rounds`` rounds has no interval, or None when it has one."""
    if rounds >= MIN_ROUNDS:
        return None
    return (f"{rounds} round{'s' * (rounds != 1)}: no 95% interval, so no verdict beyond 'within noise' (without "
            f"assuming how timings are distributed an interval needs at least {MIN_ROUNDS} rounds)")


def ratio_summary(baseline_ms, candidate_ms, noise: list | tuple | None = None) -> dict:
    """Speed-up of a candidate from per-round times (same length): the geometric mean of the rounds'
    ratios, its interval and verdict (against ``noise``, the A/A control's interval, when given)."""
    base = np.asarray(baseline_ms, dtype=float)
    cand = np.asarray(candidate_ms, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = base / cand
    ratios = ratios[np.isfinite(ratios) & (ratios > 0)]
    point, low, high = ratio_interval(ratios)
    out = {"speedup": point, "speedup_ci": None if low is None else [low, high],
           "verdict": verdict(low, high, noise), "rounds": int(ratios.size)}
    note = too_few_rounds(int(ratios.size))
    if note:
        out["ci_note"] = note
    return out


def geometric_mean(values) -> float | None:
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a) & (a > 0)]
    return float(np.exp(np.log(a).mean())) if a.size else None


def control_problem(rows: dict[str, dict]) -> str | None:
    """Why the A/A control of a comparison's rows says the measurement is biased, or None when it reads
    "within noise" (or there is no control)."""
    c = rows.get(CONTROL)
    if not c or c.get("verdict") in (None, "within noise"):
        return None
    return (f"the A/A control (the baseline timed against itself) read "
            f"{speedup_text(c['speedup'], c.get('speedup_ci'), c['verdict'])}: in this run the measurement itself "
            "is biased (what ran before a call, or load that came and went), so every verdict beside it is "
            "low-confidence")


# ----------------------------------------------------------------------------- the rounds
def round_order(keys: list[str], rng: np.random.Generator, reverse: bool = True) -> list[str]:
    """One round's order: a fresh random permutation of ``keys``, then (``reverse``) the same reversed."""
    perm = [keys[i] for i in rng.permutation(len(keys))]
    return perm + perm[::-1] if reverse else perm


class Rounds:
    """Interleaved rounds over ``timers`` (key -> a function that runs the thing once and returns its
    milliseconds), the baseline first unless named; ``control`` adds the A/A key "control" (the
    baseline's timer again). ``run()`` times one round of the keys still running; ``summary()`` gives
    every key's figures so far; ``decide()`` freezes the candidates whose verdict an interim look
    settles (they leave the later rounds). ``reverse=False``: each key once per round (a random order
    only), where one call is a whole process run (fix trials on a script: nothing carries over between
    processes, and the palindrome would double the runs)."""

    def __init__(self, timers: dict[str, Callable[[], float]], *, baseline: str | None = None,
                 control: bool = False, seed: int = SEED, batch_size: int = 1, reverse: bool = True):
        if not timers:
            raise ValueError("nothing to compare")
        self.timers = dict(timers)
        self.baseline = baseline or next(iter(self.timers))
        if control:
            self.timers[CONTROL] = self.timers[self.baseline]
        self.keys = list(self.timers)
        self.batch_size = batch_size
        self.reverse = reverse
        self.rng = np.random.default_rng(seed)
        self.samples: dict[str, list[float]] = {k: [] for k in self.keys}
        self.round_ms: dict[str, list[float]] = {k: [] for k in self.keys}
        self.orders: list[list[str]] = []
        #: key -> its row, frozen at the round its verdict was decided (it is timed no more)
        self.decided: dict[str, dict] = {}

    @property
    def done(self) -> int:
        return len(self.orders)

    @property
    def candidates(self) -> list[str]:
        """The keys compared with the baseline, the A/A control aside."""
        return [k for k in self.keys if k not in (self.baseline, CONTROL)]

    @property
    def running(self) -> list[str]:
        """The keys timed in the next round: all but the decided ones."""
        return [k for k in self.keys if k not in self.decided]

    def run(self) -> None:
        keys = self.running
        order = round_order(keys, self.rng, self.reverse)
        times: dict[str, list[float]] = {k: [] for k in keys}
        for k in order:
            times[k].append(float(self.timers[k]()))
        for k in keys:
            self.samples[k] += times[k]
            self.round_ms[k].append(sum(times[k]) / len(times[k]))
        self.orders.append(order)

    def _noise(self) -> list | None:
        if CONTROL in self.round_ms and self.baseline != CONTROL:
            return ratio_summary(self.round_ms[self.baseline], self.round_ms[CONTROL])["speedup_ci"]
        return None

    def _row(self, k: str, noise) -> dict:
        st = latency_stats(self.samples[k], self.batch_size) if self.samples[k] else {}
        row = {"median_ms": st.get("median_ms"), "p90_ms": st.get("p90_ms"), "cv": st.get("cv"),
               "throughput_per_s": st.get("samples_per_s"), "round_ms": list(self.round_ms[k]),
               "time_ms": geometric_mean(self.round_ms[k])}
        if k == self.baseline:
            row.update(speedup=1.0, speedup_ci=None, verdict=None, rounds=self.done)
        else:  # a key that left early is compared over the rounds it ran: the baseline's first ones
            base = self.round_ms[self.baseline][:len(self.round_ms[k])]
            row.update(ratio_summary(base, self.round_ms[k], None if k == CONTROL else noise))
        return row

    def summary(self, batch_size: int | None = None) -> dict[str, dict]:
        """Per key: median_ms, p90_ms, cv, throughput_per_s (all calls), round_ms, time_ms (the geometric
        mean of the round times: the figure the speed-up is the ratio of) and, but for the baseline, the
        speed-up over the baseline with its interval and verdict (beside the A/A control's, if any). A key
        decided early keeps the row of its decision, with ``decided_at`` (its rounds)."""
        if batch_size is not None:
            self.batch_size = batch_size
        noise = self._noise()
        return {k: dict(self.decided[k]) if k in self.decided else self._row(k, noise) for k in self.keys}

    def decide(self, alpha: float | None = None) -> list[str]:
        """An interim look: each candidate still running whose interval at confidence 1 - ``alpha``
        (INTERIM_ALPHA) is clear of 1 and of the A/A control's interval at the same confidence is
        decided: its row is frozen now (its 95 % interval, inside the stricter one, is clear of the
        control's 95 % one, inside the control's stricter one: the same verdict) and it is timed no
        more. Returns the keys decided at this look."""
        alpha = INTERIM_ALPHA if alpha is None else alpha
        base = np.asarray(self.round_ms[self.baseline], dtype=float)

        def strict(k: str) -> tuple[float | None, float | None]:
            return ratio_interval(base / np.asarray(self.round_ms[k], dtype=float), 1 - alpha)[1:]

        # the noise floor at the same strict level: a control whose interval widens in the later rounds
        # (a spike) cannot then take back a verdict decided against its narrower 95 % interval
        strict_noise = strict(CONTROL) if CONTROL in self.round_ms and self.round_ms[CONTROL] else None
        noise = self._noise()
        out = []
        for k in self.candidates:
            if k in self.decided:
                continue
            low, high = strict(k)
            if verdict(low, high, strict_noise) != "within noise":
                self.decided[k] = dict(self._row(k, noise), decided_at=self.done)
                out.append(k)
        return out


# ----------------------------------------------------------------------------- early stopping
#: The two-sided level of an interim look (Haybittle-Peto: far stricter than the final 5 %).
INTERIM_ALPHA = 0.001
#: At most this many interim looks, whatever the rounds: the looks add at most MAX_LOOKS x INTERIM_ALPHA.
MAX_LOOKS = 5


def looks(total: int) -> tuple[int, ...]:
    """The rounds after which an interim look is taken in a comparison of ``total`` rounds: from the
    fewest rounds whose sign-flip test can reach 1 - INTERIM_ALPHA (11), evenly spaced, at most
    MAX_LOOKS, all before the last round (whose look is the fixed run's own)."""
    first = min_rounds(1 - INTERIM_ALPHA)
    if total <= first:
        return ()
    step = max(2, math.ceil((total - first) / MAX_LOOKS))
    return tuple(range(first, total, step))[:MAX_LOOKS]


@dataclass(frozen=True)
class Stop:
    """How a comparison's rounds ended: ``planned`` and ``run`` rounds; ``reason`` None (every planned
    round ran), "decided" (every candidate's verdict was decided at an interim look) or "budget" (the
    time budget was spent); the interim ``looks`` planned (empty without early stopping)."""

    planned: int
    run: int
    reason: str | None = None
    looks: tuple[int, ...] = ()
    budget_s: float | None = None

    def to_dict(self) -> dict:
        return {"planned": self.planned, "run": self.run, "reason": self.reason, "looks": list(self.looks),
                "budget_s": self.budget_s}

    def note(self) -> str | None:
        """What the rows' round counts mean, for the result's notes; None when every round ran and
        nothing was decided early."""
        if self.reason == "budget":
            return (f"timing stopped after {self.run} of {self.planned} rounds: the time budget of {self.budget_s:g} s "
                    f"was spent (never before {MIN_ROUNDS} rounds); the undecided rows' intervals are over the "
                    "rounds run")
        if self.reason == "decided":
            return (f"timing stopped after {self.run} of {self.planned} rounds: every candidate's verdict was decided. "
                    + early_stop_method(self.looks))
        if self.looks:
            return ("early stop: " + early_stop_method(self.looks) + " Candidates not decided early ran every round.")
        return None


def early_stop_method(at: tuple[int, ...]) -> str:
    return (f"Interim looks at rounds {', '.join(map(str, at))}: a candidate whose {100 * (1 - INTERIM_ALPHA):g}% "
            "interval is clear of 1 and of the A/A control's interval at the same level is decided there and timed no more "
            f"(Haybittle-Peto: the looks add at most {100 * len(at) * INTERIM_ALPHA:.1f}% to the chance of a false "
            "verdict).")


def run_rounds(r: Rounds, rounds: int, *, early_stop: bool = False, budget_s: float | None = None,
               progress: Callable[[float, str], None] | None = None,
               on_round: Callable[[Rounds, list[str]], None] | None = None,
               clock: Callable[[], float] = time.monotonic) -> Stop:
    """Run up to ``rounds`` rounds of ``r``. ``early_stop``: interim looks (``looks``) decide candidates
    and stop once all are decided. ``budget_s`` (> 0): stop once the rounds took this long, never before
    MIN_ROUNDS. ``on_round(r, decided_now)`` after each round (a job's partial results)."""
    total = max(1, int(rounds))
    at = looks(total) if early_stop else ()
    t0 = clock()
    budget = budget_s if budget_s and budget_s > 0 else None
    reason = None
    for i in range(total):
        r.run()
        decided = r.decide() if r.done in at else []
        if progress:
            left = f", {len(r.decided)} decided" if r.decided else ""
            progress((i + 1) / total, f"interleaved round {i + 1}/{total}{left}")
        if on_round:
            on_round(r, decided)
        if at and r.candidates and all(k in r.decided for k in r.candidates):
            reason = "decided"
            break
        if budget is not None and r.done < total and r.done >= MIN_ROUNDS and clock() - t0 >= budget:
            reason = "budget"
            break
    return Stop(total, r.done, reason, at, budget)


def timed_rounds(calls: dict[str, Callable[[], object]], device, rounds: int, warmup: int = 1, *,
                 baseline: str | None = None, control: bool = False, batch_size: int = 1,
                 progress: Callable[[float, str], None] | None = None, seed: int = SEED,
                 early_stop: bool = False, budget_s: float | None = None,
                 on_round: Callable[[Rounds, list[str]], None] | None = None) -> tuple[Rounds, Stop]:
    """Time every call in ``calls`` in interleaved rounds (``run_rounds``), after ``warmup`` untimed
    calls of each; the rounds (``.summary()``) and how they ended."""
    for fn in calls.values():
        time_calls(fn, device, 0, warmup)
    sync(device)
    timers = {k: (lambda fn=fn: time_once(fn, device)) for k, fn in calls.items()}
    r = Rounds(timers, baseline=baseline, control=control, seed=seed, batch_size=batch_size)
    stop = run_rounds(r, rounds, early_stop=early_stop, budget_s=budget_s, progress=progress, on_round=on_round)
    return r, stop


def interleaved(calls: dict[str, Callable[[], object]], device, rounds: int, warmup: int = 1, *,
                baseline: str | None = None, control: bool = False, batch_size: int = 1,
                progress: Callable[[float, str], None] | None = None, seed: int = SEED) -> dict[str, dict]:
    """Time every call in ``calls`` in ``rounds`` interleaved rounds (see ``Rounds``), after ``warmup``
    untimed calls of each; per key the latency figures and, but for the baseline (the first key unless
    named), the speed-up over it with its interval and verdict. ``control`` adds the A/A row "control"."""
    if not calls:
        return {}
    r, _ = timed_rounds(calls, device, rounds, warmup, baseline=baseline, control=control, batch_size=batch_size,
                        progress=progress, seed=seed)
    return r.summary()
