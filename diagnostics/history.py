"""Stored runs side by side: two runs of one analysis compared metric by metric, and a model's trend.

A user who applied a fix wants the run before and the run after together. Every figure comes from
the stored results and their declared metrics (unit, label, which way is better); nothing is re-run.
Two runs measured at different times are not an interleaved comparison (the machine, its load and
its clocks may have changed between them), so a difference in a timing is called "within noise"
when it is smaller than what the runs' own spread allows (see ``timing_noise``), and a run whose
timings were disturbed says so. For a fair timing verdict, Optimize measures candidates interleaved.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

import msgspec

from diagnostics.declare import Metric
from diagnostics.errors import TorchScopeError
from diagnostics.registry import get_analysis
from diagnostics.results import Record
from diagnostics.store import RunRecord
from diagnostics.units import format_value

#: the difference of two medians of n timed steps each is "within noise" under this many standard errors
NOISE_Z = 2.0
#: standard error of a median of n normal samples is about this times sigma / sqrt(n)
MEDIAN_SE_FACTOR = 1.2533
#: the same factor for each latency statistic a profile reports (normal samples): a quantile q has
#: sqrt(q (1 - q)) / phi(z_q), the standard deviation 1 / sqrt(2)
SE_FACTORS = {"latency_median_ms": MEDIAN_SE_FACTOR, "latency_p90_ms": 1.7094, "latency_p99_ms": 3.7328,
              "latency_std_ms": 0.7071}
#: relative changes smaller than this are "same" for exact counts (parameters, FLOPs, bytes)
SAME_REL = 1e-9
#: files a run keeps that the trace explorer can diff
TRACE_ARTIFACTS = ("trace.json.gz", "trace.json")

VERDICTS = ("better", "worse", "same", "within noise", "changed", "n/a")


class CompareError(TorchScopeError):
    """Two runs that cannot be compared (different analyses, a failed run); the message says why."""


#: a stored setting or metric as a comparison shows it (settings that are not scalars are written as text)
Scalar = str | int | float | bool | None


class RunRef(Record, frozen=True, kw_only=True):
    """Which run a comparison side is: its id, start (epoch s), model label and device."""

    id: str
    started: float
    model: str | None
    device: str | None


class MetricChange(Record, frozen=True, kw_only=True):
    """One declared metric in run A and run B: the values, their text in the metric's unit, the change
    (``delta`` b - a, ``ratio`` b / a, ``change_pct``; None when either is not a number or a is 0) and the
    verdict (one of VERDICTS)."""

    key: str
    label: str
    unit: str
    better: str | None
    a: Any
    b: Any
    a_text: str
    b_text: str
    delta: float | None
    ratio: float | None
    change_pct: float | None
    verdict: str


class Counts(Record, frozen=True, kw_only=True):
    """How many metrics got each verdict (the plain form keys them by the verdict's text)."""

    better: int
    worse: int
    same: int
    within_noise: int = msgspec.field(name="within noise")
    changed: int
    na: int = msgspec.field(name="n/a")


class SettingChange(Record, frozen=True, kw_only=True):
    """A setting (model, device, ``model.<spec key>``, an option) that differs between the runs."""

    setting: str
    a: Scalar
    b: Scalar


class PerRun(Record, frozen=True, kw_only=True):
    """One flag for run A and one for run B (whether each was disturbed)."""

    a: bool
    b: bool


class TracePair(Record, frozen=True, kw_only=True):
    """Both runs' kept trace files (a trace diff's before and after)."""

    a: str
    b: str


class Comparison(Record, frozen=True, kw_only=True):
    """Run A (before) beside run B (after): ``compare_runs``' result."""

    analysis: str
    a: RunRef
    b: RunRef
    rows: tuple[MetricChange, ...]
    counts: Counts
    settings: tuple[SettingChange, ...]
    noise_ms: float | None
    disturbed: PerRun
    notes: tuple[str, ...]
    traces: TracePair | None


class TrendPoint(Record, frozen=True, kw_only=True):
    """One run on a trend: when it started (epoch s), its id, model, device, the metric's value, its
    series (an index into ``Trend.series``) and whether its timings were disturbed."""

    started: float
    id: str
    model: str | None
    device: str | None
    value: float
    series: int
    disturbed: bool


class TrendSeries(Record, frozen=True, kw_only=True):
    """Runs of one model, device, spec and options: its label (the settings that tell it from the other
    series), those settings and how many runs it has."""

    label: str
    settings: dict[str, Any]
    runs: int


class Trend(Record, frozen=True, kw_only=True):
    """One metric over a model's runs: ``trend``'s result."""

    analysis: str
    metric: str
    label: str
    unit: str
    better: str | None
    model: str | None
    rows: tuple[TrendPoint, ...]
    series: tuple[TrendSeries, ...]
    missing: int
    damaged: int


def trace_file(rec: RunRecord) -> str | None:
    """The Chrome trace a run kept (profile runs), or None."""
    arts = rec.artifacts or {}
    return next((arts[n] for n in TRACE_ARTIFACTS if n in arts), None)


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def timing_noise(rec_a: RunRecord, rec_b: RunRecord, key: str = "latency_median_ms") -> float | None:
    """The band (ms) within which two profile runs' latency statistic ``key`` cannot be told apart.

    NOISE_Z standard errors of the difference of the two runs' statistics, each SE_FACTORS[key] * std /
    sqrt(n) with std the run's latency std and n its timed iterations; None when a run lacks either."""
    factor = SE_FACTORS.get(key)
    if factor is None:
        return None
    parts = []
    for rec in (rec_a, rec_b):
        std = _number((rec.metrics or {}).get("latency_std_ms"))
        n = (rec.options or {}).get("latency_iters")
        if std is None or not isinstance(n, int) or n < 1:
            return None
        parts.append((factor * std) ** 2 / n)
    return NOISE_Z * math.sqrt(sum(parts))


def _verdict(m: Metric, a, b, noise_ms: float | None) -> str:
    x, y = _number(a), _number(b)
    if x is None or y is None:
        return "n/a" if a is None or b is None or a == b else ("same" if a == b else "changed")
    delta = y - x
    if m.unit in ("ms", "us", "s") and noise_ms is not None:
        scale = {"ms": 1.0, "us": 1e3, "s": 1e-3}[m.unit]
        if abs(delta) <= noise_ms * scale:
            return "within noise"
    if abs(delta) <= SAME_REL * max(abs(x), abs(y), 1e-300):
        return "same"
    if not m.better:
        return "changed"
    return "better" if (delta < 0) == (m.better == "lower") else "worse"


def _scalar(v) -> Scalar:
    return v if isinstance(v, (str, int, float, bool)) or v is None else str(v)


def _setting_rows(rec_a: RunRecord, rec_b: RunRecord) -> tuple[SettingChange, ...]:
    """What differs between the two runs' model, device and options (what the user changed)."""
    rows = []
    for what, a, b in (("model", rec_a.model_label, rec_b.model_label), ("device", rec_a.device, rec_b.device)):
        if a != b:
            rows.append((what, a, b))
    spec_a, spec_b = rec_a.spec or {}, rec_b.spec or {}
    for key in sorted(set(spec_a) | set(spec_b)):
        if key != "name" and spec_a.get(key) != spec_b.get(key):
            rows.append((f"model.{key}", spec_a.get(key), spec_b.get(key)))
    opt_a, opt_b = rec_a.options or {}, rec_b.options or {}
    for key in sorted(set(opt_a) | set(opt_b)):
        if opt_a.get(key) != opt_b.get(key):
            rows.append((key, opt_a.get(key), opt_b.get(key)))
    return tuple(SettingChange(setting=s, a=_scalar(a), b=_scalar(b)) for s, a, b in rows)


def _disturbed(rec: RunRecord) -> bool:
    """Whether the run's disturbance report (in its stored result, when loaded) says the machine was busy."""
    return bool(((rec.result or {}).get("disturbance") or {}).get("disturbed"))


def _ref(rec: RunRecord) -> RunRef:
    return RunRef(id=rec.id, started=rec.started, model=rec.model_label, device=rec.device)


def compare_runs(rec_a: RunRecord, rec_b: RunRecord) -> Comparison:
    """Run A (before) beside run B (after): one row per declared metric either run has, with the change.

    Each row: key, label, unit, a, b, delta (b - a), ratio (b / a, None when a is 0 or either is not a
    number), change_pct, verdict (one of VERDICTS: better / worse by the metric's declared direction,
    same, within noise for latencies inside ``timing_noise``, changed for settings, n/a when a run has
    no value) and a and b formatted in the metric's unit. Also the settings that differ, each run's
    disturbance verdict, and both runs' trace files when both kept one (for a trace diff)."""
    for rec, name in ((rec_a, "A"), (rec_b, "B")):
        if rec.damaged:
            raise CompareError(f"run {name} ({rec.id}) is damaged in the run store ({rec.damaged}): it cannot be "
                               "compared")
        if rec.status != "ok":
            raise CompareError(f"run {name} ({rec.id}) is {rec.status!r}, not ok: only finished runs can be compared"
                               + (f" ({rec.error})" if rec.error else ""))
    if rec_a.analysis != rec_b.analysis:
        raise CompareError(f"run A is a {rec_a.analysis!r} run and run B a {rec_b.analysis!r} run: "
                           "compare two runs of the same analysis")
    analysis = get_analysis(rec_a.analysis)
    profile = rec_a.analysis == "profile"
    noise = timing_noise(rec_a, rec_b) if profile else None
    ma, mb = rec_a.metrics or {}, rec_b.metrics or {}
    rows = []
    for m in analysis.metrics:
        if m.key not in ma and m.key not in mb:
            continue
        a, b = ma.get(m.key), mb.get(m.key)
        x, y = _number(a), _number(b)
        delta = None if x is None or y is None else y - x
        ratio = None if delta is None or x == 0 else y / x
        rows.append(MetricChange(
            key=m.key, label=m.label, unit=m.unit, better=m.better or None, a=a, b=b,
            a_text=format_value(a, m.unit), b_text=format_value(b, m.unit), delta=delta,
            ratio=ratio, change_pct=None if ratio is None else 100.0 * (ratio - 1.0),
            verdict=_verdict(m, a, b, timing_noise(rec_a, rec_b, m.key) if profile else None),
        ))
    disturbed = PerRun(a=_disturbed(rec_a), b=_disturbed(rec_b))
    notes = ["The two runs were measured at different times, not interleaved: timings compare the machine's "
             "state too. For a timing verdict with an interval, try the change in Optimize (interleaved, "
             "with an A/A control)."]
    if noise is not None:
        notes.append(f"Latency differences within ±{noise:.3g} ms for the median ({NOISE_Z:g} standard errors of "
                     "the difference of the two medians, from each run's std and timed iterations; wider for p90, "
                     "p99 and the std, whose estimates scatter more) are within noise.")
    for name, busy in (("a", disturbed.a), ("b", disturbed.b)):
        if busy:
            notes.append(f"Run {name.upper()} was timed on a busy machine (its disturbance report says so): "
                         "its timings are not reliable.")
    traces = (trace_file(rec_a), trace_file(rec_b))
    n = {v: sum(r.verdict == v for r in rows) for v in VERDICTS}
    counts = Counts(better=n["better"], worse=n["worse"], same=n["same"], within_noise=n["within noise"],
                    changed=n["changed"], na=n["n/a"])
    return Comparison(
        analysis=rec_a.analysis, a=_ref(rec_a), b=_ref(rec_b), rows=tuple(rows), counts=counts,
        settings=_setting_rows(rec_a, rec_b), noise_ms=noise, disturbed=disturbed,
        notes=tuple(notes), traces=TracePair(a=traces[0], b=traces[1]) if all(traces) else None,
    )


def _settings(r: RunRecord) -> dict:
    """What a run measured, besides when: its model, device, model spec (batch, inputs, ...) and options."""
    spec = {k: v for k, v in (r.spec or {}).items() if k != "name"}
    return {"model": r.model_label, "device": r.device, **{f"model.{k}": v for k, v in spec.items()},
            **(r.options or {})}


def _key(settings: dict) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def _series_label(settings: dict, varying: list[str]) -> str:
    """'mode=train, batch_size=16': the settings that tell this series from the others."""
    def show(v):
        return v if isinstance(v, (str, int, float, bool)) or v is None else json.dumps(v, default=str)
    return ", ".join(f"{k}={show(settings.get(k))}" for k in varying) or "every run"


def trend(runs: Iterable[RunRecord], analysis: str, metric: str, model: str | None = None) -> Trend:
    """One metric over a model's finished runs of one analysis, oldest first, in series.

    ``model`` is the run's model label (None: every model). A series holds the runs of one model,
    device, model spec and options (mode, steps, batch...): a trend line joins only runs that measured
    the same thing (an inference profile and a training one are two lines, never one). Rows: started
    (epoch s), run id, model, device, value, series (its index in ``series``), disturbed (from the run's
    disturbance report when its result was loaded: records listed without results count as not
    disturbed). ``series``: per series its label (the settings that tell it from the others), settings
    and run count. Runs without the metric are counted in ``missing``, not drawn as 0; rows damaged in
    the store (RunRecord.damaged) in ``damaged``, not drawn."""
    a = get_analysis(analysis)
    m = a.metric(metric)
    if m is None:
        known = ", ".join(x.key for x in a.metrics) or "none"
        raise CompareError(f"{analysis!r} has no metric {metric!r}; its metrics: {known}")
    chosen = [r for r in runs if r.analysis == analysis and r.status == "ok"
              and (model is None or r.model_label == model)]
    damaged = sum(1 for r in chosen if r.damaged)
    chosen = [r for r in chosen if not r.damaged]
    rows, missing, keys, settings = [], 0, {}, []
    for r in sorted(chosen, key=lambda r: r.started):
        v = _number((r.metrics or {}).get(metric))
        if v is None:
            missing += 1
            continue
        st = _settings(r)
        k = _key(st)
        if k not in keys:
            keys[k] = len(settings)
            settings.append(st)
        rows.append(TrendPoint(started=r.started, id=r.id, model=r.model_label, device=r.device, value=v,
                               series=keys[k], disturbed=_disturbed(r)))
    all_keys = sorted({k for st in settings for k in st})
    varying = [k for k in all_keys if len({_key({"v": st.get(k)}) for st in settings}) > 1]
    series = tuple(TrendSeries(label=_series_label(st, varying), settings={k: st.get(k) for k in varying},
                               runs=sum(r.series == i for r in rows)) for i, st in enumerate(settings))
    return Trend(analysis=analysis, metric=metric, label=m.label, unit=m.unit, better=m.better or None, model=model,
                 rows=tuple(rows), series=series, missing=missing, damaged=damaged)


def comparable_metrics(analysis: str) -> list[Metric]:
    """The declared metrics of ``analysis`` a trend can draw (numbers, not settings or text)."""
    return [m for m in get_analysis(analysis).metrics if m.unit not in ("bool", "text")]
