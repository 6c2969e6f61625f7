"""Figures and report sections for several ranks' traces (the trace result's ``ranks``: Ranks, from
diagnostics.trace.ranks.analyse_ranks)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from diagnostics.analyses.trace.result import Ranks
from diagnostics.render.charts.timeline import build_timeline_figure as draw_timeline
from diagnostics.render.sections import Section, section
from diagnostics.render.tables import records_frame
from diagnostics.results import given

SLOWEST_COLOR, OTHER_COLOR = "#e45756", "#4c78a8"
#: The per-rank table's columns as a user reads them (ms medians per profiler step).
COLUMNS = {"rank": "rank", "file": "file", "steps": "steps", "step_ms_median": "step (ms)",
           "step_ms_max": "slowest step (ms)", "gpu_busy_ms_median": "GPU busy (ms)",
           "gpu_idle_ms_median": "GPU idle (ms)", "gpu_idle_pct": "GPU idle (%)",
           "compute_ms_median": "compute (ms)", "comm_ms_median": "communication (ms)",
           "overlap_ms_median": "overlap (ms)", "exposed_comm_ms_median": "exposed comm (ms)",
           "late_us_median": "late at collectives (µs, median)", "arrived_last": "arrived last (collectives)",
           "waited_ms": "waited (ms)", "caused_wait_ms": "others waited for it (ms)", "rank_source": "rank from"}
#: The collectives' table per name, and the widest-skew and late ones, as a user reads them.
COLLECTIVE_COLUMNS = {"name": "collective", "family": "family", "collectives": "count",
                      "skew_us_median": "arrival skew (µs, median)", "skew_us_max": "arrival skew (µs, max)",
                      "transfer_us_median": "transfer (µs, median)", "bytes_median": "bytes (median)",
                      "busbw_median": "bus bandwidth (B/s, median)"}
WIDEST_COLUMNS = {"key": "collective", "name": "name", "step": "step", "skew_us": "arrival skew (µs)",
                  "first_rank": "first rank", "last_rank": "last rank", "transfer_us": "transfer (µs)",
                  "bytes": "bytes", "busbw": "bus bandwidth (B/s)"}
LATE_COLUMNS = {"key": "collective", "name": "name", "step": "step", "rank": "late rank",
                "late_us": "after the median rank (µs)", "excess_us": "later than it usually is (µs)"}
WAIT_COLUMNS = {"rank": "rank", "waited_for": "waited for rank", "ms": "waited (ms)", "collectives": "collectives"}
WORKER_COLUMNS = {"worker": "worker (host:pid)", "ranks": "ranks", "seconds": "seconds",
                  "peak_rss_bytes": "peak RSS (bytes)"}


def _file_name(row) -> str:
    return row.name or Path(str(row.file)).name


def rank_table(ranks: Ranks):
    """The per-rank table as a DataFrame with readable headers (file names only)."""
    df = records_frame(ranks.ranks)
    if df.empty:
        return df
    df["file"] = [_file_name(r) for r in ranks.ranks]
    return df[[c for c in COLUMNS if c in df.columns]].rename(columns=COLUMNS)


def _frame(rows, columns: dict):
    df = records_frame(rows)
    if df.empty:
        return df
    return df[[c for c in columns if c in df.columns]].rename(columns=columns)


def collectives_table(ranks: Ranks):
    return _frame(ranks.collectives.by_name, COLLECTIVE_COLUMNS)


def widest_table(ranks: Ranks):
    return _frame(ranks.collectives.widest, WIDEST_COLUMNS)


def late_table(ranks: Ranks):
    return _frame(ranks.late_collectives, LATE_COLUMNS)


def waits_table(ranks: Ranks):
    return _frame(ranks.waits, WAIT_COLUMNS)


def workers_table(ranks: Ranks):
    return _frame(ranks.workers, WORKER_COLUMNS)


def build_heatmap_figure(ranks: Ranks) -> go.Figure:
    """Step time per rank (rows) and profiler step (columns), ms: a straggling step or rank stands out."""
    hm = ranks.heatmap
    binned = hm.binned
    fig = go.Figure(go.Heatmap(
        z=[list(line) for line in hm.step_ms], x=[str(s) for s in hm.steps],
        y=[f"rank {r}" for r in hm.ranks], colorscale="Viridis", colorbar={"title": "ms"},
        hovertemplate="%{y}, step %{x}: %{z:.3f} ms<extra></extra>"))
    title = "Step time per rank and step" + (f" (mean of {binned} steps per column)" if binned > 1 else "")
    fig.update_layout(title=title, xaxis_title="profiler step", yaxis_title="rank",
                      xaxis={"type": "category"}, yaxis={"type": "category", "autorange": "reversed"})
    return fig


def build_skew_figure(ranks: Ranks) -> go.Figure:
    """Per profiler step, the widest and the median arrival skew of its collectives (µs)."""
    rows = ranks.collectives.by_step
    x = [r.step for r in rows]
    fig = go.Figure([go.Scatter(x=x, y=[r.skew_us_max for r in rows], mode="lines+markers", name="widest skew"),
                     go.Scatter(x=x, y=[r.skew_us_median for r in rows], mode="lines", name="median skew")])
    fig.update_layout(title="Arrival skew of the collectives per step (last rank's arrival - first's)",
                      xaxis_title="profiler step", yaxis_title="arrival skew (µs)")
    return fig


def build_lateness_figure(ranks: Ranks) -> go.Figure:
    """Each rank's median lateness at the collectives (µs after the median rank), stragglers in red."""
    rows = [r for r in ranks.ranks if r.late_us_median is not None]
    late = {s.rank for s in ranks.stragglers}
    fig = go.Figure(go.Bar(x=[f"rank {r.rank}" for r in rows], y=[r.late_us_median for r in rows],
                           marker_color=[SLOWEST_COLOR if r.rank in late else OTHER_COLOR for r in rows],
                           hovertemplate="%{x}: %{y:.1f} µs after the median rank (median)<extra></extra>"))
    th = ranks.thresholds
    if given(th.straggler_limit_us):
        center = th.ranks_late_us_median or 0.0
        fig.add_hline(y=center + th.straggler_limit_us, line_dash="dash", annotation_text="straggler limit")
    fig.update_layout(title="Lateness at the collectives per rank (median)", xaxis_title="rank",
                      yaxis_title="µs after the median rank", xaxis={"type": "category"})
    return fig


def build_rank_steps_figure(ranks: Ranks) -> go.Figure:
    """Median step time per rank (ms), the slowest rank in red."""
    rows = [r for r in ranks.ranks if r.step_ms_median is not None]
    names = [f"rank {r.rank}" for r in rows]
    fig = go.Figure(go.Bar(
        x=names, y=[r.step_ms_median for r in rows],
        marker_color=[SLOWEST_COLOR if r.rank == ranks.slowest_rank else OTHER_COLOR for r in rows],
        customdata=[[_file_name(r), r.steps, r.step_ms_max] for r in rows],
        hovertemplate="%{x} (%{customdata[0]}): median step %{y:.3f} ms over %{customdata[1]} steps, "
                      "slowest %{customdata[2]:.3f} ms<extra></extra>"))
    spread = ranks.spread
    title = "Median step time per rank" + (f" (spread max/min {spread:.2f}x)" if spread else "")
    fig.update_layout(title=title, xaxis_title="rank", yaxis_title="median step time (ms)",
                      xaxis={"type": "category"})
    return fig


def build_ranks_timeline_figure(ranks: Ranks, search: str | None = None) -> go.Figure:
    """All ranks on one timeline (lanes "rank N · …"), aligned as ``ranks.alignment`` says."""
    fig = draw_timeline(ranks.timeline, search=search, title="All ranks")
    fig.update_xaxes(title="time since each rank's first profiler step (ms)")
    fig.update_yaxes(title="rank · thread / stream")
    return fig


def ranks_text(ranks: Ranks) -> list[str]:
    """The lines under the ranks' section: mode, slowest rank, stragglers, late collectives, problems, notes."""
    out = [f"{len(ranks.ranks)} ranks analysed, {ranks.mode}; figures are medians per profiler step"]
    if ranks.slowest_rank is not None:
        out.append(f"slowest rank: {ranks.slowest_rank}"
                   + (f"; step-time spread (max/min) {ranks.spread:.2f}x" if ranks.spread else ""))
    out += [p.message if p.check == "unreadable" else f"not one run? ({p.check}) {p.message}" for p in ranks.problems]
    if not ranks.problems:
        out.append("no sign that these ranks come from different runs")
    limit = ranks.thresholds.straggler_limit_us or 0
    out += [f"straggler: rank {s.rank}, {s.late_us_median:,.0f} µs after the median rank at its collectives "
            f"(median; limit {limit:,.0f} µs)" for s in ranks.stragglers]
    out += [f"late collective {c.key} ({c.name}, step {c.step}): rank {c.rank} {c.late_us:,.0f} µs "
            "after the median rank" for c in ranks.late_collectives[:5]]
    cp = ranks.critical_path
    if cp and cp.available:
        out.append(f"critical path of rank {cp.rank} (step {cp.step}, {cp.chosen_as}): {cp.length_us / 1e3:,.3f} ms")
    out += [f"note: {n}" for n in ranks.notes]
    out.append(f"timeline of ranks {', '.join(map(str, ranks.timeline_ranks))}; alignment: {ranks.alignment}")
    return out


def ranks_sections(ranks: Ranks) -> list[Section]:
    """The report's "Ranks" section: text, the per-rank bar chart and table, the merged timeline."""
    builders = [lambda: build_rank_steps_figure(ranks)]
    if ranks.heatmap.steps:
        builders.append(lambda: build_heatmap_figure(ranks))
    if ranks.collectives.by_step:
        builders += [lambda: build_lateness_figure(ranks), lambda: build_skew_figure(ranks)]
    if ranks.timeline.events:
        builders.append(lambda: build_ranks_timeline_figure(ranks))
    tables = [("per rank", rank_table(ranks)), ("collectives", collectives_table(ranks)),
              ("widest arrival skew", widest_table(ranks)), ("late collectives", late_table(ranks)),
              ("who waits for whom", waits_table(ranks)), ("workers", workers_table(ranks))]
    return [section("Ranks", builders, tables=[(n, t) for n, t in tables if not t.empty], text=ranks_text(ranks))]
