"""Results as text: a metric with the unit its analysis declared, the CLI's headline lines, and the
text of ``trace analyze`` / ``trace diff``."""

from __future__ import annotations

import json

from diagnostics.analyses.trace.result import CriticalPath, Ranks, TraceDiff, TraceResult
from diagnostics.render.trace_text import communication_lines, hta_text, serving_lines
# the text tables and the trace's Summary block: a light module (no plotly), the CLI's first answer
from diagnostics.render.trace_summary import _cell, _ms, _table, summary_lines  # noqa: F401
from diagnostics.results import Disturbance, given
from diagnostics.units import format_value, speedup_text


def _declared(analysis: str, key: str):
    from diagnostics.registry import ANALYSES

    a = ANALYSES.get(analysis)
    return None if a is None else a.metric(key)


def format_metric(analysis: str, key: str, value, metrics: dict | None = None) -> str:
    """``value`` of ``analysis``' metric ``key`` in its declared unit (12.3 ms, 4.00 MiB, 87.5 %); with
    the result's ``metrics``, a metric that declares an interval carries it and its verdict
    ("x1.11 [0.24, 38.80], within noise").

    A metric the analysis did not declare is shown as a plain number, never with a guessed unit
    (and tests/test_declarations.py fails on it)."""
    m = _declared(analysis, key)
    if m is not None:
        if m.interval and metrics is not None and value is not None:
            ci = [metrics.get(m.interval[0]), metrics.get(m.interval[1])]
            return speedup_text(value, ci, metrics.get(m.verdict) if m.verdict else None, unit=m.unit)
        return format_value(value, m.unit)
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)[:200]
    return format_value(value, "text" if isinstance(value, str) else "number")


def metric_label(analysis: str, key: str) -> str:
    m = _declared(analysis, key)
    return m.label if m is not None else key.replace("_", " ")


def shown_metrics(analysis: str, metrics: dict) -> list[tuple[str, object]]:
    """The metrics to show, in the result's order, less those shown folded into another's figure
    (an interval's ends, a verdict: see ``format_metric``)."""
    from diagnostics.registry import ANALYSES

    a = ANALYSES.get(analysis)
    folded = a.companions() if a is not None else frozenset()
    return [(k, v) for k, v in metrics.items() if k not in folded]


def metric_lines(analysis: str, metrics: dict) -> list[str]:
    """'Latency (median)   12.3 ms' lines, labels aligned, in the result's order; a measured comparison
    with its interval and verdict on its line."""
    rows = [(metric_label(analysis, k), format_metric(analysis, k, v, metrics)) for k, v in shown_metrics(analysis, metrics)]
    width = max((len(label) for label, _ in rows), default=0)
    return [f"{label.ljust(width)}  {value}" for label, value in rows]


def disturbance_line(report: Disturbance | None) -> str | None:
    """One line on what the machine did while a timed job ran (results.disturbance_of); None without."""
    if report is None:
        return None
    threads = report.torch_threads or "?"
    if not report.disturbed:
        return (f"quiet run: other processes used {report.other_processes_cores:.2f} CPU cores on average; "
                f"{threads} torch threads on {report.cores} cores")
    return ("disturbed run: " + "; ".join(report.reasons)
            + ". Timings and the verdicts drawn from them are low-confidence.")


# ----------------------------------------------------------------------------- traces
def _clip(name: str, n: int = 60) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def format_analysis(result: TraceResult, top: int, summary: bool = True) -> str:
    """The text of ``trace analyze``: its summary (``summary_lines``; summary=False: without it, the CLI having
    printed it as its first answer) and top operators (at most ``top`` rows each), the other parts after them."""
    ops = result.top_operators
    out = [summary_lines(result)[0][1], ""] if summary else []
    for n in result.temporal_breakdown.notes:
        out.append(f"note (per step): {n}")
    out += communication_lines(result.communication)
    if result.serving:   # an inference server's trace (issue #42)
        out += [""] + serving_lines(result.serving)
    graphs = result.launch_stats.graphs
    if graphs and graphs.launches:
        out.append(f"note: {graphs.launches:,} CUDA graph launches started {graphs.kernels:,} kernels; "
                   "they are counted apart from the per-kernel launch figures")
    rows = ops.operators[:top]
    out += ["", f"Top {len(rows)} of {ops.n_operators} operators by self time:",
            _table(rows, [("operator", "name", _clip), ("calls", "calls", str),
                          ("self", "self_us", _ms), ("total", "total_us", _ms),
                          ("self %", "self_pct", "{:.1f}".format)])]
    if ops.kernels:
        rows = ops.kernels[:top]
        out += ["", f"Top {len(rows)} of {ops.n_kernels} GPU kernels:",
                _table(rows, [("kernel", "name", _clip), ("kind", "kind", str),
                              ("calls", "calls", str), ("total", "total_us", _ms),
                              ("%", "pct", "{:.1f}".format)])]
    out += hta_text(result, top, _table, _clip, _ms)   # the HTA-parity analyses (render.charts.trace_hta)
    if result.critical_path:
        out += ["", format_critical_path(result.critical_path, top)]
    if result.ranks:
        out += ["", format_ranks(result.ranks)]
    return "\n".join(out)


def _msv(ms) -> str:
    return "-" if ms is None else f"{ms:.3f} ms"


def _bw(bps) -> str:
    return "-" if bps is None else f"{bps / 1e9:.2f} GB/s"


def format_ranks(r: Ranks) -> str:
    """The multi-rank part of ``trace analyze A B C``: diagnostics.trace.ranks.analyse_ranks' result."""
    out = [f"Ranks: {len(r.ranks)} traces ({r.mode}); medians per profiler step"]
    out.append(_table(r.ranks, [
        ("rank", "rank", str), ("file", "name", lambda f: _clip(str(f), 40)),
        ("steps", "steps", str), ("step", "step_ms_median", _msv), ("GPU busy", "gpu_busy_ms_median", _msv),
        ("GPU idle", "gpu_idle_ms_median", _msv), ("compute", "compute_ms_median", _msv),
        ("comm", "comm_ms_median", _msv), ("overlap", "overlap_ms_median", _msv),
        ("late (median)", "late_us_median", _ms), ("last at", "arrived_last", lambda v: "-" if v is None else str(v)),
        ("waited", "waited_ms", _msv)]))
    if r.slowest_rank is not None:
        spread = "-" if r.spread is None else f"{r.spread:.2f}x"
        out.append(f"slowest rank: {r.slowest_rank} (step-time spread max/min {spread})")
    for f in r.failed:
        out.append(f"left out: {f.name}: {f.error}")
    for p in r.problems:
        if p.check != "unreadable":
            out.append(f"problem ({p.check}): {p.message}")
    if not r.problems:
        out.append("no sign that these ranks come from different runs")
    coll, limit = r.collectives, r.thresholds.straggler_limit_us
    limit = limit if given(limit) else None
    if coll.by_name:
        out.append(f"Collectives: {coll.matched:,} matched on every rank, {coll.partial:,} on some "
                   f"(by {', '.join(coll.matched_by)}; {', '.join(coll.events)}); clock: {r.clock.aligned}")
        out.append(_table(coll.by_name, [
            ("collective", "name", lambda v: _clip(str(v), 40)), ("count", "collectives", str),
            ("skew (median)", "skew_us_median", _ms), ("skew (max)", "skew_us_max", _ms),
            ("transfer (median)", "transfer_us_median", _ms), ("bus bandwidth", "busbw_median", _bw)]))
    for s in r.stragglers:
        out.append(f"straggler: rank {s.rank} arrives {_ms(s.late_us_median)} after the median rank at its "
                   f"collectives (median; limit {_ms(limit)})")
    if coll.by_name and not r.stragglers:
        out.append(f"no straggler (no rank's median lateness over {_ms(limit)})")
    for c in r.late_collectives[:10]:
        out.append(f"late collective: {c.key} ({c.name}, step {c.step}): rank {c.rank} arrived "
                   f"{_ms(c.late_us)} after the median rank ({_ms(c.excess_us)} later than it usually is)")
    if r.waits:
        out.append("who waits for whom (summed wait in the collectives where the second rank arrived last): "
                   + "; ".join(f"rank {w.rank} for rank {w.waited_for} {w.ms:.1f} ms" for w in r.waits[:5]))
    cp = r.critical_path
    if cp and cp.available:
        out.append(f"critical path of rank {cp.rank}, step {cp.step}: {_ms(cp.length_us)}; by kind: "
                   + ", ".join(f"{k.kind} {_ms(k.us)}" for k in cp.by_kind if k.us > 0))
    elif cp:
        out.append(f"critical path of rank {cp.rank}: not computed: {cp.reason}")
    for w in r.workers:
        out.append(f"worker {w.worker}: {w.ranks} rank(s), {w.seconds:.1f} s, peak RSS "
                   f"{w.peak_rss_bytes / 2**20:,.0f} MiB")
    for n in r.notes:
        out.append(f"note: {n}")
    out.append(f"merged timeline (ranks {', '.join(map(str, r.timeline_ranks))}): {r.alignment}")
    return "\n".join(out)


def format_critical_path(cp: CriticalPath, top: int) -> str:
    """The critical path of one step (diagnostics.trace.critical_path): its time by kind, its longest
    events and the what-ifs."""
    if not cp.available:
        return f"Critical path: not computed: {cp.reason}"
    how = f" ({cp.chosen_as})" if cp.chosen_as else ""
    window = cp.gpu_window_us
    out = [f"Critical path of step {cp.step}{how}: {_ms(cp.length_us)} from the step's start to the end of "
           f"its last work (CPU step {_ms(cp.host_span_us)}"
           + (f", GPU window {_ms(window)}" if given(window) else "") + "), "
           f"{cp.path_events:,} events on it of {cp.events:,}"]
    out.append("  by kind: " + ", ".join(f"{r.kind} {_ms(r.us)}" for r in cp.by_kind if r.us > 0))
    out += [f"  note: {n}" for n in cp.notes or ()]
    if cp.incomplete_steps:
        out.append("  steps cut short by the end of profiling (a kernel launch with no kernel in the trace): "
                   + ", ".join(map(str, cp.incomplete_steps)))
    rows = sorted(cp.path, key=lambda r: -r.on_path_us)[:top]
    out += [f"Longest {len(rows)} events on the path:",
            _table(rows, [("event", "name", _clip), ("kind", "kind", str), ("start", "start_us", _ms),
                          ("on path", "on_path_us", _ms), ("waited on", "waited_on", lambda v: _clip(v or "", 50))])]
    if cp.what_if:
        out += [f"What if it were {cp.factor:g}x faster (every call of the name in the step; the longest path "
                "computed again):",
                _table(cp.what_if[:top], [("event", "name", _clip), ("kind", "kind", str), ("calls", "calls", str),
                                          ("on path", "on_path_us", _ms),
                                          ("with nested", "sped_up_us", lambda v: _ms(v) if given(v) else "-"),
                                          ("saves", "saving_us", _ms),
                                          ("step after", "step_us_after", _ms)])]
    if cp.trace_file:
        out.append(f"The step's trace with the critical path marked (Perfetto, chrome://tracing): {cp.trace_file}")
    return "\n".join(out)


def format_diff(r: TraceDiff, a: str, b: str, top: int) -> str:
    """The text of ``trace diff``: ``r`` is diff_traces' result, its first ``top`` rows shown."""
    c = r.counts
    return "\n".join([
        f"{a} -> {b} ({r.unit}): {_ms(r.time_us_before)} -> {_ms(r.time_us_after)}; "
        f"{c.added} added, {c.removed} removed, {c.faster} faster, "
        f"{c.slower} slower, {c.unchanged} unchanged", "",
        _table(r.rows[:top], [("name", "name", _clip), ("kind", "kind", str), ("status", "status", str),
                              ("before", "time_us_before", _ms), ("after", "time_us_after", _ms),
                              ("delta", "delta_us", _ms),
                              ("ratio", "ratio", lambda v: "-" if v is None else f"{v:.2f}x")])])
