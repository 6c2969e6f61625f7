"""Figures for an attached run: where each step's time goes (every step, the profiled ones marked),
the parts per rank, the GPU's idle time by what the host was doing; the report's sections reuse the
Gradient flow figures and the checklist's "fix this first" table."""

from __future__ import annotations

import os

import plotly.graph_objects as go

from diagnostics.analyses.attach.protocol import PHASES
from diagnostics.analyses.attach.result import AttachResult, gradient_flow
from diagnostics.findings import by_attention
from diagnostics.render.charts.style import empty_figure
from diagnostics.render.sections import Section, notes, section
from diagnostics.render.tables import records_frame

COLORS = {"data_wait": "#F58518", "forward": "#4C78A8", "backward": "#72B7B2", "optimizer": "#54A24B",
          "comm": "#B279A2", "sync": "#E45756", "host": "#BAB0AC", "between steps": "#9D755D"}
LABELS = {"data_wait": "data wait (DataLoader)", "forward": "forward", "backward": "backward",
          "optimizer": "optimizer", "comm": "communication", "sync": "device syncs", "host": "host (Python, the rest)"}


def build_steps_figure(result: AttachResult) -> go.Figure:
    """Stacked bars: each step's parts (ms), warm-up and profiled steps marked in the hover and the axis."""
    rows = [r for r in result.step_table if not r.warmup or r.step > 1]
    if not rows:
        return empty_figure("Where each step's time goes", "no step was measured")
    x = [f"{r.step}{'*' if r.profiled else ''}" for r in rows]
    fig = go.Figure()
    for k in PHASES:
        ys = [r.part_ms(k) or 0.0 for r in rows]
        if not any(ys):
            continue
        fig.add_bar(x=x, y=ys, name=LABELS[k], marker_color=COLORS[k],
                    hovertemplate="step %{x}<br>" + LABELS[k] + ": %{y:.2f} ms<extra></extra>")
    fig.update_layout(title="Where each step's time goes<br><sup>* = profiled (torch.profiler on); the parts of a "
                            "step sum to its time</sup>", barmode="stack", xaxis_title="step",
                      yaxis_title="time (ms)", height=400, margin=dict(l=10, r=10, t=70, b=40),
                      legend=dict(orientation="h", y=-0.25, x=0), xaxis=dict(type="category"))
    return fig


def build_breakdown_figure(result: AttachResult) -> go.Figure:
    """One horizontal stacked bar per rank (one for a single process): the median step's parts (ms)."""
    ranks = result.ranks
    if not ranks:
        return empty_figure("The step's parts", "no step was measured")
    labels = [r.label for r in ranks]
    fig = go.Figure()
    for k in PHASES:
        xs = [r.breakdown_ms.get(k, 0.0) for r in ranks]
        if not any(xs):
            continue
        fig.add_bar(y=labels, x=xs, orientation="h", name=LABELS[k], marker_color=COLORS[k],
                    hovertemplate="%{y}<br>" + LABELS[k] + ": %{x:.2f} ms<extra></extra>")
    fig.update_layout(title="The step's parts<br><sup>median step outside the profiled window, after warm-up</sup>",
                      barmode="stack", xaxis_title="time per step (ms)", height=170 + 50 * len(ranks),
                      # the legend at the figure's foot, below the axis title (paper coordinates put it on the
                      # title when one bar leaves the plot 60 px high)
                      margin=dict(l=10, r=10, t=70, b=90),
                      legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.02, x=0),
                      yaxis=dict(autorange="reversed"))
    return fig


def build_gpu_idle_figure(result: AttachResult) -> go.Figure:
    """Per profiled step: GPU busy time and idle time split by what the host's main thread was doing."""
    if result.gpu is None or not result.gpu.steps:
        return empty_figure("GPU idle per step", "no GPU work in the trace")
    rows = result.gpu.steps
    x = [str(r.step) for r in rows]
    fig = go.Figure()
    fig.add_bar(x=x, y=[r.gpu_busy_ms for r in rows], name="GPU busy", marker_color="#4C78A8",
                hovertemplate="step %{x}<br>GPU busy %{y:.2f} ms<extra></extra>")
    causes = sorted({c for r in rows for c in r.idle_causes_ms}, key=lambda c: list(COLORS).index(c)
                    if c in COLORS else 99)
    for c in causes:
        fig.add_bar(x=x, y=[r.idle_causes_ms.get(c, 0.0) for r in rows], name=f"idle: host in {LABELS.get(c, c)}",
                    marker_color=COLORS.get(c, "#888888"), opacity=0.6,
                    hovertemplate="step %{x}<br>GPU idle while the host was in " + LABELS.get(c, c)
                                  + ": %{y:.2f} ms<extra></extra>")
    fig.update_layout(title="GPU busy and idle per profiled step<br><sup>idle split by what the host's main thread "
                            "was doing meanwhile</sup>", barmode="stack", xaxis_title="step",
                      yaxis_title="time (ms)", height=400, margin=dict(l=10, r=10, t=70, b=40),
                      legend=dict(orientation="h", y=-0.25, x=0), xaxis=dict(type="category"))
    return fig


def trace_paths(result: AttachResult) -> list[str]:
    """The run's trace files, absolute: one, one per rank, or none (the script ended before the profiled
    window). A run stored when the result held file names has them joined to its run folder."""
    t = result.trace
    names = [] if not t else [t] if isinstance(t, str) else list(t)
    return [n if os.path.isabs(n) or not result.run_dir else os.path.join(result.run_dir, n) for n in names]


def trace_names(result: AttachResult) -> list[str]:
    """The trace files' names in the run folder (the Trace explorer opens ``<run id>/<name>``)."""
    return [os.path.basename(p) for p in trace_paths(result)]


def _profiled_part(result: AttachResult) -> str:
    """Which steps the profiler recorded whole: the window's range, or as many of it as ended before the script."""
    w, win = result.profiled_steps, result.window
    if not w:
        return "; no step was profiled"
    if win.requested_steps is None:  # stored before the window counted its steps: its range as planned
        return f"; profiled steps {w[0]}-{w[1]}"
    n = win.steps_profiled
    if n == 0:
        return f"; no whole step was profiled (the window began at step {w[0]})"
    if n < w[1] - w[0] + 1:
        return f"; profiled steps {w[0]}-{w[0] + n - 1} ({n} of the window's {w[1] - w[0] + 1})"
    return f"; profiled steps {w[0]}-{w[1]}"


def summary_lines(result: AttachResult) -> list[str]:
    """The run in a few sentences (the CLI prints them, the report and the page show them)."""
    out = []
    code = result.exit_code
    cmd = " ".join(result.command)
    out.append(f"{cmd or 'the script'}: " + ("exit code " + str(code) if code is not None else "did not start")
               + (f" after {result.duration_s:.1f} s" if result.duration_s is not None else ""))
    if result.steps:
        out.append(f"{result.steps} steps, ended by {result.step_boundary_detail or result.step_boundary}"
                   + _profiled_part(result)
                   + (f" ({result.window.reason})" if result.window.reason else ""))
    if result.step_ms is not None:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in result.breakdown_ms.items() if v and v >= 0.005)
        out.append(f"step {result.step_ms:.2f} ms (median outside the window): {parts} ms")
        bn = result.bottleneck
        if bn:
            out.append(f"bottleneck: {bn.category} ({100 * bn.share:.0f}% of the step, {bn.ms:.2f} ms)")
        if result.overhead_pct is not None:
            o = result.overhead
            spread = (f" (the steps' own spread: {o.noise_pct[0]:+.1f}% to {o.noise_pct[1]:+.1f}%)"
                      if o.noise_pct else "")
            if o.verdict == "within noise" or result.overhead_pct <= 0:
                out.append(f"profiled steps {result.step_ms_profiled:.2f} ms: {result.overhead_pct:+.1f}% against "
                           f"the steps outside the window, within noise{spread}: no cost of the profiler seen")
            else:
                out.append(f"profiled steps {result.step_ms_profiled:.2f} ms: {result.overhead_pct:+.1f}% against "
                           f"the steps outside the window (the profiler's cost){spread}")
            if o.tool_in_profiled_steps_ms:
                out.append(f"our own work inside each profiled step (gradient statistics): "
                           f"{o.tool_in_profiled_steps_ms:.2f} ms, kept out of its step time")
    if result.plan:  # None (not asked for) or unset (stored before run --plan)
        out.extend(plan_lines(result.plan))
    if result.memory.oom is not None:
        out.extend(oom_lines(result.memory.oom))
    return out


#: The held categories in the order they are said (the rest last).
HELD_ORDER = ("parameters", "buffers", "gradients", "optimizer_state", "activations and temporaries")


def oom_lines(oom) -> list[str]:
    """The out-of-memory error in a short block: where it happened and what it asked for, what held memory by
    category and by module, and what the planner says would fit (or why it says nothing). A run stored before
    the report (a CUDA snapshot's record only) gets its one line."""
    from diagnostics.results import UNSET
    from diagnostics.units import human_bytes

    def got(v):
        return None if v is UNSET else v

    phase = got(oom.phase)
    if phase is None:
        return [f"Out of memory at step {oom.step}: {oom.why}"
                + (f"; snapshot {oom.snapshot}" if oom.snapshot else "")]
    where = phase + (f", inside {oom.inside}" if got(oom.inside) else "") + (f", in {oom.module}" if got(oom.module)
                                                                             else "")
    size = got(oom.requested_bytes)
    asked = (f"{'' if got(oom.requested_exact) else 'about '}{human_bytes(size)} requested" if size is not None
             else "the size requested is not in the error's message")
    out = [f"Out of memory at step {oom.step} ({where}): {asked} ({'CUDA' if oom.kind == 'cuda' else 'CPU'} "
           f"allocator){'; snapshot ' + oom.snapshot if oom.snapshot else ''}"]
    held = got(oom.held_bytes) or {}
    if held:
        parts = ", ".join(f"{k.replace('_', ' ')} {human_bytes(held[k])}" for k in HELD_ORDER if held.get(k) is not None)
        total = got(oom.total_bytes)
        out.append(f"held: {parts}" + (f" of {human_bytes(total)} ({oom.total_how})" if total else ""))
    for m in got(oom.by_module) or ():
        parts = ", ".join(f"{k.replace('_', ' ')} {human_bytes(getattr(m, k))}"
                          for k in ("parameters", "buffers", "gradients", "optimizer_state") if getattr(m, k))
        total = m.parameters + m.buffers + m.gradients + m.optimizer_state
        out.append(f"held by {m.module}: {human_bytes(total)} ({parts})")
    if got(oom.held_error):
        out.append(f"held: not counted: {oom.held_error}")
    fit = got(oom.plan)
    if fit is None:
        if got(oom.plan_error):
            out.append(f"planner: no answer: {oom.plan_error}")
        return out
    budget = f"{human_bytes(fit.budget_bytes)} ({fit.budget_source})"
    step = f"the step ({fit.configuration}, batch {fit.batch})"
    if fit.fits and not fit.checkpoint_modules:
        line = (f"planner: {step} fits in {budget} without checkpointing: predicted peak "
                f"{human_bytes(fit.predicted_peak_bytes)}")
        if size is not None and size > fit.budget_bytes - (fit.predicted_peak_bytes or 0):
            line += (f"; the failing allocation ({human_bytes(size)}) is not one of the planned step's own (a tensor of "
                     "the script's own, or inputs larger than the planned batch)")
        out.append(line)
    elif fit.fits:
        out.append(f"planner: checkpoint {', '.join(fit.checkpoint_modules)} (--checkpoint-modules "
                   f"{','.join(fit.checkpoint_modules)}) to fit {step} in {budget}: predicted peak "
                   f"{human_bytes(fit.predicted_peak_bytes)} (without checkpointing "
                   f"{human_bytes(fit.unconstrained_peak_bytes)})")
    else:
        needed = "; ".join(f"{n.get('change')} (peak {human_bytes(n.get('peak_bytes'))})" for n in fit.needed[:4])
        out.append(f"planner: {step} does not fit in {budget} even with every candidate checkpointed: the smallest "
                   f"peak reachable is {human_bytes(fit.smallest_peak_bytes)} (without checkpointing "
                   f"{human_bytes(fit.unconstrained_peak_bytes)})"
                   + (f"; also needed, any of: {needed}" if needed else "; nothing else the planner tries fits"))
    return out


def plan_lines(plan) -> list[str]:
    """``run --plan`` in sentences: the as-run row beside the measured peak, then each other row."""
    from diagnostics.units import human_bytes

    if plan.error:
        return [f"memory plan: not made: {plan.error}"]
    out = []
    for r in plan.rows:
        what = (f"batch {r.batch} ({r.scale}{' per rank' if r.shard else ''}), {r.dtype}, {plan.optimizer}"
                + (f", seq {r.seq} ({'; '.join(r.inputs)})" if r.seq else "")
                + (f", {r.shard} x{r.ranks} ranks" if r.shard else ""))
        if r.error:
            out.append(f"memory plan, {what}: not planned: {r.error}")
            continue
        line = (f"memory plan, {what}: {human_bytes(r.peak_bytes)} predicted (peak in {r.phase or '?'}), "
                + ("fits" if r.fits else "does not fit") + f" {plan.device}")
        if r.as_run and plan.measured_peak_bytes:
            line += (f"; this run measured {human_bytes(plan.measured_peak_bytes)} "
                     f"({plan.gap_pct:+.1f}% predicted against measured)")
        out.append(line)
    return out


def attach_sections(result: AttachResult) -> list[Section]:
    from diagnostics.registry import get_analysis
    from diagnostics.render.charts.checklist import findings_frame, fix_first_section
    from diagnostics.render.charts.gradients import gradients_sections
    from diagnostics.results import decode

    sections = [section("Run", [lambda: build_breakdown_figure(result), lambda: build_steps_figure(result)],
                        text=summary_lines(result) + notes(result))]
    if result.fix_first:
        sections.append(fix_first_section(result.fix_first, "Ranked by the milliseconds per step each part takes "
                                                            "(at most what fixing it saves)."))
    if result.findings:
        sections.append(Section("Findings", tables=[("", findings_frame(
            by_attention(result.findings), ["status", "title", "id", "evidence", "suggestion"]))]))
    if result.gpu is not None:
        sections.append(section("GPU", [lambda: build_gpu_idle_figure(result)]))
    if result.syncs:
        sections.append(Section("Device syncs", tables=[("", records_frame(result.syncs))]))
    if result.workers.per_worker:
        sections.append(Section("DataLoader workers", tables=[("", records_frame(result.workers.per_worker))]))
    if len(result.ranks) > 1:
        sections.append(Section("Ranks", tables=[("", records_frame([
            {"rank": r.rank, "pid": r.pid, "step_ms": r.step_ms, "busy_ms": r.busy_ms,
             "bottleneck": r.bottleneck.category if r.bottleneck else None, "waited for": r.waited_for,
             "trace": r.trace, **{f"{k}_ms": r.breakdown_ms.get(k) for k in PHASES}}
            for r in result.ranks]))]))
    flow = gradient_flow(result)
    if flow is not None:  # the Gradient flow analysis' own report sections, on its own result type
        for s in gradients_sections(decode(get_analysis("gradients"), flow)):
            s.title = f"Gradient flow: {s.title}"
            sections.append(s)
    if result.plan and result.plan.rows:
        p = result.plan
        sections.append(Section("Memory plan", text=[
            f"planned in the script's process at its first optimizer step's end, on fake copies of its model "
            f"({', '.join(p.inputs)}) and {p.optimizer}, for {p.device}"] + ([p.measured_how] if p.measured_how else []),
            tables=[("", records_frame([{"batch": r.batch, "scale": r.scale, "dtype": r.dtype, "as run": r.as_run,
                                         "peak_bytes": r.peak_bytes, "phase": r.phase, "module": r.module,
                                         "fits": r.fits, **{f"{k}_bytes": v for k, v in r.parts.items()},
                                         "error": r.error} for r in p.rows]))]))
    if result.step_table:
        sections.append(Section("Steps", tables=[("", records_frame(result.step_table))]))
    return sections
