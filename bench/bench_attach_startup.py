"""Attach mode's fixed start-up cost: a script that only imports torch and calls a module once, bare and
under ``python -m diagnostics run``, interleaved (with an A/A control: bare against bare).

    .venv/bin/python bench/bench_attach_startup.py [--rounds 6] [--write]

The difference of the medians is what ``run`` adds to any script whatever its length (the CLI's start-up,
the bootstrap, the analysis and the store; no window: the script takes no step). Goal (issue 39): at most
1.5 s above bare, on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from doc_section import replace_section  # noqa: E402  (bench/, beside this script)
SECTION = "## Attach mode start-up"
SCRIPT = "import torch\ntorch.nn.Linear(4, 4)(torch.randn(2, 4))\n"
GOAL_S = 1.5


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--write", action="store_true", help=f"write the figures into docs/BENCHMARKS.md ({SECTION})")
    args = ap.parse_args()
    from diagnostics.measure.compare import interleaved

    work = Path(tempfile.mkdtemp(prefix="bench-attach-startup-"))
    script = work / "tiny.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TORCHSCOPE_DATA_DIR": str(work / "store")}

    def once(attached: bool):
        cmd = [sys.executable, str(script)]
        if attached:
            cmd = [sys.executable, "-m", "diagnostics", "run", "--no-report", "-q", "--", *cmd]
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(p.stderr[-2000:])

    out = interleaved({"bare": lambda: once(False), "run": lambda: once(True)}, "cpu", args.rounds, warmup=1,
                      control=True)
    bare, run, ctl = (out[k]["median_ms"] / 1e3 for k in ("bare", "run", "control"))
    report = {"rounds": args.rounds, "load_1min": os.getloadavg()[0], "cpus": os.cpu_count(), "bare_s": bare,
              "run_s": run, "control_s": ctl, "added_s": run - bare, "control_added_s": ctl - bare,
              "goal_s": GOAL_S, "run_ci": out["run"].get("speedup_ci"), "verdict": out["run"].get("verdict")}
    print(json.dumps(report, indent=1))
    if args.write:
        write_section(report)
    return 0


def write_section(r: dict) -> None:
    met = "met" if r["added_s"] <= r["goal_s"] else "not met"
    body = f"""{SECTION}

Command: `.venv/bin/python bench/bench_attach_startup.py --rounds {r['rounds']} --write`. A script that imports
torch and calls one module (no step, so no window), bare against `python -m diagnostics run --no-report -q --`,
{r['rounds']} interleaved rounds with an A/A control, {r['cpus']} cores, 1-minute load average
{r['load_1min']:.1f} at the end.

| what | wall (median) | above bare |
|---|---|---|
| bare | {r['bare_s']:.2f} s | |
| attached (`run`) | {r['run_s']:.2f} s | {r['added_s']:+.2f} s |
| A/A: bare again | {r['control_s']:.2f} s | {r['control_added_s']:+.2f} s |

The fixed start-up cost of `run` is {r['added_s']:.2f} s here: goal ({r['goal_s']:g} s above bare) {met} on this
machine{' (a busy one: rerun on a quiet machine before reading it as the tool' + "'" + 's cost)' if r['load_1min'] > 1.5 else ''}.
"""
    replace_section(SECTION, body)


if __name__ == "__main__":
    sys.exit(main())
