"""Show an attached run (your own script): headline tiles, the step's parts per step and per rank,
the findings and "fix this first" in the checklist's form, the Gradient flow view of the real model,
DataLoader workers, device syncs by line, GPU idle, memory, and the way to its trace in the Trace
explorer."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.analyses.attach.protocol import PHASES
from diagnostics.render.charts.attach import (build_breakdown_figure, build_gpu_idle_figure, build_steps_figure,
                                              summary_lines)
from ui.views import checklist as checklist_view
from ui.views import gradients as gradients_view
from ui.widgets import Tile, chart_key, metric_row, unit_columns

#: Session-state keys the Trace explorer's "Open from" widgets read (pages/traces.py).
TRACE_SOURCE_KEY, TRACE_RUN_KEY = "trace_src_a", "trace_run_a"


def tiles(result: dict) -> list[Tile]:
    b = result.get("breakdown_ms") or {}
    bn = result.get("bottleneck") or {}
    out = [Tile("Step", result.get("step_ms"), "ms", "median step outside the profiled window, after warm-up"),
           Tile("Bottleneck", bn.get("category") or "n/a", "text",
                f"{100 * bn['share']:.0f}% of the step ({bn['ms']:.2f} ms)" if bn else "no step was measured"),
           Tile("Data wait", b.get("data_wait"), "ms", "the main thread waiting for DataLoader batches, per step"),
           Tile("Host", b.get("host"), "ms", "Python outside the timed torch calls, per step (the rest of the step)"),
           Tile("Profiler cost", result.get("overhead_pct"), "percent",
                "profiled steps against the steps outside the window"),
           Tile("Steps seen", result.get("steps"), "count", result.get("step_boundary_detail") or "")]
    if result.get("gpu"):
        out.insert(4, Tile("GPU idle", result["gpu"].get("idle_ms_per_step"), "ms", "per profiled step"))
    return out


def _findings(result: dict) -> None:
    st.subheader("Fix this first")
    st.caption("Ranked by the milliseconds per step each part takes in this run (at most what fixing it saves).")
    checklist_view.fix_first_table(result.get("fix_first") or [])
    findings = sorted(result.get("findings") or [], key=lambda f: checklist_view.ORDER.index(f["status"]))
    show_na = st.toggle("Show rules that do not apply", value=False, key=chart_key("attach_na", result, 0))
    for f in findings:
        if f["status"] != "not_applicable" or show_na:
            checklist_view._finding(f, None)


def _gradients(result: dict) -> None:
    g = result.get("gradients")
    if not g:
        st.info("No gradients were read: no optimizer stepped in the profiled steps (or --no-grads).")
        return
    opt = (result.get("optimizers") or [{}])[0]
    lr = ((opt.get("groups") or [{}])[0]).get("lr")
    gradients_view.show({**g, "options": {"steps": g["metrics"]["steps"], "optimizer": opt.get("type", "?"),
                                          "lr": float(lr) if isinstance(lr, (int, float)) else float("nan")},
                         "model": "the script's model", "device": ", ".join((result.get("model") or {})
                                                                          .get("devices", {})) or "?"})


def _data(result: dict) -> None:
    w = result.get("workers") or {}
    loader = w.get("loader")
    if loader:
        st.caption(f"DataLoader: batch_size {loader.get('batch_size')}, num_workers {loader.get('num_workers')}, "
                   f"pin_memory {loader.get('pin_memory')}, persistent_workers {loader.get('persistent_workers')}, "
                   f"prefetch_factor {loader.get('prefetch_factor')}; {loader.get('iters')} epoch(s) started")
    if w.get("per_worker"):
        df, config = unit_columns(pd.DataFrame(w["per_worker"]), {
            "fetch_collate_ms": ("Fetch + collate", "ms", "per batch, median, in the worker"),
            "collate_ms": ("Collate", "ms", "per batch, median")})
        st.dataframe(df, hide_index=True, width="stretch", column_config=config)
    elif loader and not loader.get("num_workers"):
        st.info("num_workers is 0: batches load in the main process, inside the step (data wait).")
    syncs = result.get("syncs") or []
    st.markdown("**Device syncs by line**")
    if syncs:
        df, config = unit_columns(pd.DataFrame(syncs), {"ms_per_step": ("Wait per step", "ms")})
        st.dataframe(df, hide_index=True, width="stretch", column_config=config)
    else:
        st.caption("None timed: on CPU nothing waits for a device; on CUDA no .item(), .tolist(), bool(), "
                   ".cpu() or cuda.synchronize() ran in the steps.")
    mem = result.get("memory") or {}
    st.markdown("**Memory**")
    if mem.get("peak_bytes") is not None:
        st.caption(f"CUDA peak per profiled step: {', '.join(f'{b / 2**20:.1f} MiB' for b in mem['peak_bytes_per_step'])}"
                   + (f"; snapshot {mem['snapshot']} (open it at pytorch.org/memory_viz)" if mem.get("snapshot") else ""))
    elif mem.get("note"):
        st.caption(mem["note"])
    if mem.get("oom"):
        st.error(f"Out of memory at step {mem['oom'].get('step')}: {mem['oom'].get('why')}; snapshot: "
                 f"{mem['oom'].get('snapshot') or mem['oom'].get('error')}")


def _open_trace(result: dict) -> None:
    traces = result.get("trace")
    names = traces if isinstance(traces, list) else ([traces] if traces else [])
    if not names:
        st.info("No trace: the script ended before the profiled window (see the notes).")
        return
    run_id = result.get("run_id")
    st.caption("The torch.profiler trace of the profiled steps (ProfilerStep#N carries this run's step numbers): "
               + ", ".join(f"`{n}`" for n in names) + (f" in `{result.get('run_dir')}`" if result.get("run_dir") else ""))
    if run_id and st.button("Open in the Trace explorer", icon=":material/timeline:",
                            key=chart_key("attach_trace", result, 0)):
        st.session_state[TRACE_SOURCE_KEY] = "A profiling run"
        st.session_state[TRACE_RUN_KEY] = f"{run_id}/{names[0]}"
        st.switch_page("pages/traces.py")


def show(result: dict) -> None:
    code = result.get("exit_code")
    if code not in (0, None) or result.get("status") == "interrupted":
        st.error(("The run was stopped" if result.get("status") == "interrupted" else
                  f"The script exited with code {code}") + ": what was measured until then is below.")
    for line in summary_lines(result):
        st.caption(line)
    metric_row(tiles(result))
    for note in result.get("notes") or []:
        st.info(note)
    names = ["Step", "Fix this first", "Gradient flow", "Data, syncs, memory", "Trace"]
    if result.get("gpu"):
        names.insert(1, "GPU")
    tabs = dict(zip(names, st.tabs(names)))
    with tabs["Step"]:
        st.plotly_chart(build_breakdown_figure(result), width="stretch", key=chart_key("attach_bd", result, 0))
        st.plotly_chart(build_steps_figure(result), width="stretch", key=chart_key("attach_steps", result, 0))
        if result.get("step_table"):
            df = pd.DataFrame(result["step_table"])
            df, config = unit_columns(df, {f"{k}_ms": (k.replace("_", " "), "ms") for k in ("step", *PHASES, "tool")})
            st.dataframe(df, hide_index=True, width="stretch", column_config=config)
    if "GPU" in tabs:
        with tabs["GPU"]:
            st.plotly_chart(build_gpu_idle_figure(result), width="stretch", key=chart_key("attach_gpu", result, 0))
    with tabs["Fix this first"]:
        _findings(result)
    with tabs["Gradient flow"]:
        _gradients(result)
    with tabs["Data, syncs, memory"]:
        _data(result)
    with tabs["Trace"]:
        _open_trace(result)
