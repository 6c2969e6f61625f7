"""Figures for an attached run: where each step's time goes (every step, the profiled ones marked),
the parts per rank, the GPU's idle time by what the host was doing; the report's sections reuse the
Gradient flow figures and the checklist's "fix this first" table."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.attach.protocol import PHASES
from diagnostics.render.charts.style import empty_figure
from diagnostics.render.sections import Section, figures, notes, section
from diagnostics.render.tables import records_frame

COLORS = {"data_wait": "#F58518", "forward": "#4C78A8", "backward": "#72B7B2", "optimizer": "#54A24B",
          "comm": "#B279A2", "sync": "#E45756", "host": "#BAB0AC", "between steps": "#9D755D"}
LABELS = {"data_wait": "data wait (DataLoader)", "forward": "forward", "backward": "backward",
          "optimizer": "optimizer", "comm": "communication", "sync": "device syncs", "host": "host (Python, the rest)"}


def build_steps_figure(result: dict) -> go.Figure:
    """Stacked bars: each step's parts (ms), warm-up and profiled steps marked in the hover and the axis."""
    rows = [r for r in result.get("step_table") or [] if not r.get("warmup") or r["step"] > 1]
    if not rows:
        return empty_figure("Where each step's time goes", "no step was measured")
    x = [f"{r['step']}{'*' if r.get('profiled') else ''}" for r in rows]
    fig = go.Figure()
    for k in PHASES:
        ys = [r.get(f"{k}_ms") or 0.0 for r in rows]
        if not any(ys):
            continue
        fig.add_bar(x=x, y=ys, name=LABELS[k], marker_color=COLORS[k],
                    hovertemplate="step %{x}<br>" + LABELS[k] + ": %{y:.2f} ms<extra></extra>")
    fig.update_layout(title="Where each step's time goes<br><sup>* = profiled (torch.profiler on); the parts of a "
                            "step sum to its time</sup>", barmode="stack", xaxis_title="step",
                      yaxis_title="time (ms)", height=400, margin=dict(l=10, r=10, t=70, b=40),
                      legend=dict(orientation="h", y=-0.25, x=0), xaxis=dict(type="category"))
    return fig


def build_breakdown_figure(result: dict) -> go.Figure:
    """One horizontal stacked bar per rank (one for a single process): the median step's parts (ms)."""
    ranks = result.get("ranks") or []
    if not ranks:
        return empty_figure("The step's parts", "no step was measured")
    labels = ["this process" if r["rank"] is None else f"rank {r['rank']}" + (" (waited for)" if r.get("waited_for")
                                                                                else "") for r in ranks]
    fig = go.Figure()
    for k in PHASES:
        xs = [(r.get("breakdown_ms") or {}).get(k, 0.0) for r in ranks]
        if not any(xs):
            continue
        fig.add_bar(y=labels, x=xs, orientation="h", name=LABELS[k], marker_color=COLORS[k],
                    hovertemplate="%{y}<br>" + LABELS[k] + ": %{x:.2f} ms<extra></extra>")
    fig.update_layout(title="The step's parts<br><sup>median step outside the profiled window, after warm-up</sup>",
                      barmode="stack", xaxis_title="time per step (ms)", height=120 + 50 * len(ranks),
                      margin=dict(l=10, r=10, t=70, b=40), legend=dict(orientation="h", y=-0.4, x=0),
                      yaxis=dict(autorange="reversed"))
    return fig


def build_gpu_idle_figure(result: dict) -> go.Figure:
    """Per profiled step: GPU busy time and idle time split by what the host's main thread was doing."""
    gpu = result.get("gpu")
    if not gpu or not gpu.get("steps"):
        return empty_figure("GPU idle per step", "no GPU work in the trace")
    rows = gpu["steps"]
    x = [str(r["step"]) for r in rows]
    fig = go.Figure()
    fig.add_bar(x=x, y=[r["gpu_busy_ms"] for r in rows], name="GPU busy", marker_color="#4C78A8",
                hovertemplate="step %{x}<br>GPU busy %{y:.2f} ms<extra></extra>")
    causes = sorted({c for r in rows for c in r["idle_causes_ms"]}, key=lambda c: list(COLORS).index(c)
                    if c in COLORS else 99)
    for c in causes:
        fig.add_bar(x=x, y=[r["idle_causes_ms"].get(c, 0.0) for r in rows], name=f"idle: host in {LABELS.get(c, c)}",
                    marker_color=COLORS.get(c, "#888888"), opacity=0.6,
                    hovertemplate="step %{x}<br>GPU idle while the host was in " + LABELS.get(c, c)
                                  + ": %{y:.2f} ms<extra></extra>")
    fig.update_layout(title="GPU busy and idle per profiled step<br><sup>idle split by what the host's main thread "
                            "was doing meanwhile</sup>", barmode="stack", xaxis_title="step",
                      yaxis_title="time (ms)", height=400, margin=dict(l=10, r=10, t=70, b=40),
                      legend=dict(orientation="h", y=-0.25, x=0), xaxis=dict(type="category"))
    return fig


def summary_lines(result: dict) -> list[str]:
    """The run in a few sentences (the CLI prints them, the report and the page show them)."""
    out = []
    code = result.get("exit_code")
    cmd = " ".join(result.get("command") or [])
    out.append(f"{cmd or 'the script'}: " + ("exit code " + str(code) if code is not None else "did not start")
               + (f" after {result['duration_s']:.1f} s" if result.get("duration_s") is not None else ""))
    if result.get("steps"):
        w = result.get("profiled_steps")
        out.append(f"{result['steps']} steps, ended by {result.get('step_boundary_detail') or result.get('step_boundary')}"
                   + (f"; profiled steps {w[0]}-{w[1]}" if w else "; no step was profiled")
                   + (f" ({result['window']['reason']})" if (result.get("window") or {}).get("reason") else ""))
    if result.get("step_ms") is not None:
        b = result.get("breakdown_ms") or {}
        parts = ", ".join(f"{k} {v:.2f}" for k, v in b.items() if v and v >= 0.005)
        out.append(f"step {result['step_ms']:.2f} ms (median outside the window): {parts} ms")
        bn = result.get("bottleneck")
        if bn:
            out.append(f"bottleneck: {bn['category']} ({100 * bn['share']:.0f}% of the step, {bn['ms']:.2f} ms)")
        if result.get("overhead_pct") is not None:
            out.append(f"profiled steps {result['step_ms_profiled']:.2f} ms: {result['overhead_pct']:+.1f}% against the "
                       "steps outside the window (the profiler's cost)")
    return out


def attach_sections(result: dict) -> list[Section]:
    from diagnostics.render.charts.checklist import fix_first_section
    from diagnostics.render.charts.gradients import gradients_sections

    sections = [section("Run", [lambda: build_breakdown_figure(result), lambda: build_steps_figure(result)],
                        text=summary_lines(result) + notes(result))]
    ranked = result.get("fix_first") or []
    if ranked:
        sections.append(fix_first_section(ranked, "Ranked by the milliseconds per step each part takes (at most "
                                                  "what fixing it saves)."))
    order = ("error", "fail", "warn", "pass", "not_applicable")
    findings = sorted(result.get("findings") or [], key=lambda f: order.index(f.get("status", "not_applicable")))
    if findings:
        df = records_frame(findings)
        sections.append(Section("Findings", tables=[("", df[[c for c in ("status", "title", "id", "evidence",
                                                                          "suggestion") if c in df.columns]])]))
    if result.get("gpu"):
        sections.append(section("GPU", [lambda: build_gpu_idle_figure(result)]))
    if result.get("syncs"):
        sections.append(Section("Device syncs", tables=[("", records_frame(result["syncs"]))]))
    w = result.get("workers") or {}
    if w.get("per_worker"):
        sections.append(Section("DataLoader workers", tables=[("", records_frame(w["per_worker"]))]))
    if len(result.get("ranks") or []) > 1:
        sections.append(Section("Ranks", tables=[("", records_frame([
            {"rank": r["rank"], "pid": r["pid"], "step_ms": r["step_ms"], "busy_ms": r.get("busy_ms"),
             "bottleneck": (r.get("bottleneck") or {}).get("category"), "waited for": r.get("waited_for"),
             "trace": r.get("trace"), **{f"{k}_ms": (r.get("breakdown_ms") or {}).get(k) for k in PHASES}}
            for r in result["ranks"]]))]))
    if result.get("gradients"):
        for s in gradients_sections(result["gradients"]):
            s.title = f"Gradient flow: {s.title}"
            sections.append(s)
    if result.get("step_table"):
        sections.append(Section("Steps", tables=[("", records_frame(result["step_table"]))]))
    return sections
