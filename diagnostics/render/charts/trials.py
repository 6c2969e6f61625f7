"""Fix trials on a script: the speed-up chart with intervals (Optimize's, ``speedup_bars``), the report's
sections and the CLI's lines."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.trials.result import FixTrial, TrialsResult
from diagnostics.render.charts.optimize import speedup_bars
from diagnostics.render.sections import Section, notes, section
from diagnostics.render.tables import records_frame
from diagnostics.units import format_value, speedup_text


def timed_rows(result: TrialsResult) -> list[FixTrial]:
    """The rows with a speed-up (the control, the fixes that ran, the combination), the baseline aside."""
    rows = list(result.trials[1:]) + ([result.combination] if result.combination else [])
    return [r for r in rows if r.speedup is not None and r.verdict not in ("not applicable", "failed")]


def build_trials_speedup_figure(result: TrialsResult) -> go.Figure:
    return speedup_bars(timed_rows(result))


def row_line(r: FixTrial) -> str:
    """One row in words: its verdict and speed-up with the interval, its step, its cost in loss and memory."""
    if r.verdict == "not applicable":
        return f"{r.fix}: not applicable: {r.reason}"
    if r.verdict in ("failed", "diverged"):
        return f"{r.fix}: {r.verdict}: {r.reason}"
    parts = [f"{format_value(r.step_ms, 'ms')} per step"]
    if r.fix != "baseline":
        parts.insert(0, speedup_text(r.speedup, list(r.speedup_ci) if r.speedup_ci else None, r.verdict or ""))
    if r.loss_max_rel_diff is not None and r.fix != "baseline":
        parts.append(f"loss diff {r.loss_max_rel_diff:.3g} (relative, largest)")
    if r.peak_bytes is not None:
        parts.append(f"peak {format_value(r.peak_bytes, 'bytes')}")
    if r.warmup_extra_ms is not None and r.warmup_extra_ms > 1000:
        parts.append(f"warm-up +{r.warmup_extra_ms / 1e3:.1f} s (compile)")
    return f"{r.fix}: " + ", ".join(parts)


def summary_lines(result: TrialsResult) -> list[str]:
    lines = [f"{result.status}: {len(result.fixes)} fix(es) tried in {result.metrics.runs} runs of the script "
             f"({result.rounds} rounds, {result.warmup} warm-up + {result.steps} timed steps each)"]
    lines += [row_line(r) for r in result.trials]
    if result.combination:
        lines.append("together: " + row_line(result.combination))
    lines += [f"change: {c}" for c in result.changes]
    return lines


def trials_sections(result: TrialsResult) -> list[Section]:
    text = summary_lines(result) + notes(result) + [result.method]
    rows = list(result.trials) + ([result.combination] if result.combination else [])
    return [section("Fixes tried on the script", [lambda: build_trials_speedup_figure(result)], text=text,
                    tables=[("trials (baseline first)", records_frame(rows))])]
