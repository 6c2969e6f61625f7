"""Where the Compile page's time goes on a small MLP, and what empty_cache_codegen cuts (issue #36).

1. ``--jobs`` compile jobs on the sample ``mlp`` through ``runner.run_job`` (a worker with its private,
   empty compiler cache, as the page and the CLI run it): the phases from the job's own progress
   (worker start and model load, Dynamo's explain, the light pass for fullgraph and recompiles, the
   backend's compile, the timed rounds), and when the first partial result (the graph breaks) arrived.
2. ``--pairs`` pairs of fresh processes, each on a new empty inductor cache, alternating which goes
   first: the inductor first call (compile) of the same MLP with ``measure.dynamo.empty_cache_codegen``
   and without it (inductor's defaults: the vector-ISA probe and the precompiled header), and, without
   it, what the old recompile probe cost (a second inductor compile at twice the batch) against the
   light backend's probe that replaced it.
3. With ``--reference DIR`` (a checkout of the code before, e.g. ``git archive <base> | tar -x -C DIR``):
   ``--cli`` pairs of ``python -m diagnostics compile --model mlp`` from this checkout and from DIR,
   alternating, each a fresh process and worker: the wall time, and when the graph breaks were first
   printed (this checkout prints them as they come; before, they came with the result).

    .venv/bin/python bench/bench_compile_time.py [--jobs 1] [--pairs 2] [--reference DIR --cli 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def uptime() -> str:
    load = os.getloadavg()
    return f"load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} on {os.cpu_count()} cores"


def job_phases() -> dict:
    from diagnostics.runner import Job, run_job
    from diagnostics.spec import ModelSpec

    marks: list[tuple[float, str]] = []
    partials: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    out = run_job(Job("compile", ModelSpec(name="mlp"), {}), on_progress=lambda f, m: marks.append(
        (time.perf_counter() - t0, m)), on_partial=lambda p: partials.append((time.perf_counter() - t0, p.stage)))
    total = time.perf_counter() - t0
    assert out.ok, out.error

    def at(prefix: str) -> float:
        return next(t for t, m in marks if m.startswith(prefix))

    explain, light, compiling, timing = (at("Dynamo: graphs"), at("Dynamo: fullgraph"), at("compiling"),
                                         at("eager vs compiled"))
    return {"total_s": total, "start_and_load_s": explain, "explain_s": light - explain,
            "light_pass_s": compiling - light, "compile_s": timing - compiling, "timing_s": total - timing,
            "breaks_shown_at_s": partials[0][0], "recompiles_shown_at_s": partials[1][0],
            "compile_time_s": out.result.metrics.compile_time_s}


CHILD = r"""
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from diagnostics.intake import load_model
from diagnostics.inputs import call
from diagnostics.measure.dynamo import empty_cache_codegen
from diagnostics.spec import ModelSpec
from contextlib import nullcontext
l = load_model(ModelSpec(name="mlp"))
m, x, x2 = l.model.eval(), l.inputs, l.make_inputs(2 * l.batch_size)
out = {}
with (empty_cache_codegen() if sys.argv[2] == "codegen" else nullcontext()), torch.no_grad():
    c = torch.compile(m)
    t = time.perf_counter(); call(c, x); out["first_call_s"] = time.perf_counter() - t
    if sys.argv[2] == "default":
        t = time.perf_counter(); call(c, x2); out["inductor_probe_s"] = time.perf_counter() - t
        torch._dynamo.reset()
        light = torch.compile(m, backend="eager")
        t = time.perf_counter(); call(light, x); call(light, x2); out["light_probe_s"] = time.perf_counter() - t
print(json.dumps(out))
"""


def child(kind: str) -> dict:
    cache = tempfile.mkdtemp(prefix="bench-inductor-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TMPDIR=cache)
    p = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), kind], env=env, capture_output=True, text=True,
                       timeout=900)
    if p.returncode:
        raise RuntimeError(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def cli_run(root: Path) -> dict:
    """``compile --model mlp`` from ``root``: wall seconds, and seconds to the first Dynamo line."""
    data = tempfile.mkdtemp(prefix="bench-compile-cli-")
    env = dict(os.environ, TORCHSCOPE_DATA_DIR=data, PYTHONPATH=str(root))
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "diagnostics", "compile", "--model", "mlp", "--no-report",
                          "--quiet"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first = None
    for line in p.stdout:
        if first is None and ("Dynamo:" in line or line.strip().startswith("Graphs")):
            first = time.perf_counter() - t0
    p.wait(timeout=900)
    return {"wall_s": time.perf_counter() - t0, "breaks_printed_s": first}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--reference", type=Path, help="a checkout of the code before (for --cli)")
    ap.add_argument("--cli", type=int, default=2, help="pairs of CLI runs, this checkout vs --reference")
    a = ap.parse_args()
    print(f"start: {uptime()}", flush=True)
    for i in range(a.jobs):
        ph = job_phases()
        print(f"job {i + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in ph.items()) + f"; {uptime()}", flush=True)
    pairs = []
    for i in range(a.pairs):
        order = ("codegen", "default") if i % 2 == 0 else ("default", "codegen")
        runs = {k: child(k) for k in order}
        pairs.append(runs)
        d, c = runs["default"], runs["codegen"]
        print(f"pair {i + 1}: first call (inductor compile) {d['first_call_s']:.1f} s default vs "
              f"{c['first_call_s']:.1f} s with empty_cache_codegen; the old batch x2 inductor probe "
              f"{d['inductor_probe_s']:.1f} s vs the light probe {d['light_probe_s']:.2f} s; {uptime()}", flush=True)
    if pairs:
        ratio = statistics.median(p["codegen"]["first_call_s"] / p["default"]["first_call_s"] for p in pairs)
        print(f"\nsummary: empty_cache_codegen / default first call, median of {len(pairs)} pairs: x{ratio:.2f}")
    if a.reference:
        cli = []
        for i in range(a.cli):
            order = ("now", "before") if i % 2 == 0 else ("before", "now")
            runs = {k: cli_run(ROOT if k == "now" else a.reference.resolve()) for k in order}
            cli.append(runs)
            n, b = runs["now"], runs["before"]
            print(f"cli pair {i + 1}: now {n['wall_s']:.1f} s (breaks printed at {n['breaks_printed_s']:.1f} s) vs "
                  f"before {b['wall_s']:.1f} s (breaks printed at {b['breaks_printed_s']:.1f} s); {uptime()}", flush=True)
        print(f"summary: CLI wall time now / before, median x"
              f"{statistics.median(r['now']['wall_s'] / r['before']['wall_s'] for r in cli):.2f}; breaks printed "
              f"now / before x{statistics.median(r['now']['breaks_printed_s'] / r['before']['breaks_printed_s'] for r in cli):.2f}")
    print(f"end: {uptime()}")


if __name__ == "__main__":
    main()
