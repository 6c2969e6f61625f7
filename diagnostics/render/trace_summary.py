"""The trace's Summary as text: ``trace analyze``'s first answer (issue #42), printed while the job computes the
other views, so this module is light (no plotly, no chart module: ``render.text`` has those); and the plain
text tables every CLI text uses (``_table``, ``_ms``)."""

from __future__ import annotations

from diagnostics.analyses.trace.result import TracePartial, TraceResult


def _ms(us) -> str:
    if us is None:
        return "-"
    # From a million seconds on (a bogus timestamp), 1e+305 ms rather than 306 digits.
    return f"{us / 1000:.3f} ms" if abs(us) < 1e12 else f"{us / 1000:.3g} ms"


def _cell(row, key: str):
    """A column of a text table's row: a typed row's field (or a row dict's key, for the rows it builds)."""
    return row.get(key) if isinstance(row, dict) else getattr(row, key)


def _table(rows, cols: list) -> str:
    """A plain text table: cols is [(header, key, formatter)]."""
    cells = [[h for h, _, _ in cols]] + [[f(_cell(r, k)) for _, k, f in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(row, widths))) for row in cells]
    return "\n".join(lines)


def summary_lines(result: TracePartial | TraceResult) -> list[tuple[tuple, str]]:
    """The Summary block of ``trace analyze``, the CLI's first answer (the job's partial result, issue #42;
    a reopen's final result): one (key, text) pair, printed once, before the other views."""
    s = result.summary
    out = [f"{s.source}: {s.events:,} events, {s.bytes / 1e6:.1f} MB, "
           f"duration {_ms(s.duration_us)}, {s.n_steps} steps, "
           f"rank {s.rank if s.rank is not None else '-'}, "
           f"{'GPU' if s.has_gpu else 'CPU only'}"]
    cache = getattr(result, "trace_cache", None)
    if cache and cache.result:
        out.append("the stored analysis of this trace (the files, the options and the trace code are unchanged "
                   "since it ran)")
    for w in s.warnings:
        out.append(f"warning: {w}")
    for n in s.notes:
        out.append(f"note: {n}")
    out += ["", "Events by category:",
            _table(s.categories, [("category", "cat", str), ("events", "events", "{:,}".format),
                                  ("total", "total_us", _ms)])]
    if s.streams:
        out += ["", "GPU streams:", _table(s.streams, [
            ("device", "device", str), ("stream", "stream", str), ("kernels", "kernels", str),
            ("memcpy", "memcpy", str), ("memset", "memset", str), ("busy", "busy_us", _ms)])]
    return [(("summary",), "\n".join(out))]
