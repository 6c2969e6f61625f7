"""Small pages for the trace layer's big arrays (issue #42).

numpy asks the kernel for transparent huge pages (madvise MADV_HUGEPAGE) on every array of 4 MB or more.
Where the kernel's THP defrag setting is "madvise" (a common default), a fault in such an array may wait
for the kernel to compact memory into a free 2 MB page. The trace layer makes dozens of fresh arrays of
tens of MB on a big trace (the columns joined after the parse, the nesting's sorts): on this project's
2-core VM that waiting took 0.4-0.9 s of the 1 GB trace's first answer, against 0.2 s with small pages
(docs/BENCHMARKS.md, "Trace first answer"). small_pages() turns numpy's request off for a block and puts
back what was there after. It changes how memory is mapped, never a value.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


def _switch():
    """numpy's process-wide setter (private: numpy._core.multiarray in numpy 2, numpy.core in 1), or None."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            mod = __import__(name, fromlist=["_set_madvise_hugepage"])
        except ImportError:
            continue
        return getattr(mod, "_set_madvise_hugepage", None)
    return None


_lock = threading.Lock()
_inside = 0        # blocks open now, in any thread
_before = None     # numpy's setting when the first of them opened


@contextmanager
def small_pages() -> Iterator[None]:
    """numpy's large arrays made without the huge-page request while the block runs. The setting is the
    process': a thread beside the block gets small pages too (only its speed can change), and blocks open in
    several threads at once (a Dask worker's tasks) put the setting back when the last of them ends."""
    global _inside, _before
    switch = _switch()
    if switch is None:
        yield
        return
    with _lock:
        if _inside == 0:
            _before = switch(False)
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                switch(_before)
