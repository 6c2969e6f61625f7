"""Show an attached run (your own script): headline tiles, the step's parts per step and per rank,
the findings and "fix this first" in the checklist's form, the Gradient flow view of the real model,
DataLoader workers, device syncs by line, GPU idle, memory, and the way to its trace in the Trace
explorer."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from diagnostics.analyses.attach.protocol import PHASES
from diagnostics.analyses.attach.result import AttachResult, gradient_flow
from diagnostics.findings import by_attention
from diagnostics.registry import get_analysis
from diagnostics.render.charts.attach import (build_breakdown_figure, build_gpu_idle_figure, build_steps_figure,
                                              oom_lines, summary_lines, trace_names)
from diagnostics.render.tables import records_frame
from diagnostics.results import decode
from ui.views import checklist as checklist_view
from ui.views import gradients as gradients_view
from ui.widgets import Tile, md_text, metric_row, unit_columns

#: Session-state keys the Trace explorer's "Open from" widgets read (pages/traces.py).
TRACE_SOURCE_KEY, TRACE_RUN_KEY = "trace_src_a", "trace_run_a"


def _key(name: str, result: AttachResult) -> str:
    """A widget's key, one per run shown."""
    return f"{name}-{result.run_id or result.run_dir}"


def tiles(result: AttachResult) -> list[Tile]:
    b = result.breakdown_ms
    bn = result.bottleneck
    out = [Tile("Step", result.step_ms, "ms", "median step outside the profiled window, after warm-up"),
           Tile("Bottleneck", bn.category if bn else "n/a", "text",
                f"{100 * bn.share:.0f}% of the step ({bn.ms:.2f} ms)" if bn else "no step was measured"),
           Tile("Data wait", b.get("data_wait"), "ms", "the main thread waiting for DataLoader batches, per step"),
           Tile("Host", b.get("host"), "ms", "Python outside the timed torch calls, per step (the rest of the step)"),
           _cost_tile(result),
           Tile("Steps seen", result.steps, "count", result.step_boundary_detail)]
    if result.gpu is not None:
        out.insert(4, Tile("GPU idle", result.gpu.idle_ms_per_step, "ms", "per profiled step"))
    return out


def _cost_tile(result: AttachResult) -> Tile:
    """The profiler's cost: a negative or in-spread difference reads "within noise", never as a cost."""
    o = result.overhead
    spread = f" (steps' own spread {o.noise_pct[0]:+.1f}% to {o.noise_pct[1]:+.1f}%)" if o.noise_pct else ""
    if result.overhead_pct is not None and (o.verdict == "within noise" or result.overhead_pct <= 0):
        return Tile("Profiler cost", "within noise", "text",
                    f"profiled steps {result.overhead_pct:+.1f}% against the others{spread}")
    return Tile("Profiler cost", result.overhead_pct, "percent",
                "profiled steps against the steps outside the window" + spread)


def _findings(result: AttachResult) -> None:
    st.subheader("Fix this first")
    st.caption("Ranked by the milliseconds per step each part takes in this run (at most what fixing it saves).")
    checklist_view.fix_first_table(result.fix_first)
    show_na = st.toggle("Show rules that do not apply", value=False, key=_key("attach_na", result))
    for f in by_attention(result.findings):
        if f.status != "not_applicable" or show_na:
            checklist_view.show_finding(f)


def _gradients(result: AttachResult) -> None:
    flow = gradient_flow(result)
    if flow is None:
        st.info("No gradients were read: no optimizer stepped in the profiled steps (or --no-grads).")
        return
    gradients_view.show(decode(get_analysis("gradients"), flow))  # the Gradient flow page's own view


def _data(result: AttachResult) -> None:
    w = result.workers
    loader = w.loader
    if loader:
        st.caption(f"DataLoader: batch_size {loader.batch_size}, num_workers {loader.num_workers}, "
                   f"pin_memory {loader.pin_memory}, persistent_workers {loader.persistent_workers}, "
                   f"prefetch_factor {loader.prefetch_factor}; {loader.iters} epoch(s) started")
    if w.per_worker:
        df, config = unit_columns(records_frame(w.per_worker), {
            "fetch_collate_ms": ("Fetch + collate", "ms", "per batch, median, in the worker"),
            "collate_ms": ("Collate", "ms", "per batch, median")})
        st.dataframe(df, hide_index=True, width="stretch", column_config=config)
    elif loader and loader.num_workers == 0:
        st.info("num_workers is 0: batches load in the main process, inside the step (data wait).")
    st.markdown("**Device syncs by line**")
    if result.syncs:
        df, config = unit_columns(records_frame(result.syncs), {"ms_per_step": ("Wait per step", "ms")})
        st.dataframe(df, hide_index=True, width="stretch", column_config=config)
    else:
        st.caption("None timed: on CPU nothing waits for a device; on CUDA no .item(), .tolist(), bool(), "
                   ".cpu() or cuda.synchronize() ran in the steps.")
    mem = result.memory
    st.markdown("**Memory**")
    if mem.peak_bytes is not None:
        st.caption(f"CUDA peak per profiled step: {', '.join(f'{b / 2**20:.1f} MiB' for b in mem.peak_bytes_per_step)}"
                   + (f"; snapshot {mem.snapshot} (open it at pytorch.org/memory_viz)" if mem.snapshot else ""))
    elif mem.alloc_peak_bytes_per_step:
        st.caption("CPU allocator peak per profiled step (above the step's start, from the profiler's allocation "
                   f"events): {', '.join(f'{b / 2**20:.1f} MiB' for b in mem.alloc_peak_bytes_per_step)}")
    if mem.peak_bytes is None and mem.note:
        st.caption(mem.note)
    if mem.oom:
        st.caption(f"Out of memory at step {mem.oom.step}: {md_text(mem.oom.why)}"
                   + (f"; snapshot {mem.oom.snapshot} (open it at pytorch.org/memory_viz)" if mem.oom.snapshot else ""))
        if mem.oom.by_module:
            st.markdown("**Held at the out-of-memory error, by module**")
            df, config = unit_columns(records_frame(mem.oom.by_module), {
                k: (k.replace("_", " "), "bytes") for k in ("parameters", "buffers", "gradients", "optimizer_state")})
            st.dataframe(df, hide_index=True, width="stretch", column_config=config)


def _open_trace(result: AttachResult) -> None:
    names = trace_names(result)
    if not names:
        st.info("No trace: the script ended before the profiled window (see the notes).")
        return
    st.caption("The torch.profiler trace of the profiled steps (ProfilerStep#N carries this run's step numbers): "
               + ", ".join(f"`{n}`" for n in names) + (f" in `{result.run_dir}`" if result.run_dir else ""))
    if result.run_id and st.button("Open in the Trace explorer", icon=":material/timeline:",
                                   key=_key("attach_trace", result)):
        st.session_state[TRACE_SOURCE_KEY] = "A profiling run"
        st.session_state[TRACE_RUN_KEY] = f"{result.run_id}/{names[0]}"
        st.switch_page("pages/traces.py")


def show(result: AttachResult) -> None:
    code = result.exit_code
    if result.status == "interrupted":  # a deliberate stop (Stop, Ctrl-C, --timeout) is not an error
        st.info(f"The run was stopped{f' (exit code {code})' if code is not None else ''}: what was measured "
                "until then is below.", icon=":material/stop_circle:")
    elif code not in (0, None):
        st.error(f"The script exited with code {code}: what was measured until then is below.")
    oom = oom_lines(result.memory.oom) if result.memory.oom is not None else []
    if oom:  # the out-of-memory block: where, what it asked for, what held memory, what would fit
        st.error("\n\n".join(md_text(line) for line in oom), icon=":material/memory:")
    for line in summary_lines(result):
        if line not in oom:
            st.caption(line)
    metric_row(tiles(result))
    for note in result.notes:  # they quote the command and the run folder's names: shown as written
        st.info(md_text(note))
    names = ["Step", "Fix this first", "Gradient flow", "Data, syncs, memory", "Trace"]
    if result.gpu is not None:
        names.insert(1, "GPU")
    tabs = dict(zip(names, st.tabs(names)))
    with tabs["Step"]:
        st.plotly_chart(build_breakdown_figure(result), width="stretch", key=_key("attach_bd", result))
        st.plotly_chart(build_steps_figure(result), width="stretch", key=_key("attach_steps", result))
        if result.step_table:
            df, config = unit_columns(records_frame(result.step_table),
                                      {f"{k}_ms": (k.replace("_", " "), "ms") for k in ("step", *PHASES, "tool")})
            st.dataframe(df, hide_index=True, width="stretch", column_config=config)
    if "GPU" in tabs:
        with tabs["GPU"]:
            st.plotly_chart(build_gpu_idle_figure(result), width="stretch", key=_key("attach_gpu", result))
    with tabs["Fix this first"]:
        _findings(result)
    with tabs["Gradient flow"]:
        _gradients(result)
    with tabs["Data, syncs, memory"]:
        _data(result)
    with tabs["Trace"]:
        _open_trace(result)
