"""The reduce of the multi-rank analysis: the ranks' summaries (summary.rank_summary) -> cross-rank views.

Nothing here reads a trace: every figure comes from the summaries, so reducing 500 ranks costs what
their collectives and steps cost, never their events.

* **Clock**: every rank's times are put on one clock, the earliest rank's first event (each summary
  carries the wall clock of its own first event). Ranks of one host share a clock; ranks of several
  hosts (their traces' ``host_name`` differ) may not, and a trace that names no host is taken to
  have a clock of its own. So each clock's offset is estimated from the collectives' ends (a
  blocking collective ends at about the same moment on every rank: the last one to arrive lets them
  all go) and taken off: ``clock``.
* **Collectives**: the same collective on every rank (summary's key: sequence number or order).
  Per collective its arrival skew (last arrival - first), the last rank to arrive, the transfer time
  (the shortest duration across ranks: the last to arrive waits for nobody, so its time is the
  transfer), the bus bandwidth (bytes / transfer time x the nccl-tests factor of its family and
  group size).
* **Who waits for whom**: in each collective every rank waits for the last one to arrive, for the
  difference of their arrivals. Summed per (waiting rank, rank waited for), and per rank.
* **Stragglers**: a rank whose median lateness (its arrival - the median arrival of the collective)
  is above the others' by more than max(STRAGGLER_MIN_LATE_US, STRAGGLER_SPREAD x their spread).
* **Late collectives**: one rank arriving at one collective much later than it usually does: its
  lateness there less its own median lateness is over max(LATE_MIN_US, LATE_SPREAD x the spread of
  that excess over all ranks and collectives). A straggler is late everywhere, a late collective once.
* **Heat map**: step time per rank and profiler step (steps binned to HEATMAP_MAX_STEPS columns).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: A rank is a straggler when its median lateness is over the ranks' median by more than this (µs) ...
STRAGGLER_MIN_LATE_US = 200.0
#: ... and more than this many times the ranks' spread (median absolute deviation of their lateness).
STRAGGLER_SPREAD = 6.0
#: A rank's arrival at one collective is late when it exceeds its own median lateness by more than this
#: (µs) ...
LATE_MIN_US = 1000.0
#: ... and more than this many times the spread of that excess over all ranks and collectives.
LATE_SPREAD = 10.0
#: Late collectives and widest-skew collectives listed, at most; waiting pairs listed, at most.
LIST_ROWS = 20
#: Heat map columns at most: more profiler steps are binned (mean step time per bin).
HEATMAP_MAX_STEPS = 300
#: nccl-tests' bus bandwidth factor per family: bus bandwidth = algorithm bandwidth x factor(n).
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0}


def _mad(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(np.abs(x - np.median(x)))) if x.size else 0.0


def _f(v) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


def collective_frame(rows: list[dict]) -> pd.DataFrame:
    """Every rank's collectives in one frame: rank, key, name, family, step, start (µs on the job's
    clock, before any host offset), dur, end, bytes, group_size, host."""
    zero = min(r["clock"]["origin_ns"] for r in rows)
    parts = []
    for r in rows:
        c = r["collectives"]
        if not c["key"]:
            continue
        offset = (r["clock"]["origin_ns"] - zero) / 1e3
        start = np.asarray(c["start_us"], dtype=float) + offset
        dur = np.asarray(c["dur_us"], dtype=float)
        parts.append(pd.DataFrame({"rank": r["rank"], "key": c["key"], "name": c["name"], "family": c["family"],
                                   "step": np.asarray(c["step"], dtype=np.int64), "start": start, "dur": dur,
                                   "end": start + dur, "bytes": np.asarray(c["bytes"], dtype=np.int64),
                                   "group_size": np.asarray(c["group_size"], dtype=np.int64), "host": r["host"]}))
    if not parts:
        return pd.DataFrame(columns=["rank", "key", "name", "family", "step", "start", "dur", "end", "bytes",
                                     "group_size", "host"])
    return pd.concat(parts, ignore_index=True)


def clock_group(row: dict) -> str:
    """The clock a rank's times are on: its host's, or its own when its trace names no host."""
    return row.get("host_name") or f"rank {row['rank']}"


def align_hosts(df: pd.DataFrame, rows: list[dict]) -> dict:
    """Each clock's offset (µs; a host's, or a rank's that names no host), estimated from the collectives'
    ends and taken off ``df``'s times in place; {"aligned": how, "offsets_us": {clock: offset}}."""
    hosts = sorted({r["host"] for r in rows})
    if len(hosts) < 2:
        return {"aligned": f"one clock (every rank's trace names host {hosts[0]})", "offsets_us": {}}
    if df.empty:
        return {"aligned": "not aligned (no collective to align on)", "offsets_us": {}}
    n = df.groupby("key")["rank"].transform("size")
    full = df[n == n.max()]
    dev = full["end"] - full.groupby("key")["end"].transform("median")
    per_host = dev.groupby(full["host"]).median()
    ref = per_host.get(rows[0]["host"], 0.0)
    offsets = {h: float(per_host.get(h, ref) - ref) for h in hosts}
    shift = df["host"].map(offsets).to_numpy(dtype=float)
    df["start"] -= shift
    df["end"] -= shift
    named = all(r.get("host_name") for r in rows)
    return {"aligned": "by the collectives' ends, one offset per " + ("host" if named else "host (a rank whose trace "
                                                                                        "names none: its own)"),
            "offsets_us": offsets}


def collectives_view(df: pd.DataFrame, world: int | None, n_ranks: int) -> tuple[dict, pd.DataFrame]:
    """Per collective (key): arrivals, skew, transfer time, bandwidth; and the per-(rank, collective)
    frame with each arrival's lateness and wait (for stragglers and who waits for whom)."""
    if df.empty:
        return {"matched": 0, "partial": 0, "by_name": [], "widest": [], "by_step": []}, df
    g = df.groupby("key", sort=False)
    per = pd.DataFrame({
        "name": g["name"].first(), "family": g["family"].first(), "step": g["step"].min(),
        "ranks": g["rank"].size(), "first_us": g["start"].min(), "last_us": g["start"].max(),
        "median_arrival_us": g["start"].median(), "transfer_us": g["dur"].min(), "max_dur_us": g["dur"].max(),
        "bytes": g["bytes"].max(), "group_size": g["group_size"].max()})
    last_idx = df.loc[df.groupby("key", sort=False)["start"].idxmax()]
    first_idx = df.loc[df.groupby("key", sort=False)["start"].idxmin()]
    per["last_rank"] = last_idx.set_index("key")["rank"]
    per["first_rank"] = first_idx.set_index("key")["rank"]
    per["skew_us"] = per["last_us"] - per["first_us"]
    size = np.where(per["group_size"] > 0, per["group_size"], world or 0)
    size = np.where(size > 0, size, per["ranks"])
    per["group_n"] = size
    factor = np.array([BUS_FACTOR[f](n) if f in BUS_FACTOR and n > 0 else np.nan
                       for f, n in zip(per["family"], size)])
    ok = (per["bytes"] > 0) & (per["transfer_us"] > 0)
    per["algbw"] = np.where(ok, per["bytes"] / (per["transfer_us"].where(ok, 1.0) * 1e-6), np.nan)
    per["busbw"] = per["algbw"] * factor
    full = per["ranks"] == n_ranks
    # per (rank, collective): lateness against the collective's median arrival, wait for its last arrival
    df = df.join(per[["median_arrival_us", "last_us", "last_rank"]], on="key")
    df["late_us"] = df["start"] - df["median_arrival_us"]
    df["wait_us"] = df["last_us"] - df["start"]
    by_name = []
    for (name, fam), sub in per.groupby(["name", "family"], sort=True):
        bw = sub["busbw"].dropna()
        by_name.append({"name": name, "family": fam, "collectives": int(len(sub)),
                        "skew_us_median": float(sub["skew_us"].median()), "skew_us_max": float(sub["skew_us"].max()),
                        "transfer_us_median": float(sub["transfer_us"].median()),
                        "bytes_median": _f(sub["bytes"].where(sub["bytes"] > 0).median()),
                        "bytes_total": int(sub["bytes"].clip(lower=0).sum()),
                        "busbw_median": _f(bw.median()) if len(bw) else None})
    widest = per.sort_values("skew_us", ascending=False).head(LIST_ROWS)
    by_step = per[per["step"] >= 0].groupby("step").agg(
        collectives=("skew_us", "size"), skew_us_max=("skew_us", "max"), skew_us_median=("skew_us", "median"),
        transfer_us=("transfer_us", "sum")).reset_index()
    view = {"matched": int(full.sum()), "partial": int((~full).sum()),
            "by_name": by_name, "widest": _rows(widest.reset_index(), _COLL_COLUMNS),
            "by_step": _rows(by_step, ("step", "collectives", "skew_us_max", "skew_us_median", "transfer_us"))}
    return view, df


_COLL_COLUMNS = ("key", "name", "family", "step", "ranks", "skew_us", "first_rank", "last_rank", "transfer_us",
                 "max_dur_us", "bytes", "group_n", "algbw", "busbw")


def _rows(df: pd.DataFrame, cols) -> list[dict]:
    out = []
    for rec in df[list(cols)].to_dict("records"):
        row = {}
        for k, v in rec.items():
            if isinstance(v, (np.integer,)):
                v = int(v)
            elif isinstance(v, (float, np.floating)):
                v = _f(v)
            row[k] = v
        out.append(row)
    return out


def lateness(df: pd.DataFrame, ranks: list[int]) -> dict:
    """Per rank: median lateness, collectives arrived at last, time waited and time others waited for
    it; the stragglers; the late collectives; who waits for whom."""
    if df.empty:
        return {"per_rank": {}, "stragglers": [], "late_collectives": [], "waits": [],
                "thresholds": {}}
    late = df.groupby("rank")["late_us"].median()
    last_counts = df[df["rank"] == df["last_rank"]].groupby("rank").size()
    waited = df.groupby("rank")["wait_us"].sum()
    # who waits for whom: every rank's wait in a collective is for the one that arrived last there
    others = df[df["rank"] != df["last_rank"]]
    pairs = others.groupby(["rank", "last_rank"]).agg(us=("wait_us", "sum"), collectives=("wait_us", "size"))
    pairs = pairs.reset_index().sort_values("us", ascending=False)
    caused = others.groupby("last_rank")["wait_us"].sum() / max(1, len(ranks) - 1)
    lv = np.array([late.get(r, np.nan) for r in ranks], dtype=float)
    center = float(np.nanmedian(lv)) if np.isfinite(lv).any() else 0.0
    spread = _mad(lv)
    limit = max(STRAGGLER_MIN_LATE_US, STRAGGLER_SPREAD * spread)
    stragglers = sorted(({"rank": int(r), "late_us_median": float(late[r]), "over_us": float(late[r] - center)}
                         for r in late.index if late[r] - center > limit), key=lambda s: -s["late_us_median"])
    excess = df["late_us"] - df["rank"].map(late)
    ex_limit = max(LATE_MIN_US, LATE_SPREAD * _mad(excess.to_numpy()))
    late_rows = df.assign(excess_us=excess)[excess > ex_limit].sort_values("excess_us", ascending=False)
    late_rows = late_rows.head(LIST_ROWS)
    late_list = [{"key": r.key, "name": r.name, "step": int(r.step), "rank": int(r.rank),
                  "late_us": float(r.late_us), "excess_us": float(r.excess_us),
                  "rank_late_us_median": float(late[r.rank])} for r in late_rows.itertuples()]
    per_rank = {int(r): {"late_us_median": _f(late.get(r)), "arrived_last": int(last_counts.get(r, 0)),
                         "waited_ms": float(waited.get(r, 0.0)) / 1e3, "caused_wait_ms": float(caused.get(r, 0.0)) / 1e3}
                for r in ranks}
    waits = [{"rank": int(p.rank), "waited_for": int(p.last_rank), "ms": float(p.us) / 1e3,
              "collectives": int(p.collectives)} for p in pairs.head(LIST_ROWS).itertuples()]
    return {"per_rank": per_rank, "stragglers": stragglers, "late_collectives": late_list, "waits": waits,
            "thresholds": {"straggler_limit_us": limit, "ranks_late_us_median": center, "ranks_spread_us": spread,
                           "late_limit_us": ex_limit}}


def heatmap(rows: list[dict]) -> dict:
    """Step time (ms) per rank (rows, in rank order) and profiler step (columns); ``None`` where a rank
    has no such step. More than HEATMAP_MAX_STEPS steps: consecutive steps binned (their mean)."""
    numbers = sorted({s for r in rows for s in r["step_series"]["step"]})
    if not numbers:
        return {"ranks": [], "steps": [], "step_ms": [], "binned": 1}
    col = {s: i for i, s in enumerate(numbers)}
    grid = np.full((len(rows), len(numbers)), np.nan)
    for i, r in enumerate(rows):
        st = r["step_series"]
        grid[i, [col[s] for s in st["step"]]] = np.asarray(st["dur_us"], dtype=float) / 1e3
    per = max(1, -(-len(numbers) // HEATMAP_MAX_STEPS))
    if per > 1:
        n = -(-len(numbers) // per)
        padded = np.full((len(rows), n * per), np.nan)
        padded[:, :len(numbers)] = grid
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                grid = np.nanmean(padded.reshape(len(rows), n, per), axis=2)
        labels = [numbers[i * per] for i in range(n)]
    else:
        labels = numbers
    return {"ranks": [r["rank"] for r in rows], "steps": labels,
            "step_ms": [[_f(v) for v in line] for line in grid], "binned": per}


def workers(rows: list[dict]) -> list[dict]:
    """Per worker process that ran summaries: ranks, seconds, peak RSS (its high-water mark)."""
    out: dict = {}
    for r in rows:
        w = r.get("worker") or {}
        key = f"{w.get('host')}:{w.get('pid')}"
        cur = out.setdefault(key, {"worker": key, "ranks": 0, "seconds": 0.0, "peak_rss_bytes": 0})
        cur["ranks"] += 1
        cur["seconds"] += float(w.get("seconds") or 0.0)
        cur["peak_rss_bytes"] = max(cur["peak_rss_bytes"], int(w.get("peak_rss_bytes") or 0))
    return sorted(out.values(), key=lambda w: w["worker"])
