"""diff_traces(before, after) -> TraceDiff (records/diff.py): operators and kernels added, removed, faster, slower.

Host operators (cpu_op) are compared on self time, GPU kernels/memcpys/memsets on their time.
When both traces have ProfilerSteps, times are per step (so a longer capture is not "slower"), over what
the trace analysis' step figures count: host operators that start in a step, GPU work attributed to one
(breakdowns.gpu_step_attribution). GPU work queued before profiling began is never counted (a previous,
unprofiled step's), nor, per step, work launched outside every step; both are reported as left out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnostics.trace.classify import host_op_mask
from diagnostics.trace.breakdowns import _assign_step, _records, gpu_step_attribution, steps
from diagnostics.trace.model import Trace
from diagnostics.trace.records.diff import DiffCounts, DiffLeftOut, DiffRow, TraceDiff

# A change smaller than this fraction of the before time counts as unchanged...
CHANGE_RATIO = 0.10
# ...and so does any change smaller than this many microseconds (timer noise).
NOISE_FLOOR_US = 1.0
STATUSES = ("added", "removed", "faster", "slower", "unchanged")


def _counted(trace: Trace, per_step: bool) -> tuple[np.ndarray, pd.DataFrame]:
    """The host operator mask and the GPU events compared (see the module docstring)."""
    m = host_op_mask(trace)
    g = gpu_step_attribution(trace)
    keep = g["attributed"] != "before_profiling"
    if per_step:
        keep &= g["step_i"] >= 0
        rows = np.flatnonzero(m)
        m = np.zeros_like(m)
        m[rows[_assign_step(trace.events["ts"].to_numpy()[rows], steps(trace)) >= 0]] = True
    return m, g[keep]


def left_out(trace: Trace, per_step: bool) -> DiffLeftOut:
    """GPU time the diff leaves out of ``trace``: queued before profiling, and (per step) launched outside
    every step, µs."""
    g = gpu_step_attribution(trace)
    dur = g["dur_us"].to_numpy()
    outside = float(dur[(g["attributed"] == "outside_steps").to_numpy()].sum()) if per_step else 0.0
    return DiffLeftOut(before_profiling_us=float(dur[(g["attributed"] == "before_profiling").to_numpy()].sum()),
                       outside_steps_us=outside)


def _table(trace: Trace, scale: float, per_step: bool) -> pd.DataFrame:
    m, g = _counted(trace, per_step)
    ops = pd.DataFrame({"name": trace.strings("name", m),
                        "time": trace.nesting()["self_us"][m], "kind": "cpu_op"})
    kern = pd.DataFrame({"name": g["name"], "time": g["dur_us"], "kind": "gpu"})
    both = pd.concat([ops, kern], ignore_index=True)
    agg = both.groupby(["kind", "name"]).agg(calls=("time", "size"), time_us=("time", "sum"))
    agg["calls"] = agg["calls"] / scale
    agg["time_us"] = agg["time_us"] / scale
    return agg


def diff_traces(before: Trace, after: Trace) -> TraceDiff:
    """Per operator/kernel: calls and time before/after, delta, ratio and status (STATUSES)."""
    n_a, n_b = len(steps(before)), len(steps(after))
    per_step = n_a > 0 and n_b > 0
    a = _table(before, n_a if per_step else 1.0, per_step)
    b = _table(after, n_b if per_step else 1.0, per_step)
    df = a.add_suffix("_before").join(b.add_suffix("_after"), how="outer").reset_index()
    df[["calls_before", "calls_after", "time_us_before", "time_us_after"]] = df[
        ["calls_before", "calls_after", "time_us_before", "time_us_after"]].fillna(0.0)
    keys = pd.MultiIndex.from_frame(df[["kind", "name"]])
    in_a, in_b = keys.isin(a.index), keys.isin(b.index)
    df["delta_us"] = df["time_us_after"] - df["time_us_before"]
    with np.errstate(divide="ignore", invalid="ignore"):
        df["ratio"] = np.where(df["time_us_before"] > 0,
                               df["time_us_after"] / df["time_us_before"], np.nan)
    big = (df["delta_us"].abs() >= NOISE_FLOOR_US) & \
        (df["delta_us"].abs() >= CHANGE_RATIO * df["time_us_before"])
    status = np.select(
        [~in_a, ~in_b, big & (df["delta_us"] < 0), big & (df["delta_us"] > 0)],
        ["added", "removed", "faster", "slower"], default="unchanged")
    df["status"] = status
    df = df.assign(_abs=df["delta_us"].abs()).sort_values(
        ["_abs", "name"], ascending=[False, True]).drop(columns="_abs")
    counts = DiffCounts(**{s: int((df["status"] == s).sum()) for s in STATUSES})
    cols = ["kind", "name", "status", "calls_before", "calls_after", "time_us_before",
            "time_us_after", "delta_us", "ratio"]
    return TraceDiff(
        unit="per step" if per_step else "whole trace", steps_before=n_a, steps_after=n_b,
        time_us_before=float(df["time_us_before"].sum()), time_us_after=float(df["time_us_after"].sum()),
        counts=counts, rows=tuple(DiffRow(**r) for r in _records(df[cols])),
        change_ratio=CHANGE_RATIO, noise_floor_us=NOISE_FLOOR_US,
        left_out_before=left_out(before, per_step), left_out_after=left_out(after, per_step))
