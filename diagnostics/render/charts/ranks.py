"""Figures and report sections for several ranks' traces (diagnostics.trace.ranks.analyse_ranks' result)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from diagnostics.render.charts.timeline import build_timeline_figure as draw_timeline
from diagnostics.render.sections import Section, section
from diagnostics.render.tables import records_frame

SLOWEST_COLOR, OTHER_COLOR = "#e45756", "#4c78a8"
#: The per-rank table's columns as a user reads them (ms medians per profiler step).
COLUMNS = {"rank": "rank", "file": "file", "steps": "steps", "step_ms_median": "step (ms)",
           "step_ms_max": "slowest step (ms)", "gpu_busy_ms_median": "GPU busy (ms)",
           "gpu_idle_ms_median": "GPU idle (ms)", "gpu_idle_pct": "GPU idle (%)",
           "compute_ms_median": "compute (ms)", "comm_ms_median": "communication (ms)",
           "overlap_ms_median": "overlap (ms)", "exposed_comm_ms_median": "exposed comm (ms)",
           "rank_source": "rank from"}


def rank_table(ranks: dict):
    """The per-rank table as a DataFrame with readable headers (file names only)."""
    df = records_frame([dict(r, file=r.get("name") or Path(str(r["file"])).name) for r in ranks.get("ranks") or []])
    if df.empty:
        return df
    return df[[c for c in COLUMNS if c in df.columns]].rename(columns=COLUMNS)


def build_rank_steps_figure(ranks: dict) -> go.Figure:
    """Median step time per rank (ms), the slowest rank in red."""
    rows = [r for r in ranks.get("ranks") or [] if r.get("step_ms_median") is not None]
    names = [f"rank {r['rank']}" for r in rows]
    fig = go.Figure(go.Bar(
        x=names, y=[r["step_ms_median"] for r in rows],
        marker_color=[SLOWEST_COLOR if r["rank"] == ranks.get("slowest_rank") else OTHER_COLOR for r in rows],
        customdata=[[r.get("name") or Path(str(r["file"])).name, r["steps"], r.get("step_ms_max")] for r in rows],
        hovertemplate="%{x} (%{customdata[0]}): median step %{y:.3f} ms over %{customdata[1]} steps, "
                      "slowest %{customdata[2]:.3f} ms<extra></extra>"))
    spread = ranks.get("spread")
    title = "Median step time per rank" + (f" (spread max/min {spread:.2f}x)" if spread else "")
    fig.update_layout(title=title, xaxis_title="rank", yaxis_title="median step time (ms)",
                      xaxis={"type": "category"})
    return fig


def build_ranks_timeline_figure(ranks: dict, search: str | None = None) -> go.Figure:
    """All ranks on one timeline (lanes "rank N · …"), aligned as ranks["alignment"] says."""
    fig = draw_timeline(ranks["timeline"], search=search, title="All ranks")
    fig.update_xaxes(title="time since each rank's first profiler step (ms)")
    fig.update_yaxes(title="rank · thread / stream")
    return fig


def ranks_text(ranks: dict) -> list[str]:
    """The lines under the ranks' section: mode, slowest rank, problems, notes, alignment."""
    out = [f"{len(ranks.get('ranks') or [])} ranks analysed, {ranks.get('mode')}; figures are medians per profiler step"]
    if ranks.get("slowest_rank") is not None:
        spread = ranks.get("spread")
        out.append(f"slowest rank: {ranks['slowest_rank']}"
                   + (f"; step-time spread (max/min) {spread:.2f}x" if spread else ""))
    problems = ranks.get("problems") or []
    out += [p["message"] if p["check"] == "unreadable" else f"not one run? ({p['check']}) {p['message']}"
            for p in problems]
    if not problems:
        out.append("no sign that these ranks come from different runs")
    out += [f"note: {n}" for n in ranks.get("notes") or []]
    out.append(f"timeline alignment: {ranks.get('alignment')}")
    return out


def ranks_sections(ranks: dict) -> list[Section]:
    """The report's "Ranks" section: text, the per-rank bar chart and table, the merged timeline."""
    builders = [lambda: build_rank_steps_figure(ranks)]
    if (ranks.get("timeline") or {}).get("events"):
        builders.append(lambda: build_ranks_timeline_figure(ranks))
    return [section("Ranks", builders, tables=[("per rank", rank_table(ranks))], text=ranks_text(ranks))]
