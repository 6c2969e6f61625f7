"""Attach mode's cost: the same training script bare and under ``python -m diagnostics run``, interleaved.

    .venv/bin/python bench/bench_attach.py [--rounds 4] [--steps 300] [--write]

The load (bench/attach_workload.py): an MLP (256 -> 512 -> 512 -> 10, Adam) trained on random data
through a DataLoader (batch 64, num_workers 0) for --steps steps on CPU (OMP_NUM_THREADS=1). The
script times each of its own steps with perf_counter and writes the median.

Three figures, each a comparison:

* whole command: the wall time of ``python attach_workload.py`` against ``python -m diagnostics run
  --no-report -q -- python attach_workload.py`` (start-up, the bootstrap, 5 profiled steps with
  torch.profiler, the trace export, the analysis and the store), timed in interleaved ABBA rounds by
  diagnostics.measure.compare.interleaved, with its A/A control (bare against bare);
* per step outside the window: the script's own median step, attached against bare (the same
  rounds): the hooks' cost in every step;
* per step in the window: the run's own ``overhead_pct`` (its profiled steps against its steps
  outside the window): torch.profiler's cost while it records.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from doc_section import replace_section  # noqa: E402  (bench/, beside this script)
WORKLOAD = ROOT / "bench" / "attach_workload.py"
SECTION = "## Attach mode overhead"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--write", action="store_true", help=f"write the figures into docs/BENCHMARKS.md ({SECTION})")
    args = ap.parse_args()
    from diagnostics.measure.compare import interleaved

    work = Path(tempfile.mkdtemp(prefix="bench-attach-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "STEPS": str(args.steps),
           "TORCHSCOPE_DATA_DIR": str(work / "store")}
    own: dict[str, list] = {"bare": [], "run": [], "control": []}
    runs: list[dict] = []
    counter = {"n": 0}

    def once(kind: str):
        counter["n"] += 1
        timing = work / f"self-{counter['n']}.json"
        cmd = [sys.executable, str(WORKLOAD)]  # "control": the bare command again (the A/A row)
        if kind == "run":
            cmd = [sys.executable, "-m", "diagnostics", "run", "--no-report", "-q", "--json", "--", *cmd]
        p = subprocess.run(cmd, cwd=work, env={**env, "SELF_TIMING": str(timing)}, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{kind} failed: {p.stderr[-2000:]}")
        own[kind].append(json.loads(timing.read_text())["step_ms"])
        if kind == "run":
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))

    out = interleaved({"bare": lambda: once("bare"), "run": lambda: once("run"), "control": lambda: once("control")},
                      "cpu", args.rounds, warmup=0)
    load = os.getloadavg()[0]
    bare_step = statistics.median(own["bare"])
    run_step = statistics.median(own["run"])
    window = [r["overhead_pct"] for r in runs if r.get("overhead_pct") is not None]
    ours_outside = [r["step_ms"] for r in runs if r.get("step_ms")]
    report = {
        "rounds": args.rounds, "steps": args.steps, "load_1min": load, "cpus": os.cpu_count(),
        "whole_command": {k: {kk: out[k][kk] for kk in ("median_ms", "speedup", "speedup_ci", "verdict")}
                          for k in out},
        "script_step_ms": {"bare": bare_step, "attached": run_step, "overhead_pct": 100 * (run_step / bare_step - 1),
                           "control": statistics.median(own["control"]),
                           "control_pct": 100 * (statistics.median(own["control"]) / bare_step - 1)},
        "run_step_ms_outside_window": statistics.median(ours_outside) if ours_outside else None,
        "window_overhead_pct": statistics.median(window) if window else None,
        "tool_outside_s": statistics.median([r["overhead"]["tool_outside_s"] for r in runs]),
        "export_s": statistics.median([r["overhead"].get("export_s") or 0 for r in runs]),
        "window": [r["profiled_steps"] for r in runs],
    }
    print(json.dumps(report, indent=1))
    if args.write:
        write_section(report)
    return 0


def _per_step_verdict(r: dict) -> str:
    """The attached script's step against both bare runs' (the reference and the A/A control): a cost is
    what lies above the slower of the two, as the A/A's own spread is order and drift, not attach."""
    st = r["script_step_ms"]
    slower = max(st["bare"], st["control"])
    cost = 100 * (st["attached"] / slower - 1)
    spread = abs(st["control_pct"])
    if cost <= 0:
        return (f"the attached script's step ({st['attached']:.3f} ms) lies within the two bare runs' "
                f"({st['bare']:.3f} and {st['control']:.3f} ms): no per-step cost shows beyond the A/A's "
                f"{spread:.1f} % spread, so the 2 % goal is met as far as this run can tell.")
    verdict = "within the 2 % goal" if cost <= 2 else "above the 2 % goal"
    return (f"the attached script's step is {cost:+.1f} % above the slower bare run ({st['attached']:.3f} against "
            f"{slower:.3f} ms), {verdict}; the A/A's own spread on this run was {spread:.1f} %.")


def write_section(r: dict) -> None:
    wc = r["whole_command"]
    bare, run, ctl = wc["bare"], wc["run"], wc["control"]

    def ratio(row):
        ci = row.get("speedup_ci") or [None, None]
        slow = 1 / row["speedup"] if row.get("speedup") else None
        return (f"x{slow:.3f} [{1 / ci[1]:.3f}, {1 / ci[0]:.3f}]" if slow and ci[0] else "n/a") + \
            f" ({row.get('verdict')})"

    body = f"""{SECTION}

Command: `.venv/bin/python bench/bench_attach.py --rounds {r['rounds']} --steps {r['steps']} --write`
(`bench/bench_attach.py`, load `bench/attach_workload.py`).

Load: an MLP (256 -> 512 -> 512 -> 10, Adam) trained on random data through a DataLoader (batch 64,
num_workers 0) for {r['steps']} steps, CPU, OMP_NUM_THREADS=1, {r['cpus']} cores; the script times its own
steps. Bare `python bench/attach_workload.py` against `python -m diagnostics run --no-report -q -- python
bench/attach_workload.py` (automatic warm-up, 5 profiled steps), {r['rounds']} interleaved ABBA rounds
(`diagnostics.measure.compare.interleaved`) with an A/A control. 1-minute load average
{r['load_1min']:.1f} when the run ended: the machine was shared, so the figures carry its noise.

| what | bare | attached | attached / bare [95% interval] |
|---|---|---|---|
| whole command (wall) | {bare['median_ms'] / 1e3:.2f} s | {run['median_ms'] / 1e3:.2f} s | {ratio(run)} |
| A/A control: bare again | {bare['median_ms'] / 1e3:.2f} s | {ctl['median_ms'] / 1e3:.2f} s | {ratio(ctl)} |
| the script's own median step (outside the window) | {r['script_step_ms']['bare']:.3f} ms | {r['script_step_ms']['attached']:.3f} ms | {r['script_step_ms']['overhead_pct']:+.1f} % |
| A/A: the script's own median step, bare again | {r['script_step_ms']['bare']:.3f} ms | {r['script_step_ms']['control']:.3f} ms | {r['script_step_ms']['control_pct']:+.1f} % |
| profiled steps against the run's steps outside the window | | | {r['window_overhead_pct']:+.1f} % (median over runs) |

Our time between steps (profiler start and stop, trace export, files): {r['tool_outside_s']:.2f} s
per run, of which the trace export {r['export_s']:.2f} s; the run's own step_ms outside the window
{r['run_step_ms_outside_window']:.3f} ms against the script's own {r['script_step_ms']['attached']:.3f} ms. Profiled
windows: {', '.join(f'{w[0]}-{w[1]}' if w else 'none' for w in r['window'])}.

Reading: the per-step cost outside the window is what the goal (at most 2 % per step) is about. The
A/A control's own step moved {r['script_step_ms']['control_pct']:+.1f} % between two bare runs of this set:
{_per_step_verdict(r)} The whole command adds a fixed cost (the CLI's start-up, torch.profiler's first start,
the export, the analysis and the store), so its ratio shrinks as the script runs longer. The profiled
steps' extra ({r['window_overhead_pct']:+.1f} %) is torch.profiler's (record_shapes, profile_memory) and the
gradient statistics', only in the window.
"""
    replace_section(SECTION, body)


if __name__ == "__main__":
    sys.exit(main())
