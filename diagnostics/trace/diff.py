"""diff_traces(before, after): operators and kernels added, removed, faster, slower.

Host operators (cpu_op) are compared on self time, GPU kernels/memcpys/memsets on their time.
When both traces have ProfilerSteps, times are per step (so a longer capture is not "slower").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnostics.trace.classify import host_op_mask
from diagnostics.trace.breakdowns import _gpu_frame, _records, steps
from diagnostics.trace.model import Trace

# A change smaller than this fraction of the before time counts as unchanged...
CHANGE_RATIO = 0.10
# ...and so does any change smaller than this many microseconds (timer noise).
NOISE_FLOOR_US = 1.0
STATUSES = ("added", "removed", "faster", "slower", "unchanged")


def _table(trace: Trace, scale: float) -> pd.DataFrame:
    m = host_op_mask(trace)
    ops = pd.DataFrame({"name": trace.strings("name", m),
                        "time": trace.nesting()["self_us"][m], "kind": "cpu_op"})
    g = _gpu_frame(trace)
    kern = pd.DataFrame({"name": g["name"], "time": g["dur_us"], "kind": "gpu"})
    both = pd.concat([ops, kern], ignore_index=True)
    agg = both.groupby(["kind", "name"]).agg(calls=("time", "size"), time_us=("time", "sum"))
    agg["calls"] = agg["calls"] / scale
    agg["time_us"] = agg["time_us"] / scale
    return agg


def diff_traces(before: Trace, after: Trace) -> dict:
    """Per operator/kernel: calls and time before/after, delta, ratio and status (STATUSES)."""
    n_a, n_b = len(steps(before)), len(steps(after))
    per_step = n_a > 0 and n_b > 0
    a = _table(before, n_a if per_step else 1.0)
    b = _table(after, n_b if per_step else 1.0)
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
    counts = {s: int((df["status"] == s).sum()) for s in STATUSES}
    cols = ["kind", "name", "status", "calls_before", "calls_after", "time_us_before",
            "time_us_after", "delta_us", "ratio"]
    return {
        "unit": "per step" if per_step else "whole trace",
        "steps_before": n_a, "steps_after": n_b,
        "time_us_before": float(df["time_us_before"].sum()),
        "time_us_after": float(df["time_us_after"].sum()),
        "counts": counts,
        "rows": _records(df[cols]),
        "change_ratio": CHANGE_RATIO, "noise_floor_us": NOISE_FLOOR_US,
    }
