"""A user dataset module (a Python file defining ``build_dataset()``) and a DataLoader timer.

Executing a user's file is refused in server-safe mode, like Python-file models.
"""

from __future__ import annotations

import time
from pathlib import Path

from diagnostics.errors import ModelLoadError
from diagnostics.intake import import_user_file


def load_dataset(path: str):
    """Import ``path`` and return ``build_dataset()``; errors name the problem."""
    p = Path(path)
    module = import_user_file(p, "dataset modules (Python files)", missing="dataset file not found")
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
    try:
        return _time(_loader(dataset, desc, workers), batches), None
    except Exception as e:  # the user's Dataset in loader workers: anything can go wrong there
        if workers == 0:
            raise
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return _time(_loader(dataset, desc, 0), batches), (
        f"with num_workers={workers} the DataLoader failed ({why}); the time is measured with num_workers=0")


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
