"""A user dataset module (a Python file defining ``build_dataset()``) and a DataLoader timer.

Executing a user's file is refused in server-safe mode, like Python-file models.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import uuid
from pathlib import Path

from diagnostics.errors import ModelLoadError, TrustError
from diagnostics.intake import safe_mode


def load_dataset(path: str):
    """Import ``path`` and return ``build_dataset()``; errors name the problem."""
    if safe_mode():
        raise TrustError("dataset modules (Python files) are disabled on this server (server-safe mode)")
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"dataset file not found: {p.name}")
    name = f"torchscope_dataset_{uuid.uuid4().hex[:8]}"
    try:
        spec = importlib.util.spec_from_file_location(name, p)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ModelLoadError(f"{p.name} has a syntax error at line {e.lineno}: {e.msg}") from e
    except Exception as e:
        raise ModelLoadError(f"{p.name} raised while being imported: {type(e).__name__}: {e}") from e
    if not callable(getattr(module, "build_dataset", None)):
        raise ModelLoadError(f"{p.name} defines no build_dataset() function returning a torch Dataset")
    try:
        ds = module.build_dataset()
    except Exception as e:
        raise ModelLoadError(f"build_dataset() in {p.name} raised: {type(e).__name__}: {e}") from e
    if not hasattr(ds, "__getitem__") and not hasattr(ds, "__iter__"):
        raise ModelLoadError(f"build_dataset() in {p.name} returned {type(ds).__name__}, not a Dataset")
    return ds


def _loader(dataset, desc: dict, workers: int):
    from torch.utils.data import DataLoader

    kw = {"batch_size": int(desc.get("batch_size") or 1), "num_workers": workers,
          "pin_memory": bool(desc.get("pin_memory"))}
    if workers > 0:
        if desc.get("prefetch_factor"):
            kw["prefetch_factor"] = int(desc["prefetch_factor"])
        kw["persistent_workers"] = bool(desc.get("persistent_workers"))
    return DataLoader(dataset, **kw)


def time_loader(dataset, desc: dict, batches: int = 5) -> tuple[float | None, str | None]:
    """Median seconds to fetch one batch (after the first, which pays the start-up), and a note."""
    workers = int(desc.get("num_workers") or 0)
    return _time(_loader(dataset, desc, workers), batches), None


def _time(loader, batches: int) -> float | None:
    import statistics

    it = iter(loader)
    times = []
    for i in range(batches + 1):
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        if i:  # the first batch pays worker start-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else None
