"""Worker processes that never run the parent's main script again.

multiprocessing's spawn and forkserver start a worker by running the parent's ``__main__`` file again
when it has one (a script, not a ``-m`` module). Inside Streamlit's script runner or an AppTest that file
is a page script (an AppTest's does not even run outside it: every worker died at start and the pool
replaced it forever). Trace workers need nothing from ``__main__``: while they start, ``plain_main()``
shows them an empty one. Stdlib only (the trace layer needs no torch)."""

from __future__ import annotations

import contextlib
import sys
import types


@contextlib.contextmanager
def plain_main():
    """Within the block, processes started by spawn / forkserver do not re-run the main script."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None or not getattr(main, "__file__", None):
        yield  # `python -m ...` (workers import the module by name) or no file: nothing is re-run
        return
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main
