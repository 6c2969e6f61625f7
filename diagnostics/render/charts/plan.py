"""Figures and text for the memory plan: what holds each predicted peak against the device, the batch x
sequence grid coloured by fit, memory over the first configuration's step, the make-it-fit list; the
report's sections and the CLI's fit table."""

from __future__ import annotations

import plotly.graph_objects as go

from diagnostics.analyses.plan.result import PART_KEYS, PlanResult
from diagnostics.render.charts.memory import COLORS as MEMORY_COLORS
from diagnostics.render.sections import Section, notes, section
from diagnostics.render.tables import records_frame
from diagnostics.units import human_bytes

GIB = 2**30
COLORS = {**MEMORY_COLORS, "kv cache": "#00838F", "rounding": "#BDBDBD", "workspaces": "#6D4C41"}
FIT, NO_FIT = "#2E7D32", "#C62828"


def _gib(v) -> float | None:
    return None if v is None else v / GIB


def build_plan_breakdown_figure(result: PlanResult) -> go.Figure:
    """Stacked bars (GiB): what holds each configuration's predicted peak, with the device's budget."""
    rows = result.rows
    labels = [r.label for r in rows]
    fig = go.Figure()
    for cat in PART_KEYS:
        ys = [_gib(r.parts.get(cat, 0)) for r in rows]
        if not any(ys):
            continue
        fig.add_bar(x=labels, y=ys, name=cat, marker_color=COLORS.get(cat, "#9E9E9E"),
                    hovertemplate="%{x}<br>" + cat + ": %{y:.2f} GiB<extra></extra>")
    budget = _gib(result.device.budget_bytes)
    fig.add_hline(y=budget, line_dash="dash", line_color=NO_FIT,
                  annotation_text=f"{result.device.name}: {budget:,.1f} GiB for the step",
                  annotation_position="top left")
    fig.update_layout(title="Predicted peak per configuration, by what holds it", barmode="stack",
                      yaxis_title="memory (GiB)", height=440, margin=dict(t=50, l=10, r=10, b=10),
                      legend=dict(orientation="h", y=-0.25), xaxis=dict(automargin=True))
    return fig


def build_plan_grid_figure(result: PlanResult, index: int = 0) -> go.Figure:
    """Batch x sequence grid of one setting: predicted peak (GiB) in each cell, green where it fits."""
    g = result.grids[index]
    seqs = ["(no sequence)" if s is None else f"seq {s}" for s in g.seqs]
    batches = [f"b{b}" for b in g.batches]
    z = [[1 if ok else 0 for ok in row] for row in g.fits]
    text = [[f"{v / GIB:,.1f}" for v in row] for row in g.peak_bytes]
    fig = go.Figure(go.Heatmap(z=z, x=batches, y=seqs, text=text, texttemplate="%{text}", zmin=0, zmax=1,
                               colorscale=[[0, "#FFCDD2"], [0.5, "#FFCDD2"], [0.5, "#C8E6C9"], [1, "#C8E6C9"]],
                               showscale=False, customdata=[[human_bytes(v) for v in row] for row in g.peak_bytes],
                               hovertemplate="%{x}, %{y}: %{customdata}<extra></extra>"))
    fig.update_layout(title=f"{g.setting}: predicted peak (GiB), green fits {result.device.name}",
                      xaxis_title="batch size", yaxis_title="sequence length", height=140 + 44 * len(seqs),
                      margin=dict(t=50, l=10, r=10, b=40))
    return fig


def build_plan_timeline_figure(result: PlanResult) -> go.Figure:
    """Memory by category over the first configuration's traced step (stacked areas, GiB), phases marked."""
    tl = result.timeline
    x = list(tl.op_index) if tl else []
    fig = go.Figure()
    for cat in PART_KEYS:
        ys = tl.series.get(cat) if tl else None
        if not ys or not any(ys):
            continue
        fig.add_scatter(x=x, y=[_gib(v) for v in ys], name=cat, stackgroup="mem", mode="lines",
                        line=dict(width=0.5, color=COLORS.get(cat, "#9E9E9E"), shape="hv"),
                        hovertemplate=cat + ": %{y:.2f} GiB<extra></extra>")
    phases = list(tl.phase) if tl else []
    start = 0
    shades = {"forward": "#E3F2FD", "backward": "#FCE4EC", "optimizer": "#FFF8E1"}
    for i in range(1, len(phases) + 1):
        if i == len(phases) or phases[i] != phases[start]:
            if phases[start] in shades and x:
                fig.add_vrect(x0=x[start], x1=x[i - 1], fillcolor=shades[phases[start]], opacity=0.5, layer="below",
                              line_width=0, annotation_text=phases[start], annotation_position="top left")
            start = i
    fig.update_layout(title=f"Predicted memory over one step ({tl.configuration if tl else ''})", height=400,
                      xaxis_title="op (in the order the step runs them)", yaxis_title="memory (GiB)",
                      margin=dict(t=50, l=10, r=10, b=10), hovermode="x unified", legend=dict(orientation="h", y=-0.2))
    return fig


def build_plan_suggestions_figure(result: PlanResult) -> go.Figure:
    """The make-it-fit candidates' predicted peaks against the budget."""
    s = result.suggestions
    fig = go.Figure(go.Bar(x=[_gib(x.peak_bytes) for x in s], y=[x.change for x in s], orientation="h",
                           marker_color=[FIT if x.fits else NO_FIT for x in s],
                           customdata=[x.cost for x in s],
                           hovertemplate="%{y}: %{x:.2f} GiB<br>cost: %{customdata}<extra></extra>"))
    fig.add_vline(x=_gib(result.device.budget_bytes), line_dash="dash", line_color="black",
                  annotation_text="budget", annotation_position="top")
    fig.update_layout(title="Make it fit: each change's predicted peak", xaxis_title="predicted peak (GiB)",
                      yaxis=dict(autorange="reversed", automargin=True), height=160 + 36 * len(s),
                      margin=dict(t=50, l=10, r=10, b=40), showlegend=False)
    return fig


def device_line(result: PlanResult) -> str:
    d = result.device
    return (f"{d.name}: {human_bytes(d.capacity_bytes)} ({d.source})"
            + (f"; less {human_bytes(d.context_bytes)} of CUDA context" if d.context_bytes else ""))


# ----------------------------------------------------------------------------- report and CLI text
ROW_COLUMNS = ["setting", "batch", "seq", "peak_bytes", "fits", "headroom_bytes", "phase", "module", "how"]


def plan_sections(result: PlanResult) -> list[Section]:
    sections = [section("Will it fit?", [lambda: build_plan_breakdown_figure(result)],
                        text=[device_line(result), result.method, f"traced on {result.traced_on}"] + notes(result),
                        tables=[("configurations", records_frame(result.rows)[ROW_COLUMNS]),
                                ("what holds each peak (bytes)", records_frame(result.breakdown))])]
    if result.grids:
        sections.append(section("Batch x sequence", [lambda i=i: build_plan_grid_figure(result, i)
                                                     for i in range(len(result.grids))],
                                tables=[("largest batch that fits", records_frame(result.max_batch))]))
    if result.suggestions:
        sections.append(section("Make it fit", [lambda: build_plan_suggestions_figure(result)],
                                tables=[("changes, cheapest first", records_frame(result.suggestions))]))
    if result.fit:
        sections.append(section(f"Fit in {human_bytes(result.fit.budget_bytes)}", [], text=fit_lines(result.fit),
                                tables=[("checkpointing candidates", records_frame(result.fit.candidates))]
                                + ([("what else would be needed", records_frame(result.fit.needed))]
                                   if result.fit.needed else [])))
    if result.timeline is not None:
        sections.append(section("Over the step", [lambda: build_plan_timeline_figure(result)]))
    return sections


def fit_lines(fit) -> list[str]:
    """The budget answer in sentences (the CLI, the report, the page)."""
    where = f"{fit.configuration} · batch {fit.batch}" + (f" · seq {fit.seq}" if fit.seq is not None else "")
    lines = [f"{where}: {human_bytes(fit.unconstrained_peak_bytes)} without checkpointing, budget "
             f"{human_bytes(fit.budget_bytes)}"]
    cost = (f"{fit.recompute_ms:,.1f} ms recomputed per step" if fit.recompute_ms is not None
            else "recompute time not measured")
    if fit.recompute_flops:
        cost += f", {fit.recompute_flops:,} FLOPs"
    if fit.fits and not fit.checkpoint_modules:
        lines.append("fits without checkpointing")
    elif fit.fits:
        lines.append(f"fits: checkpoint {fit.checkpoint_option} -> predicted peak "
                     f"{human_bytes(fit.predicted_peak_bytes)} ({cost})")
        lines.append(f"measure it: --checkpoint-modules {fit.checkpoint_option}")
    else:
        lines.append(f"does not fit: checkpointing every candidate ({fit.checkpoint_option}) reaches "
                     f"{human_bytes(fit.smallest_peak_bytes or fit.predicted_peak_bytes)} at best ({cost})")
        for s in fit.needed:
            lines.append(f"  {'fits' if s.fits else 'no  '} {human_bytes(s.peak_bytes):>11}  {s.change} - {s.cost}")
        if not any(s.fits for s in fit.needed):
            lines.append("  nothing traced fits: a smaller batch or sequence, or more devices")
    lines.append(f"recompute times: {fit.timing}")
    return lines


def plan_text(result: PlanResult) -> str:
    """The CLI's answer: a fit table, the largest batch per sequence length, the make-it-fit list."""
    lines = [f"device: {device_line(result)}", ""]
    head = f"{'configuration':<44} {'peak':>11} {'headroom':>11}  fits  at"
    lines += [head, "-" * len(head)]
    for r in result.rows:
        if r.error:
            lines.append(f"{r.label[:44]:<44} {'-':>11} {'-':>11}  n/a   failed: {r.error[:160]}")
            continue
        room = r.headroom_bytes
        lines.append(f"{r.label[:44]:<44} {human_bytes(r.peak_bytes):>11} "
                     f"{('-' if room < 0 else '') + human_bytes(abs(room)):>11}  {'yes ' if r.fits else 'NO  '}  "
                     f"{r.phase} / {r.module}")
    if result.max_batch:
        lines += ["", "largest batch that fits:"]
        for m in result.max_batch:
            seq = "" if m.seq is None else f" at seq {m.seq}"
            lines.append(f"  {m.setting}{seq}: {m.max_batch}  ({m.checked})")
    if result.fit:
        lines += ["", f"fit in {human_bytes(result.fit.budget_bytes)}:"] + ["  " + x for x in fit_lines(result.fit)]
    if result.suggestions:
        lines += ["", "make it fit (cheapest first):"]
        for s in result.suggestions:
            lines.append(f"  {'fits' if s.fits else 'no  '} {human_bytes(s.peak_bytes):>11}  {s.change} "
                         f"- {s.cost}")
    for n in result.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
