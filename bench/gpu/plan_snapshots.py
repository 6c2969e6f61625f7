"""Memory snapshots of the plan's GPU cases, to see what the prediction misses on a real GPU.

    python bench/gpu/plan_snapshots.py OUT_DIR [CASE ...]

For each case of bench/gpu/plan_cuda.py (by index; default 0 3 5 6): the measured training step
(analyses/plan/measured.py, the Memory analysis' protocol) runs under
``torch.cuda.memory._record_memory_history`` and the allocator's snapshot is written to
OUT_DIR/snap-<index>.pickle (open it at pytorch.org/memory_viz, or read it with pickle: its
``device_traces`` hold every alloc / free with its Python stack). Also prints the step's
max_memory_allocated and the allocator's counters. Needs torch with CUDA.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plan_cuda  # noqa: E402  (the cases and the trace-package shim)


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    picks = [int(a) for a in sys.argv[2:]] or [0, 3, 5, 6]
    plan_cuda._trace_package_without_its_views()
    import torch

    from diagnostics.analyses.plan.configs import Config, Setting
    from diagnostics.analyses.plan.measured import measured_peak
    from diagnostics.intake import load_model

    for i in picks:
        model, batch, seq, setting = plan_cuda.CASES[i]
        config = Config(batch, seq, Setting(**setting))
        loaded = load_model(plan_cuda.spec_of(model, batch, seq, "cuda"))
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=400_000)
        try:
            m = measured_peak(loaded, config)
            snap = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        stats = torch.cuda.memory_stats()
        keys = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "requested_bytes.all.peak",
                "allocation.all.peak", "num_alloc_retries")
        print(i, model, batch, seq, setting, m, {k: stats.get(k) for k in keys}, flush=True)
        with open(out / f"snap-{i}.pickle", "wb") as f:
            pickle.dump(snap, f)
        del loaded
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
