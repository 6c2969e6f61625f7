"""Early stopping vs the full run on Optimize's default inference set on the sample CNN (issue #36).

Two parts, both in one process and one run (ratios are taken within the run; the load is recorded):

1. ``--jobs`` pairs of whole Optimize jobs (``runner.run_job``: a fresh worker each, as the page and the
   CLI run them), early stop on and off in alternating order (ABBA): the job's wall time, its timing
   phase (from the job's own progress: "timing ..." to its end) and the rounds run.
2. The default set built once (``trials.build_trials``), then ``--pairs`` pairs of its timing phase
   (``trials.time_interleaved``, 20 rounds, the A/A control) with early stop on and off, alternating:
   the time each took, the calls made and each fix's verdict. Agreement is the share of fixes whose
   verdict is the same in the early-stopped comparison and the full one timed next to it; beside it,
   the same share between two full comparisons timed one after the other (how much verdicts move from
   one full run to the next on this machine).

    .venv/bin/python bench/bench_early_stop.py [--jobs 1] [--pairs 6] [--iters 20]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def uptime() -> str:
    load = os.getloadavg()
    return f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} on {os.cpu_count()} cores"


def whole_job(early: bool, iters: int) -> dict:
    from diagnostics.runner import Job, run_job
    from diagnostics.results import given
    from diagnostics.spec import ModelSpec

    marks = {}
    t0 = time.perf_counter()

    def progress(f, m):
        if m.startswith("timing") and "timing" not in marks:
            marks["timing"] = time.perf_counter()

    out = run_job(Job("optimize", ModelSpec(name="cnn"), {"early_stop": early, "iters": iters,
                                                          "save_artifacts": False}),
                  on_progress=progress, artifact_dir=Path(tempfile.mkdtemp(prefix="bench-early-")))
    end = time.perf_counter()
    assert out.ok, out.error
    r = out.result
    return {"wall_s": end - t0, "timing_s": end - marks.get("timing", end), "rounds": r.timing_stop.run,
            "verdicts": {row.fix: row.verdict for row in r.rows if row.fix != "baseline"},
            "decided": sum(given(row.decided_at) for row in r.rows)}


def timing_pairs(pairs: int, iters: int) -> list[tuple[dict, dict]]:
    import torch

    from diagnostics.analyses.optimize.catalog import fix_ids
    from diagnostics.analyses.optimize.trials import build_trials, time_interleaved
    from diagnostics.intake import load_model
    from diagnostics.measure.environment import environment_facts
    from diagnostics.measure.structure import forward_facts, static_facts
    from diagnostics.spec import ModelSpec

    loaded = load_model(ModelSpec(name="cnn"))
    facts = {"static": static_facts(loaded.model), "env": environment_facts(loaded.device),
             "source": loaded.spec.source, "forward": forward_facts(copy.deepcopy(loaded.model), loaded.inputs)}
    t0 = time.perf_counter()
    _, candidates = build_trials(loaded.model, loaded.inputs, torch.device("cpu"), fix_ids("inference"), facts)
    print(f"built {len(candidates) - 1} candidates in {time.perf_counter() - t0:.1f} s", flush=True)

    def once(early: bool) -> dict:
        t = time.perf_counter()
        times, _, stop = time_interleaved(candidates, loaded.inputs, loaded.device, iters, 3, control=True,
                                          early_stop=early)
        return {"s": time.perf_counter() - t, "rounds": stop.run,
                "calls": 2 * sum(len(v["round_ms"]) for v in times.values()),
                "verdicts": {k: v["verdict"] for k, v in times.items() if v["verdict"] is not None},
                "decided": sum(v.get("decided_at") is not None for v in times.values())}

    out = []
    for i in range(pairs):
        first, second = (True, False) if i % 2 == 0 else (False, True)  # alternate which runs first
        a, b = once(first), once(second)
        early, full = (a, b) if first else (b, a)
        out.append((early, full))
        print(f"pair {i + 1}: early {early['s']:.2f} s ({early['rounds']} rounds, {early['decided']} decided), "
              f"full {full['s']:.2f} s; {uptime()}", flush=True)
    return out


def agreement(a: dict, b: dict) -> float:
    keys = sorted(set(a) & set(b))
    return sum(a[k] == b[k] for k in keys) / len(keys)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1, help="pairs of whole Optimize jobs")
    ap.add_argument("--pairs", type=int, default=6, help="pairs of timing phases on the candidates built once")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    print(f"start: {uptime()}", flush=True)
    jobs = []
    for i in range(a.jobs):
        order = (True, False) if i % 2 == 0 else (False, True)
        runs = {early: whole_job(early, a.iters) for early in order}
        jobs.append(runs)
        e, f = runs[True], runs[False]
        print(f"job pair {i + 1}: early {e['wall_s']:.1f} s (timing {e['timing_s']:.1f} s, {e['rounds']} rounds, "
              f"{e['decided']} decided) vs full {f['wall_s']:.1f} s (timing {f['timing_s']:.1f} s); verdicts agree "
              f"{agreement(e['verdicts'], f['verdicts']):.0%}; {uptime()}", flush=True)
    pairs = timing_pairs(a.pairs, a.iters) if a.pairs else []
    print("\nsummary")
    for i, runs in enumerate(jobs):
        print(f"  whole job {i + 1}: early / full wall time x{runs[True]['wall_s'] / runs[False]['wall_s']:.2f}, "
              f"timing phase x{runs[True]['timing_s'] / runs[False]['timing_s']:.2f}")
    if pairs:
        pair_summary(pairs)
    print(f"end: {uptime()}")


def pair_summary(pairs: list[tuple[dict, dict]]) -> None:
    ratio = statistics.median(e["s"] / f["s"] for e, f in pairs)
    calls = sum(e["calls"] for e, _ in pairs) / sum(f["calls"] for _, f in pairs)
    agree = statistics.mean(agreement(e["verdicts"], f["verdicts"]) for e, f in pairs)
    full_full = [agreement(pairs[i][1]["verdicts"], pairs[i + 1][1]["verdicts"]) for i in range(len(pairs) - 1)]
    decided = sum(e["decided"] for e, _ in pairs)
    print(f"  timing phase, {len(pairs)} pairs: early / full time, median x{ratio:.2f}; calls x{calls:.2f}; "
          f"{decided} fix verdicts decided early of {sum(len(e['verdicts']) - 1 for e, _ in pairs)}")
    print(f"  verdict agreement early vs full (same pair): {agree:.1%}; full vs the next full: "
          f"{statistics.mean(full_full) if full_full else float('nan'):.1%}")


if __name__ == "__main__":
    main()
