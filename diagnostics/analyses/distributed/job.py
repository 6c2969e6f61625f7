"""Per-rank analysis of a distributed run: step time, computation vs communication, collectives,
stragglers. Registered as "distributed" (launch with torchrun, then analyse) and
"distributed_traces" (analyse a folder of per-rank traces, e.g. copied from several nodes).

Each rank's trace is split per step into computation, communication, their overlap and the rest
by the trace layer (``diagnostics.trace.comm``, which says what each part holds). This module
launches the run, finds the traces, tells stragglers and assembles the ranks:

* busy time = step time - exposed communication: the rank's own work. DDP's all-reduce makes
  every rank's *step* equally long (the fast ranks wait for the slow one inside the collective),
  so a straggler is found by its busy time: a rank is a straggler when its median busy time
  exceeds the median of the *other* ranks by more than ``STRAGGLER_MARGIN`` and by
  ``STRAGGLER_MIN_EXCESS_MS`` (leave-one-out: with 2 ranks the slow one must not raise its own bar).
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
from pathlib import Path

from diagnostics.analyses.distributed import (DISTRIBUTED, DISTRIBUTED_TRACES, STRAGGLER_MARGIN,
                                              STRAGGLER_MIN_EXCESS_MS)
from diagnostics.analyses.distributed.dist_job import DistJob, DistributedInputError
from diagnostics.analyses.distributed.result import DistributedResult
from diagnostics.devices import usable_cores
from diagnostics.results import build
from diagnostics.settings import check_server_path
from diagnostics.trace.comm import collective_bytes, rank_breakdown
from diagnostics.trace.classify import gpu_work_mask, host_mask

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_SIDECARS = (".steps.json", ".status.json", "job.json")


# ---------------------------------------------------------------------------- folders of ranks
def find_rank_traces(folder) -> list[Path]:
    """Every *.json / *.json.gz under ``folder`` but the run's sidecars; which are traces is told on loading."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DistributedInputError(f"trace folder not found: {folder}")
    found = [p for p in sorted(folder.rglob("*")) if p.is_file()
             and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
             and not p.name.endswith(_SIDECARS)]
    if not found:
        raise DistributedInputError(f"{folder} holds no trace files (*.json or *.json.gz)")
    return found


def find_stragglers(busy_ms: dict[int, float], margin: float = STRAGGLER_MARGIN,
                    min_excess_ms: float = STRAGGLER_MIN_EXCESS_MS) -> tuple[list[int], dict]:
    """Ranks whose median busy time exceeds the median of the *other* ranks by the margin (and floor).

    Leave-one-out: a rank is compared with the others only, so with 2 ranks a slow one does not
    inflate its own yardstick (busy 17.9 vs 2.7 ms: threshold 2.7 + 10 = 12.7 ms, not 20.3 ms). With
    an even number of others their median is the upper middle value (statistics.median_high), so
    two equally slow ranks out of three are not both called stragglers of the third.

    The thresholds dict keeps one headline threshold: the busiest rank's (``compared_rank``), which
    is the lowest of all ranks' thresholds, so a rank is a straggler only if the busiest one is;
    ``median_ms`` is the median of the ranks other than that one. Every rank's own figures are in
    ``per_rank`` (keyed by the rank as a string): others_median_ms, threshold_ms.
    """
    if margin < 0 or min_excess_ms < 0:
        raise DistributedInputError("the straggler margin and minimum excess must be >= 0")

    def limit(med: float) -> float:
        return max(med * (1.0 + margin), med + min_excess_ms)

    ranks = sorted(busy_ms)
    median_all = float(statistics.median(busy_ms.values())) if busy_ms else 0.0
    per_rank = {}
    for r in ranks:
        others = [busy_ms[o] for o in ranks if o != r]
        if others:
            med = float(statistics.median_high(others))
            per_rank[str(r)] = {"others_median_ms": med, "threshold_ms": limit(med)}
    if len(ranks) < 2:  # one rank: nothing to compare with
        return [], {"metric": "busy_ms", "rule": "leave-one-out", "median_ms": median_all,
                    "median_all_ms": median_all, "margin": margin, "min_excess_ms": min_excess_ms,
                    "threshold_ms": limit(median_all), "compared_rank": ranks[0] if ranks else None,
                    "per_rank": per_rank}
    stragglers = [r for r in ranks if busy_ms[r] > per_rank[str(r)]["threshold_ms"]]
    busiest = max(ranks, key=lambda r: (busy_ms[r], -r))
    head = per_rank[str(busiest)]
    return stragglers, {"metric": "busy_ms", "rule": "leave-one-out", "median_ms": head["others_median_ms"],
                        "median_all_ms": median_all, "margin": margin, "min_excess_ms": min_excess_ms,
                        "threshold_ms": head["threshold_ms"], "compared_rank": busiest, "per_rank": per_rank}


def _median(values) -> float:
    values = list(values)
    return float(statistics.median(values)) if values else 0.0


def analyze_folder_path(folder, *, margin: float = STRAGGLER_MARGIN, min_excess_ms: float = STRAGGLER_MIN_EXCESS_MS,
                        progress=None, comm_kernels: str | None = None) -> dict:
    """Analyse every per-rank trace in ``folder`` (one file per rank); ``comm_kernels``: the user's
    pattern for in-house communication kernels (classify.use_comm_kernels)."""
    from diagnostics.trace.classify import communication, use_comm_kernels
    from diagnostics.trace.ingest import load_trace

    from diagnostics.trace.errors import TraceError

    progress = progress or (lambda f, m: None)
    folder = Path(folder)
    files = find_rank_traces(folder)
    per_rank: dict[int, dict] = {}
    notes: list[str] = []
    infos = {}
    skipped: list[dict] = []
    for i, path in enumerate(files):
        progress(0.8 + 0.15 * i / len(files), f"analysing {path.name}")
        rel = str(path.relative_to(folder)) if path.is_relative_to(folder) else path.name
        try:
            trace = load_trace(path)
        except TraceError as e:  # a config, a metrics file, a broken download: not a trace, skip it
            skipped.append({"file": rel, "reason": str(e)})
            continue
        if not (host_mask(trace) | gpu_work_mask(trace)).any():
            skipped.append({"file": rel, "reason": f"{path.name}: no CPU or GPU events (not a profiler trace)"})
            continue
        info = trace.meta.get("distributedInfo") if isinstance(trace.meta.get("distributedInfo"), dict) else {}
        rank = trace.rank
        if rank is None:
            m = _RANK_IN_NAME.search(path.name)
            rank = int(m.group(1)) if m else i
            notes.append(f"{path.name} has no distributedInfo; taken as rank {rank}")
        if rank in per_rank:
            raise DistributedInputError(f"two traces claim rank {rank}: {per_rank[rank]['file']} and {path.name}; "
                                   "load one run's traces at a time")
        comm_bytes, note = collective_bytes(path, trace)
        if note:
            notes.append(note)
        use_comm_kernels(trace, comm_kernels)
        b = rank_breakdown(trace, comm_bytes)
        comm = communication(trace)
        b["families"] = [f.family for f in comm.families]
        notes.extend(f"{path.name}: {n}" for n in comm.notes if f"{path.name}: {n}" not in notes)
        b["file"] = path.name
        b["info"] = info
        wall = path.with_name(f"rank{rank}.steps.json")
        if wall.is_file():
            try:
                b["wall_step_ms"] = json.loads(wall.read_text()).get("step_ms") or []
            except ValueError:
                pass
        notes.extend(f"{path.name}: {w}" for w in trace.warnings[:3])
        per_rank[rank] = b
        infos[rank] = info
    if not per_rank:
        raise DistributedInputError(
            f"{folder} holds no profiler trace: none of its {len(files)} .json file(s) is one ("
            + "; ".join(s["reason"] for s in skipped[:3]) + ("; ..." if len(skipped) > 3 else "") + ")")
    if skipped:
        notes.insert(0, f"skipped {len(skipped)} file(s) that are not traces: "
                     + ", ".join(s["file"] for s in skipped[:5]) + (", ..." if len(skipped) > 5 else ""))
    result = _assemble(per_rank, infos, notes, margin, min_excess_ms, str(folder))
    result["skipped_files"] = skipped
    result["metrics"]["files_skipped"] = len(skipped)
    return result


def _world(ranks: list, infos: dict, notes: list) -> int:
    """The world size the traces state (the number of ranks loaded when none does); notes on mixed or missing ranks."""
    world_sizes = {i.get("world_size") for i in infos.values() if i.get("world_size")}
    world = max(world_sizes) if world_sizes else len(ranks)
    if len(world_sizes) > 1:
        notes.append(f"the traces disagree on the world size ({sorted(world_sizes)}): mixed runs?")
    if world_sizes and len(ranks) < world:
        missing = sorted(set(range(world)) - set(ranks))
        notes.append(f"loaded {len(ranks)} of {world} ranks; missing: {missing}")
    return world


def _rank_row(r, rank: dict, busy_ms: float, stragglers: list, thresholds: dict) -> dict:
    """One rank's medians over its steps, its overlap, and how it stands against the others (leave-one-out)."""
    st = rank["steps"]
    row = {"rank": r, "file": rank["file"], "steps": len(st)}
    for key in ("step_ms", "compute_ms", "comm_ms", "overlap_ms", "compute_only_ms", "exposed_comm_ms",
                "other_ms", "busy_ms"):
        row[key] = _median(s[key] for s in st)
    comm_total = sum(s["comm_ms"] for s in st)
    row["overlap_ratio"] = sum(s["overlap_ms"] for s in st) / comm_total if comm_total else None
    wall = rank.get("wall_step_ms")
    row["wall_step_ms"] = _median(wall) if wall else None
    row["straggler"] = r in stragglers
    own = thresholds["per_rank"].get(str(r))  # leave-one-out: this rank against the others
    row["others_median_ms"] = own["others_median_ms"] if own else None
    row["threshold_ms"] = own["threshold_ms"] if own else None
    row["busy_excess_pct"] = (100.0 * (busy_ms - own["others_median_ms"]) / own["others_median_ms"]
                              if own and own["others_median_ms"] else None)
    return row


def _collectives(per_rank: dict, ranks: list) -> list[dict]:
    """The collectives by name and call site over every rank, the costliest first."""
    groups: dict[tuple[str, str], dict] = {}
    for r in ranks:
        for c in per_rank[r]["calls"]:
            g = groups.setdefault((c["name"], c["where"]), {"name": c["name"], "family": c.get("family"),
                                                           "where": c["where"], "calls": 0,
                                                           "ranks": set(), "total_ms": 0.0, "max_ms": 0.0,
                                                           "bytes": 0, "calls_with_bytes": 0})
            g["calls"] += 1
            g["ranks"].add(r)
            g["total_ms"] += c["dur_ms"]
            g["max_ms"] = max(g["max_ms"], c["dur_ms"])
            if c["bytes"] is not None:
                g["bytes"] += c["bytes"]
                g["calls_with_bytes"] += 1
    collectives = []
    for g in sorted(groups.values(), key=lambda g: -g["total_ms"]):
        known = g.pop("calls_with_bytes")
        collectives.append({**g, "ranks": len(g["ranks"]), "mean_ms": g["total_ms"] / g["calls"],
                            "bytes": g["bytes"] if known == g["calls"] else None,
                            "mean_bytes": g["bytes"] / known if known else None})
    return collectives


def _assemble(per_rank: dict, infos: dict, notes: list, margin: float, min_excess_ms: float, folder: str) -> dict:
    ranks = sorted(per_rank)
    backends = {i.get("backend") for i in infos.values() if i.get("backend")}
    world = _world(ranks, infos, notes)
    step_rows = [{"rank": r, **s} for r in ranks for s in per_rank[r]["steps"]]
    busy = {r: _median(s["busy_ms"] for s in per_rank[r]["steps"]) for r in ranks}
    stragglers, thresholds = find_stragglers(busy, margin, min_excess_ms)
    rank_rows = [_rank_row(r, per_rank[r], busy[r], stragglers, thresholds) for r in ranks]
    all_steps = [s["step_ms"] for s in step_rows]
    comm_sum = sum(s["comm_ms"] for s in step_rows)
    step_sum = sum(all_steps)
    on_gpu = any(per_rank[r]["on_gpu"] for r in ranks)
    metrics = {
        "world_size": world, "ranks_loaded": len(ranks),
        "steps_per_rank": min((len(per_rank[r]["steps"]) for r in ranks), default=0),
        "median_step_ms": _median(all_steps), "max_step_ms": max(all_steps, default=0.0),
        "median_busy_ms": thresholds["median_all_ms"],
        "comm_fraction": comm_sum / step_sum if step_sum else 0.0,
        "exposed_comm_fraction": sum(s["exposed_comm_ms"] for s in step_rows) / step_sum if step_sum else 0.0,
        "overlap_ratio": sum(s["overlap_ms"] for s in step_rows) / comm_sum if comm_sum else None,
        "stragglers": len(stragglers),
    }
    return {
        "folder": folder,
        "backend": ", ".join(sorted(backends)) or "unknown",
        "device_kind": "GPU" if on_gpu else "CPU",
        "metrics": metrics,
        "ranks": rank_rows,
        "steps": step_rows,
        "collectives": _collectives(per_rank, ranks),
        "stragglers": stragglers,
        "thresholds": thresholds,
        "distributed_info": {str(r): {k: v for k, v in infos[r].items() if k in ("rank", "world_size", "backend")}
                             for r in ranks},
        "notes": notes,
    }


# ---------------------------------------------------------------------------- registered analyses
def analyze_folder(ctx, options: dict) -> DistributedResult:
    """Registered "distributed_traces": per-rank traces already on disk (e.g. from several nodes)."""
    options = DISTRIBUTED_TRACES.validate(options)  # idempotent: the runner validated them too
    result = analyze_folder_path(check_server_path(options["trace_dir"], "trace folder"),
                                 margin=options["straggler_margin"], min_excess_ms=options["straggler_min_ms"],
                                 progress=ctx.progress, comm_kernels=options["comm_kernels"])
    return build(DistributedResult, {**result, "source": "folder"})


def analyze(ctx, options: dict) -> DistributedResult:
    """Registered "distributed": launch DDP training of the model with torchrun, then analyse."""
    options = DISTRIBUTED.validate(options)  # idempotent: the runner validated them too
    if options["trace_dir"]:
        return analyze_folder(ctx, {k: options[k] for k in DISTRIBUTED_TRACES.option_keys})
    import torch

    from diagnostics.analyses.distributed.dist_job import choose_backend
    from diagnostics.analyses.distributed.launch import launch, torchrun_command

    nproc = options["nproc"]
    requested = options["backend"]
    backend, backend_why = choose_backend(requested, nproc,
                                          torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for key in ("straggler_rank", "die_rank"):
        r = options[key]
        if r is not None and not r < nproc:
            raise DistributedInputError(f"{key} {r} is not a rank of a {nproc}-process run (0..{nproc - 1})")
    if ctx.spec is not None and ctx.spec.source != "sample":
        # A model file: load it once here, so a file that does not load fails now, as bad input,
        # rather than on every rank after torchrun started.
        import dataclasses

        from diagnostics.intake import load_model

        ctx.progress(0.02, f"checking that {ctx.spec.name} loads")
        load_model(dataclasses.replace(ctx.spec, device="cpu"))
    out_dir = ctx.artifact_dir / "distributed"
    spec = ctx.spec.to_dict() if ctx.spec is not None else {"source": "sample", "name": "mlp"}
    job = DistJob(spec=spec, out_dir=str(out_dir), steps=options["steps"], warmup=options["warmup"],
                  backend=backend, pg_timeout_s=options["pg_timeout_s"], straggler_rank=options["straggler_rank"],
                  straggler_sleep_ms=options["straggler_sleep_ms"], die_rank=options["die_rank"],
                  die_step=options["die_step"], die_how=options["die_how"])
    ctx.progress(0.05, f"launching torchrun with {nproc} processes (backend {backend}: {backend_why})")
    run = launch(job, nproc, timeout_s=options["run_timeout_s"],
                 on_progress=ctx.progress)
    result = analyze_folder_path(out_dir, margin=options["straggler_margin"],
                                 min_excess_ms=options["straggler_min_ms"], progress=ctx.progress,
                                 comm_kernels=options["comm_kernels"])
    result["source"] = "launch"
    oversubscribed(result, nproc, job.threads, on_gpu=backend == "nccl")
    if requested == "auto":
        result["notes"].insert(0, f"backend {backend} ({backend_why})")
    result["launch"] = {
        "command": shlex.join(torchrun_command(Path(out_dir) / "job.json", nproc)),
        "nproc": nproc, "backend": backend, "backend_requested": requested, "backend_reason": backend_why,
        "duration_s": run.duration_s,
        "straggler_rank": job.straggler_rank, "straggler_sleep_ms": job.straggler_sleep_ms,
    }
    ctx.progress(1.0, "done")
    return build(DistributedResult, result)


def oversubscribed(result: dict, nproc: int, threads: int, on_gpu: bool, cores: int | None = None) -> None:
    """On the CPU, ranks x threads beyond the cores make ranks wait for a core: their busy-time
    differences are scheduling, not stragglers. Say so, and call no rank a straggler for it."""
    cores = cores or usable_cores()
    demand = nproc * max(1, int(threads))
    result["cpu"] = {"ranks": nproc, "threads_per_rank": int(threads), "cores": cores,
                     "oversubscribed": (not on_gpu) and demand > cores}
    if not result["cpu"]["oversubscribed"]:
        return
    flagged = list(result["stragglers"])
    result["stragglers"] = []
    result["metrics"]["stragglers"] = 0
    for row in result["ranks"]:
        row["straggler"] = False
    result["notes"].insert(0, f"{nproc} ranks x {threads} thread(s) = {demand} busy threads on {cores} CPU cores: "
                              "the ranks took turns on the cores, so a slower rank is not called a straggler"
                              + (f" (rank(s) {', '.join(map(str, flagged))} would have been)" if flagged else "")
                              + f". Run at most {cores} ranks x threads here to compare ranks.")
