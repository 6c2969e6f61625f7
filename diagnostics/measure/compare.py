"""Interleaved timing comparisons: is the candidate faster than the baseline, beyond the noise?

A comparison runs in rounds. Each round times every call twice in a palindrome (baseline, the
candidates, the candidates again in reverse, the baseline: ABBA for one candidate), alternating
which end starts from round to round, so load that rises or falls during a round lands on baseline
and candidates alike. Per round, a candidate's speed-up is the baseline's mean time over its own;
the reported speed-up is the median of the rounds' ratios, with a bootstrap confidence interval over
rounds. The verdict reads the interval: "faster" only when its low end is above 1, "slower" only
when its high end is below 1, "within noise" otherwise.

An A/A control (``control=True``) times the baseline once more as if it were a candidate: its
interval is the noise floor of that run, shown beside the real candidates.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from diagnostics.measure.timer import latency_stats, sync, time_calls, time_once

CONTROL = "control"
VERDICTS = ("faster", "slower", "within noise")
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
#: Fewer rounds than this give no interval: the verdict is "within noise".
MIN_ROUNDS = 2


def verdict(low: float | None, high: float | None) -> str:
    """"faster" when the whole interval is above 1, "slower" when it is below 1, else "within noise"."""
    if low is None or high is None:
        return "within noise"
    if low > 1:
        return "faster"
    if high < 1:
        return "slower"
    return "within noise"


def median_interval(values, confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES,
                    seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile-bootstrap interval of the median of ``values`` (None, None with too few values)."""
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    if a.size < MIN_ROUNDS:
        return None, None
    rng = np.random.default_rng(seed)
    medians = np.median(a[rng.integers(0, a.size, size=(resamples, a.size))], axis=1)
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def ratio_summary(baseline_ms, candidate_ms) -> dict:
    """Speed-up of a candidate from per-round times (same length): median ratio, interval, verdict."""
    base = np.asarray(baseline_ms, dtype=float)
    cand = np.asarray(candidate_ms, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = base / cand
    finite = ratios[np.isfinite(ratios)]
    low, high = median_interval(finite)
    return {"speedup": float(np.median(finite)) if finite.size else None,
            "speedup_ci": None if low is None else [low, high], "verdict": verdict(low, high),
            "rounds": int(finite.size)}


def interleaved(calls: dict[str, Callable[[], object]], device, rounds: int, warmup: int = 1, *,
                baseline: str | None = None, control: bool = False, batch_size: int = 1,
                progress: Callable[[float, str], None] | None = None) -> dict[str, dict]:
    """Time every call in ``calls`` in interleaved rounds; per key the latency figures and, for all
    but the baseline (the first key unless named), the speed-up over the baseline with its interval
    and verdict. ``control`` adds a key "control" that calls the baseline again (the A/A row)."""
    keys = list(calls)
    if not keys:
        return {}
    baseline = baseline or keys[0]
    calls = dict(calls)
    if control:
        calls[CONTROL] = calls[baseline]
        keys.append(CONTROL)
    rounds = max(1, int(rounds))
    for k in keys:
        time_calls(calls[k], device, 0, warmup)
    sync(device)
    per_round: dict[str, list[float]] = {k: [] for k in keys}
    samples: dict[str, list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        order = keys if r % 2 == 0 else keys[::-1]
        times: dict[str, list[float]] = {k: [] for k in keys}
        for k in list(order) + list(order[::-1]):
            times[k].append(time_once(calls[k], device))
        for k in keys:
            samples[k] += times[k]
            per_round[k].append(sum(times[k]) / len(times[k]))
        if progress:
            progress((r + 1) / rounds, f"interleaved round {r + 1}/{rounds}")
    out = {}
    for k in keys:
        st = latency_stats(samples[k], batch_size)
        row = {"median_ms": st["median_ms"], "p90_ms": st["p90_ms"], "cv": st["cv"],
               "throughput_per_s": st["samples_per_s"], "round_ms": per_round[k]}
        if k == baseline:
            row.update(speedup=1.0, speedup_ci=None, verdict=None, rounds=rounds)
        else:
            row.update(ratio_summary(per_round[baseline], per_round[k]))
        out[k] = row
    return out
