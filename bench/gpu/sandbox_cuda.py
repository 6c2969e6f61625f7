"""GPU check for issue #30: CUDA jobs run inside the sandbox's namespaces as they do without them.

The job's mount view shows only the granted paths (GPU device files, /sys, a /proc of its own), so
CUDA must find its driver, devices and /proc/driver/nvidia there. Runs a load check, a profile and
the memory analysis of the built-in MLP on cuda:0 in both confinement modes (namespaces, and
Landlock + seccomp alone), each as a fresh cold worker, and prints one line per job; exit code 0
when every job is ok and each ran in the mode it asked for.

    python bench/gpu/sandbox_cuda.py        # about a minute on an H100
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diagnostics import ModelSpec, sandbox  # noqa: E402
from diagnostics.runner import Job, run_job  # noqa: E402
from diagnostics.store import Store  # noqa: E402


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here")
        return 2
    print(f"sandbox: {sandbox.probe().describe()}; namespaces: {sandbox.namespace_support()}")
    store = Store(tempfile.mkdtemp(prefix="torchscope-gpu-sandbox-"))
    spec = ModelSpec(source="sample", name="mlp", device="cuda:0")
    failed = 0
    for mode in ("namespaces", "landlock-only"):
        os.environ["TORCHSCOPE_SANDBOX"] = "1"
        os.environ[sandbox.NAMESPACES_ENV] = "1" if mode == "namespaces" else "0"
        for analysis in ("validate", "profile", "memory"):
            out = run_job(Job(analysis, spec), store=store, timeout_s=300)
            log = (Path(out.artifact_dir) / "worker.log").read_text(errors="replace")
            line = next((ln for ln in log.splitlines() if ln.startswith("sandbox: ")), "sandbox: ?")
            in_ns = "namespaces (user" in line
            ok = out.ok and in_ns == (mode == "namespaces" and sandbox.namespace_support()[0])
            failed += not ok
            print(f"{mode:14} {analysis:9} {out.status:8} {out.duration_s:6.1f} s  {line[:110]}"
                  + ("" if out.ok else f"\n    error: {out.error}\n    log: {out.log_tail[-600:]}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
