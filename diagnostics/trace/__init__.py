"""The trace layer: one Trace model of a Chrome/Kineto trace and everything read from it (no streamlit).

    trace = load_trace("run.pt.trace.json.gz")      # ingest.py: Trace (model.py), events as columns
    classify.py   what an event is: steps, categories, collectives, op families, Tensor Cores
    intervals.py  union / intersect / subtract / clip / length of time intervals
    breakdowns.py summary, temporal_breakdown, top_operators, idle_time, steps
    launches.py   launch_stats: launch delay, call duration, short kernels, graph launches
    timeline.py   timeline_data(trace, t0, t1): the one timeline
    profiler_tables.py  the profiler page's steps, device split, modules, kernels
    comm.py       one rank's computation / communication split and collectives
    gpu_activity.py kernel sequences, launch queue, copy bandwidth, GPU annotations, launch delay, overlap
    diff.py       diff_traces(before, after)
    cache.py      cached_load(path, root): parsed traces kept on disk, so an unchanged file reopens fast
    critical_path.py  one step's critical path (host ops, launches, kernels, syncs), what-ifs, the marked trace
    serving.py    an inference server's iterations (vLLM, SGLang): phases, batch, tokens, split, graph replays
The profiler page, the trace explorer, the distributed analysis and the checklist all read traces
through this layer. Views return their typed records (records/: one module per producer); the
several ranks' view (ranks/) plain data; TraceError says why a file is unusable.
"""

from diagnostics.trace.errors import TraceError

# The names below are imported on first use (PEP 562), not with the package: importing a record
# (records/, torch- and pandas-free) or the errors must not import pandas, which the views need
# (issue #42: the CLI's start-up, `--help` and the registry, read the trace records only).
_LAZY = {
    "idle_time": "breakdowns", "steps": "breakdowns", "summary": "overview",
    "temporal_breakdown": "breakdowns", "top_operators": "breakdowns",
    "launch_stats": "launches", "diff_traces": "diff", "load_trace": "ingest", "trace_files": "ingest",
    "timeline_data": "timeline", "Trace": "model",
}

#: The views of one trace by name (breakdowns.py's and launches.py's functions; imported on first use).
_VIEWS = ("summary", "temporal_breakdown", "top_operators", "idle_time", "launch_stats")


def __getattr__(name: str):
    import importlib

    if name == "ANALYSES":
        value = {v: __getattr__(v) for v in _VIEWS}
    elif name in _LAZY:
        value = getattr(importlib.import_module(f"diagnostics.trace.{_LAZY[name]}"), name)
    else:
        raise AttributeError(f"module 'diagnostics.trace' has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "ANALYSES", "Trace", "TraceError", "diff_traces", "idle_time", "launch_stats", "load_trace",
    "steps", "summary", "temporal_breakdown", "timeline_data", "top_operators", "trace_files",
]
