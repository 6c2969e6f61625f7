"""overview.summary, the first answer (issue #42), against the pandas Summary it replaced.

The reference below is breakdowns.summary as it was before #42's numpy Summary (its group-bys, the GPU
frame's kinds, devices and streams, pandas' sorts), run on the trace's DataFrame (Trace.events): the same
record, field by field, with every number equal to the last digit (no sum is reordered: the per-category
and per-thread sums are the same bincounts, the stream busy times the same interval unions), on every trace
of tests/data/traces (the public corpus and ours). And the Summary is computed from the columns alone: the
trace's DataFrame is not made, pandas not imported.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diagnostics.trace import intervals as iv
from diagnostics.trace.breakdowns import _records  # the pandas rows -> plain records step of the reference
from diagnostics.trace.classify import (
    FRAME_CATS, MEMCPY_CATS, MEMSET_CATS, MTIA_CATS, MTIA_DMA_RE, STEP_RE, comm_mask, gpu_work_mask, host_mask,
    step_mask,
)
from diagnostics.trace.errors import TraceError
from diagnostics.trace.ingest import load_trace
from diagnostics.trace.overview import summary
from diagnostics.trace.records.breakdowns import Category, MemoryPeak, Step, Stream, Thread, TraceSummary

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
TRACES = sorted(str(p.relative_to(DATA)) for p in (DATA / "traces").rglob("*")
                if p.name.endswith((".json", ".json.gz")) and p.name != "hta_reference.json")


# ---- the reference: the pandas Summary before #42 (breakdowns.summary at e131b72) ------------------

def _ref_steps(trace) -> pd.DataFrame:
    ev = trace.events
    rows = np.flatnonzero(step_mask(trace))
    df = pd.DataFrame({"row": rows, "name": ev["name"].astype(object).to_numpy()[rows],
                       "start_us": ev["ts"].to_numpy()[rows], "dur_us": ev["dur"].to_numpy()[rows]})
    df["step"] = df["name"].str.extract(STEP_RE, expand=False).astype(int)
    df = df.sort_values(["step", "dur_us"], ascending=[True, False]).drop_duplicates("step")
    return df.sort_values("start_us").reset_index(drop=True)[["step", "name", "start_us", "dur_us"]]


def _ref_gpu(trace) -> pd.DataFrame:
    ev = trace.events
    rows = np.flatnonzero(gpu_work_mask(trace))
    cat = ev["cat"].astype(object).str.lower().to_numpy()[rows]
    names = ev["name"].astype(object).to_numpy()[rows]
    kind = np.full(rows.size, "compute", dtype=object)
    kind[np.isin(cat, list(MEMCPY_CATS))] = "memcpy"
    kind[np.isin(cat, list(MEMSET_CATS))] = "memset"
    kind[np.isin(cat, list(MTIA_CATS)) & np.array([bool(MTIA_DMA_RE.search(str(n))) for n in names], dtype=bool)] = \
        "memcpy"
    kind[comm_mask(trace)[rows]] = "communication"
    pid, tid = ev["pid"].astype(object).to_numpy()[rows], ev["tid"].astype(object).to_numpy()[rows]
    device, stream = ev["device"].to_numpy()[rows], ev["stream"].to_numpy()[rows]
    g = pd.DataFrame({"kind": kind, "start_us": ev["ts"].to_numpy()[rows], "dur_us": ev["dur"].to_numpy()[rows],
                      "device": np.where(device >= 0, device.astype(str), pid),
                      "stream": np.where(stream >= 0, stream.astype(str), tid)})
    g["end_us"] = g["start_us"] + g["dur_us"]
    return g.sort_values("start_us", kind="stable").reset_index(drop=True)


def _ref_categories(trace) -> pd.DataFrame:
    complete, dur = trace.complete_mask(), trace.events["dur"].to_numpy()
    cat = trace.events["cat"].cat
    cat_codes = cat.codes.to_numpy().astype(np.int64)
    all_labels = np.array([str(c) for c in cat.categories] + [""], dtype=object)
    n_cat = len(all_labels)
    slot = np.where(cat_codes >= 0, cat_codes, n_cat - 1)
    count = np.bincount(slot, minlength=n_cat)
    total = np.bincount(slot, weights=np.where(complete, dur, 0.0), minlength=n_cat)
    labels = np.where(all_labels == "", "(none)", all_labels)
    seen = np.flatnonzero(count)
    by_cat = pd.DataFrame({"cat": labels[seen], "events": count[seen], "total_us": total[seen]})
    by_cat = by_cat.groupby("cat", observed=True).agg(events=("events", "sum"), total_us=("total_us", "sum"))
    return by_cat.sort_values("events", ascending=False).reset_index()


def _ref_threads(trace) -> pd.DataFrame:
    ts = trace.events["ts"].to_numpy()
    nest = trace.nesting()
    cpu = host_mask(trace)
    roots = cpu & (nest["parent"] < 0)
    pid_c = trace.events["pid"].cat.codes.to_numpy().astype(np.int64)
    tid_c = trace.events["tid"].cat.codes.to_numpy().astype(np.int64)
    lane = ((pid_c << 32) | tid_c)[cpu]
    uniq, inv = np.unique(lane, return_inverse=True)
    pid_l = np.array([str(c) for c in trace.events["pid"].cat.categories] + [""], dtype=object)
    tid_l = np.array([str(c) for c in trace.events["tid"].cat.categories] + [""], dtype=object)
    threads = pd.DataFrame({"pid": pid_l[(uniq >> 32).astype(np.int64)],
                            "tid": tid_l[(uniq & 0xFFFFFFFF).astype(np.int64)],
                            "events": np.bincount(inv.ravel(), minlength=uniq.size),
                            "busy_us": np.bincount(inv.ravel(), weights=np.where(roots, nest["end_us"] - ts, 0.0)[cpu],
                                                   minlength=uniq.size)})
    threads = threads.groupby(["pid", "tid"]).agg(events=("events", "sum"), busy_us=("busy_us", "sum")).reset_index()
    threads["name"] = [trace.thread_names.get(f"{p}/{t}", "") for p, t in zip(threads["pid"], threads["tid"])]
    return threads[["pid", "tid", "name", "events", "busy_us"]]


def _ref_streams(g: pd.DataFrame) -> list:
    out = []
    for (device, stream), sub in g.groupby(["device", "stream"]):
        counts = sub["kind"].value_counts()
        out.append({"device": device, "stream": stream,
                    "kernels": int(counts.get("compute", 0) + counts.get("communication", 0)),
                    "memcpy": int(counts.get("memcpy", 0)), "memset": int(counts.get("memset", 0)),
                    "busy_us": iv.length(iv.union(sub["start_us"].to_numpy(), sub["end_us"].to_numpy()))})
    return out


def _ref_memory(trace) -> list:
    ev = trace.events
    mem = ev["total_allocated"].to_numpy() >= 0
    out = []
    if mem.any():
        mdf = pd.DataFrame({"device_type": ev["device_type"].to_numpy()[mem], "device": ev["device"].to_numpy()[mem],
                            "alloc": ev["total_allocated"].to_numpy()[mem]})
        for (dt, dv), sub in mdf.groupby(["device_type", "device"]):
            out.append({"device": ("cpu" if dt == 0 else "cuda" if dt == 1 else f"type {dt}") + ("" if dv < 0 else f":{dv}"),
                        "peak_allocated_bytes": int(sub["alloc"].max())})
    return out


def reference_summary(trace) -> TraceSummary:
    ev = trace.events
    timed = trace.complete_mask() & ~trace.cat_mask(FRAME_CATS)
    ts, dur = ev["ts"].to_numpy(), ev["dur"].to_numpy()
    start = float(ts[timed].min()) if timed.any() else 0.0
    end = float((ts + dur)[timed].max()) if timed.any() else 0.0
    g = _ref_gpu(trace)
    st = _ref_steps(trace)
    notes = []
    if trace.cat_mask(MTIA_CATS).any():
        notes.append("MTIA trace: its device events (mtia_ccp_events) are read as kernels (DMA ones as "
                     "copies) and mtia_runtime events as runtime calls; \"GPU\" below means the MTIA device")
    return TraceSummary(
        source=trace.source, bytes=trace.n_bytes, events=len(ev), duration_us=end - start, rank=trace.rank,
        schema_version=trace.meta.get("schemaVersion"), base_time_ns=trace.meta.get("baseTimeNanoseconds"),
        has_gpu=bool(len(g)), n_steps=len(st),
        steps=tuple(Step(**r) for r in _records(st)),
        categories=tuple(Category(**r) for r in _records(_ref_categories(trace))),
        threads=tuple(Thread(**r) for r in _records(_ref_threads(trace))),
        streams=tuple(Stream(**r) for r in _ref_streams(g)),
        memory=tuple(MemoryPeak(**r) for r in _ref_memory(trace)),
        skipped_events=trace.skipped_events, warnings=tuple(trace.warnings), notes=tuple(notes))


# ---- the tests ---------------------------------------------------------------------------------------

def test_the_corpus_is_all_there():
    """29 traces when this was written (the public corpus, with_stack and ours): the test below runs on each."""
    assert len(TRACES) >= 29 and any("ns_resolution" in t for t in TRACES) and any("with_stack" in t for t in TRACES)


@pytest.mark.parametrize("rel", TRACES)
def test_the_numpy_summary_equals_the_pandas_one(rel):
    try:
        trace = load_trace(DATA / rel)
    except TraceError as e:   # a trace the ingest refuses has no Summary either way
        pytest.skip(f"not a readable trace: {e}")
    ours = summary(trace)
    assert trace._frame is None, "the Summary made the trace's DataFrame"
    ref = reference_summary(trace)
    for f in TraceSummary.__struct_fields__:   # field by field first: a failure names the field
        assert getattr(ours, f) == getattr(ref, f), f
    assert ours == ref
    # the numbers themselves, not a float near them, and never NaN (records hold None for that)
    for a, b in zip(ours.threads + ours.streams + ours.categories, ref.threads + ref.streams + ref.categories):
        assert repr(a) == repr(b)


def test_the_summary_is_not_empty_on_a_gpu_trace():
    """The comparison is not vacuous: a GPU trace's Summary has steps, streams, threads and categories with time."""
    s = summary(load_trace(DATA / "traces" / "public" / "hta" / "ns_resolution_rank0.json.gz"))
    assert s.n_steps == 5 and s.has_gpu and s.streams and s.threads and s.categories
    assert sum(c.events for c in s.categories) == s.events
    assert all(st.busy_us > 0 for st in s.streams)


def test_the_summary_imports_no_pandas():
    """In a fresh interpreter: load a trace and compute its Summary; neither pandas nor pyarrow, plotly or torch
    is imported (issue #42: the first answer does not pay for them)."""
    code = ("import sys; from diagnostics.trace.ingest import load_trace; from diagnostics.trace.overview import "
            f"summary; s = summary(load_trace({str(DATA / 'traces' / 'gpu_small.json')!r})); assert s.streams; "
            "print(sorted(m for m in ('pandas', 'pyarrow', 'plotly', 'torch') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-800:]
    assert p.stdout.strip() == "[]"


def test_the_dataframe_is_made_on_first_use_from_the_same_columns():
    trace = load_trace(DATA / "traces" / "gpu_small.json")
    assert trace._frame is None
    ev = trace.events
    assert trace.events is ev   # made once
    assert list(ev.columns) == list(trace.columns)
    for col in ("ts", "dur", "corr", "stream"):
        assert np.array_equal(ev[col].to_numpy(), trace.column(col), equal_nan=True)
    for col in ("name", "cat", "pid"):
        assert list(ev[col].astype(object).fillna("").to_numpy()) == list(trace.strings(col))
