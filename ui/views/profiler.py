"""Show a profiler result: latency, step breakdown, operators, modules, kernels, timeline, trace files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from diagnostics.render.charts.profiler import (build_device_split_figure, build_kernel_figure,
                                         build_latency_histogram_figure, build_module_tree_figure,
                                         build_roofline_figure, build_step_breakdown_figure, build_timeline_figure,
                                         build_top_operators_figure, modules_missing)
from diagnostics.units import human_bytes, human_count
from ui.widgets import metric_row
from ui.views.timeline import occurrences, show_timeline

ARTIFACTS = (  # result key, button label, mime
    ("trace_json", "Chrome trace (.json)", "application/json"),
    ("trace_json_gz", "Chrome trace (.json.gz)", "application/gzip"),
    ("tb_zip", "TensorBoard trace folder (.zip)", "application/zip"),
)
MS = "%.3f ms"


def _ms(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3g} ms" if v >= 0.01 else f"{v * 1e3:.3g} µs"


def operator_table(result: dict, by_shape: bool, query: str) -> pd.DataFrame:
    rows = result["operators_by_shape"] if by_shape and result.get("operators_by_shape") else result["operators"]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    if query:
        df = df[df["name"].str.contains(query, case=False, regex=False)]
    cols = ["name"] + (["input_shapes"] if "input_shapes" in df else []) + [
        "calls", "self_cpu_ms", "self_cpu_pct", "cpu_total_ms", "mean_cpu_ms"]
    if result.get("cuda_ran"):
        cols += ["self_device_ms", "self_device_pct", "device_total_ms"]
    if result["config"].get("profile_memory"):
        cols += ["self_cpu_memory_bytes", "cpu_memory_bytes"]
        if result.get("cuda_ran"):
            cols += ["self_device_memory_bytes", "device_memory_bytes"]
    return df.sort_values("self_cpu_ms", ascending=False)[cols].reset_index(drop=True)


def _config_caption(result: dict) -> str:
    c = result["config"]
    what = "inference (eval + inference_mode)" if c["mode"] == "inference" else (
        f"training step ({c['optimizer'].upper()}, lr {c['lr']:g}, loss: {result.get('loss')})")
    flags = [k for k in ("record_shapes", "profile_memory", "with_stack", "with_modules") if c[k]]
    return (f"{result['model']} · {result['device']} · batch {result['batch_size']} · {what} · schedule wait "
            f"{c['wait']} / warmup {c['warmup']} / active {c['active']} × repeat {c['repeat']} · activities "
            f"{', '.join(c['activities'])} · {', '.join(flags) or 'no extra recording'} · torch "
            f"{result.get('torch_version', '?')}")


def _roofline(result: dict) -> None:
    roofs, rows, m = result.get("roofs"), result.get("roofline") or [], result["metrics"]
    if not roofs:
        st.info("The roofline was off for this run (option roofline).")
        return
    ds = roofs.get("datasheet")
    metric_row([
        ("MFU", "n/a" if m.get("mfu") is None else f"{100 * m['mfu']:.1f}%",
         "model FLOPs per step / median latency / measured GEMM peak"),
        ("Model FLOPs / step", human_count(m.get("model_flops_per_step"), "FLOP"), "FlopCounterMode, one step"),
        ("GEMM peak (GFLOP/s)", f"{roofs['peak_flops'] / 1e9:,.3g}",
         "measured here" + ("" if not ds else f"; datasheet ({ds['gpu']}): {ds['peak_flops'] / 1e9:,.0f} GFLOP/s")),
        ("Bandwidth (GB/s)", f"{roofs['bandwidth_bytes_per_s'] / 1e9:.3g}",
         "measured here" + ("" if not ds else f"; datasheet: {ds['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s")),
        ("Above the roofs (ms)", f"{m.get('roofline_headroom_ms') or 0:.3g}", "per step: time minus time at the roof, "
                                                                              "summed over operators"),
    ])
    st.caption(roofs["method"])
    st.plotly_chart(build_roofline_figure(result), width="stretch")
    if rows:
        df = pd.DataFrame([{"op": r["op"], "bound": r["bound"], "time / step (ms)": r["time_ms"],
                            "at the roof (ms)": r["roof_ms"], "headroom (ms)": r["headroom_ms"],
                            "% of roof": r["pct_of_roof"], "achieved TFLOP/s": r["achieved_tflops"],
                            "FLOP / byte": r["intensity"], "GFLOP / step": r["flops"] / 1e9,
                            "MB moved / step": r["bytes"] / 1e6, "calls": r["calls"]} for r in rows])
        st.dataframe(df, hide_index=True, width="stretch",
                     column_config={c: st.column_config.NumberColumn(c, format="%.4g") for c in df.columns
                                    if c not in ("op", "bound", "calls")})


def show(result: dict) -> None:
    m, lat = result["metrics"], result["latency"]
    st.caption(_config_caption(result))
    metric_row([
        ("Median latency", _ms(lat["median_ms"]), f"{lat['iterations']} timed iterations after {lat['warmup']} "
                                                  f"warmup, outside the profiler ({lat['method']}); mean "
                                                  f"{_ms(lat['mean_ms'])}, std {_ms(lat['std_ms'])}"),
        ("p90", _ms(lat["p90_ms"]), None),
        ("p99", _ms(lat["p99_ms"]), None),
        ("Samples/s", human_count(lat["samples_per_s"]),
         f"throughput: {lat['samples_per_s']:,.0f} samples/s = batch {result['batch_size']} / median latency"),
        ("Profiled step", _ms(m["step_time_mean_ms"]), f"mean of {m['profiled_steps']} active steps under the "
                                                       "profiler (includes its overhead)"),
        ("Profiler overhead", "n/a" if m.get("profiler_overhead_pct") is None else f"{m['profiler_overhead_pct']:+.0f}%",
         "median profiled step vs the median unprofiled latency: how much the profiler's recording "
         "(ranges, module hooks, events) distorts the step"),
    ])
    if m.get("peak_device_memory_bytes") is not None:
        st.caption(f"Peak device memory while profiling: {human_bytes(m['peak_device_memory_bytes'])}")
    for note in result.get("notes", []):
        st.info(note)

    tabs = st.tabs(["Latency", "Steps", "Operators", "Roofline", "Modules", "GPU kernels", "Timeline", "Trace files"])
    with tabs[0]:
        st.plotly_chart(build_latency_histogram_figure(result), width="stretch")
    with tabs[1]:
        st.plotly_chart(build_step_breakdown_figure(result), width="stretch")
        if result.get("cuda_ran"):
            st.plotly_chart(build_device_split_figure(result), width="stretch")
        else:
            with st.expander("Execution categories (the TensorBoard plugin's split; GPU categories are zero on CPU)"):
                st.plotly_chart(build_device_split_figure(result), width="stretch")
        st.dataframe(pd.DataFrame(result["steps"]), hide_index=True, width="stretch",
                     column_config={c: st.column_config.NumberColumn(c.replace("_ms", " (ms)"), format=MS)
                                    for c in result["steps"][0] if c.endswith("_ms")} if result["steps"] else None)
    with tabs[2]:
        _operators(result)
    with tabs[3]:
        _roofline(result)
    with tabs[4]:
        _modules(result)
    with tabs[5]:
        _kernels(result)
    with tabs[6]:
        tl = result["timeline"]
        st.caption(f"{tl['shown_events']:,} of {tl['total_events']:,} events drawn (downsampled so it draws fast: "
                   "the longest events are kept, a bar may stand for several); drag to zoom, double-click to "
                   "reset. For every event, open the trace file in Perfetto.")
        show_timeline(tl, lambda search: build_timeline_figure(result, search=search), key="prof")
    with tabs[7]:
        _downloads(result)


def _operators(result: dict) -> None:
    c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
    query = c1.text_input("Filter operators", key="prof_op_filter", placeholder="e.g. conv, aten::mm")
    has_shapes = result.get("operators_by_shape") is not None
    by_shape = c2.toggle("Group by input shape", key="prof_by_shape", disabled=not has_shapes,
                         help=None if has_shapes else "needs record_shapes")
    top_n = c3.slider("Top N", 5, 50, 15, key="prof_top_n")
    by = c4.radio("Rank by", ["self_cpu_ms", "self_device_ms"], key="prof_rank_by", horizontal=True,
                  format_func={"self_cpu_ms": "self CPU", "self_device_ms": "self device"}.get,
                  disabled=not result.get("cuda_ran"))
    df = operator_table(result, by_shape, query)
    st.plotly_chart(build_top_operators_figure(result, top_n, by, rows=df.to_dict("records") if query else
                                               (result["operators_by_shape"] if by_shape and has_shapes else None)),
                    width="stretch")
    config = {
        "name": st.column_config.TextColumn("Operator"),
        "input_shapes": st.column_config.TextColumn("Input shapes"),
        "calls": st.column_config.NumberColumn("Calls", format="localized"),
        "self_cpu_pct": st.column_config.ProgressColumn("Self CPU %", format="%.1f%%", min_value=0, max_value=100),
        "self_device_pct": st.column_config.ProgressColumn("Self device %", format="%.1f%%", min_value=0,
                                                           max_value=100),
    }
    for col in ("self_cpu_ms", "cpu_total_ms", "mean_cpu_ms", "self_device_ms", "device_total_ms"):
        config[col] = st.column_config.NumberColumn(col.replace("_ms", "").replace("_", " ") + " (ms)", format=MS)
    for col in ("self_cpu_memory_bytes", "cpu_memory_bytes", "self_device_memory_bytes", "device_memory_bytes"):
        config[col] = st.column_config.NumberColumn(col.replace("_bytes", "").replace("_", " ") + " (bytes)",
                                                    format="compact")
    st.caption(f"{len(df)} operators · times summed over all profiled (active) steps · key_averages semantics: "
               "self = own time without child operators")
    event = st.dataframe(df, hide_index=True, width="stretch", column_config=config, on_select="rerun",
                         selection_mode="single-row", key="prof_op_table")
    rows = event.selection.rows if event and event.selection else []
    if rows:  # the link from a row to its occurrences on the timeline
        occurrences(result["timeline"], str(df.iloc[rows[0]]["name"]), key="prof")
    else:
        st.caption("Select a row to see that operator's occurrences on the timeline.")


def _modules(result: dict) -> None:
    if not result["modules"]:
        why = modules_missing(result)
        st.info(why[:1].upper() + why[1:] + ".")
        return
    which = st.radio("Pass", ["forward", "backward"], horizontal=True, key="prof_module_pass",
                     disabled=result["mode"] != "train")
    st.plotly_chart(build_module_tree_figure(result, which), width="stretch")
    df = pd.DataFrame(result["modules"])
    cols = ["name", "type", "calls", "forward_ms", "forward_self_ms", "backward_ms", "backward_self_ms"]
    config = {c: st.column_config.NumberColumn(c.replace("_ms", "").replace("_", " ") + " (ms)", format=MS)
              for c in ("forward_ms", "forward_self_ms", "backward_ms", "backward_self_ms")}
    if "mfu" in df:  # with the roofline: each module's FLOPs over its time and the measured peak
        df["mfu_pct"] = df["mfu"].map(lambda v: None if v is None or v != v else 100.0 * v)
        cols += ["flops", "mfu_pct"]
        config.update(flops=st.column_config.NumberColumn("FLOPs / step", format="compact"),
                      mfu_pct=st.column_config.NumberColumn("MFU (%)", format="%.1f"))
        if "flops_not_counted" in df:  # ops under the module that the FLOP count leaves out
            cols.append("flops_not_counted")
            config.update(flops_not_counted=st.column_config.TextColumn("FLOPs not counted for"))
    st.dataframe(df[cols], hide_index=True, width="stretch", column_config=config)
    st.caption("Forward: each module's record_function range. Backward: autograd nodes attributed to the module "
               "whose forward created them (sequence numbers). Times include child modules; 'self' excludes them.")


def _kernels(result: dict) -> None:
    if not result["kernels"]:
        st.info("No GPU kernels: CUDA did not run in this profile (CPU device, or the CUDA activity was off).")
        return
    m = result["metrics"]
    st.caption(f"{len(result['kernels'])} kernels, {_ms(m['kernel_time_ms'])} in total; "
               f"{m['tensor_core_kernel_pct']:.1f}% of kernel time on Tensor Cores (kernel-name heuristic)")
    st.plotly_chart(build_kernel_figure(result), width="stretch")
    df = pd.DataFrame(result["kernels"])
    st.dataframe(df[["name", "calls", "total_us", "mean_us", "max_us", "min_us", "grid", "block", "tensor_cores",
                     "pct_of_kernel_time"]], hide_index=True, width="stretch",
                 column_config={"tensor_cores": st.column_config.CheckboxColumn("Tensor Cores"),
                                "pct_of_kernel_time": st.column_config.ProgressColumn(
                                    "% of kernel time", format="%.1f%%", min_value=0, max_value=100),
                                **{c: st.column_config.NumberColumn(c.replace("_us", " (µs)"), format="%.1f")
                                   for c in ("total_us", "mean_us", "max_us", "min_us")}})


def _downloads(result: dict) -> None:
    st.markdown("Open **trace.json** in [Perfetto](https://ui.perfetto.dev) or `chrome://tracing`; load it in "
                "Holistic Trace Analysis (it carries `distributedInfo` rank 0). Unzip the TensorBoard folder "
                "for tools that read `*.pt.trace.json` folders.")
    arts = result.get("artifacts") or {}
    cols = st.columns(len(ARTIFACTS))
    for col, (key, label, mime) in zip(cols, ARTIFACTS):
        path = arts.get(key)
        if not path or not Path(path).is_file():
            col.caption(f"{label}: file no longer on disk")
            continue
        col.download_button(f"{label} · {human_bytes(Path(path).stat().st_size)}",
                            data=lambda p=path: Path(p).read_bytes(), file_name=Path(path).name, mime=mime,
                            key=f"prof_dl_{key}", icon=":material/download:", on_click="ignore")


#: How this module shows each analysis' result (ui.views.show finds it through the analysis' ``view``).
VIEWS = {"profile": show}
