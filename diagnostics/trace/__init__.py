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

from diagnostics.trace.breakdowns import idle_time, steps, summary, temporal_breakdown, top_operators
from diagnostics.trace.launches import launch_stats
from diagnostics.trace.diff import diff_traces
from diagnostics.trace.errors import TraceError
from diagnostics.trace.ingest import load_trace, trace_files
from diagnostics.trace.timeline import timeline_data
from diagnostics.trace.model import Trace

#: The views of one trace by name.
ANALYSES = {
    "summary": summary,
    "temporal_breakdown": temporal_breakdown,
    "top_operators": top_operators,
    "idle_time": idle_time,
    "launch_stats": launch_stats,
}

__all__ = [
    "ANALYSES", "Trace", "TraceError", "diff_traces", "idle_time", "launch_stats", "load_trace",
    "steps", "summary", "temporal_breakdown", "timeline_data", "top_operators", "trace_files",
]
