"""Show fix trials: the measured table, latency / speed-up / size / fidelity charts, downloads; and,
while the job runs, the rows measured so far (``show_partial``)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pandas as pd
import streamlit as st

from diagnostics.analyses.optimize.assess import ranked, reassessed
from diagnostics.analyses.optimize.catalog import get_fix
from diagnostics.analyses.optimize.result import OptimizePartial, OptimizeResult, TrialRow
from diagnostics.render.charts.optimize import (build_fidelity_figure, build_latency_figure, build_peak_figure,
                                                build_size_figure, build_speedup_figure,
                                                build_train_fidelity_figure)
from diagnostics.results import given
from diagnostics.units import compact, human_bytes
from ui.widgets import Tile, artifact_bytes, artifact_size, comparison_detail, metric_row, unit_columns


def trials_table(rows: tuple[TrialRow, ...] | list[TrialRow], train: bool) -> pd.DataFrame:
    out = []
    for r in rows:
        row = {  # what decides first (what it buys and costs, speed-up, fidelity), then the raw measurements
            "fix": r.title, "status": r.status, "assessment": _assessment(r), "speed-up (x)": r.speedup,
            "time": r.time_ms, "95% interval": _interval(r.speedup_ci), "verdict": _verdict(r)}
        if train:
            row.update({"peak memory": r.peak_bytes, "loss diff (rel, max)": r.loss_rel_diff,
                        "gradient cosine": r.grad_cosine})
        row.update({
            "median": r.median_ms, "p90": r.p90_ms, "peak memory": r.peak_bytes,
            "size ratio": r.size_ratio, "max abs err": r.max_abs_err, "cosine": r.cosine,
            "top-1 agreement": r.top1_agreement, "throughput (samples/s)": r.throughput_per_s,
            "first call": r.first_call_ms, "size": r.size_bytes,
            "why / notes": r.why or "; ".join(r.notes),
        })
        out.append(row)
    return pd.DataFrame(out)


FLAG_TEXT = {"gain": "✅ gain", "trade_off": "⚖️ trade-off", "regression": "🔻 regression",
             "fidelity_loss": "⚠️ fidelity loss", "neutral": "➖ no change"}
FLAG_COLOR = {"gain": "#e8f5e9", "trade_off": "#fff8e1", "regression": "#ffebee", "fidelity_loss": "#fff3e0"}


def _assessment(r: TrialRow) -> str:
    if r.status != "ok":  # failed / not applicable: why, in the column read first
        return f"{r.status.replace('_', ' ')}: {r.why or '; '.join(r.notes)}"
    if not r.flag:
        return ""
    return f"{FLAG_TEXT[r.flag]}: {'; '.join(r.assessment)}"


def _highlight(df: pd.DataFrame, flags: list) -> pd.DataFrame:
    """Background of the assessment cell by flag: regressions and fidelity losses stand out."""
    out = pd.DataFrame("", index=df.index, columns=df.columns)
    for i, flag in zip(df.index, flags):
        if flag in FLAG_COLOR:
            out.loc[i, "assessment"] = f"background-color: {FLAG_COLOR[flag]}"
    return out


def _interval(ci) -> str:
    return "" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _verdict(r: TrialRow) -> str:
    if given(r.measuring):
        return f"measuring… ({r.measuring})"
    if r.fix == "baseline" or r.verdict is None:
        return ""
    return (r.verdict + (" (low confidence)" if r.confidence == "low" else "")
            + (f" · decided at round {r.decided_at}" if given(r.decided_at) else ""))


def with_thresholds(result: OptimizeResult, min_cosine: float, min_top1: float) -> OptimizeResult:
    """The result with its rows re-assessed at the user's fidelity thresholds (no re-run)."""
    return msgspec.structs.replace(result, rows=reassessed(result.rows, result.mode, min_cosine, min_top1))


def _best_interval(result: OptimizeResult) -> list | None:
    """The best fix's interval: from the metrics, or (a run stored before they held it) from its row."""
    m = result.metrics
    if given(m.best_speedup_ci_low):
        return [m.best_speedup_ci_low, m.best_speedup_ci_high]
    return next((r.speedup_ci for r in result.rows if r.fix == m.best_fix), None)


def tiles(result: OptimizeResult) -> list[Tile]:
    m = result.metrics
    train = result.mode == "train"
    best = m.best_fix
    base = next((r for r in result.rows if r.fix == "baseline"), None)
    time_ms = base.time_ms if base is not None and base.time_ms is not None else None
    what = f"training step, {result.optimizer}" if train else "eval mode, torch.no_grad()"
    return [  # the baseline's time as the table shows it and the speed-ups divide it (one figure on the page)
        Tile("Baseline step" if train else "Baseline time", m.baseline_median_ms if time_ms is None else time_ms, "ms",
             f"{what}: median of its calls" if time_ms is None else
             f"{what}: the geometric mean of the interleaved rounds' times, the figure every speed-up divides "
             f"(the table's time); the median of its calls was {compact(m.baseline_median_ms, 'ms')}"),
        Tile("Best speed-up", None if best is None else m.best_speedup, "ratio",
             "no fix was faster beyond the noise (the A/A control's interval)" if best is None else
             f"fix: {best}; its 95% interval is above 1 and above the A/A control's", missing="none",
             detail=None if best is None else comparison_detail(_best_interval(result), "faster")),
        Tile("Noise floor (A/A)", m.control_speedup, "ratio",
             "the baseline timed against itself: its interval is this run's noise floor; anything but 'within "
             "noise' means the measurement, not the model, moved",
             detail=comparison_detail([m.control_ci_low, m.control_ci_high], m.control_verdict,
                                      why=f"no interval: {result.iters} rounds")),
        Tile("Faster / slower", f"{m.fixes_faster} / {m.fixes_slower}", "text",
             f"fixes faster / slower than the baseline, of {m.trials_ok} run; {m.trials_failed} failed, "
             f"{m.trials_not_applicable} n/a; "
             f"{sum(r.flag == 'fidelity_loss' for r in result.rows)} below the fidelity thresholds"),
    ]


def _columns(rows: tuple[TrialRow, ...] | list[TrialRow], train: bool) -> tuple[pd.DataFrame, dict]:
    """The trials table with its units scaled and its column config (the result's, or a partial one's)."""
    table, config = unit_columns(trials_table(rows, train), {
        "time": ("Time", "ms"), "median": ("Median", "ms"), "p90": ("p90", "ms"), "first call": ("First call", "ms"),
        "peak memory": ("Peak memory", "bytes"), "size": ("Size", "bytes")},
        {c: st.column_config.NumberColumn(c, format="%.4g", width={"cosine": 65, "top-1 agreement": 90}.get(c))
         for c in
         ("throughput (samples/s)", "size ratio", "max abs err", "cosine", "top-1 agreement",
          "loss diff (rel, max)", "gradient cosine")})
    config.update({"speed-up (x)": st.column_config.NumberColumn("speed-up", format="x%.2f", width=70,
                                                                 help="the baseline's time / this fix's time: the "
                                                                      "geometric mean of the rounds' ratios"),
                   "verdict": st.column_config.TextColumn("verdict", width=160),
                   "top-1 agreement": st.column_config.NumberColumn("top-1", format="%.4g", width=70,
                                                                    help="top-1 agreement with the baseline: the "
                                                                         "share of samples whose top class agrees"),
                   "median": {**config["median"], "width": 85},
                   "time": {**config["time"], "width": 85,
                            "help": "geometric mean of the interleaved rounds' times: the speed-up is the "
                                    "baseline's time over this one"},
                   "fix": st.column_config.TextColumn("fix", width=160),  # the first table fits 1400 px: widths in px
                   "assessment": st.column_config.TextColumn("assessment", width=180),
                   "status": st.column_config.TextColumn("status", width="small"),
                   "95% interval": st.column_config.TextColumn("95% CI", width=95,
                                                               help="95% interval of the speed-up (exact, "
                                                                    "from the rounds; none below 6 rounds)"),
                   "why / notes": st.column_config.TextColumn("why / notes", width="medium")})
    return table, config


def _first_columns(train: bool) -> list[str]:
    fidelity = ["loss diff (rel, max)", "gradient cosine"] if train else ["cosine", "top-1 agreement"]
    return ["fix", "assessment", "speed-up (x)", "95% interval", "verdict", "time"] \
        + (["peak memory"] if train else []) + fidelity


def show(result: OptimizeResult) -> None:
    result = msgspec.structs.replace(result, rows=tuple(ranked(result.rows)))  # what each buys first
    rows = result.rows
    train = result.mode == "train"
    st.caption(f"{result.model} · device {result.device} · batch {result.batch_size} · "
               + (f"training step: {result.optimizer}, loss {result.loss}, {result.train_steps} "
                  "fidelity steps · " if train else "")
               + f"{_rounds_text(result)} · {result.metrics.threads} torch threads")
    metric_row(tiles(result))
    for note in result.notes:
        st.caption(note)
    table, config = _columns(rows, train)
    # what decides first, in one table that fits the page; the raw measurements in a second one
    first = _first_columns(train)
    flags = [r.flag for r in rows]
    st.dataframe(table[first].style.apply(lambda df: _highlight(df, flags), axis=None), hide_index=True,
                 width="stretch", column_config={c: v for c, v in config.items() if c in first})
    rest = ["fix", "status"] + [c for c in table.columns if c not in first and c != "status"]
    with st.expander("Every trial's status, notes and measurements (p90, throughput, first call, memory, "
                     "size, errors)"):
        st.dataframe(table[rest], hide_index=True, width="stretch",
                     column_config={c: v for c, v in config.items() if c in rest})
    if any(r.status == "ok" for r in rows if r.fix not in ("baseline", "control")):
        if train:
            t1, t2, t3, t4 = st.tabs(["Step time", "Speed-up", "Peak memory", "Loss and gradients"])
            t3.plotly_chart(build_peak_figure(result), width="stretch")
            t4.plotly_chart(build_train_fidelity_figure(result), width="stretch")
        else:
            t1, t2, t3, t4 = st.tabs(["Latency", "Speed-up", "Size", "Fidelity"])
            t3.plotly_chart(build_size_figure(result), width="stretch")
            t4.plotly_chart(build_fidelity_figure(result), width="stretch")
        t1.plotly_chart(build_latency_figure(result), width="stretch")
        t2.plotly_chart(build_speedup_figure(result), width="stretch")
    arts = [r for r in rows if r.artifact is not None]
    if arts:
        st.markdown("**Optimized models** (the fixed copy, and the recipe that reproduces it)")
        for r in arts:
            _artifact_row(r)


def _rounds_text(result: OptimizeResult) -> str:
    stop = result.timing_stop
    if given(stop) and stop.run < stop.planned:
        why = "every verdict decided" if stop.reason == "decided" else "time budget spent"
        return f"{stop.run} of {stop.planned} interleaved rounds ({why})"
    return f"{result.iters} interleaved rounds"


def show_partial(partial: OptimizePartial) -> None:
    """While the trials run: every chosen fix's row as soon as it is built and checked (fidelity, size,
    first call), then its speed-up while the interleaved rounds run; a fix decided at an interim look
    shows its final verdict, the others read "measuring" until the rounds end."""
    rows = []
    for r in partial.rows:
        if r.flag == "neutral" and (given(r.measuring) or r.verdict is None):
            r = msgspec.structs.replace(r, flag=None, assessment=())  # not "no change": its time is not known yet
        rows.append(r)
    done = {r.fix for r in rows}
    for fix_id in partial.fixes:
        if fix_id not in done:  # chosen, not built yet: its row is there from the start
            rows.append(_waiting_row(fix_id, partial.mode))
    train = partial.mode == "train"
    table, config = _columns(rows, train)
    first = _first_columns(train)
    st.caption(f"Measured so far ({partial.stage}): each row appears once its fix is built and checked; "
               "speed-ups once the interleaved rounds run.")
    st.dataframe(table[first], hide_index=True, width="stretch",
                 column_config={c: v for c, v in config.items() if c in first})


def _waiting_row(fix_id: str, mode: str) -> TrialRow:
    """A chosen fix not built yet, as a row with nothing measured."""
    unknown = dict.fromkeys(("median_ms", "p90_ms", "throughput_per_s", "first_call_ms", "peak_bytes", "size_bytes",
                             "size_kind", "speedup", "size_ratio", "max_abs_err", "rel_err", "cosine",
                             "top1_agreement", "artifact", "speedup_ci", "verdict", "confidence", "time_ms", "rounds",
                             "losses", "loss_rel_diff", "grad_cosine", "flag"))
    return TrialRow(fix=fix_id, title=get_fix(fix_id, mode).title, status="waiting", why="not built yet", notes=(),
                    params={}, assessment=(), **unknown)


def _artifact_row(r: TrialRow) -> None:
    a = r.artifact
    model_path, recipe_path = Path(a.path), Path(a.recipe)
    c1, c2, c3 = st.columns([2, 2, 1.4], vertical_alignment="center")
    c1.markdown(r.title)
    size = artifact_size(model_path)
    if size is not None:
        kind = {"torchscript": "TorchScript", "onnx": "ONNX", "state_dict": "state_dict"}.get(
            a.kind, "torch.export (.pt2)" if model_path.suffix == ".pt2" else a.kind)
        c2.download_button(f"{kind} · {human_bytes(size)}", lambda: artifact_bytes(model_path),
                           file_name=model_path.name, key=f"opt_dl_{r.fix}", icon=":material/download:",
                           on_click="ignore", width="stretch")
    if artifact_size(recipe_path) is not None:
        c3.download_button("recipe (JSON)", lambda: artifact_bytes(recipe_path), file_name=recipe_path.name,
                           key=f"opt_recipe_{r.fix}", mime="application/json", on_click="ignore",
                           width="stretch")
