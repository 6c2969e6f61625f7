"""What an attached run measured, from its run folder (see protocol.py): the step time and its parts,
the bottleneck, the profiler's window and the tool's overhead, per rank, with the DataLoader
workers, the device syncs by line, the gradients, memory and the GPU's idle time; then the findings.

The figures:

* ``step_ms``: the median step outside the profiled window, after warm-up (the last
  ``stable_steps`` steps before the window and every step after it): what the script does bare;
* ``breakdown_ms``: per part the median over the same steps; ``host`` is the step less the others'
  medians (host is "the rest" by definition), so the parts sum to ``step_ms``; each step's own
  parts sum to its time (``step_table``);
* ``overhead_pct``: the profiled steps' median against ``step_ms`` (the profiler's cost per step);
  ``overhead`` also holds our time between steps (export, files) per step of the run;
* from the trace (the profiled steps): on CUDA the GPU's idle time per step and, from the main
  thread's phases placed on the trace's clock, what the host was doing meanwhile; under
  torch.distributed, communication the light timing cannot see (DDP's all-reduce inside backward)
  as the trace layer's exposed communication.

No torch: the trace layer reads the traces, gradient_health judges the gradients.
"""

from __future__ import annotations

import math
import os
import stat
import statistics
from pathlib import Path

import msgspec

from diagnostics.analyses.attach import rules
from diagnostics.analyses.attach.protocol import (
    ERRORS, GRADS, MAX_JSON_BYTES, MAX_JSONL_BYTES, META, OOM, PHASES, PLAN, PROC_PREFIX, SEGMENTS, STEPS, WORKERS, AttachConfig,
    raw_trace_name, read_json, read_jsonl,
)
from diagnostics.analyses.attach.result import AttachResult, Bottleneck, OomFit, OutOfMemory, RunPlan
from diagnostics.devices import logical_cores
from diagnostics.findings import rank_fix_first
from diagnostics.measure.gradient_health import (
    STATUSES as GRAD_STATUSES, THRESHOLD_HELP, THRESHOLDS, finite, summarize_layers,
)
from diagnostics.units import human_bytes

#: A rank is "waited for" when its busy time (step less communication) is over the others' median by
#: this fraction (the distributed analysis' straggler margin) and the others spend time in comm.
WAIT_MARGIN = 0.20
#: Communication the trace shows beyond what the light timing measured, per step, below which it
#: is not moved out of backward (scheduler noise).
TRACE_COMM_MIN_MS = 0.5
#: GPU idle causes: our phase names, plus the time between steps (ours) and outside every step.
BETWEEN = "between steps"

#: Traces read ahead by this process (the launcher reads each window's trace while the script runs on, once it
#: is gzipped: session.TraceGzip), so that the analysis after the script's end does not parse it then (0.2 s
#: for the corpus dcgan's): path -> ((size, mtime_ns) when read, the Trace). Each is used once, and only if the
#: file is still the one read.
_READ_AHEAD: dict = {}


def read_ahead(path) -> None:
    """Parse the trace at ``path`` now, for this process' coming analyse_run of its run folder (a failure is
    left for the analysis to meet and report)."""
    from diagnostics.trace.ingest import load_trace

    try:
        before = os.stat(path)
        trace = load_trace(str(path))
    except Exception:
        return
    _READ_AHEAD[str(path)] = ((before.st_size, before.st_mtime_ns), trace)


def _load_trace(path: Path):
    """The trace at ``path``: read ahead if it was and the file has not changed since, else read now."""
    from diagnostics.trace.ingest import load_trace

    got = _READ_AHEAD.pop(str(path), None)
    if got is not None:
        try:
            now = os.stat(path)
        except OSError:
            now = None
        if now is not None and got[0] == (now.st_size, now.st_mtime_ns):
            return got[1]
    return load_trace(str(path))


def analyze(ctx, options) -> AttachResult:
    """The registered analysis: (re-)analyse a run folder written by ``python -m diagnostics run``."""
    ctx.progress(0.1, "reading the run folder")
    return analyse_run(options["run_dir"], exit_code=options["exit_code"], command=options["command"] or [],
                       cwd=options["cwd"] or "", progress=ctx.progress)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def analyse_run(run_dir, *, exit_code: int | None = None, command=(), cwd: str = "", duration_s: float | None = None,
                interrupted: bool = False, progress=None, run_id: str | None = None) -> AttachResult:
    progress = progress or (lambda f, m: None)
    run_dir = Path(run_dir)
    cfg = AttachConfig.read(str(run_dir))
    notes: list[str] = []
    errors = []
    procs = []
    for d in sorted(run_dir.glob(f"{PROC_PREFIX}*")):
        p = _load_proc(d)
        errors += [{"pid": p["pid"], **e} for e in p["errors"]]
        if p["steps"]:
            procs.append(p)
    workers = _worker_lines(run_dir)
    progress(0.3, f"{len(procs)} process(es) stepped")
    ranked = []
    for p in procs:
        fig = _figures(p, cfg, run_dir, notes)
        fig["workers"] = _workers(workers.get(p["pid"], []), p, fig)
        ranked.append(fig)
    ranked.sort(key=lambda f: (f["rank"] is None, f["rank"] if f["rank"] is not None else 0, f["pid"]))
    progress(0.7, "findings")
    status = ("interrupted" if interrupted else "failed" if exit_code not in (0, None) else
              "no steps" if not ranked else "ok")
    if not ranked:
        notes.append(_no_steps_note(run_dir, errors, exit_code))
    odd = _not_read(run_dir)
    if odd:
        notes.append("not read from the run folder (only regular files of bounded size are read back): "
                     + "; ".join(odd[:10]) + (f"; and {len(odd) - 10} more" if len(odd) > 10 else ""))
    for e in errors:
        notes.append(f"the bootstrap failed in process {e['pid']} ({e.get('where')}): {e.get('error')}; that "
                     "process ran on unprofiled from there")
    head = ranked[0] if ranked else None
    waited = _waited_for(ranked)
    rank_rows = [dict(rank=f["rank"], pid=f["pid"], steps=f["steps"], step_ms=f["step_ms"],  # RankResult
                      breakdown_ms=f["breakdown_ms"], bottleneck=f["bottleneck"], profiled_steps=f["window"],
                      step_ms_profiled=f["step_ms_profiled"], overhead_pct=f["overhead_pct"], trace=f["trace"],
                      busy_ms=f["busy_ms"], waited_for=f["rank"] == waited and waited is not None)
                 for f in ranked]
    if len(ranked) > 1:
        notes.append(f"{len(ranked)} processes stepped: the headline figures are rank {head['rank']}'s, every "
                     "rank's are in ranks")
        windows = {tuple(f["window"] or ()) for f in ranked}
        if len(windows) > 1:
            notes.append("the ranks profiled different steps: " + "; ".join(
                f"rank {f['rank']}: {f['window']}" for f in ranked))
    ranks_view = _ranks_view(run_dir, ranked) if len(ranked) > 1 else None
    trace = ([f["trace"] for f in ranked if f["trace"]] if len(ranked) > 1 else (head or {}).get("trace"))
    facts = rules.Facts(head=head, ranked=ranked, waited_for=waited, cpu_count=logical_cores())
    found = rules.evaluate(facts)
    fix_first = rank_fix_first([rules.fix_first_row(f) for f in found if f.flagged])
    if head:
        notes += head["notes"]
        if head["partial_step"] and (interrupted or exit_code not in (0, None)):
            notes.append(f"the script ended during step {head['partial_step']}, after {head['steps']} whole steps")
    breakdown = head["breakdown_ms"] if head else {}
    metrics = _metrics(head, ranked, exit_code, found)
    try:
        artifacts = sorted(p.name for p in run_dir.iterdir() if p.is_file() and not p.is_symlink())
    except OSError as e:  # the run folder deleted or unreadable while the script ran: the exit code stands
        artifacts = []
        if run_dir.exists():
            notes.append(f"the run folder {run_dir} could not be read ({type(e).__name__}: {e.strerror or e}): "
                         "what was measured there is lost, the script's exit code stands")
    progress(1.0, "done")
    parts = ({"window": head["window_info"], "overhead": head["overhead"], "step_table": head["table"],
              "workers": head["workers"], "loaders": head["loaders"], "optimizers": head["optimizers"],
              "model": head["model"], "syncs": head["syncs"], "memory": head["memory"], "gpu": head["gpu"],
              "evaluation": head["meta"].get("evaluation") or {}, "plan": head["plan"],
              "gradients": head["gradients"]} if head else {})
    # the parts the run folder gave as plain data, checked against their types here (a wrong one names its field)
    return msgspec.convert(dict(
        exit_code=exit_code, status=status, command=list(command), cwd=cwd, duration_s=duration_s,
        steps=head["steps"] if head else 0, step_boundary=head["boundary"] if head else None,
        step_boundary_detail=head["boundary_detail"] if head else "",
        profiled_steps=head["window"] if head else None, step_ms=head["step_ms"] if head else None,
        step_ms_profiled=head["step_ms_profiled"] if head else None, breakdown_ms=breakdown,
        bottleneck=head["bottleneck"] if head else None, overhead_pct=head["overhead_pct"] if head else None,
        trace=trace, ranks=rank_rows, waited_for_rank=waited, ranks_view=ranks_view, findings=found,
        fix_first=fix_first, notes=notes, errors=errors, metrics=metrics, artifacts=artifacts, run_id=run_id,
        run_dir=str(run_dir), **parts), AttachResult)


# ---------------------------------------------------------------------- one process
def _load_proc(d: Path) -> dict:
    rows = read_jsonl(str(d / STEPS))
    steps = [r for r in rows if not r.get("partial")]
    # The boundary changed mid-run (an optimizer first stepped after manual-update or batch steps: gradient
    # accumulation's micro-batches before the first optimizer step): the agent counted the steps again from 1,
    # so the rows of the old boundary are dropped (a step number appears once).
    restart = next((i for i in range(len(steps) - 1, 0, -1) if steps[i]["n"] <= steps[i - 1]["n"]), 0)
    return {"pid": int(d.name[len(PROC_PREFIX):]) if d.name[len(PROC_PREFIX):].isdigit() else 0, "dir": d,
            "meta": read_json(str(d / META), {}) or {}, "steps": steps[restart:],
            "partial": [r for r in rows if r.get("partial")], "errors": read_jsonl(str(d / ERRORS))}


def _total(r: dict) -> float:
    return (r["t1"] - r["t0"]) * 1e3 - (r.get("tool_ms") or 0.0)


def _breakdown(rows: list[dict], step_ms: float) -> dict:
    """Per part the median over ``rows``; host the rest, so the parts sum to ``step_ms``. When the
    medians of the other parts exceed the median step (a bimodal run), the median step's own parts."""
    parts = {k: _median([r["ms"].get(k, 0.0) for r in rows]) or 0.0 for k in PHASES if k != "host"}
    host = step_ms - sum(parts.values())
    if host < 0:
        mid = sorted(rows, key=_total)[len(rows) // 2]
        scale = step_ms / _total(mid) if _total(mid) > 0 else 1.0
        return {k: mid["ms"].get(k, 0.0) * scale for k in PHASES}
    return {**parts, "host": host}


def _figures(p: dict, cfg: AttachConfig, run_dir: Path, notes: list) -> dict:
    meta, rows = p["meta"], p["steps"]
    own_notes = list(meta.get("notes") or [])
    window = meta.get("window")
    prof = [r for r in rows if r.get("p")]
    if window:
        lo = max(2, window[0] - cfg.stable_steps)
        outside = [r for r in rows if not r.get("p") and r["n"] >= lo]
    else:
        outside = [r for r in rows if r["n"] > cfg.min_warmup] or rows
        if meta.get("boundary") != "time window":
            own_notes.append(f"the script ended after {len(rows)} step(s), before the profiled window "
                             + ("(--at was past the end)" if cfg.at else "(warm-up had not ended: try --at K)")
                             + ": no trace, the figures are the steps after warm-up")
    basis = outside or prof
    if not outside and prof:
        own_notes.append("no step ran outside the profiled window: step_ms is the profiled steps' median "
                         "(it includes the profiler's cost)")
    step_ms = _median([_total(r) for r in basis])
    breakdown = _breakdown(basis, step_ms) if basis and step_ms is not None else {}
    step_prof = _median([_total(r) for r in prof])
    overhead_pct = 100.0 * (step_prof - step_ms) / step_ms if prof and outside and step_ms else None
    noise = _overhead_noise(outside, prof, step_ms) if overhead_pct is not None else None
    trace_name = (meta.get("exports") or {}).get("trace")
    if isinstance(trace_name, str) and not _plain_file(run_dir, trace_name) \
            and _plain_file(run_dir, raw_trace_name(trace_name)):
        trace_name = raw_trace_name(trace_name)  # exported, not gzipped (the launcher was stopped): the same trace
    # a name in the run folder, never a path the script chose (/dev/zero, a FIFO, another user's file)
    trace_path = run_dir / trace_name if isinstance(trace_name, str) and _plain_file(run_dir, trace_name) else None
    segments = (read_json(str(p["dir"] / SEGMENTS), {}) or {}).get("segments") or []
    trace_fig = _trace_figures(trace_path, segments, prof, meta, own_notes) if trace_path and trace_path.exists() \
        else {}
    moved = trace_fig.get("comm_moved_ms")
    if moved:  # communication inside backward (DDP's all-reduce), seen in the trace: out of backward
        shift = min(moved, breakdown.get("backward", 0.0))
        breakdown = {**breakdown, "backward": breakdown["backward"] - shift, "comm": breakdown["comm"] + shift}
        own_notes.append(f"{shift:.2f} ms per step of communication ran inside backward (DDP's gradient all-reduce "
                         "waits there): measured in the profiled steps' trace as exposed communication and moved "
                         "from backward to comm")
    total_steps = max(rows[-1]["n"] if rows else 0, meta.get("steps_seen") or 0)  # long runs: counted, not all kept
    outside_all = sum(1 for r in rows if not r.get("p"))
    partial = p["partial"][-1]["n"] if p["partial"] and meta.get("boundary") != "time window" else None
    tool_outside_s = meta.get("tool_outside_s") or 0.0
    elapsed = sum(_total(r) for r in rows) / 1e3
    table = [{"step": r["n"], "profiled": bool(r.get("p")), "warmup": bool(window and r["n"] < window[0] - cfg.stable_steps
                                                                         or not window and r["n"] <= cfg.min_warmup),
              "step_ms": _total(r), **{f"{k}_ms": r["ms"].get(k, 0.0) for k in PHASES},
              "tool_ms": r.get("tool_ms") or 0.0, "batches": r.get("b"), "peak_bytes": r.get("mem"),
              "rss_bytes": r.get("rss")} for r in rows]
    for row in table:
        extra = trace_fig.get("per_step", {}).get(row["step"], {})
        row.update(extra)
    window_info = {"first": window[0] if window else None, "last": window[1] if window else None,
                   "reason": meta.get("window_reason") or ("--at" if cfg.at else ""),
                   "note": meta.get("window_note") or "", "requested_steps": cfg.steps, "at": cfg.at,
                   "steps_profiled": len(prof)}
    if window and len(prof) < cfg.steps:
        own_notes.append(f"only {len(prof)} of the {cfg.steps} steps asked for were profiled: the script ended first")
    compiles = [r.get("c") for r in rows]
    recompiles = _recompiles_after_warmup(rows, window, cfg)
    return {
        "pid": p["pid"], "rank": meta.get("rank"), "world_size": meta.get("world_size"), "meta": meta,
        "boundary": meta.get("boundary"), "boundary_detail": _boundary_detail(meta),
        "steps": total_steps, "partial_step": partial, "window": list(window) if window else None, "window_info": window_info,
        "step_ms": step_ms, "step_ms_profiled": step_prof, "breakdown_ms": breakdown,
        "bottleneck": Bottleneck.of(breakdown, step_ms), "overhead_pct": overhead_pct,
        "busy_ms": (step_ms - breakdown.get("comm", 0.0)) if step_ms is not None else None,
        "trace": str(trace_path.resolve()) if trace_path else None, "table": table, "notes": own_notes, "trace_fig": trace_fig,
        "overhead": {"profiled_vs_outside_pct": overhead_pct, "tool_outside_s": tool_outside_s,
                     "tool_outside_ms_per_step": 1e3 * tool_outside_s / max(1, outside_all + len(prof)),
                     "tool_outside_pct": 100.0 * tool_outside_s / elapsed if elapsed > 0 else None,
                     "export_s": (meta.get("exports") or {}).get("export_s"),
                     "tool_in_steps_ms": _median([r.get("tool_ms") or 0.0 for r in outside]),
                     "tool_in_profiled_steps_ms": _median([r.get("tool_ms") or 0.0 for r in prof]),
                     "noise_pct": noise, "verdict": _overhead_verdict(overhead_pct, noise),
                     "steps_outside": len(outside), "steps_profiled": len(prof)},
        "syncs": _syncs(basis + prof if outside else prof),
        "loaders": meta.get("loaders") or [], "optimizers": meta.get("optimizers") or [],
        "model": _model(meta),
        "memory": (memory := _memory(rows, prof, meta, run_dir, trace_fig.get("alloc_peaks") or {},
                                     _oom(p["dir"], meta, own_notes, trace_fig.get("alloc_peaks") or {}))),
        "gpu": trace_fig.get("gpu"),
        "gradients": _gradients(p["dir"]),
        "plan": _plan(p["dir"], memory, asked=cfg.plan is not None),
        "recompiles": recompiles, "compiles": compiles[-1] if compiles else None,
        "outside_rows": outside, "prof_rows": prof,
    }


def _overhead_noise(outside: list, prof: list, step_ms: float) -> list[float] | None:
    """The interval the profiler's cost (percent) could fall in from the steps' own spread alone: the
    profiled median against the outside steps' interquartile range (a difference inside it is noise)."""
    xs = sorted(_total(r) for r in outside)
    if len(xs) < 4 or not prof or not step_ms:
        return None
    q1, q3 = xs[len(xs) // 4], xs[(3 * len(xs)) // 4]
    return [100.0 * (q1 - step_ms) / step_ms, 100.0 * (q3 - step_ms) / step_ms]


def _overhead_verdict(pct: float | None, noise: list | None) -> str:
    """'cost' when the profiled steps are slower than the others beyond their spread, else 'within noise'
    (a negative difference is never a cost)."""
    if pct is None:
        return ""
    if pct <= 0 or (noise is not None and pct <= noise[1]):
        return "within noise"
    return "cost"


def _boundary_detail(meta: dict) -> str:
    b = meta.get("boundary")
    if b == "optimizer":
        opts = meta.get("optimizers") or []
        names = ", ".join(o["type"] for o in opts)
        cycle = meta.get("cycle") or 1
        return (f"the optimizer's step ({names})" if cycle == 1 else
                f"every {cycle} optimizer steps ({names}): one iteration steps {cycle} times")
    return meta.get("boundary_detail") or ""


def _recompiles_after_warmup(rows, window, cfg) -> dict | None:
    cs = [(r["n"], r.get("c")) for r in rows if r.get("c") is not None]
    if not cs:
        return None
    start = window[0] if window else cfg.min_warmup + 1
    before = [c for n, c in cs if n < start]
    base = before[-1] if before else cs[0][1]
    after = [(n, c) for n, c in cs if n >= start]
    extra = (after[-1][1] - base) if after else 0
    steps = [n for (n, c), (_, prev) in zip(after, [(None, base)] + after[:-1]) if c != prev]
    slow = []
    if steps:
        med = _median([_total(r) for r in rows if r["n"] >= start and r["n"] not in steps])
        slow = [_total(r) - med for r in rows if r["n"] in steps and med is not None]
    return {"graphs_before": base, "graphs_after_warmup": extra, "steps": steps,
            "extra_ms_total": sum(x for x in slow if x > 0) if slow else 0.0}


def _syncs(rows: list[dict]) -> list[dict]:
    n = len(rows)
    agg: dict[str, list] = {}
    for r in rows:
        for loc, c, ms in r.get("syncs") or []:
            a = agg.setdefault(loc, [0, 0.0])
            a[0] += c
            a[1] += ms
    out = [{"location": loc, "calls_per_step": c / n, "ms_per_step": ms / n, "calls": c}
           for loc, (c, ms) in agg.items()] if n else []
    return sorted(out, key=lambda s: -s["ms_per_step"])


def _model(meta: dict) -> dict:
    opts = meta.get("optimizers") or []
    dtypes: dict[str, int] = {}
    devices: dict[str, int] = {}
    for o in opts:
        for k, v in (o.get("param_dtypes") or {}).items():
            dtypes[k] = dtypes.get(k, 0) + v
        for k, v in (o.get("devices") or {}).items():
            devices[k] = devices.get(k, 0) + v
    sizes = list((meta.get("batch_sizes") or {}).values())
    return {"modules": meta.get("roots") or [], "param_dtypes": dtypes, "devices": devices,
            "batch_size": max(set(sizes), key=sizes.count) if sizes else None,
            "loader_batch_size": next((l.get("batch_size") for l in meta.get("loaders") or []), None),
            "autocast": meta.get("autocast") or {}, "cuda": meta.get("cuda"), "device_name": meta.get("device_name"),
            "torch": meta.get("torch"), "argv": meta.get("argv"), "rank": meta.get("rank"),
            "world_size": meta.get("world_size")}


def _memory(rows, prof, meta, run_dir: Path, alloc_peaks: dict, oom: dict | None = None) -> dict:
    peaks = [r.get("mem") for r in prof if r.get("mem") is not None]
    rss = [r.get("rss") for r in prof if r.get("rss") is not None]
    alloc = [alloc_peaks[r["n"]] for r in prof if r["n"] in alloc_peaks]
    exports = meta.get("exports") or {}
    out = {"cuda": bool(meta.get("cuda")), "peak_bytes_per_step": peaks, "peak_bytes": max(peaks) if peaks else None,
           "alloc_peak_bytes_per_step": alloc, "rss_bytes_per_step": rss, "snapshot": exports.get("snapshot"),
           "oom": oom if oom is not None else meta.get("oom")}
    if not peaks:
        out["note"] = ("CPU: the allocator's peak per profiled step above the step's start, from the profiler's "
                       "allocation events (alloc_peak_bytes_per_step; the first profiled step can read higher: "
                       "what it frees of tensors made before profiling is not in those events); "
                       "rss_bytes_per_step is the process' resident "
                       "memory (RSS: its whole footprint, the profiler's own buffers included), not the step's"
                       if alloc else "CPU: no allocation events in the trace; rss_bytes_per_step is the process' "
                       "resident memory (RSS), not the step's" if rss else "not measured")
    return out


# ---------------------------------------------------------------------- the trace
def _trace_figures(path: Path, segments: list, prof: list, meta: dict, notes: list) -> dict:
    """Profiled steps as the trace saw them: the step numbers, the GPU's idle time and why, and the
    communication the light timing cannot see."""
    import numpy as np

    from diagnostics.trace import intervals as iv
    from diagnostics.trace.classify import gpu_work_mask, kernel_mask
    from diagnostics.trace.comm import rank_breakdown
    from diagnostics.trace.errors import TraceError
    from diagnostics.trace.breakdowns import steps as step_table

    try:
        trace = _load_trace(path)
    except (TraceError, OSError) as e:
        notes.append(f"the exported trace {path.name} could not be read: {e}")
        return {}
    st = step_table(trace)
    out: dict = {"trace_steps": [int(s) for s in st["step"]], "per_step": {}}
    want = [r["n"] for r in prof]
    # the step the script died in (an exception inside the window) is in the trace, unfinished: not a difference
    died_in = [max(want) + 1] if want and meta.get("state") == "aborted" else []
    if want and sorted(out["trace_steps"]) not in (sorted(want), sorted(want) + died_in):
        notes.append(f"the trace's step numbers {out['trace_steps']} differ from the profiled steps {want}")
    # our clock -> the trace's: the step ranges start where our step marks are
    marks = {s[2]: s[0] for s in segments if len(s) == 3}
    offsets = [float(start) - marks[int(n)] * 1e6 for n, start in zip(st["step"], st["start_us"]) if int(n) in marks]
    offset = _median(offsets)
    if meta.get("world_size") and meta["world_size"] > 1:
        try:
            rb = rank_breakdown(trace)
            ours = {r["n"]: r["ms"].get("comm", 0.0) for r in prof}
            extra = [max(0.0, s["exposed_comm_ms"] - ours.get(s["step"], 0.0)) for s in rb["steps"]
                     if s["step"] in ours]
            moved = _median(extra)
            if moved and moved > TRACE_COMM_MIN_MS:
                out["comm_moved_ms"] = moved
            for s in rb["steps"]:
                out["per_step"].setdefault(s["step"], {})["trace_exposed_comm_ms"] = s["exposed_comm_ms"]
        except Exception as e:  # the split is a refinement: the light timing stands without it
            notes.append(f"communication in the trace was not read: {type(e).__name__}: {e}")
    ev = trace.events
    ts = ev["ts"].to_numpy(dtype=float)
    out["alloc_peaks"] = _cpu_alloc_peaks(ts, ev["total_allocated"].to_numpy(), ev["device_type"].to_numpy(), st)
    for n, peak in out["alloc_peaks"].items():
        out["per_step"].setdefault(n, {})["alloc_peak_bytes"] = peak
    if not gpu_work_mask(trace).any():
        return out
    end = ts + ev["dur"].to_numpy(dtype=float)
    g = gpu_work_mask(trace)
    busy = iv.union(ts[g], end[g])
    k = kernel_mask(trace)
    kern = iv.union(ts[k], end[k])
    phase_iv = _phase_intervals(segments, offset) if offset is not None else {}
    rows = []
    for n, s0, d in zip(st["step"], st["start_us"], st["dur_us"]):
        lo, hi = float(s0), float(s0 + d)
        step_busy = iv.clip(busy, lo, hi)
        idle = iv.subtract((np.array([lo]), np.array([hi])), step_busy)
        causes = {ph: iv.length(iv.intersect(idle, ivs)) / 1e3 for ph, ivs in phase_iv.items()}
        placed = sum(causes.values())
        idle_ms = iv.length(idle) / 1e3
        if idle_ms - placed > 1e-3:
            causes[BETWEEN] = idle_ms - placed
        row = {"step": int(n), "step_ms": d / 1e3, "gpu_busy_ms": iv.length(step_busy) / 1e3,
               "kernel_ms": iv.length(iv.clip(kern, lo, hi)) / 1e3, "gpu_idle_ms": idle_ms,
               "kernels": int(((ts[k] >= lo) & (ts[k] < hi)).sum()),
               "idle_causes_ms": {c: v for c, v in causes.items() if v > 1e-3}}
        rows.append(row)
        out["per_step"].setdefault(int(n), {}).update(gpu_idle_ms=idle_ms, kernel_ms=row["kernel_ms"])
    kd = (end[k] - ts[k])
    total_causes: dict[str, float] = {}
    for r in rows:
        for c, v in r["idle_causes_ms"].items():
            total_causes[c] = total_causes.get(c, 0.0) + v / len(rows)
    out["gpu"] = {"steps": rows, "idle_ms_per_step": _median([r["gpu_idle_ms"] for r in rows]),
                  "kernel_ms_per_step": _median([r["kernel_ms"] for r in rows]),
                  "kernels_per_step": _median([r["kernels"] for r in rows]),
                  "kernel_us_median": float(statistics.median(kd)) if len(kd) else None,
                  "idle_causes_ms_per_step": dict(sorted(total_causes.items(), key=lambda kv: -kv[1])),
                  "clock_placed": offset is not None}
    return out


def _cpu_alloc_peaks(ts, total, device_type, st) -> dict[int, int]:
    """Per profiled step, the CPU allocator's peak above the step's start, from the profiler's allocation
    events (their running "Total Allocated", counted from the window's start): the bytes the step itself
    held at its highest, not the process' resident memory (which the profiler's own buffers grow)."""
    import numpy as np

    mem = (total >= 0) & (device_type == 0)
    if not mem.any():
        return {}
    order = np.argsort(ts[mem], kind="stable")
    mts, alloc = ts[mem][order], total[mem][order].astype(np.int64)
    out = {}
    for n, s0, d in zip(st["step"], st["start_us"], st["dur_us"]):
        lo, hi = np.searchsorted(mts, float(s0), "left"), np.searchsorted(mts, float(s0 + d), "right")
        base = int(alloc[lo - 1]) if lo > 0 else 0
        out[int(n)] = max(0, int(alloc[lo:hi].max()) - base) if hi > lo else 0
    return out


def _phase_intervals(segments: list, offset_us: float) -> dict:
    """The main thread's phases as trace-time intervals (µs): segments are (time, phase now) change
    points, and (time, phase, step) where a profiled step begins."""
    from diagnostics.trace import intervals as iv

    pts = sorted((s[0], s[1]) for s in segments)
    spans: dict[str, tuple[list, list]] = {}
    for (t, ph), (t_next, _) in zip(pts, pts[1:]):
        if t_next > t:
            a, b = spans.setdefault(ph, ([], []))
            a.append(t * 1e6 + offset_us)
            b.append(t_next * 1e6 + offset_us)
    return {ph: iv.union(a, b) for ph, (a, b) in spans.items()}


# ---------------------------------------------------------------------- what is not read
def _plain_file(folder: Path, name: str) -> bool:
    """``name`` is a file name (no folder part) of a regular file in ``folder`` (a link is not followed)."""
    if not name or os.path.basename(name) != name or name in (".", ".."):
        return False
    try:
        return stat.S_ISREG(os.lstat(folder / name).st_mode)
    except OSError:
        return False


def _not_read(run_dir: Path) -> list[str]:
    """The run folder's entries the readers refuse (protocol.read_bytes): a FIFO, a socket, a device, a
    link, a file past its bound; looked for where the protocol's files are (the folder, proc-*/, workers/)."""
    out: list[str] = []
    folders = [run_dir] + [d for d in sorted(run_dir.glob(f"{PROC_PREFIX}*")) + [run_dir / WORKERS]
                           if not d.is_symlink() and d.is_dir()]
    for folder in folders:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            rel = e.name if folder == run_dir else f"{folder.name}/{e.name}"
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and not _too_big(e.name, st.st_size)):
                continue
            out.append(f"{rel} ({_kind_of(st)})")
    return out


def _too_big(name: str, size: int) -> bool:
    bound = MAX_JSONL_BYTES if name.endswith(".jsonl") else MAX_JSON_BYTES
    return name.endswith((".json", ".jsonl")) and size > bound


def _kind_of(st: os.stat_result) -> str:
    if stat.S_ISREG(st.st_mode):
        return f"{st.st_size:,} bytes, over the bound read back"
    return {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device", stat.S_IFLNK: "a symbolic link"}.get(stat.S_IFMT(st.st_mode), "not a file")


# ---------------------------------------------------------------------- DataLoader workers
def _worker_lines(run_dir: Path) -> dict[int, list]:
    """Every worker batch, by the pid of the process its workers belong to."""
    out: dict[int, list] = {}
    folder = run_dir / WORKERS
    if not folder.is_dir():
        return out
    for f in sorted(folder.glob("*.jsonl")):
        for line in read_jsonl(str(f)):
            if isinstance(line, list) and len(line) >= 6:
                out.setdefault(int(line[5]), []).append(line)
    return out


def _workers(lines: list, p: dict, fig: dict) -> dict:
    """Each worker's fetch + collate time per batch in the steady part of the run, and what it means:
    too slow workers (one batch takes longer than the workers together can hide) or too few."""
    loaders = fig["loaders"]
    loader = max(loaders, key=lambda l: l.get("iters", 0) + (l.get("len") or 0)) if loaders else None
    rows = fig["outside_rows"] + fig["prof_rows"]
    out: dict = {"loader": loader, "per_worker": [], "batches": 0}
    if not rows:
        return out
    lo, hi = min(r["t0"] for r in rows), max(r["t1"] for r in rows)
    steady = [x for x in lines if lo <= x[1] <= hi]
    by_worker: dict[int, list] = {}
    for x in steady:
        by_worker.setdefault(int(x[3]), []).append(x)
    for w, xs in sorted(by_worker.items()):
        out["per_worker"].append({"worker": w, "batches": len(xs),
                                  "fetch_collate_ms": _median([(x[1] - x[0]) * 1e3 for x in xs]),
                                  "collate_ms": _median([x[2] * 1e3 for x in xs]),
                                  "samples_per_batch": _median([x[4] for x in xs])})
    out["batches"] = len(steady)
    per_batch = _median([(x[1] - x[0]) * 1e3 for x in steady])
    out["fetch_collate_ms"] = per_batch
    out["collate_ms"] = _median([x[2] * 1e3 for x in steady])
    data_wait = fig["breakdown_ms"].get("data_wait", 0.0)
    compute = (fig["step_ms"] or 0.0) - data_wait
    batches_per_step = _median([r.get("b") or 0 for r in rows]) or 1
    out["batches_per_step"] = batches_per_step
    out["step_compute_ms"] = compute
    n = (loader or {}).get("num_workers")
    out["num_workers"] = n
    if per_batch is not None and n:
        # a worker makes one batch in per_batch ms; n of them supply one every per_batch / n ms,
        # while a step takes one every compute / batches_per_step ms without waiting
        need = per_batch * batches_per_step / compute if compute > 0 else None
        out["supply_interval_ms"] = per_batch / n
        out["demand_interval_ms"] = compute / batches_per_step if batches_per_step else None
        out["workers_needed"] = math.ceil(need - 1e-6) if need else None  # 8.0000001 workers are 8
    elif not n and loader is not None:
        out["main_process"] = True
    return out


# ---------------------------------------------------------------------- gradients
def _oom(d: Path, meta: dict, notes: list, alloc_peaks: dict | None = None) -> dict | None:
    """The out-of-memory error the process died of: the agent's report (oom.json, read bounded as JSON and
    checked against OutOfMemory; its plan's Fit fields taken into OomFit), with the CUDA snapshot's file from
    meta.json; meta.json's record alone where there is no report (runs stored before it). On the CPU, when
    the failing step was profiled, the rest (activations and temporaries) is the allocator's view of it
    (``alloc_peaks``: the step's allocations above its start, up to the failure, from the profiler's
    allocation events) instead of the process' resident memory less the tensors counted."""
    base = meta.get("oom") if isinstance(meta.get("oom"), dict) else None
    refused: list[str] = []
    data = read_json(str(d / OOM), None, refused)
    notes.extend(refused)
    if not isinstance(data, dict):
        return base
    plan = data.get("plan")
    if isinstance(plan, dict):
        fit = plan.get("fit") if isinstance(plan.get("fit"), dict) else {}
        data["plan"] = {**{k: fit[k] for k in OomFit.__struct_fields__ if k in fit},
                        **{k: plan[k] for k in ("device", "device_kind", "budget_source", "optimizer", "notes")
                           if k in plan}}
    if base:
        data.update({k: base[k] for k in ("snapshot", "error") if k in base})
    held, step = data.get("held_bytes"), data.get("step")
    if data.get("kind") == "cpu" and isinstance(held, dict) and alloc_peaks and step in alloc_peaks:
        counted = sum(v for k, v in held.items() if k != REST and isinstance(v, int))
        rss = data.get("total_bytes")
        data["held_bytes"] = {**held, REST: int(alloc_peaks[step])}
        data["total_bytes"] = counted + int(alloc_peaks[step])
        data["total_how"] = ("the CPU allocator's view (the failing step was profiled): the tensors counted plus the "
                             "step's allocations above its start up to the failure, from the profiler's allocation "
                             "events" + (f" (the process' resident memory then: {human_bytes(rss)})" if rss else ""))
    try:
        oom = msgspec.convert({k: v for k, v in data.items() if k in OutOfMemory.__struct_fields__}, OutOfMemory)
    except msgspec.ValidationError as e:
        notes.append(f"{OOM} is not an out-of-memory report this version writes: {e}")
        return base
    return msgspec.to_builtins(oom)


#: The held category that is the allocated total less the tensors counted.
REST = "activations and temporaries"


def _plan(d: Path, memory: dict, asked: bool = True) -> dict | None:
    """``run --plan``'s rows from the process' plan.json (read bounded, as JSON: nothing unpickled), checked
    against RunPlan, with the peak the run measured set beside the as-run row (RunPlan's doc says how)."""
    refused: list[str] = []
    data = read_json(str(d / PLAN), None, refused)
    if data is None:
        if refused:
            return {"error": refused[0]}
        return {"error": "the plan is made at the first torch.optim optimizer step's end, and this process had none "
                         "(no optimizer, a manual update, or the script ended before its first step)"} if asked else None
    try:
        plan = msgspec.convert(data, RunPlan)
    except msgspec.ValidationError as e:
        return {"error": f"{PLAN} is not a plan this version writes: {e}"}
    measured, how = None, ""
    if memory.get("peak_bytes") is not None:
        measured = int(memory["peak_bytes"])
        how = "CUDA: the largest per-step max_memory_allocated() over the profiled steps"
    elif memory.get("alloc_peak_bytes_per_step") and plan.held_bytes:
        # The window's first step is left out where others follow: what it frees of tensors made before the
        # profiler started (last step's gradients, set to None) is not in the allocation events' running total,
        # so its peak reads that much too high (plan_lm.py: 16.43 MB against 14.99 MB in each later step, whose
        # absolute peak is the same). How many steps the window holds depends on when step times settle.
        peaks = memory["alloc_peak_bytes_per_step"]
        steady = sorted(peaks[1:] or peaks)
        above = steady[len(steady) // 2]
        measured = int(sum(plan.held_bytes.values())) + int(above)
        how = (f"CPU allocator: what the script's tensors held at the first optimizer step's end "
               f"({', '.join(f'{k} {v}' for k, v in plan.held_bytes.items())} bytes) + the median per-step peak "
               f"above the step's start ({above} bytes; "
               f"{'the profiled steps after the first' if len(peaks) > 1 else 'the one profiled step'})")
    own = next((r for r in plan.rows if r.as_run and r.peak_bytes), None)
    gap = 100.0 * (own.peak_bytes - measured) / measured if own is not None and measured else None
    return msgspec.to_builtins(msgspec.structs.replace(plan, measured_peak_bytes=measured, measured_how=how,
                                                       gap_pct=gap))


def _gradients(d: Path) -> dict | None:
    """The Gradient flow page's result from the profiled steps' gradient sums (per parameter, summed
    per layer = the module owning it), judged with gradient_health's thresholds."""
    data = read_json(str(d / GRADS), None)
    if not data or not data.get("steps"):
        return None
    names: list[str] = []
    numels: dict[str, int] = {}
    types: dict[str, str] = {}
    pnames: dict[str, list] = {}
    per_step = []
    for s in data["steps"]:
        sink: dict[str, dict] = {}
        for p in s["params"]:
            layer, _, pname = p["name"].rpartition(".")
            layer = layer or "(model)"
            if layer not in numels:
                names.append(layer)
                numels[layer] = 0
                types[layer] = p.get("type") or "?"
                pnames[layer] = []
            if pname not in pnames[layer]:
                pnames[layer].append(pname)
                numels[layer] += p["numel"]
            acc = sink.setdefault(layer, {"sq": 0.0, "abs": 0.0, "max": 0.0, "zeros": 0, "nan": 0, "inf": 0,
                                          "numel": 0})
            norm = p["norm"] if p["norm"] is not None and math.isfinite(p["norm"]) else 0.0
            acc["sq"] += norm * norm
            acc["abs"] += p["abs_sum"] if p["abs_sum"] is not None and math.isfinite(p["abs_sum"]) else 0.0
            acc["max"] = max(acc["max"], p["max"] if p["max"] is not None and math.isfinite(p["max"]) else 0.0)
            acc["zeros"] += p["zeros"]
            acc["nan"] += p["nan"]
            acc["inf"] += p["inf"]
            acc["numel"] += p["numel"]
        per_step.append({"step": s["step"], "sink": sink, "upd": {}})
    steps_table, layers, global_norms = summarize_layers(names, per_step, numels, types, pnames, {},
                                                         [None] * len(per_step))
    counts = {s: sum(1 for l in layers if l["status"] == s) for s in GRAD_STATUSES}
    for r in steps_table:
        for k in ("grad_norm", "grad_abs_mean", "grad_abs_max"):
            r[k] = finite(r[k])
    for l in layers:
        for k in ("grad_norm_mean", "grad_norm_max", "grad_norm_first", "grad_norm_last", "grad_abs_mean",
                  "grad_abs_max", "grad_norm_relative"):
            l[k] = None if l[k] is None else finite(l[k])
    for g in global_norms:
        g["global_norm"] = finite(g["global_norm"])
    metrics = {"layers": len(layers), "layers_healthy": counts["healthy"], "layers_vanishing": counts["vanishing"],
               "layers_exploding": counts["exploding"], "layers_dead": counts["dead"],
               "layers_nonfinite": counts["non-finite"], "layers_flagged": len(layers) - counts["healthy"],
               "global_norm_first": global_norms[0]["global_norm"], "global_norm_last": global_norms[-1]["global_norm"],
               "global_norm_max": max((g["global_norm"] for g in global_norms if g["global_norm"] is not None),
                                      default=None),
               "steps": len(per_step)}
    verdict = "healthy" if metrics["layers_flagged"] == 0 else ", ".join(
        f"{counts[s]} {s}" for s in GRAD_STATUSES[1:] if counts[s])
    return {"loss": "the script's own", "loss_stand_in": False, "confidence": "normal",
            "model": "the script's model", "device": None, "verdict": verdict,
            "thresholds": [{"name": k, "value": v, "meaning": THRESHOLD_HELP[k]} for k, v in THRESHOLDS.items()],
            "metrics": metrics, "layers": layers, "steps": steps_table, "global_norms": global_norms,
            "activations": [], "notes": ["gradients of the profiled steps, read before each optimizer step "
                                         "(the parameters the optimizer holds); update ratios and activations "
                                         "are not measured in an attached run"]}


# ---------------------------------------------------------------------- ranks
def _waited_for(ranked: list[dict]) -> int | None:
    """The rank the others wait for: the most busy time (step less communication), over the others'
    median by WAIT_MARGIN while the others spend time in comm (as the distributed analysis' rule)."""
    timed = [f for f in ranked if f["busy_ms"] is not None and f["rank"] is not None]
    if len(timed) < 2:
        return None
    top = max(timed, key=lambda f: f["busy_ms"])
    others = [f for f in timed if f is not top]
    med = _median([f["busy_ms"] for f in others])
    waiting = _median([f["breakdown_ms"].get("comm", 0.0) for f in others]) or 0.0
    if med is not None and top["busy_ms"] > med * (1 + WAIT_MARGIN) and waiting > 0:
        return top["rank"]
    return None


def _ranks_view(run_dir: Path, ranked: list[dict]) -> dict | None:
    """The trace layer's Ranks view over the ranks' traces (per-rank table, "not one run" problems)."""
    paths = [str(run_dir / f["trace"]) for f in ranked if f["trace"]]
    if len(paths) < 2:
        return None
    from diagnostics.trace.errors import TraceError
    from diagnostics.trace.ranks import analyse_ranks

    try:
        view = analyse_ranks(paths, max_events=2000, parallel=False)
    except (TraceError, OSError) as e:
        return {"error": str(e)}
    return {k: v for k, v in view.items() if k != "timeline"}


def _no_steps_note(run_dir: Path, errors: list, exit_code: int | None = None) -> str:
    """Why no step was seen, from what the processes wrote (never a guess when one of them imported torch)."""
    if not run_dir.is_dir():
        return (f"the run folder {run_dir} was deleted while the script ran: nothing it measured could be read, "
                "the script's exit code stands")
    metas = [m for m in (read_json(str(d / META), {}) for d in run_dir.glob(f"{PROC_PREFIX}*")) if m]
    ended = ("" if exit_code is None else " (it exited with code 0)" if exit_code == 0
             else f" (it exited with code {exit_code})")
    if errors and not metas:
        return "the bootstrap failed before any step: see errors"
    if not metas and not any(run_dir.glob(f"{PROC_PREFIX}*")) and not (run_dir / WORKERS).exists():
        return ("no step was seen: no process of the job imported torch where the bootstrap runs (python -E, -I "
                "or -S, or an environment that drops PYTHONPATH, keeps it out), or the script ended before "
                "importing torch" + ended)
    if metas and not any(m.get("events") for m in metas):
        return (f"no step was seen: torch was imported ({len(metas)} process(es)), but the script ended before "
                "it called a module, a backward, an optimizer or a DataLoader" + ended)
    return ("no step was seen: no optimizer stepped, and no module forward or DataLoader batch ended a step "
            "before the script ended" + ended)


def _metrics(head: dict | None, ranked: list, exit_code, found) -> dict:
    m: dict = {"exit_code": exit_code, "ranks": len(ranked)}
    if not head:
        return {**m, "steps": 0}
    b = head["breakdown_ms"]
    m.update({"steps": head["steps"], "profiled_steps": len(head["prof_rows"]), "step_ms": head["step_ms"],
              "step_ms_profiled": head["step_ms_profiled"], "overhead_pct": head["overhead_pct"],
              **{f"{k}_ms": b.get(k) for k in PHASES},
              "bottleneck_share": head["bottleneck"].share if head["bottleneck"] else None,
              "findings_failed": sum(1 for f in found if f.status == "fail"),
              "findings_warned": sum(1 for f in found if f.status == "warn")})
    if head["gpu"]:
        m["gpu_idle_ms"] = head["gpu"]["idle_ms_per_step"]
        m["kernel_ms"] = head["gpu"]["kernel_ms_per_step"]
    if head["memory"].get("peak_bytes") is not None:
        m["peak_memory_bytes"] = head["memory"]["peak_bytes"]
    return m
