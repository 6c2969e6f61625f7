"""Figures for the fix trials: latency with p90 whiskers, speed-up, size on disk and fidelity."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from diagnostics.analyses.optimize.result import OptimizePartial, OptimizeResult, TrialRow
from diagnostics.render.sections import Section, notes, section
from diagnostics.render.tables import records_frame
from diagnostics.results import given
from diagnostics.units import format_value, speedup_text


def _ok_rows(result: OptimizeResult) -> list[TrialRow]:
    return [r for r in result.rows if r.status == "ok"]


def _layout(fig: go.Figure, title: str, xaxis: str, n: int) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis=dict(autorange="reversed"), showlegend=False,
                      height=max(260, 34 * n + 120), margin=dict(l=10, r=10, t=50, b=40))
    return fig


def build_latency_figure(result: OptimizeResult) -> go.Figure:
    """Median latency per call (ms) with a whisker up to the p90; the baseline in grey."""
    rows = _ok_rows(result)
    med = [r.median_ms for r in rows]
    up = [max(0.0, r.p90_ms - r.median_ms) for r in rows]
    colors = ["#9e9e9e" if r.fix in ("baseline", "control") else "#4C78A8" for r in rows]
    fig = go.Figure(go.Bar(
        y=[r.title for r in rows], x=med, orientation="h", marker_color=colors,
        error_x=dict(type="data", symmetric=False, array=up, arrayminus=[0] * len(rows)),
        customdata=[[r.p90_ms] for r in rows],
        hovertemplate="%{y}<br>median %{x:.3f} ms<br>p90 %{customdata[0]:.3f} ms<extra></extra>"))
    if result.mode == "train":
        return _layout(fig, f"Training-step time, batch {result.batch_size} (median, whisker to p90)",
                       "step time (ms)", len(rows))
    return _layout(fig, f"Latency per call, batch {result.batch_size} (median, whisker to p90)",
                   "latency (ms)", len(rows))


VERDICT_COLOR = {"faster": "#2e7d32", "slower": "#c62828", "within noise": "#9e9e9e"}


def build_speedup_figure(result: OptimizeResult) -> go.Figure:
    """Each fix's speed-up over the baseline (the geometric mean of the interleaved rounds' ratios) with its 95%
    interval as an error bar, coloured by verdict; the A/A control's interval is the shaded noise floor."""
    return speedup_bars([r for r in _ok_rows(result) if r.fix != "baseline"])


def speedup_bars(rows) -> go.Figure:
    """The speed-up chart of any timed rows (each with ``fix``, ``title``, ``speedup``, ``speedup_ci`` and
    ``verdict``; the A/A control's row named "control"): Optimize's trials and the fix trials on a script."""
    sp = [r.speedup for r in rows]
    ci = [r.speedup_ci or [s, s] for r, s in zip(rows, sp)]
    colors = ["#5b6375" if r.fix == "control" else VERDICT_COLOR.get(r.verdict, "#9e9e9e") for r in rows]
    fig = go.Figure(go.Bar(
        y=[r.title for r in rows], x=sp, orientation="h", marker_color=colors,
        error_x=dict(type="data", symmetric=False, array=[(c[1] - s) if s is not None else 0 for c, s in zip(ci, sp)],
                     arrayminus=[(s - c[0]) if s is not None else 0 for c, s in zip(ci, sp)], color="#263238"),
        customdata=[[speedup_text(r.speedup, r.speedup_ci, r.verdict)] for r in rows],
        hovertemplate="%{y}<br>%{customdata[0]} vs baseline (95% interval)<extra></extra>"))
    control = next((r for r in rows if r.fix == "control" and r.speedup_ci), None)
    if control:
        lo, hi = control.speedup_ci
        fig.add_vrect(x0=lo, x1=hi, fillcolor="#90a4ae", opacity=0.25, line_width=0,
                      annotation_text="noise floor (A/A)", annotation_position="top left")
    fig.add_vline(x=1.0, line_dash="dash", line_color="#616161")
    return _layout(fig, "Speed-up vs baseline (x, higher is faster; bars: 95% interval)",
                   "speed-up (x baseline)", len(rows))


def build_size_figure(result: OptimizeResult) -> go.Figure:
    """Size of the saved model on disk (MiB)."""
    rows = [r for r in _ok_rows(result) if r.fix != "control"]
    mib = [r.size_bytes / 2**20 for r in rows]
    fig = go.Figure(go.Bar(y=[r.title for r in rows], x=mib, orientation="h",
                           marker_color=["#9e9e9e" if r.fix == "baseline" else "#72B7B2" for r in rows],
                           customdata=[[r.size_kind, r.size_ratio] for r in rows],
                           hovertemplate="%{y}<br>%{x:.3f} MiB (%{customdata[0]})<br>x%{customdata[1]:.2f} of "
                                         "baseline<extra></extra>"))
    return _layout(fig, "Size on disk (MiB)", "size (MiB)", len(rows))


def build_fidelity_figure(result: OptimizeResult) -> go.Figure:
    """How far outputs moved: max abs error (log scale) and cosine similarity / top-1 agreement."""
    rows = [r for r in _ok_rows(result) if r.fix not in ("baseline", "control")]
    names = [r.title for r in rows]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.25,
                        subplot_titles=("Max abs error vs baseline (output units, log)",
                                        "Cosine similarity and top-1 agreement (0-1)"))
    fig.add_bar(y=names, x=[max(r.max_abs_err or 0, 1e-12) for r in rows], orientation="h", name="max abs error",
                marker_color="#F58518", row=1, col=1,
                customdata=[r.max_abs_err for r in rows], hovertemplate="%{y}<br>%{customdata:.3g}<extra></extra>")
    fig.add_bar(y=names, x=[r.cosine for r in rows], orientation="h", name="cosine similarity",
                marker_color="#4C78A8", row=1, col=2, hovertemplate="%{y}<br>cosine %{x:.6f}<extra></extra>")
    if any(r.top1_agreement is not None for r in rows):
        fig.add_bar(y=names, x=[r.top1_agreement for r in rows], orientation="h", name="top-1 agreement",
                    marker_color="#54A24B", row=1, col=2, hovertemplate="%{y}<br>top-1 %{x:.3f}<extra></extra>")
    fig.update_xaxes(type="log", title_text="max |Δ output| (log scale)", row=1, col=1)
    fig.update_xaxes(range=[0, 1.05], title_text="similarity (fraction)", row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title="Fidelity to the baseline outputs", barmode="group", height=max(300, 40 * len(rows) + 140),
                      margin=dict(l=10, r=10, t=80, b=40),
                      legend=dict(orientation="h", y=-0.2, x=1, xanchor="right"))
    return fig


def build_peak_figure(result: OptimizeResult) -> go.Figure:
    """Peak memory of one step per candidate (MiB), the baseline in grey; the ratio on hover."""
    rows = [r for r in _ok_rows(result) if r.fix != "control" and r.peak_bytes is not None]
    base = next((r.peak_bytes for r in rows if r.fix == "baseline"), None)
    fig = go.Figure(go.Bar(y=[r.title for r in rows], x=[r.peak_bytes / 2**20 for r in rows], orientation="h",
                           marker_color=["#9e9e9e" if r.fix == "baseline" else "#B279A2" for r in rows],
                           customdata=[[r.peak_bytes / base if base else None] for r in rows],
                           hovertemplate="%{y}<br>%{x:.2f} MiB<br>x%{customdata[0]:.2f} of the baseline's"
                                         "<extra></extra>"))
    what = "training step" if result.mode == "train" else "call"
    return _layout(fig, f"Peak memory of one {what} (MiB)", "peak memory (MiB)", len(rows))


def build_train_fidelity_figure(result: OptimizeResult) -> go.Figure:
    """Training fidelity: the loss after each step per candidate (lines), and the cosine between each
    fix's gradients after the first step and the baseline's (bars)."""
    rows = [r for r in _ok_rows(result) if r.fix != "control" and r.losses]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.22,
                        subplot_titles=("Loss after each training step", "Gradient cosine vs baseline (first step)"))
    for r in rows:
        fig.add_scatter(x=list(range(1, len(r.losses) + 1)), y=list(r.losses), mode="lines+markers", name=r.title,
                        line=dict(color="#616161", width=3) if r.fix == "baseline" else None, row=1, col=1,
                        hovertemplate=r.title + "<br>step %{x}: loss %{y:.6g}<extra></extra>")
    fixes = [r for r in rows if r.fix != "baseline" and r.grad_cosine is not None]
    fig.add_bar(y=[r.title for r in fixes], x=[r.grad_cosine for r in fixes], orientation="h",
                marker_color="#4C78A8", showlegend=False, row=1, col=2,
                hovertemplate="%{y}<br>cosine %{x:.6f}<extra></extra>")
    low = min([r.grad_cosine for r in fixes] + [0.99])
    fig.update_xaxes(title_text="step", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text=f"loss ({result.loss or 'the model loss'})", row=1, col=1)
    fig.update_xaxes(range=[max(0.0, low - 0.01), 1.0005], title_text="cosine (1 = same direction)", row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_layout(title="Training fidelity to the baseline", height=max(340, 40 * len(rows) + 180),
                      margin=dict(l=10, r=10, t=80, b=40), legend=dict(orientation="h", y=-0.25, x=0))
    return fig


# ----------------------------------------------------------------------------- report sections
def optimize_sections(result: OptimizeResult) -> list[Section]:
    trials = section("Trials", [lambda: build_latency_figure(result), lambda: build_speedup_figure(result)],
                     text=notes(result), tables=[("trials (baseline first)", records_frame(result.rows))])
    if result.mode == "train":
        return [trials, section("Memory and fidelity", [lambda: build_peak_figure(result),
                                                         lambda: build_train_fidelity_figure(result)])]
    return [trials, section("Size and fidelity", [lambda: build_size_figure(result), lambda: build_fidelity_figure(result)])]


# ----------------------------------------------------------------------------- lines as they come
def trial_lines(result: OptimizePartial | OptimizeResult) -> list[tuple[tuple, str]]:
    """One line per trial as soon as it is known, for the CLI (a job's partial result, then the final one):
    (key, text) pairs, each key printed once. A fix's "built" line once it is built and checked (fidelity,
    first call, size; or why it did not run), its "timed" line once its verdict is final (decided at an
    interim look, or at the end); rows still being measured have none yet."""
    train = result.mode == "train"
    out = []
    for r in result.rows:
        fix, title = r.fix, r.title
        if fix != "control":
            if r.status != "ok":
                out.append((("built", fix), f"  {title}: {r.status.replace('_', ' ')}: {r.why or ''}"))
            else:
                parts = ([f"loss diff {_num(r.loss_rel_diff, '.3g')}", f"gradient cosine {_num(r.grad_cosine)}"]
                         if train else [f"cosine {_num(r.cosine)}"]
                         + ([f"top-1 {format_value(r.top1_agreement, 'fraction')}"]
                            if r.top1_agreement is not None else []))
                parts += [f"first call {format_value(r.first_call_ms, 'ms')}"]
                if r.size_ratio is not None and fix != "baseline":
                    parts.append(f"size {format_value(r.size_ratio, 'ratio')}")
                out.append((("built", fix), f"  {title}: built · " + " · ".join(parts)))
        if fix != "baseline" and r.status == "ok" and r.verdict and not given(r.measuring):
            when = f" (decided at round {r.decided_at})" if given(r.decided_at) else ""
            out.append((("timed", fix), f"  {title}: {format_value(r.time_ms, 'ms')}, "
                                        f"{speedup_text(r.speedup, r.speedup_ci, r.verdict)}{when}"))
    return out


def _num(v, fmt: str = ".4f") -> str:
    return "n/a" if v is None else format(v, fmt)

