"""The trace analysis' results in words: the HTA-parity parts (hta_text and its sentences), the serving view
(serving_lines) and the communication families (communication_lines). Plotly- and pandas-free, so that
``trace analyze``'s text, and a reopen that only prints it, import no chart module (issue #42); the chart modules
(charts/trace_hta.py, serving.py, traces.py) draw the same results and name these too."""

from __future__ import annotations

from diagnostics.analyses.trace.result import (
    Communication, CommOverlap, QueueLength, Serving, TraceResult,
)
from diagnostics.results import UNSET, given


def _clip(name: str, n: int = 70) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _gbps(x: float | None) -> str:
    return "not counted" if x is None else f"{x / 1e9:,.2f} GB/s"


def has_parts(result: TraceResult) -> bool:
    """False for a result made before these analyses existed (then the page says so once)."""
    return bool(result.kernel_sequences)   # UNSET is falsy


# ---- words ----------------------------------------------------------------------------------------

def queue_text(q: QueueLength) -> str:
    if q.blocked_us is None:
        return "; ".join(q.notes)
    return (f"Time with {q.full:,} or more launches queued on a stream (launch calls blocked): "
            f"{q.blocked_us:,.1f} µs; largest queue {max((s.max for s in q.streams), default=0):,}.")


def overlap_text(o: CommOverlap | None, shown: tuple[str, ...] = ()) -> str:
    """The communication / computation overlap in a sentence (None or UNSET: a result that predates it);
    its notes already ``shown`` above it are not repeated."""
    notes = [n for n in (o.notes if o else ()) if n not in shown]
    if not o or o.overlap_pct is None:
        return "Communication / computation overlap: " + "; ".join(notes or ["not counted"])
    what = "compute kernels only (HTA)" if o.compute == "kernels" else "all non-communication GPU work"
    families = ", ".join(o.families)
    return (f"Communication / computation overlap: {o.overlap_pct:.1f} % of {o.comm_us / 1e3:,.3f} ms of "
            f"communication{f' ({families})' if families else ''} ran beside computation ({what}).")


def definitions_text(result: TraceResult) -> str:
    idle, q, o, ld = result.idle_time, result.queue_length, result.comm_overlap, result.launch_delay
    return (f"Definitions: idle kernel wait up to {idle.kernel_wait_max_us:g} µs ({idle.rules} "
            f"rules); a launch is queued until its GPU work {'ends' if q and q.until == 'kernel_end' else 'starts'}; "
            f"overlap over {'compute kernels' if o and o.compute == 'kernels' else 'all GPU work'}; launch delay "
            f"from the launch call's {'end' if ld and ld.since == 'call_end' else 'start'}.")


def hta_text(result: TraceResult, top: int, table, clip, ms) -> list[str]:
    """Lines of ``trace analyze``'s text for the HTA-parity results (``table``, ``clip``, ``ms``: the
    text module's own formatters)."""
    if not has_parts(result):
        return []
    out = []
    seqs = result.kernel_sequences
    rows = seqs.by_time[:top]
    out += ["", f"Frequent kernel sequences (2..{seqs.max_len} kernels, by GPU time; fusion candidates):",
            table(rows, [("sequence", "sequence", clip), ("count", "count", "{:,}".format),
                         ("GPU time", "total_us", ms), ("gaps", "gap_us", ms)]) if rows
            else "; ".join(seqs.notes) or "(no run of kernels occurs twice on a stream)"]
    q = result.queue_length
    out += ["", "Launch queue: " + queue_text(q)] + [f"note: {n}" for n in q.notes if q.streams]
    if q.streams:
        out.append(table(q.streams, [("device", "device", str), ("stream", "stream", str),
                                     ("launches", "launches", "{:,}".format), ("max", "max", "{:,}".format),
                                     ("mean", "mean", lambda v: "-" if v is None else f"{v:.2f}"),
                                     ("at full", "full_us", ms)]))
    bw = result.memcpy_bandwidth
    out += ["", "Memcpy / memset bandwidth:"] + [f"note: {n}" for n in bw.notes]
    if bw.directions:
        out.append(table(bw.directions, [
            ("direction", "direction", str), ("events", "events", "{:,}".format),
            ("bytes", "bytes", lambda v: "not counted" if v is None else f"{v:,}"), ("time", "time_us", ms),
            ("bandwidth", "bytes_per_s", _gbps), ("median", "median_bytes_per_s", _gbps)]))
    ann = result.annotations
    out += ["", "GPU user annotations:"] + [f"note: {n}" for n in ann.notes]
    if ann.annotations:
        out.append(table(ann.annotations[:top], [
            ("annotation", "name", clip), ("count", "count", "{:,}".format), ("total", "total_us", ms),
            ("GPU busy inside", "gpu_busy_us", ms)]))
    ld = result.launch_delay
    out += ["", "Launch delay (launch call start to GPU start):"] + [f"note: {n}" for n in ld.notes]
    if ld.by_name:
        out.append(table(ld.by_name[:top], [
            ("kernel", "name", clip), ("op", "op", lambda v: v or "-"), ("launches", "launches", "{:,}".format),
            ("median µs", "p50_us", "{:,.1f}".format), ("p90 µs", "p90_us", "{:,.1f}".format),
            ("max µs", "max_us", "{:,.1f}".format)]))
    out += ["", overlap_text(result.comm_overlap), definitions_text(result)]
    return out


#: The split's parts in the result's order, each a colour.
SPLIT_COLORS = (("attention_us", "attention", "#4c78a8"), ("GEMM_us", "GEMM", "#72b7b2"),
                ("communication_us", "communication", "#f58518"), ("sampling_us", "sampling", "#e45756"),
                ("other_us", "other compute", "#54a24b"), ("copies_us", "copies", "#b279a2"),
                ("queued_us", "queued (launched, GPU idle)", "#9d755d"), ("host_us", "host (GPU idle)", "#bab0ac"))


def split_parts(iterations) -> tuple:
    """SPLIT_COLORS' parts the iterations hold (a result from before queued_us was told apart has none)."""
    return tuple(p for p in SPLIT_COLORS if all(given(getattr(it, p[0], UNSET)) for it in iterations))


def _label(it) -> str:
    bits = [f"#{it.iteration}", it.phase or "?"]
    if it.batch_size is not None:
        bits.append(f"bs={it.batch_size}")
    if it.tokens is not None:
        bits.append(f"toks={it.tokens}")
    return " ".join(bits)


def serving_lines(serving: Serving | None) -> list[str]:
    """The serving view in sentences (the CLI's text and the report's)."""
    if not serving or not serving.available:
        return []
    out = [f"Inference server trace ({serving.engine or 'engine not named'}): {len(serving.iterations)} iteration(s), "
           f"phases from the {serving.phase_source or 'annotations'}"]
    for p in serving.phases:
        bs = f", median batch {p.batch_size_median:g}" if p.batch_size_median is not None else ""
        out.append(f"  {p.phase}: {p.iterations} iteration(s), median {p.median_us / 1e3:,.3f} ms "
                   f"(GPU busy {p.median_gpu_busy_us / 1e3:,.3f} ms), {p.tokens:,} tokens{bs}")
    for it in serving.iterations[:20]:
        parts = ", ".join(f"{name} {getattr(it, key) / 1e3:,.3f}" for key, name, _ in split_parts([it])
                          if getattr(it, key) > 0)
        out.append(f"  iteration {_label(it)}: {it.time_us / 1e3:,.3f} ms ({parts} ms); "
                   f"{it.kernels:,} GPU events, {it.graph_kernels:,} of them replayed by {it.graph_launches} graph "
                   "launch(es)")
    g = serving.graphs
    if g and g.launches:
        share = f" ({g.share_of_gpu:.0%} of the GPU time)" if g.share_of_gpu is not None else ""
        out.append(f"  graph replays: {g.launches:,} launch(es) replayed {g.kernels:,} kernels, "
                   f"{g.gpu_us / 1e3:,.3f} ms of kernel time{share}, each kernel attributed to its launch")
    out += [f"  note: {n}" for n in serving.notes]
    return out


def communication_lines(comm: Communication | None) -> list[str]:
    """The trace's communication by family (classify.communication), one line each, then its notes
    (none for a result that predates communication families: UNSET)."""
    if not comm:
        return []
    where = {"GPU": "kernels", "host": "host calls"}
    found = [f"{f.family} {where[f.where]}: {f.events:,} ({f.names} name{'s' if f.names != 1 else ''}), "
             f"{f.time_us / 1e3:,.3f} ms, e.g. {f.example[:80]}" for f in comm.families]
    lines = ["Communication by family: " + ("; ".join(found) if found else "none matched")]
    if comm.comm_kernels:
        lines.append(f"Your communication-kernel pattern: {comm.comm_kernels!r}")
    return lines + list(comm.notes)
