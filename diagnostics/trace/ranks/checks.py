"""Which file is which rank, and the "not one run" checks over the ranks' summaries.

A rank's number is its trace's distributedInfo.rank, else the number in its file name ("rank3",
"worker_3"), else its place in the list; ``rank_source`` says which. Each check is a named problem
(CHECKS): ranks disagreeing on world_size or on their process-group configs, a rank number twice,
ranks of 0..world_size-1 missing, different trace schema / CUDA / NCCL versions or devices, trace
starts further apart than START_SKEW_MAX_S, different sets of profiler step numbers, files that are
not traces.
"""

from __future__ import annotations

import re
from pathlib import Path

from diagnostics.trace.errors import TraceError
from diagnostics.trace.timeline import natural_key

#: Ranks whose traces start further apart than this (wall clock) are not one run's.
START_SKEW_MAX_S = 300.0
#: Files a distributed run writes beside its rank traces (diagnostics.analyses.distributed): not traces.
NOT_TRACES = (".steps.json", ".status.json", "job.json")
#: The number in a file name that names its rank.
RANK_NAME_RE = re.compile(r"(?:rank|worker)[_\-.]?(\d+)", re.IGNORECASE)
#: The problem checks, in the order they are reported.
CHECKS = ("unreadable", "world_size", "pg_config", "duplicate_rank", "missing_rank", "versions",
          "start_time", "steps")


def rank_paths(paths) -> list[Path]:
    """Trace files from files and folders (a folder: its *.json / *.json.gz, in natural name order)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        p = Path(p).expanduser()
        if p.is_dir():
            found = [f for f in p.rglob("*") if f.is_file() and f.name.endswith((".json", ".json.gz"))
                     and not f.name.endswith(NOT_TRACES)]
            if not found:
                raise TraceError(f"{p}: the folder holds no trace files (*.json or *.json.gz)")
            out += sorted(found, key=lambda f: natural_key(str(f.relative_to(p))))
        elif p.is_file():
            out.append(p)
        else:
            raise TraceError(f"{p}: no such file or folder")
    seen, unique = set(), []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    if not unique:
        raise TraceError("no rank traces given")
    return unique


def assign_ranks(rows: list[dict]) -> None:
    for i, r in enumerate(rows):
        if r.get("dist_rank") is not None:
            r["rank"], r["rank_source"] = r["dist_rank"], "distributedInfo"
            continue
        m = RANK_NAME_RE.findall(r["name"])
        if m:
            r["rank"], r["rank_source"] = int(m[-1]), "file name"
        else:
            r["rank"], r["rank_source"] = i, "order"


def _problem(check: str, message: str) -> dict:
    return {"check": check, "message": message}


def _by_value(rows: list, key) -> dict:
    """value (as text) -> ranks holding it."""
    out: dict = {}
    for r in rows:
        out.setdefault(repr(key(r)), []).append(r["rank"])
    return out


def _spell(groups: dict) -> str:
    return "; ".join(f"{v} on rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
                     for v, rs in groups.items())


def check_one_run(rows: list[dict], failed: list[dict], start_skew_max_s: float = START_SKEW_MAX_S) -> list[dict]:
    """The named problems that say these ranks are not one run's (see CHECKS)."""
    problems = [_problem("unreadable", f"{f['name']}: not read ({f['error']})") for f in failed]
    sizes = {r["world_size"] for r in rows if r["world_size"] is not None}
    if len(sizes) > 1:
        problems.append(_problem("world_size", "ranks disagree on world_size: "
                                 + _spell(_by_value([r for r in rows if r["world_size"] is not None],
                                                    lambda r: r["world_size"]))))
    pg = [r for r in rows if r["pg_config"] is not None or r["pg_count"] is not None]
    if len({repr((r["pg_count"], r["pg_config"])) for r in pg}) > 1:
        groups: dict = {}
        for r in pg:
            groups.setdefault(repr((r["pg_count"], r["pg_config"])), []).append(r)
        problems.append(_problem("pg_config", "ranks disagree on their process groups (distributedInfo pg_count / "
                                 "pg_config): " + "; ".join(
                                     f"{len(g[0]['pg_config'] or []) if isinstance(g[0]['pg_config'], list) else '?'} "
                                     f"group config(s), pg_count {g[0]['pg_count']} on rank"
                                     f"{'s' if len(g) > 1 else ''} {', '.join(str(r['rank']) for r in g)}"
                                     for g in groups.values())))
    counts: dict = {}
    for r in rows:
        counts.setdefault(r["rank"], []).append(r["name"])
    for rank, files in sorted(counts.items()):
        if len(files) > 1:
            problems.append(_problem("duplicate_rank", f"rank {rank} appears {len(files)} times: {', '.join(files)}"))
    if len(sizes) == 1:
        (size,) = sizes
        missing = sorted(set(range(size)) - set(counts))
        beyond = sorted(r for r in counts if not 0 <= r < size)
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
            problems.append(_problem("missing_rank", f"world_size is {size} but rank{'s' if len(missing) > 1 else ''} "
                                     f"{shown} {'are' if len(missing) > 1 else 'is'} missing"))
        if beyond:
            problems.append(_problem("missing_rank", f"rank{'s' if len(beyond) > 1 else ''} "
                                     f"{', '.join(map(str, beyond))} outside 0..{size - 1} (world_size {size})"))
    keys = sorted({k for r in rows for k in r["versions"]})
    for k in keys:
        groups = _by_value(rows, lambda r: r["versions"].get(k))
        if len(groups) > 1:
            problems.append(_problem("versions", f"ranks were recorded with different {k}: {_spell(groups)}"))
    starts = [(r["start_s"], r["rank"]) for r in rows if r["start_s"] is not None]
    if len(starts) > 1:
        (lo, r_lo), (hi, r_hi) = min(starts), max(starts)
        if hi - lo > start_skew_max_s:
            problems.append(_problem("start_time", f"traces start {hi - lo:,.0f} s apart (rank {r_lo} first, rank {r_hi} "
                                     f"last; one run's ranks start within {start_skew_max_s:,.0f} s)"))
    step_sets = _by_value(rows, lambda r: _ranges(r["step_numbers"]))
    if len(step_sets) > 1:
        problems.append(_problem("steps", "ranks hold different profiler steps: "
                                 + "; ".join(f"{v.strip(chr(39))} on rank{'s' if len(rs) > 1 else ''} "
                                             f"{', '.join(map(str, rs))}" for v, rs in step_sets.items())))
    return problems


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> "steps 1-3, 7"; [] -> "no steps"."""
    if not numbers:
        return "no steps"
    parts, start, prev = [], numbers[0], numbers[0]
    for n in numbers[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return "steps " + ", ".join(parts)
