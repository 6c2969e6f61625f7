"""Chrome/Kineto trace explorer engine: load_trace, analyses, timeline and diff (no streamlit).

    trace = load_trace("run.pt.trace.json.gz")      # Trace: events DataFrame + metadata
    summary(trace); temporal_breakdown(trace); top_operators(trace, n=20)
    idle_time(trace); launch_stats(trace, n=20); timeline_data(trace, t0, t1)
    diff_traces(before, after)
Every analysis returns plain JSON-able data (records); TraceError says why a file is unusable.
"""

from diagnostics.trace.views import (
    ANALYSES, idle_time, launch_stats, steps, summary, temporal_breakdown, top_operators,
)
from diagnostics.trace.diff import diff_traces
from diagnostics.trace.errors import TraceError
from diagnostics.trace.ingest import load_trace, trace_files
from diagnostics.trace.timeline import timeline_data
from diagnostics.trace.model import Trace

__all__ = [
    "ANALYSES", "Trace", "TraceError", "diff_traces", "idle_time", "launch_stats", "load_trace",
    "steps", "summary", "temporal_breakdown", "timeline_data", "top_operators", "trace_files",
]
