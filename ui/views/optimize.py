"""Show fix trials: the measured table, latency / speed-up / size / fidelity charts, downloads."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from diagnostics.render.charts.optimize import (build_fidelity_figure, build_latency_figure, build_size_figure,
                                         build_speedup_figure)
from diagnostics.units import human_bytes
from ui.widgets import metric_row


def trials_table(result: dict) -> pd.DataFrame:
    rows = []
    for r in result["rows"]:
        rows.append({  # what decides first (speed-up, fidelity), then the raw measurements
            "fix": r["title"], "status": r["status"], "speed-up (x)": r["speedup"],
            "95% interval": _interval(r.get("speedup_ci")), "verdict": _verdict(r),
            "median (ms)": r["median_ms"],
            "p90 (ms)": r["p90_ms"], "peak memory (MiB)": None if r["peak_bytes"] is None else r["peak_bytes"] / 2**20,
            "size ratio": r["size_ratio"], "max abs err": r["max_abs_err"], "cosine": r["cosine"],
            "top-1 agreement": r["top1_agreement"], "throughput (samples/s)": r["throughput_per_s"],
            "first call (ms)": r["first_call_ms"],
            "size (MiB)": None if r["size_bytes"] is None else r["size_bytes"] / 2**20,
            "why / notes": r["why"] or "; ".join(r["notes"]),
        })
    return pd.DataFrame(rows)


def _interval(ci) -> str:
    return "" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _verdict(r: dict) -> str:
    if r["fix"] == "baseline" or r.get("verdict") is None:
        return ""
    return r["verdict"] + (" (low confidence)" if r.get("confidence") == "low" else "")


def show(result: dict) -> None:
    m = result["metrics"]
    st.caption(f"{result['model']} · device {result['device']} · batch {result['batch_size']} · "
               f"{result['iters']} interleaved rounds · {m.get('threads', '?')} torch threads")
    best = m["best_fix"]
    low, high = m.get("control_ci_low"), m.get("control_ci_high")
    metric_row([
        ("Baseline median", f"{m['baseline_median_ms']:.3g} ms", "eval mode, torch.no_grad()"),
        ("Best speed-up", "none beyond the noise" if best is None else f"x{m['best_speedup']:.2f}",
         None if best is None else f"fix: {best}"),
        ("Noise floor (A/A)", "n/a" if m.get("control_speedup") is None else f"x{m['control_speedup']:.2f}",
         None if low is None else f"interval [{low:.2f}, {high:.2f}]"),
        ("Faster / slower", f"{m.get('fixes_faster', 0)} / {m.get('fixes_slower', 0)}",
         f"of {m['trials_ok']} run; {m['trials_failed']} failed, {m['trials_not_applicable']} n/a"),
    ])
    for note in result.get("notes", []):
        st.caption(note)
    st.dataframe(trials_table(result), hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(c, format="%.4g") for c in
                                ("median (ms)", "p90 (ms)", "throughput (samples/s)", "speed-up (x)", "first call (ms)",
                                 "peak memory (MiB)", "size (MiB)", "size ratio", "max abs err", "cosine",
                                 "top-1 agreement")})
    if any(r["status"] == "ok" for r in result["rows"] if r["fix"] not in ("baseline", "control")):
        t1, t2, t3, t4 = st.tabs(["Latency", "Speed-up", "Size", "Fidelity"])
        t1.plotly_chart(build_latency_figure(result), width="stretch")
        t2.plotly_chart(build_speedup_figure(result), width="stretch")
        t3.plotly_chart(build_size_figure(result), width="stretch")
        t4.plotly_chart(build_fidelity_figure(result), width="stretch")
    arts = [r for r in result["rows"] if r.get("artifact")]
    if arts:
        st.markdown("**Optimized models** (the fixed copy, and the recipe that reproduces it)")
        for r in arts:
            _artifact_row(r)


def _artifact_row(r: dict) -> None:
    a = r["artifact"]
    model_path, recipe_path = Path(a["path"]), Path(a["recipe"])
    c1, c2, c3 = st.columns([2, 2, 1.4], vertical_alignment="center")
    c1.markdown(r["title"])
    if model_path.exists():
        kind = "TorchScript" if a["kind"] == "torchscript" else "state_dict"
        c2.download_button(f"{kind} · {human_bytes(model_path.stat().st_size)}", model_path.read_bytes,
                           file_name=model_path.name, key=f"opt_dl_{r['fix']}", icon=":material/download:",
                           on_click="ignore", width="stretch")
    if recipe_path.exists():
        c3.download_button("recipe (JSON)", recipe_path.read_bytes, file_name=recipe_path.name,
                           key=f"opt_recipe_{r['fix']}", mime="application/json", on_click="ignore",
                           width="stretch")


#: How this module shows each analysis' result (ui.views.show finds it through the analysis' ``view``).
VIEWS = {"optimize": show}
