"""Profiler job overhead and latency fidelity against bare torch.profiler / perf_counter scripts.

(a) Wall time of the dashboard's profiling job (the "profile" analysis) vs a bare script doing the
    same steps on the same model: build the model, time the step (warmup + N iterations with
    perf_counter), profile wait/warmup/active steps with torch.profiler (same schedule and
    record_shapes), export the Chrome trace and compute key_averages. Measured in-process
    (runner.execute vs a function) and end to end (runner.run_job's spawned worker vs the bare
    script in a fresh `python` process). Target: job <= 1.15x bare.
(b) The job's reported median latency vs the median of a bare perf_counter loop on the same model
    in the same run. Target: within 5%.

Runs are interleaved and repeated; medians are reported (the machine may be shared).

    .venv/bin/python bench/bench_profiler.py [--repeats 5] [--write]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# One intra-op thread everywhere (this process, the runner's worker, the bare subprocess): on a
# shared machine, oversubscribed threads make every figure noisier. Set before torch is imported.
THREADS = os.environ.setdefault("OMP_NUM_THREADS", "1")

SECTION = "## Profiler overhead and latency fidelity"
SAMPLE, BATCH = "cnn", 8
OPTIONS = {"mode": "train", "optimizer": "sgd", "lr": 0.01, "wait": 1, "warmup": 1, "active": 3, "repeat": 1,
           "record_shapes": True, "profile_memory": False, "with_stack": False, "with_modules": True,
           "latency_warmup": 5, "latency_iters": 25}


def bare(out_dir: str) -> dict:
    """What a user would write by hand: the same model, steps, schedule and exports; no dashboard."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from sample_models import SAMPLES, task_loss

    sample = SAMPLES[SAMPLE]
    torch.manual_seed(0)
    model = sample.build()
    x = torch.randn((BATCH,) + tuple(sample.inputs[0].shape[1:]), generator=torch.Generator().manual_seed(0))
    loss_fn = task_loss(sample.task, sample.num_classes, 0)
    opt = torch.optim.SGD(model.parameters(), lr=OPTIONS["lr"])
    model.train()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x)).backward()
        opt.step()

    for _ in range(OPTIONS["latency_warmup"]):
        step()
    samples = []
    for _ in range(OPTIONS["latency_iters"]):
        t0 = time.perf_counter()
        step()
        samples.append((time.perf_counter() - t0) * 1e3)
    n = OPTIONS["wait"] + OPTIONS["warmup"] + OPTIONS["active"]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=OPTIONS["record_shapes"],
                 schedule=schedule(wait=OPTIONS["wait"], warmup=OPTIONS["warmup"], active=OPTIONS["active"]),
                 on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(out_dir, "bare_trace.json"))) as prof:
        for _ in range(n):
            step()
            prof.step()
    prof.key_averages()
    return {"median_ms": statistics.median(samples)}


def job_in_process(out_dir: str) -> dict:
    from diagnostics.runner import Job, execute
    from diagnostics.spec import ModelSpec

    r = execute(Job("profile", ModelSpec(name=SAMPLE, batch_size=BATCH), OPTIONS), Path(out_dir))
    return {"median_ms": r["latency"]["median_ms"]}


def job_via_runner(out_dir: str) -> float:
    from diagnostics.runner import Job, run_job
    from diagnostics.spec import ModelSpec

    t0 = time.perf_counter()
    outcome = run_job(Job("profile", ModelSpec(name=SAMPLE, batch_size=BATCH), OPTIONS), artifact_dir=Path(out_dir))
    dt = time.perf_counter() - t0
    if not outcome.ok:
        raise SystemExit(f"runner job failed: {outcome.error}\n{outcome.log_tail}")
    return dt


def bare_subprocess(out_dir: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--bare-once", out_dir], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9, help="in-process rounds")
    ap.add_argument("--runner-repeats", type=int, default=5, help="rounds that also time the runner / subprocess")
    ap.add_argument("--write", action="store_true", help=f"write the figures into docs/BENCHMARKS.md ({SECTION})")
    ap.add_argument("--bare-once", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_once:
        bare(args.bare_once)
        return

    import torch

    tmp = tempfile.mkdtemp(prefix="bench-profiler-")
    # one untimed round each, so imports and first-call costs are not in the figures
    bare(tmp)
    job_in_process(tmp)
    # As the runner's worker does once torch is loaded (diagnostics/runner/worker.py): what is loaded now
    # is out of the collector's reach, for both sides alike. Without it a full collection (0.2 s,
    # scanning torch's ~300k objects) lands in whichever side tips the threshold, mostly the job.
    gc.freeze()
    t_job, t_bare, lat_job, lat_bare, r_job, r_bare = [], [], [], [], [], []
    for i in range(args.repeats):
        # ABBA order inside a round, so a load change during the round hits both sides alike
        first, second = (job_in_process, bare) if i % 2 == 0 else (bare, job_in_process)
        for fn in (first, second):
            dt, out = timed(fn, tmp)
            (t_job if fn is job_in_process else t_bare).append(dt)
            (lat_job if fn is job_in_process else lat_bare).append(out["median_ms"])
        if i < args.runner_repeats:
            pair = (lambda: r_job.append(job_via_runner(tempfile.mkdtemp(dir=tmp))),
                    lambda: r_bare.append(bare_subprocess(tmp)))
            for run in (pair if i % 2 == 0 else pair[::-1]):
                run()
        print(f"round {i + 1}/{args.repeats}: in-process job {t_job[-1]:.2f} s, bare {t_bare[-1]:.2f} s; "
              + (f"runner {r_job[-1]:.2f} s, bare subprocess {r_bare[-1]:.2f} s; " if i < args.runner_repeats else "")
              + f"latency job {lat_job[-1]:.2f} ms, bare {lat_bare[-1]:.2f} ms", flush=True)
    med = statistics.median

    def paired(a, b):  # the median of per-round ratios: rounds share the machine's load at the time
        return med([x / y for x, y in zip(a, b)])

    rows = [
        ("Profiling job in-process (runner.execute) vs bare script function", med(t_job), med(t_bare), "s",
         paired(t_job, t_bare), "<= 1.15x"),
        ("Profiling job via the runner (spawned worker) vs bare script in a new python", med(r_job), med(r_bare),
         "s", paired(r_job, r_bare), "<= 1.15x"),
        ("Reported median latency vs bare perf_counter loop", med(lat_job), med(lat_bare), "ms",
         paired(lat_job, lat_bare), "within 5% (0.95-1.05)"),
    ]
    header = ("| measurement | dashboard (median) | bare (median) | ratio (median of per-round ratios) | target |\n"
              "|---|---|---|---|---|")
    lines = [f"| {name} | {a:.3f} {u} | {b:.3f} {u} | {ratio:.3f}x | {target} |" for name, a, b, u, ratio, target in rows]
    table = "\n".join([header] + lines)
    print(table)
    if args.write:
        write_section(table, args.repeats, args.runner_repeats, torch.__version__,
                      in_process=rows[0][4], end_to_end=rows[1][4], latency=rows[2][4], load=os.getloadavg()[0])


def _verdict(in_process: float, end_to_end: float, latency: float) -> str:
    met = [r <= 1.15 for r in (in_process, end_to_end)]
    wall = ("**the 1.15x wall-time target is met** in both comparisons" if all(met) else
            "**the 1.15x wall-time target is met end to end but not in-process**" if met[1] else
            "**the 1.15x wall-time target is met in-process but not end to end**" if met[0] else
            "**the 1.15x wall-time target is not met here**")
    lat = ("the latency target (within 5 %) is met" if 0.95 <= latency <= 1.05 else
           "**the latency target (within 5 %) is not met**")
    return (f"{wall} (in-process {in_process:.2f}x, end to end {end_to_end:.2f}x); {lat} "
            f"({latency:.3f}x).")


def write_section(table: str, repeats: int, runner_repeats: int, torch_version: str, in_process: float,
                  end_to_end: float, latency: float, load: float) -> None:
    path = ROOT / "docs" / "BENCHMARKS.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    body = f"""{SECTION}

Command: `.venv/bin/python bench/bench_profiler.py --repeats {repeats} --runner-repeats {runner_repeats} --write`
(`bench/bench_profiler.py`).

Model: sample `{SAMPLE}`, batch {BATCH}, training step (SGD), schedule wait {OPTIONS['wait']} / warmup
{OPTIONS['warmup']} / active {OPTIONS['active']}, record_shapes, with_modules (the dashboard's module ranges),
latency {OPTIONS['latency_warmup']} warmup + {OPTIONS['latency_iters']} timed iterations; CPU
({platform.processor() or platform.machine()}, {os.cpu_count()} cores, OMP_NUM_THREADS={THREADS}, torch {torch_version}).
The bare script builds the same model, times the same step with perf_counter, profiles the same
schedule with torch.profiler, exports the Chrome trace and computes key_averages. The dashboard job
additionally puts module ranges in every step, groups key_averages by input shape (the per-operator
table is that grouping summed by name, so there is one pass, as in the bare script), writes
trace.json.gz and the TensorBoard zip and builds every view (the timeline through
diagnostics.trace). Each round runs both sides back to back (ABBA order); {repeats} in-process rounds,
{runner_repeats} of them also end to end. Ratios are the median of the per-round ratios, since rounds
share the machine's load at the time (1-minute load average {load:.1f} when the run ended).

{table}

Reading: {_verdict(in_process, end_to_end, latency)} The latency the page reports is measured before
the profiler starts, with the same step code and no hooks, so it matches a bare perf_counter loop in the
paired comparison; the plain medians of the two columns can differ more than that when the load changes
between rounds, which the per-round ratio cancels. The job's wall time carries a fixed extra over the
bare script (module-range hooks, the grouped key_averages, trace.json.gz + the TensorBoard zip, the
step/module/kernel views and the timeline: about 0.05-0.15 s in a cProfile of one job). It does not
grow with the number of iterations or the model's compute, so on this deliberately small workload
(about 1 s of work in all) it is the whole difference, and heavier workloads land closer to 1x.
End to end, the job's worker leaves with os._exit as soon as its answer is sent and flushed (no
interpreter teardown, which takes about 1 s with torch loaded here), while the bare script's process
tears down normally: that is why the end-to-end ratio can be below 1.
Garbage collection: the worker calls gc.freeze() once torch is loaded, so a full collection scans
only the job's objects (0.04 s instead of 0.2 s here); the in-process rounds do the same after the
untimed first round, for both sides. Before that change a full collection fell inside most job
rounds and the in-process ratio read 1.24x (21 rounds); the profiler's FunctionEvent trees are
reference cycles, so each profile leaves ~20k objects for the collector, in the bare script too.

"""
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + body + (text[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
