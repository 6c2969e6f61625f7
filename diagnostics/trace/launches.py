"""launch_stats: launch calls and the GPU work they started (launch delay, runtime call duration, short
kernels), graph launches apart; on breakdowns' GPU frame (each GPU event with its launch call). Returns its
record, LaunchStats (records/breakdowns.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnostics.trace.breakdowns import _gpu_frame, _records
from diagnostics.trace.classify import is_graph_launch
from diagnostics.trace.model import Trace
from diagnostics.trace.records.breakdowns import GraphLaunch, GraphLaunches, LaunchName, LaunchPoint, LaunchStats

# Launches whose kernel started this long after the runtime call began are flagged.
LONG_LAUNCH_DELAY_US = 100.0
LAUNCH_SAMPLE = 2000   # (cpu, gpu duration) points kept for a scatter plot


def launch_stats(trace: Trace, n: int) -> LaunchStats:
    """Launch calls and the GPU work they started: launch delay, call duration, launch-bound kernels.

    A graph launch (cudaGraphLaunch, hipGraphLaunch: GRAPH_LAUNCH_RE) is one call that starts all
    of its graph's kernels, so it counts as one launch and its kernels are kept out of the
    per-kernel figures (comparing one 1 ms graph launch with each of its hundred kernels would call
    them all launch-bound); ``graphs`` describes graph launches per launch. ``launches`` counts the
    calls that started GPU work, a graph launch once. For the other GPU events (``kernel_launches``:
    one per event) the launch delay is GPU start - call start; ``short_kernels`` are those shorter
    than their launch call, ``long_delays`` those delayed more than LONG_LAUNCH_DELAY_US.
    Returns totals, per-name aggregates and a sample for scatter plots.
    """
    g = _gpu_frame(trace)
    g = g[g["launch_start_us"].notna()].copy()
    graph = np.array([is_graph_launch(x) for x in g["launch_name"].fillna("")], dtype=bool)
    graphs = _graph_launches(g[graph], n)
    g = g[~graph]
    if not len(g):
        return LaunchStats(launches=graphs.launches, kernel_launches=0, short_kernels=0, long_delays=0,
                           long_launch_delay_us=LONG_LAUNCH_DELAY_US, by_name=(), sample=(), graphs=graphs)
    g["delay_us"] = g["start_us"] - g["launch_start_us"]
    g["short"] = g["dur_us"] < g["launch_dur_us"]
    g["long_delay"] = g["delay_us"] > LONG_LAUNCH_DELAY_US
    by = g.groupby("name").agg(launches=("dur_us", "size"), gpu_us=("dur_us", "sum"),
                               runtime_us=("launch_dur_us", "sum"),
                               mean_delay_us=("delay_us", "mean"),
                               max_delay_us=("delay_us", "max"),
                               short_kernels=("short", "sum"),
                               long_delays=("long_delay", "sum")).reset_index()
    by = by.sort_values(["short_kernels", "launches"], ascending=False)
    step = max(1, len(g) // LAUNCH_SAMPLE)
    sample = g.iloc[::step][["name", "kind", "launch_dur_us", "dur_us", "delay_us"]]
    return LaunchStats(
        launches=int(len(g)) + graphs.launches, kernel_launches=int(len(g)), short_kernels=int(g["short"].sum()),
        long_delays=int(g["long_delay"].sum()), long_launch_delay_us=LONG_LAUNCH_DELAY_US,
        by_name=tuple(LaunchName(**r) for r in _records(by.head(n))),
        sample=tuple(LaunchPoint(**r) for r in _records(sample)), graphs=graphs,
        mean_delay_us=float(g["delay_us"].mean()), max_delay_us=float(g["delay_us"].max()),
        mean_runtime_us=float(g["launch_dur_us"].mean()))


def _graph_launches(g: pd.DataFrame, n: int) -> GraphLaunches:
    """Graph launches (one row of ``g`` per kernel they started, grouped by correlation id): per
    launch its kernels, call duration, delay to its first kernel, GPU span and summed kernel time;
    ``shorter_than_launch``: graphs whose GPU span is shorter than their launch call."""
    if not len(g):
        return GraphLaunches(launches=0, kernels=0, by_launch=())
    # A flow-linked kernel may lack a correlation id: its launch's start time names the launch.
    key = g["corr"].astype(float).where(g["corr"] >= 0, -1.0 - g["launch_start_us"])
    per = g.groupby(key).agg(launch_name=("launch_name", "first"), launch_start_us=("launch_start_us", "first"),
                             runtime_us=("launch_dur_us", "first"), kernels=("dur_us", "size"),
                             first_start_us=("start_us", "min"), last_end_us=("end_us", "max"),
                             gpu_us=("dur_us", "sum")).reset_index(drop=True)
    per["delay_us"] = per["first_start_us"] - per["launch_start_us"]
    per["span_us"] = per["last_end_us"] - per["first_start_us"]
    per = per.sort_values("launch_start_us")
    return GraphLaunches(
        launches=int(len(per)), kernels=int(per["kernels"].sum()), mean_kernels_per_launch=float(per["kernels"].mean()),
        mean_runtime_us=float(per["runtime_us"].mean()), mean_delay_us=float(per["delay_us"].mean()),
        max_delay_us=float(per["delay_us"].max()), gpu_us=float(per["gpu_us"].sum()),
        shorter_than_launch=int((per["span_us"] < per["runtime_us"]).sum()),
        by_launch=tuple(GraphLaunch(**r) for r in _records(per[["launch_name", "launch_start_us", "runtime_us",
                                                                 "kernels", "delay_us", "span_us", "gpu_us"]].head(n))))
