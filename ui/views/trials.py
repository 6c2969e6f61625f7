"""Show fix trials on a script: headline tiles (the best fix, the A/A control), the speed-up chart with
intervals (Optimize's), the table of rows (verdict, speed-up, step, peak memory, loss difference, why not)
and the changes to make in the script."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.analyses.trials.result import FixTrial, TrialsResult
from diagnostics.significance import MIN_ROUNDS  # torch-free: the server never imports torch
from diagnostics.render.charts.trials import build_trials_speedup_figure, timed_rows
from ui.widgets import Tile, comparison_detail, metric_row, unit_columns


def _rounds_short(result: TrialsResult) -> int | None:
    """The rounds measured when too few for an interval (trials stopped early), else None."""
    timed = [r for r in result.trials[1:] if r.speedup is not None]   # the baseline is the reference
    if not timed or any(r.speedup_ci for r in timed):
        return None
    done = min(r.rounds for r in timed)
    return done if done < MIN_ROUNDS else None


def tiles(result: TrialsResult) -> list[Tile]:
    m = result.metrics
    best_ci = (m.best_ci_low, m.best_ci_high) if m.best_ci_low is not None else None
    control_ci = (m.control_ci_low, m.control_ci_high) if m.control_ci_low is not None else None
    short = _rounds_short(result)
    # stopped before an interval could be drawn: nothing is decided, rather than "none" faster
    rounds = f"{short} of the {MIN_ROUNDS} rounds an interval needs" if short is not None else None
    return [Tile("Baseline step", m.baseline_step_ms, "ms", "the script as it is: mean timed step, geometric mean "
                                                            "of its runs"),
            Tile("Best speed-up", m.best_speedup, "ratio", "the fastest fix faster beyond the noise, over the "
                                                           "baseline",
                 missing="none" if short is None else "not decided",
                 detail=f"{m.best_fix} {comparison_detail(best_ci, None)}" if m.best_speedup else rounds),
            Tile("Fixes faster", m.fixes_faster, "count", f"{m.fixes_slower} slower, {m.fixes_not_applicable} not "
                                                          f"applicable, {m.fixes_failed} failed or diverged"),
            Tile("A/A control", m.control_speedup, "ratio", "the baseline against itself: the noise floor",
                 detail=comparison_detail(control_ci, m.control_verdict,
                                          why=f"{rounds};" if rounds else "no interval")),
            Tile("Runs", m.runs, "count", f"{result.rounds} rounds of {result.warmup} warm-up + {result.steps} timed "
                                          "steps each")]


def trials_frame(rows: list[FixTrial]) -> pd.DataFrame:
    return pd.DataFrame([{
        "fix": r.fix, "verdict": r.verdict or "", "speed-up (x)": r.speedup,
        "95% interval": "" if not r.speedup_ci else f"[{r.speedup_ci[0]:.2f}, {r.speedup_ci[1]:.2f}]",
        "step": r.step_ms, "peak memory": r.peak_bytes, "loss diff (rel, max)": r.loss_max_rel_diff,
        "grad norm diff (rel, max)": r.grad_norm_max_rel_diff, "warm-up extra": r.warmup_extra_ms,
        "rounds": r.rounds, "why not / failure": r.reason or "", "change to make": r.change or ""} for r in rows])


def show(result: TrialsResult) -> None:
    if result.status != "ok":
        st.warning(f"Trials {result.status}: " + "; ".join(result.notes[:1]))
    metric_row(tiles(result))
    if timed_rows(result):
        st.plotly_chart(build_trials_speedup_figure(result), width="stretch")
    rows = list(result.trials) + ([result.combination] if result.combination else [])
    df, config = unit_columns(trials_frame(rows), {"step": ("step", "ms"), "peak memory": ("peak memory", "bytes"),
                                                   "warm-up extra": ("warm-up extra", "ms")})
    st.dataframe(df, column_config=config, hide_index=True)
    if result.changes:
        st.subheader("Changes to make in the script")
        for c in result.changes:
            st.markdown(f"- `{c}`")
    for n in result.notes:
        st.caption(n)
    st.caption(result.method)
