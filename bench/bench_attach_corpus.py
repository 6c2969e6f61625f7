"""Attach mode's cost on real training scripts nobody here wrote (tests/data/pytorch_examples, pytorch/examples,
BSD-3): each script bare and under ``python -m diagnostics run``, interleaved, with an A/A control.

    .venv/bin/python bench/bench_attach_corpus.py [--rounds 6] [--write]

Goal (issue 39): the whole script at most 1.05x bare beyond attach's fixed start-up cost, on a quiet machine.

Every round runs, in a fresh random order (``diagnostics.measure.compare.Rounds``, one call of each key per
round: each call is a whole process, nothing carries over between them): each corpus script bare, attached
(``run --no-report -q``: the automatic warm-up, 5 profiled steps, the analysis and the store) and bare again
(the A/A control), and the start-up pair: a script that only imports torch and calls one module, bare and
attached (bench_attach_startup.py's). Per script and round:

* whole command: attached / bare (wall of the whole command);
* beyond start-up: (attached - the same round's start-up cost) / bare, the start-up cost being the start-up
  pair's attached minus bare;
* A/A: bare again / bare.

Each figure is the geometric mean of the rounds' ratios with its exact 95 % interval (``ratio_interval``:
at least 6 ratios); the corpus row pools every script's rounds. The scripts' arguments make each run a real
job's length (word_language_model and dcgan: 9-13 s bare at a load of 3 on this 2-core machine) rather
than a 3-second toy, but for regression/main.py, which trains until its loss is under 1e-3 and takes no
argument (about 3 s). time_sequence_prediction/train.py is not timed: it needs matplotlib and a numpy pickle torch>=2.6 refuses to load, and one of its LBFGS steps
takes over a minute here (a bench of a few rounds cannot hold it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from doc_section import replace_section  # noqa: E402  (bench/, beside this script)

EXAMPLES = ROOT / "tests" / "data" / "pytorch_examples"
SECTION = "## Attach mode overhead on the real-script corpus"
GOAL = 1.05
TINY = "import torch\ntorch.nn.Linear(4, 4)(torch.randn(2, 4))\n"


def _corpus(folder: Path, words: int = 200, lines: int = 1200) -> Path:
    """A text corpus in wikitext's layout (train / valid / test), the same every time (as the corpus test's)."""
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(words)]
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", lines), ("valid", lines // 4), ("test", lines // 4)):
        text = "\n".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 20))) for _ in range(n))
        (folder / f"{name}.txt").write_text(text + "\n")
    return folder


def scripts(work: Path) -> dict[str, dict]:
    """name -> argv (after the Python), extra environment, what it is (for the doc)."""
    data = _corpus(work / "corpus")
    return {
        "word_language_model": {
            "argv": [str(EXAMPLES / "word_language_model" / "main.py"), "--data", str(data), "--model", "LSTM",
                     "--emsize", "128", "--nhid", "128", "--nlayers", "2", "--epochs", "8", "--batch_size", "16",
                     "--bptt", "35", "--log-interval", "100", "--save", "model.pt"],
            "env": {},
            "what": "2-layer LSTM (128), manual SGD update, an evaluation every epoch, 8 epochs on a generated corpus"},
        "dcgan": {
            "argv": [str(EXAMPLES / "dcgan" / "main.py"), "--dataset", "fake", "--workers", "2", "--batchSize", "16",
                     "--ngf", "16", "--ndf", "16", "--nz", "32", "--niter", "1", "--manualSeed", "1", "--outf", "."],
            "env": {"PYTHONPATH": f"{ROOT}{os.pathsep}{EXAMPLES / 'shims'}", "FAKEDATA_SIZE": "1024"},
            "what": "GAN, two Adam optimizers, DataLoader with 2 workers, 1024 fake 64x64 images (64 iterations)"},
        "regression": {
            "argv": [str(EXAMPLES / "seeded.py"), str(EXAMPLES / "regression" / "main.py")],
            "env": {},
            "what": "one nn.Linear, manual update until the loss is under 1e-3 (about 830 batches; no argument)"},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--only", nargs="*", help="these corpus scripts only")
    ap.add_argument("--write", action="store_true", help=f"write the figures into docs/BENCHMARKS.md ({SECTION})")
    ap.add_argument("--report", type=Path, help="a report this bench printed (JSON): its section written again, "
                                                "nothing run")
    args = ap.parse_args()
    if args.report:
        report = json.loads(args.report.read_text())
        _against_both_bare(report)   # (a report from before that figure: made from its round_ms)
        if args.write:
            write_section(report)
        print(json.dumps(report, indent=1))
        return 0
    from diagnostics.measure.compare import Rounds

    work = Path(tempfile.mkdtemp(prefix="bench-attach-corpus-"))
    base_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TORCHSCOPE_DATA_DIR": str(work / "store")}
    table = scripts(work)
    if args.only:
        table = {k: v for k, v in table.items() if k in args.only}
    (work / "tiny.py").write_text(TINY)
    table_all = {**table, "startup": {"argv": [str(work / "tiny.py")], "env": {}, "what": "start-up pair"}}
    runs: dict[str, list[dict]] = {k: [] for k in table}

    def timer(name: str, kind: str):
        spec = table_all[name]
        cwd = work / name / kind
        cwd.mkdir(parents=True, exist_ok=True)

        def once() -> float:
            cmd = [sys.executable, *spec["argv"]]
            if kind == "run":
                cmd = [sys.executable, "-m", "diagnostics", "run", "--no-report", "-q", "--json", "--", *cmd]
            t = time.perf_counter()
            p = subprocess.run(cmd, cwd=cwd, env={**base_env, **spec["env"]}, capture_output=True, text=True,
                               input="")
            ms = (time.perf_counter() - t) * 1e3
            if p.returncode != 0:
                raise SystemExit(f"{name} {kind} failed ({p.returncode}): {p.stderr[-2000:]}")
            if kind == "run" and name in runs:
                r = json.loads(p.stdout.strip().splitlines()[-1])
                runs[name].append({"wall_s": ms / 1e3, "duration_s": r.get("duration_s"),
                                   "profiled_steps": r.get("profiled_steps"), "steps": r.get("steps"),
                                   "overhead_pct": r.get("overhead_pct"), **(r.get("overhead") or {})})
            return ms
        return once

    timers = {"startup/bare": timer("startup", "bare"), "startup/run": timer("startup", "run")}
    for name in table:
        for kind in ("bare", "run", "control"):  # "control": the bare command again (the A/A)
            timers[f"{name}/{kind}"] = timer(name, kind)
    for fn in timers.values():  # one untimed call of each: the page cache, the store's first write
        fn()
    for v in runs.values():
        v.clear()
    rounds = Rounds(timers, reverse=False)
    loads = []
    for i in range(args.rounds):
        rounds.run()
        loads.append(os.getloadavg()[0])
        print(f"round {i + 1}/{args.rounds} done, load {loads[-1]:.1f}", file=sys.stderr, flush=True)
    report = summarize(rounds.round_ms, runs, table, loads, args.rounds)
    report["orders"] = rounds.orders
    report["round_ms"] = rounds.round_ms  # every figure above, recomputable (--report)
    print(json.dumps(report, indent=1))
    if args.write:
        write_section(report)
    return 0


def _interval(ratios: list[float]) -> dict:
    from diagnostics.measure.compare import ratio_interval, too_few_rounds

    point, low, high = ratio_interval(ratios)
    kept = sum(1 for x in ratios if x > 0)  # ratio_interval's too: a round whose start-up exceeded the run's, out
    note = too_few_rounds(kept)
    if kept < len(ratios):
        note = (f"{len(ratios) - kept} of {len(ratios)} rounds left out (their start-up pair read more than the "
                f"attached run's whole extra: load spikes)" + (f"; {note}" if note else ""))
    return {"ratio": point, "ci": None if low is None else [low, high], "n": kept, "note": note}


def summarize(round_ms: dict, runs: dict, table: dict, loads: list, n_rounds: int) -> dict:
    startup = [r - b for r, b in zip(round_ms["startup/run"], round_ms["startup/bare"])]
    out: dict = {"rounds": n_rounds, "cpus": os.cpu_count(), "load_1min": {"min": min(loads), "median":
                 statistics.median(loads), "max": max(loads)},
                 "startup_s": {"bare": statistics.median(round_ms["startup/bare"]) / 1e3,
                               "attached": statistics.median(round_ms["startup/run"]) / 1e3,
                               "added": statistics.median(startup) / 1e3},
                 "scripts": {}}
    pooled = {"whole": [], "beyond": [], "control": []}
    for name in table:
        bare, run, ctl = (round_ms[f"{name}/{k}"] for k in ("bare", "run", "control"))
        ratios = {"whole": [r / b for r, b in zip(run, bare)],
                  "beyond": [(r - s) / b for r, s, b in zip(run, startup, bare)],
                  "control": [c / b for c, b in zip(ctl, bare)]}
        for k, v in ratios.items():
            pooled[k] += v
        own = runs[name]
        out["scripts"][name] = {
            "what": table[name]["what"], "argv": [Path(a).name if a.startswith(str(ROOT)) else a
                                                   for a in table[name]["argv"]],
            "bare_s": statistics.median(bare) / 1e3, "attached_s": statistics.median(run) / 1e3,
            "control_s": statistics.median(ctl) / 1e3, **{k: _interval(v) for k, v in ratios.items()},
            # where the attached run's time went (its own figures, medians over the rounds)
            "script_s": _med(own, "duration_s"), "after_script_s": _med_diff(own, "wall_s", "duration_s"),
            "tool_outside_s": _med(own, "tool_outside_s"), "export_s": _med(own, "export_s"),
            "window_overhead_pct": _med(own, "overhead_pct"),
            "windows": sorted({tuple(r["profiled_steps"] or ()) for r in own}), "steps": _med(own, "steps")}
    out["corpus"] = {k: _interval(v) for k, v in pooled.items()}
    out["round_ms"] = round_ms
    _against_both_bare(out)
    return out


def _against_both_bare(report: dict) -> None:
    """"beyond_both" per script and pooled: beyond start-up against both of the round's bare runs (their
    geometric mean), (attached - start-up cost) / sqrt(bare x bare again). Every round runs the script bare
    twice; the ratio to one of them carries that run's noise alone (the A/A column shows how much)."""
    rm = report.get("round_ms")
    if not rm:
        return
    startup = [r - b for r, b in zip(rm["startup/run"], rm["startup/bare"])]
    pooled = []
    for name, s in report["scripts"].items():
        bare, run, ctl = (rm[f"{name}/{k}"] for k in ("bare", "run", "control"))
        ratios = [(r - st) / math.sqrt(b * c) for r, st, b, c in zip(run, startup, bare, ctl)]
        s["beyond_both"] = _interval(ratios)
        pooled += ratios
    report["corpus"]["beyond_both"] = _interval(pooled)


def _med(rows: list[dict], key: str):
    xs = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def _med_diff(rows: list[dict], a: str, b: str):
    xs = [r[a] - r[b] for r in rows if r.get(a) is not None and r.get(b) is not None]
    return statistics.median(xs) if xs else None


def _both(row: dict) -> str:
    return _fmt(row["beyond_both"]) if row.get("beyond_both") else "-"


def _fmt(row: dict) -> str:
    if row["ci"]:
        return f"x{row['ratio']:.3f} [{row['ci'][0]:.3f}, {row['ci'][1]:.3f}]"
    return f"x{row['ratio']:.3f} (no interval: {row['n']} ratios)"


def _arg(a: str) -> str:
    """A path argument as the doc shows it: its name (the checkout's and the bench's temporary folder's)."""
    return Path(a).name if os.sep in a else a


def _goal(row: dict) -> str:
    if row["ci"] and row["ci"][1] <= GOAL:
        return f"met (the whole interval at or under x{GOAL:g})"
    if row["ratio"] <= GOAL:
        return f"met at the point, not over the whole interval (x{GOAL:g})"
    return f"not met (x{GOAL:g})"


def _reading(r: dict) -> str:
    """The goal's verdict, where this run can give one: on a quiet machine (load at most 1.5) with an A/A
    control within noise; else what the run can say and why it says no more."""
    c, ld = r["corpus"], r["load_1min"]
    aa, beyond = c["control"]["ci"], c["beyond"]
    both = (f" Against both of each round's bare runs: {_fmt(c['beyond_both'])}, under the A/A control's own "
            f"{_fmt(c['control'])}." if c.get("beyond_both") else "")
    if ld["max"] <= 1.5 and aa and aa[0] <= 1 <= aa[1]:
        return f"goal (issue 39) x{GOAL:g} beyond start-up, on the pooled corpus: {_goal(beyond)}.{both}"
    if beyond["ci"] and beyond["ci"][1] <= GOAL:
        where = f"at or under x{GOAL:g} over its whole interval"
    elif beyond["ci"] and beyond["ci"][0] > GOAL:
        where = f"above x{GOAL:g} over its whole interval"
    else:
        where = f"with x{GOAL:g} inside its interval"
    ours = [s["after_script_s"] + s["tool_outside_s"] for s in r["scripts"].values()
            if s.get("after_script_s") is not None and s.get("tool_outside_s") is not None]
    span = f"{min(ours):.2f}-{max(ours):.2f} s" if ours else "not measured"
    why = (f"the A/A control's own interval, {_fmt(c['control'])}, leaves out 1 on a quiet machine (load "
           f"{ld['min']:.1f}-{ld['max']:.1f}): the bare arm and its repeat differ by more than this run's noise"
           if ld["max"] <= 1.5 else
           f"the load average was {ld['min']:.1f}-{ld['max']:.1f} on {r['cpus']} cores, the start-up pair itself "
           f"read {r['startup_s']['added']:+.2f} s (0.29 s on a quiet machine, 'Attach mode start-up' above) and "
           f"the A/A control's own interval is {_fmt(c['control'])} (the machine was shared with other jobs)")
    return (f"goal (issue 39) x{GOAL:g} beyond start-up NOT judged by this run: {why}. "
            f"What it shows: the pooled beyond-start-up ratio {_fmt(beyond)}, {where}; the time the attached "
            f"run itself reports outside the script's steps and outside the script (the launcher's start before "
            f"it, the analysis, store and exit after) comes to {span} per run (the table above); the rest of the script's wall above bare is not broken down by this run (the "
            "start-up's share inside the script, the hooks' per-step cost, DataLoader workers' timing: candidates, "
            "not measured here). Rerun on a quiet machine for the verdict.")


def write_section(r: dict) -> None:
    ld = r["load_1min"]
    rows = []
    for name, s in r["scripts"].items():
        rows.append(f"| {name} | {s['bare_s']:.2f} s | {s['attached_s']:.2f} s | {_fmt(s['whole'])} | "
                    f"{_fmt(s['beyond'])} | {_both(s)} | {_fmt(s['control'])} |")
    where = []
    for name, s in r["scripts"].items():
        where.append(f"| {name} | {s['script_s']:.2f} s ({s['script_s'] - s['bare_s']:+.2f} s) | "
                     f"{s['after_script_s']:.2f} s | {s['tool_outside_s']:.2f} s | "
                     f"{s['export_s']:.3f} s | {s['window_overhead_pct']:+.0f} % | "
                     f"{', '.join(f'{w[0]}-{w[1]}' for w in s['windows'] if w) or 'none'} |")
    c = r["corpus"]
    scripts_doc = "\n".join(f"* {name}: {s['what']} (`{' '.join(_arg(a) for a in s['argv'])}`)"
                            for name, s in r["scripts"].items())
    quiet = ld["max"] <= 1.5
    body = f"""{SECTION}

Command: `.venv/bin/python bench/bench_attach_corpus.py --rounds {r['rounds']} --write` (`bench/bench_attach_corpus.py`).
The corpus scripts (tests/data/pytorch_examples, pytorch/examples, BSD-3), CPU, OMP_NUM_THREADS=1, {r['cpus']} cores:

{scripts_doc}

Each round runs every script bare, attached (`python -m diagnostics run --no-report -q --`: automatic warm-up,
5 profiled steps, analysis, store) and bare again (A/A control), plus the start-up pair (a script that imports
torch and calls one module, bare and attached), all in one fresh random order; {r['rounds']} rounds.
"Beyond start-up" is (attached - that round's start-up cost) / bare; "against both bare runs" divides by the
geometric mean of the round's two bare runs (bare and bare again) instead. Ratios: geometric mean of the rounds'
with an exact 95 % interval (`diagnostics.measure.compare.ratio_interval`; the corpus row pools the scripts'
rounds). 1-minute load average over the rounds: {ld['min']:.1f} to {ld['max']:.1f} (median {ld['median']:.1f}):
{'a quiet machine' if quiet else 'a shared, busy machine: every figure carries its noise (the A/A column says how much)'}.

| script | bare | attached | whole command | beyond start-up | beyond start-up, against both bare runs | A/A: bare again |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}
| corpus (pooled) | | | {_fmt(c['whole'])} | {_fmt(c['beyond'])} | {_both(c)} | {_fmt(c['control'])} |

Start-up cost measured beside them: {r['startup_s']['added']:+.2f} s (tiny script {r['startup_s']['bare']:.2f} s bare,
{r['startup_s']['attached']:.2f} s attached).

Where the attached run's time goes (medians over the rounds; the run's own figures):

| script | script's wall (launcher's view; above the bare command's median) | the launcher outside the script (its own start before, analysis, store, exit after) | ours between steps (window start/stop, export, files) | trace export inside the script | profiled steps vs the others | windows |
|---|---|---|---|---|---|---|
{chr(10).join(where)}

Reading: {_reading(r)} The last run on a quiet machine (load 1.0-1.1, before issue 39's last cuts below, commit
be8c4a7): pooled beyond start-up x1.051 [0.984, 1.122], A/A x0.996 [0.949, 1.045], start-up +0.44 s. The 1.05x goal is
for real jobs: the ratio of the whole command shrinks as the script runs longer, since what attach adds is
mostly fixed (the start-up, the window's profiler start and stop, the analysis); regression (3 s bare on a
quiet machine) shows what a toy reads; its steps (0.4 ms) are short enough for the hooks' per-step cost
and the profiled steps' to show. Two costs were taken out of the script's wall for this (measured one run
each while making the change, load 1-4): the window's torch.profiler start imported inductor, dynamo and
sympy into a script that never loaded them (2.1 s; now 5 ms: word_language_model and regression build no
optimizer, so nothing else imports them), and torch's .gz export gzipped the trace line by line in Python
inside the script (2.0-3.0 s for dcgan's 8.5 MB trace; now kineto writes it raw in 0.09 s and the launcher
gzips it beside the script). The launcher also imports the trace layer (pandas) while the script runs.

Then (issue 39's last costs; each measured on its own while making the change, on this machine at a load of
7-9, so as shares more than as seconds): the window records the ops and the allocation events the views read,
no input shapes unless `--shapes` (dcgan's trace 8.4 MB -> 6.2 MB, its stop and export with it); the gradient
statistics are four fused reductions per dtype (`torch._foreach_norm`, ord 0 counting the nonzeros), still
inside the profiled steps and counted in `tool_in_profiled_steps_ms`, about 300 trace ops per call rather than
355; the live status is rewritten once a second (each rewrite is a new file renamed into place: 4 ms median on
this VM's disk, 1.6 % of the script's main thread at four a second); the launcher gzips at level 3 (dcgan's
trace 89 ms rather than 216 ms of a core beside the script), parses the gzipped trace while the script runs
on (the analysis after it read it again: 0.21 s -> 0.15 s for dcgan), sees the script's end on a pidfd
(Popen.wait polled every 50 ms) and ends without the interpreter's teardown of pandas and the trace layer
(0.25-0.4 s of every run, the start-up pair's included; its exit handlers run and its output is flushed
first). Not cut: the hooks' per-step cost outside the window (regression's 0.2 ms steps: about 75 us each at
a load of 9, from torch's global module hooks' slow path and our own bookkeeping), and the window's 5
profiled steps themselves (the profiler's per-op cost: what the trace is made of).
"""
    replace_section(SECTION, body)


if __name__ == "__main__":
    sys.exit(main())
