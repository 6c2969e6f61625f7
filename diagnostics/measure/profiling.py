"""Profile a step function: ``profile_steps(step, n, device) -> Trace``; and the one way an exported
profiler trace is given its rank (``with_rank_info``: the Profiler's single process and each torchrun rank).

The steps run under torch.profiler (CPU, and CUDA on a CUDA device), each inside a range named
as torch.profiler names its own steps (``classify.step_label``: ProfilerStep#0, #1, ...), and the
exported Chrome trace comes back loaded through the trace layer. Whatever reads it counts with
the trace layer's classifiers, and the step views find the steps. What runs between the steps
(``between``: by default a device synchronize, so each step's GPU work ends before the next one
starts) is outside every step range, so it is not counted as the steps' work.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import orjson
import torch

from diagnostics.trace import load_trace
from diagnostics.trace.classify import step_label
from diagnostics.trace.model import Trace


def profile_steps(step: Callable[[], object], steps: int, device: torch.device | str,
                  between: Callable[[], object] | None = None) -> Trace:
    """Run ``step`` ``steps`` times under torch.profiler, each call a marked step; the trace."""
    from torch.profiler import ProfilerActivity, profile, record_function

    device = torch.device(device)
    cuda = device.type == "cuda"
    if between is None:
        between = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(step_label(i)):
                step()
            between()
    with tempfile.TemporaryDirectory(prefix="torchscope-profile-") as folder:
        path = Path(folder) / "steps.pt.trace.json"
        prof.export_chrome_trace(str(path))
        return load_trace(path)


#: What a single process' exported trace says about ranks when the profiler wrote nothing (HTA needs a rank).
SINGLE_PROCESS = {"rank": 0, "world_size": 1, "backend": "none"}


def written_rank_info(data: bytes):
    """The ``distributedInfo`` an exported trace's bytes hold (whatever its type), or None; the document is
    parsed only when the key is in it."""
    if b'"distributedInfo"' not in data:
        return None
    doc = orjson.loads(data)
    return doc.get("distributedInfo") if isinstance(doc, dict) else None


def with_rank_info(data: bytes, info, rank: int = 0, world_size: int = 1, backend: str = "none") -> tuple[bytes, dict]:
    """(the exported trace ``data`` with a ``distributedInfo`` naming its rank, that distributedInfo).

    ``info``: the distributedInfo ``data`` holds (a loaded trace's ``meta``, or ``written_rank_info``).
    torch.profiler writes it itself (rank, world_size, backend...) when a process group exists: one
    that names a rank is kept as written, ``data`` unchanged. Otherwise ``rank``, ``world_size`` and
    ``backend`` are set in it (whatever else it holds kept): spliced in after the opening brace where
    it had none, so the file is not parsed a second time."""
    if isinstance(info, dict) and "rank" in info:
        return data, info
    new = {**(info if isinstance(info, dict) else {}), "rank": rank, "world_size": world_size, "backend": backend}
    head = data.lstrip()
    if info is None and head[:1] == b"{" and head[1:].lstrip()[:1] not in (b"}", b""):  # a comma follows
        return b'{"distributedInfo": ' + orjson.dumps(new) + b"," + head[1:], new
    doc = orjson.loads(data)
    doc["distributedInfo"] = new
    return orjson.dumps(doc), new
