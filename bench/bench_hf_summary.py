"""Where a Hugging Face config's Model page summary spends its time, and what the one-pass count saves.

1. The phases, each in a fresh process (a worker's view): ``import torch`` (with torch._dynamo, as
   a spare has it), ``import transformers``, building the model (``diagnostics.hf.build``: the meta
   probe for the fits-in-memory check, then the real model with transformers' random init), and
   the summary's counting (shapes, forward FLOPs, forward + backward FLOPs).
2. The counting, old way against new, in one process on one built model, interleaved ABBA per
   round with an A/A control: the pass-by-pass way (a forward for the shapes, a counted forward, a
   counted training step) against the one counted training step (``summary.job._forward_counts``).
   Both give the same figures (checked here on every round).

    .venv/bin/python bench/bench_hf_summary.py [--hf gpt2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PHASES = r"""
import json, sys, time, tempfile
T = time.perf_counter
out = {}
t = T(); import torch, torch._dynamo; out["import torch (+ dynamo)"] = T() - t
t = T(); import transformers; out["import transformers"] = T() - t
from diagnostics.cli.model_args import hf_spec
from diagnostics.intake import load_model
from diagnostics.runner import AnalysisContext, Job
from diagnostics.analyses.summary import job as summary
spec = hf_spec(sys.argv[1])
t = T(); loaded = load_model(spec); out["build the model (meta probe, random init)"] = T() - t
ctx = AnalysisContext(Job("summary", spec), tempfile.mkdtemp()); ctx._loaded = loaded
t = T(); summary.analyze(ctx, {"skip_backward": False}); out["the summary (one counted training step, the table)"] = T() - t
print("PHASES " + json.dumps(out))
"""


def phases(hf: str) -> dict:
    p = subprocess.run([sys.executable, "-c", PHASES, hf], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout.split("PHASES ", 1)[1])


def counting(hf: str, rounds: int) -> dict:
    import torch

    from diagnostics.analyses.summary import job as summary
    from diagnostics.cli.model_args import hf_spec
    from diagnostics.intake import load_model
    from diagnostics.runner import AnalysisContext, Job

    spec = hf_spec(hf)
    loaded = load_model(spec)
    ctx = AnalysisContext(Job("summary", spec), Path("/tmp"))
    ctx._loaded = loaded
    trainable = sum(p.numel() for p in loaded.model.parameters() if p.requires_grad)
    loaded.model.eval()  # as the summary counts (_forward_counts sets it around both ways)
    ways = {"pass by pass (before)": summary._counts_pass_by_pass, "one pass (now)": summary._forward_counts}

    def once(name):
        shapes = {}
        torch.manual_seed(0)
        t = time.perf_counter()
        fwd, both, *_ = ways[name](ctx, loaded, {"skip_backward": False}, trainable, shapes)
        return time.perf_counter() - t, (fwd.total, both.total, json.dumps(shapes, sort_keys=True))

    old, new = list(ways)
    rows = {"old": [], "new": [], "aa": [], "ratio": [], "same": True}
    for r in range(rounds):
        order = [old, new, new, old] if r % 2 == 0 else [new, old, old, new]
        got = {old: [], new: []}
        figures = set()
        for name in order:
            s, fig = once(name)
            got[name].append(s)
            figures.add(fig)
        rows["same"] &= len(figures) == 1
        rows["old"] += got[old]
        rows["new"] += got[new]
        rows["aa"].append(got[old][0] / got[old][1])
        rows["ratio"].append(statistics.mean(got[new]) / statistics.mean(got[old]))
        print(f"round {r + 1}: before {got[old][0]:.2f} / {got[old][1]:.2f} s, now {got[new][0]:.2f} / "
              f"{got[new][1]:.2f} s · load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf", default="gpt2", help="an architecture with sizes, as the CLI's --hf (default: gpt2)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()
    ph = phases(args.hf)
    rows = counting(args.hf, args.rounds)
    load1 = os.getloadavg()
    print(f"\n`{args.hf}` summary, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; load averages "
          f"{' '.join(f'{x:.2f}' for x in load0)} before, {' '.join(f'{x:.2f}' for x in load1)} after\n")
    print("| phase (a fresh process) | seconds |\n|---|---|")
    for k, v in ph.items():
        print(f"| {k} | {v:.2f} |")
    med = statistics.median
    print(f"\n| counting shapes and FLOPs ({args.rounds} rounds, ABBA) | median (range) |\n|---|---|")
    for key, label in (("old", "pass by pass: shapes, forward, forward + backward (before)"),
                       ("new", "one counted training step (now)")):
        print(f"| {label} | {med(rows[key]):.2f} s ({min(rows[key]):.2f}-{max(rows[key]):.2f}) |")
    print(f"| now / before, per round | {med(rows['ratio']):.2f}x ({min(rows['ratio']):.2f}-{max(rows['ratio']):.2f}) |")
    print(f"| A/A: before / before, per round | {med(rows['aa']):.2f}x ({min(rows['aa']):.2f}-{max(rows['aa']):.2f}) |")
    print(f"| the same figures (FLOP totals, shapes) every time | {'yes' if rows['same'] else 'NO'} |")
    return 0 if rows["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
