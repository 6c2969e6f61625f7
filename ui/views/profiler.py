"""Show a profiler result: latency, step breakdown, operators, modules, kernels, timeline, trace files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from diagnostics.analyses.profile import OperatorRow, ProfileResult
from diagnostics.render.charts.profiler import (build_device_split_figure, build_kernel_figure,
                                         build_latency_histogram_figure, build_module_tree_figure,
                                         build_roofline_figure, build_step_breakdown_figure, build_timeline_figure,
                                         build_top_operators_figure, modules_missing)
from diagnostics.render.tables import frame
from diagnostics.units import compact, human_bytes
from ui.widgets import Tile, artifact_bytes, artifact_size, comparison_detail, metric_row, unit_columns
from ui.views.timeline import occurrences, show_timeline

ARTIFACTS = (  # field of the result's artifacts, button label, mime
    ("trace_json", "Chrome trace (.json)", "application/json"),
    ("trace_json_gz", "Chrome trace (.json.gz)", "application/gzip"),
    ("tb_zip", "TensorBoard trace folder (.zip)", "application/zip"),
)


def operator_rows(result: ProfileResult, by_shape: bool, query: str) -> tuple[OperatorRow, ...]:
    """The operators shown: per name, or per input shape when asked and recorded; those whose name holds
    ``query`` (case-insensitive)."""
    rows = result.operators_by_shape if by_shape and result.operators_by_shape else result.operators
    q = query.lower()
    return tuple(r for r in rows if q in r.name.lower()) if query else rows


def operator_table(result: ProfileResult, by_shape: bool, query: str) -> pd.DataFrame:
    df = frame(operator_rows(result, by_shape, query))
    if df.empty:
        return df
    cols = ["name"] + (["input_shapes"] if "input_shapes" in df else []) + [
        "calls", "self_cpu_ms", "self_cpu_pct", "cpu_total_ms", "mean_cpu_ms"]
    if result.cuda_ran:
        cols += ["self_device_ms", "self_device_pct", "device_total_ms"]
    if result.config.get("profile_memory"):
        cols += ["self_cpu_memory_bytes", "cpu_memory_bytes"]
        if result.cuda_ran:
            cols += ["self_device_memory_bytes", "device_memory_bytes"]
    return df.sort_values("self_cpu_ms", ascending=False)[cols].reset_index(drop=True)


def _config_caption(result: ProfileResult) -> str:
    c = result.config  # the options as run
    what = "inference (eval + inference_mode)" if c["mode"] == "inference" else (
        f"training step ({c['optimizer'].upper()}, lr {c['lr']:g}, loss: {result.loss})")
    flags = [k for k in ("record_shapes", "profile_memory", "with_stack", "with_modules") if c[k]]
    return (f"{result.model} · {result.device} · batch {result.batch_size} · {what} · schedule wait "
            f"{c['wait']} / warmup {c['warmup']} / active {c['active']} × repeat {c['repeat']} · activities "
            f"{', '.join(c['activities'])} · {', '.join(flags) or 'no extra recording'} · torch "
            f"{result.torch_version}")


def tiles(result: ProfileResult) -> list[Tile]:
    m, lat = result.metrics, result.latency
    return [
        Tile("Median latency", lat.median_ms, "ms",
             f"{lat.iterations} timed iterations after {lat.warmup} warmup, outside the profiler "
             f"({lat.method}); mean {compact(lat.mean_ms, 'ms')}, std {compact(lat.std_ms, 'ms')}"),
        Tile("p90", lat.p90_ms, "ms", "90th percentile of the timed iterations"),
        Tile("p99", lat.p99_ms, "ms", "99th percentile of the timed iterations"),
        Tile("Throughput", lat.samples_per_s, "per_s",
             ("n/a" if lat.samples_per_s is None else f"{lat.samples_per_s:,.0f} samples/s")
             + f" = batch {result.batch_size} / median latency"),
        Tile("Profiled step", m.step_time_mean_ms, "ms", f"mean of {m.profiled_steps} active steps under the "
                                                         "profiler (includes its overhead)"),
        _overhead_tile(m),
    ]


def _overhead_tile(m) -> Tile:
    """The profiler's overhead: a recorder cannot make the step faster, so an estimate below 0 whose interval
    reaches 0 reads 'within noise' (the estimate and its interval under it), never a negative overhead."""
    pct, low, high = m.profiler_overhead_pct, m.profiler_overhead_ci_low, m.profiler_overhead_ci_high
    why = ("a profiled step against an unprofiled one, timed in the same interleaved rounds (each profiled step "
           "in its own session, start-up and trace processing untimed): how much the profiler's recording "
           "(ranges, module hooks, events) distorts the step, with its 95% interval")
    if pct is None:
        return Tile("Profiler overhead", None, "percent", why)
    detail = comparison_detail([low, high], None, "percent")
    if pct < 0 and low is not None and high is not None and low <= 0 <= high:
        return Tile("Profiler overhead", "within noise", "text", why + "; the estimate is below 0, within its "
                    "interval: the rounds' noise, not a faster step", detail=f"{detail}, estimate {pct:+.1f} %")
    return Tile("Profiler overhead", pct, "percent", why, signed=True, detail=detail)


def roofline_tiles(result: ProfileResult) -> list[Tile]:
    roofs, m = result.roofs, result.metrics
    ds = roofs.datasheet
    return [
        Tile("MFU", m.mfu, "fraction", "model FLOPs per step / median latency / measured GEMM peak"),
        Tile("Model FLOPs/step", m.model_flops_per_step, "flop", "FlopCounterMode, one step",
             missing="not counted"),
        Tile("GEMM peak", roofs.peak_flops, "flop_per_s",
             "measured here" + ("" if not ds else f"; datasheet ({ds.gpu}): "
                                                  f"{compact(ds.peak_flops, 'flop_per_s')}")),
        Tile("Bandwidth", roofs.bandwidth_bytes_per_s, "bytes_per_s",
             "memory bandwidth measured here" + ("" if not ds else
                                                 f"; datasheet: {compact(ds.bandwidth_bytes_per_s, 'bytes_per_s')}")),
        Tile("Above the roofs", m.roofline_headroom_ms, "ms", "per step: time minus time at the roof, "
                                                               "summed over operators"),
    ]


def _roofline(result: ProfileResult) -> None:
    roofs, rows = result.roofs, result.roofline
    if not roofs:
        if result.roofline_unavailable:
            st.warning(f"Roofline not available: {result.roofline_unavailable}")
        else:
            st.info("The roofline was off for this run (option roofline).")
        return
    metric_row(roofline_tiles(result))
    st.caption(roofs.method)
    st.plotly_chart(build_roofline_figure(result), width="stretch")
    if rows:
        df = pd.DataFrame([{"op": r.op, "bound": r.bound, "time_ms": r.time_ms, "roof_ms": r.roof_ms,
                            "headroom_ms": r.headroom_ms, "pct_of_roof": r.pct_of_roof,
                            "achieved": r.achieved_tflops * 1e12, "intensity": r.intensity, "flops": r.flops,
                            "bytes": r.bytes, "calls": r.calls} for r in rows])
        df, config = unit_columns(df, {
            "time_ms": ("Time/step", "ms"), "roof_ms": ("At the roof", "ms", "the time at the roofline's bound"),
            "headroom_ms": ("Headroom", "ms", "time per step minus the time at the roof"),
            "pct_of_roof": ("Of roof", "percent", "achieved / attainable performance"),
            "achieved": ("Achieved", "flop_per_s"), "flops": ("FLOPs/step", "flop"), "bytes": ("Moved/step", "bytes"),
            "calls": ("Calls", "count")})
        config.update(op=st.column_config.TextColumn("Operator"), bound=st.column_config.TextColumn("Bound"),
                      intensity=st.column_config.NumberColumn("Intensity (FLOP/B)", format="%.3g"))
        st.dataframe(df, hide_index=True, width="stretch", column_config=config)


def show(result: ProfileResult) -> None:
    m = result.metrics
    st.caption(_config_caption(result))
    metric_row(tiles(result))
    if m.peak_device_memory_bytes is not None:
        st.caption(f"Peak device memory while profiling: {human_bytes(m.peak_device_memory_bytes)}")
    for note in result.notes:
        st.info(note)

    tabs = st.tabs(["Latency", "Steps", "Operators", "Roofline", "Modules", "GPU kernels", "Timeline", "Trace files"])
    with tabs[0]:
        st.plotly_chart(build_latency_histogram_figure(result), width="stretch")
    with tabs[1]:
        st.plotly_chart(build_step_breakdown_figure(result), width="stretch")
        if result.cuda_ran:
            st.plotly_chart(build_device_split_figure(result), width="stretch")
        else:
            with st.expander("Execution categories (the TensorBoard plugin's split; GPU categories are zero on CPU)"):
                st.plotly_chart(build_device_split_figure(result), width="stretch")
        steps = frame(result.steps)
        steps, config = unit_columns(steps, {c: (c[:-3].replace("_", " ").capitalize(), "ms") for c in steps.columns
                                             if c.endswith("_ms")})
        st.dataframe(steps, hide_index=True, width="stretch", column_config=config)
    with tabs[2]:
        _operators(result)
    with tabs[3]:
        _roofline(result)
    with tabs[4]:
        _modules(result)
    with tabs[5]:
        _kernels(result)
    with tabs[6]:
        tl = result.timeline  # the trace layer's Timeline record (charts.timeline draws it)
        st.caption(f"{tl.shown:,} of {tl.in_range:,} events drawn (downsampled so it draws fast: "
                   "the longest events are kept, a bar may stand for several); drag to zoom, double-click to "
                   "reset. For every event, open the trace file in Perfetto.")
        show_timeline(tl, lambda search: build_timeline_figure(result, search=search), key="prof")
    with tabs[7]:
        _downloads(result)


def _operators(result: ProfileResult) -> None:
    c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
    query = c1.text_input("Filter operators", key="prof_op_filter", placeholder="e.g. conv, aten::mm")
    has_shapes = result.operators_by_shape is not None
    by_shape = c2.toggle("Group by input shape", key="prof_by_shape", disabled=not has_shapes,
                         help=None if has_shapes else "needs record_shapes")
    top_n = c3.slider("Top N", 5, 50, 15, key="prof_top_n")
    by = c4.radio("Rank by", ["self_cpu_ms", "self_device_ms"], key="prof_rank_by", horizontal=True,
                  format_func={"self_cpu_ms": "self CPU", "self_device_ms": "self device"}.get,
                  disabled=not result.cuda_ran)
    df = operator_table(result, by_shape, query)
    st.plotly_chart(build_top_operators_figure(result, top_n, by, rows=operator_rows(result, by_shape, query)),
                    width="stretch")
    config = {
        "name": st.column_config.TextColumn("Operator"),
        "input_shapes": st.column_config.TextColumn("Input shapes"),
        "calls": st.column_config.NumberColumn("Calls", format="localized"),
        "self_cpu_pct": st.column_config.ProgressColumn("Self CPU %", format="%.1f%%", min_value=0, max_value=100),
        "self_device_pct": st.column_config.ProgressColumn("Self device %", format="%.1f%%", min_value=0,
                                                           max_value=100),
    }
    df, config = unit_columns(df, {
        "self_cpu_ms": ("Self CPU", "ms", "own CPU time without child operators, all profiled steps"),
        "cpu_total_ms": ("CPU total", "ms", "CPU time including child operators"),
        "mean_cpu_ms": ("CPU per call", "ms", "CPU total / calls"),
        "self_device_ms": ("Self device", "ms"), "device_total_ms": ("Device total", "ms"),
        "self_cpu_memory_bytes": ("Self CPU memory", "bytes"), "cpu_memory_bytes": ("CPU memory", "bytes"),
        "self_device_memory_bytes": ("Self device memory", "bytes"),
        "device_memory_bytes": ("Device memory", "bytes")}, config)
    st.caption(f"{len(df)} operators · times summed over all profiled (active) steps · key_averages semantics: "
               "self = own time without child operators")
    event = st.dataframe(df, hide_index=True, width="stretch", column_config=config, on_select="rerun",
                         selection_mode="single-row", key="prof_op_table")
    rows = event.selection.rows if event and event.selection else []
    if rows:  # the link from a row to its occurrences on the timeline
        occurrences(result.timeline, str(df.iloc[rows[0]]["name"]), key="prof")
    else:
        st.caption("Select a row to see that operator's occurrences on the timeline.")


def _modules(result: ProfileResult) -> None:
    if not result.modules:
        why = modules_missing(result)
        st.info(why[:1].upper() + why[1:] + ".")
        return
    which = st.radio("Pass", ["forward", "backward"], horizontal=True, key="prof_module_pass",
                     disabled=result.mode != "train")
    st.plotly_chart(build_module_tree_figure(result, which), width="stretch")
    df = frame(result.modules)
    cols = ["name", "type", "calls", "forward_ms", "forward_self_ms"]
    if result.mode == "train":  # inference runs no backward: no columns of zeros
        cols += ["backward_ms", "backward_self_ms"]
    df, config = unit_columns(df, {"forward_ms": ("Forward", "ms", "including child modules"),
                                   "forward_self_ms": ("Forward self", "ms", "without child modules"),
                                   "backward_ms": ("Backward", "ms", "including child modules"),
                                   "backward_self_ms": ("Backward self", "ms", "without child modules")})
    config.update(name=st.column_config.TextColumn("Module"), type=st.column_config.TextColumn("Type"),
                  calls=st.column_config.NumberColumn("Calls"))
    if "mfu" in df:  # with the roofline: each module's FLOPs over its time and the measured peak
        df["mfu_pct"] = df["mfu"].map(lambda v: None if v is None or v != v else 100.0 * v)
        cols += ["flops", "mfu_pct"]
        config.update(flops=st.column_config.NumberColumn("FLOPs/step (FLOP)", format="compact"),
                      mfu_pct=st.column_config.NumberColumn("MFU (%)", format="%.1f"))
        if "flops_not_counted" in df:  # ops under the module that the FLOP count leaves out
            cols.append("flops_not_counted")
            config.update(flops_not_counted=st.column_config.TextColumn("Not counted", width="small",
                                                                        help="ops under the module that the FLOP "
                                                                             "count leaves out"))
    st.dataframe(df[cols], hide_index=True, width="stretch", column_config=config)
    st.caption("Forward: each module's record_function range. Backward: autograd nodes attributed to the module "
               "whose forward created them (sequence numbers). Times include child modules; 'self' excludes them.")


def _kernels(result: ProfileResult) -> None:
    if not result.kernels:
        st.info("No GPU kernels: CUDA did not run in this profile (CPU device, or the CUDA activity was off).")
        return
    m = result.metrics
    st.caption(f"{len(result.kernels)} kernels, {compact(m.kernel_time_ms, 'ms')} in total; "
               f"{m.tensor_core_kernel_pct:.1f}% of kernel time on Tensor Cores (kernel-name heuristic)")
    st.plotly_chart(build_kernel_figure(result), width="stretch")
    df = frame(result.kernels)[["name", "calls", "total_us", "mean_us", "max_us", "min_us", "grid", "block",
                                          "tensor_cores", "pct_of_kernel_time"]]
    df, config = unit_columns(df, {c: (c[:-3].capitalize(), "us") for c in ("total_us", "mean_us", "max_us", "min_us")})
    config.update(name=st.column_config.TextColumn("Kernel"),
                  tensor_cores=st.column_config.CheckboxColumn("Tensor Cores"),
                  pct_of_kernel_time=st.column_config.ProgressColumn("Of kernel time", format="%.1f%%", min_value=0,
                                                                     max_value=100))
    st.dataframe(df, hide_index=True, width="stretch", column_config=config)


def _downloads(result: ProfileResult) -> None:
    st.markdown("Open **trace.json** in [Perfetto](https://ui.perfetto.dev) or `chrome://tracing`; load it in "
                "Holistic Trace Analysis (it carries `distributedInfo` rank 0). Unzip the TensorBoard folder "
                "for tools that read `*.pt.trace.json` folders.")
    cols = st.columns(len(ARTIFACTS))
    for col, (key, label, mime) in zip(cols, ARTIFACTS):
        path = getattr(result.artifacts, key)
        size = artifact_size(path)
        if size is None:
            col.caption(f"{label}: file no longer on disk")
            continue
        col.download_button(f"{label} · {human_bytes(size)}",
                            data=lambda p=path: artifact_bytes(p), file_name=Path(path).name, mime=mime,
                            key=f"prof_dl_{key}", icon=":material/download:", on_click="ignore")
