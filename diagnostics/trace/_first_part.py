"""A helper process of load_trace(split=True): ``python -m diagnostics.trace._first_part PATH TARGET [FROM]``.

Decodes the trace's events up to the first event boundary at or after TARGET (decoded bytes), from the
array's start or (FROM, a .json with several helpers) from the first event boundary at or after FROM, and writes
them to stdout block by block as ingest.write_part does (a JSON header and raw arrays: data, never a
pickle), then an end record saying whether the split was clean. Exits 1 on any error; the caller then
reads the trace alone.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from diagnostics.trace.ingest import first_part, write_part, write_record
    from diagnostics.trace.pages import small_pages

    out = sys.stdout.buffer
    with small_pages():
        end = first_part(Path(argv[1]), int(argv[2]), lambda part: write_part(part, out),
                         int(argv[3]) if len(argv) > 3 else None)
    write_record(out, end)
    out.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except BrokenPipeError:  # the caller stopped reading: it has gone on without us
        sys.exit(1)
