"""Profile a step function: ``profile_steps(step, n, device) -> Trace``.

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
