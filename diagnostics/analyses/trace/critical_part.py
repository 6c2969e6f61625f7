"""The trace analysis' critical-path part (issue #18): one step's critical path and what-ifs as the
result's "critical_path" key, and the step written out as a Chrome trace with the path marked.

Kept apart from job.py so that job.py only calls ``critical_path_result``, in the whole trace job and in
the trace_critical_path part (another step, from the kept columns). A trace the path cannot be computed
for (no profiler step ranges, a step too large) gets a CriticalPath with ``available`` False and the reason:
the rest of the trace analysis still stands.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import orjson

from diagnostics.errors import TorchScopeError
from diagnostics.trace.critical_path import UnknownStep, chrome_trace, critical_path, step_graph
from diagnostics.trace.errors import TraceError
from diagnostics.trace.records.critical_path import CriticalPath

#: The exported trace, beside the run's other artifacts.
EXPORT_FILE = "critical_path.pt.trace.json"


def critical_path_result(trace, options, artifact_dir: Path | None) -> CriticalPath:
    """``critical_path`` of the step the options name (``critical_path_step``; None: the longest)."""
    step = options["critical_path_step"]
    try:
        model = step_graph(trace, step)
        cp = critical_path(trace, model=model)
    except UnknownStep as e:
        raise TorchScopeError(f"option critical_path_step: {e}") from None
    except TraceError as e:
        return CriticalPath(available=False, reason=str(e))
    except Exception as e:  # noqa: BLE001  a fault here must not cost the rest of the trace analysis
        return CriticalPath(available=False,
                            reason=f"the critical path could not be computed ({type(e).__name__}: {e})")
    if artifact_dir is not None:
        path = Path(artifact_dir) / EXPORT_FILE
        doc = chrome_trace(trace, model)
        try:   # orjson: the step's marked trace is ~66k events on xDiT SD3.5, json.dumps took 0.5 s (issue #42)
            data = orjson.dumps(doc)
        except TypeError:   # an integer past 64 bits (a pid or tid a trace wrote so): json writes it
            data = json.dumps(doc).encode()
        path.write_bytes(data)
        cp = msgspec.structs.replace(cp, trace_file=str(path))
    return cp
