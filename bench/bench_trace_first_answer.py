"""First answer of ``trace analyze`` (issue #42, item 5): the whole CLI process beside its peers, in one run.

    .venv/bin/python bench/bench_trace_first_answer.py [--rounds 5] [FILE ...] [--write-doc]

Each round runs, every one in a fresh process and in an order that turns by one place per round:

* **orjson**: ``python -c`` reading the file (gunzip when .gz) and ``orjson.loads`` of it: a bare parse;
* **orjson again**: the same, the A/A control (its ratio to the first is the noise floor);
* **--help**: ``python -m diagnostics --help``, the CLI's own start-up;
* **first open**: ``python -m diagnostics trace analyze FILE --no-report --quiet`` on a fresh data folder
  (no trace cache, no stored result), the whole process until its answer is printed;
* **first answer**: in that same process, when its first line reached stdout: the Summary, which the trace
  job sends as a partial result and the CLI prints while the other views are computed (issue #42);
* **reopen**: the same command again on the folder the round's first open left (its stored result);
* **worker open**: the first open as it ran before #42 item 5, in the runner's worker (the same command with
  ``--timeout 3600``, which keeps the worker path), on a fresh data folder of its own.

Goals: first answer <= 2.5x orjson, reopen <= 1.5x --help. Ratios are per round (same round, same load),
reported as the median with the range over rounds. FILE defaults to the public traces in tests/data
(HTA's test traces, MIT licence). --write-doc replaces the "## Trace first answer" section of
docs/BENCHMARKS.md with the table.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "BENCHMARKS.md"
SECTION = "## Trace first answer"
PUBLIC = ROOT / "tests" / "data" / "traces" / "public" / "hta"
DEFAULT_FILES = [PUBLIC / "ns_resolution_rank0.json.gz", PUBLIC / "nccl_allreduce_rank0.json.gz"]
PY = sys.executable
PARSE = ("import gzip, orjson, sys; p = sys.argv[1]; "
         "orjson.loads(gzip.open(p).read() if p.endswith('.gz') else open(p, 'rb').read())")
TOOLS = ("orjson", "orjson again", "--help", "first open", "reopen", "worker open")
#: Read from the first open's own process: when its first line (the Summary) reached stdout.
COLUMNS = TOOLS[:3] + ("first answer",) + TOOLS[3:]
#: Goals (issue #42): the first answer against a bare parse, the reopen against the CLI's start-up.
FIRST_GOAL, REOPEN_GOAL = 2.5, 1.5


def _run(argv: list[str], env: dict, first: dict | None = None) -> float:
    """The process' wall time; with ``first`` (a dict), also when its first line reached stdout
    (``first["s"]``): the first answer, the Summary that ``trace analyze`` prints before the other views."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if first is not None:
        line = p.stdout.readline()
        first["s"] = time.perf_counter() - t if line else math.nan
    _out, err = p.communicate()
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}):\n{err.decode(errors='replace')[-2000:]}")
    return wall


def one_round(path: Path, order: list[str]) -> dict[str, float]:
    """Every tool once on ``path`` in ``order`` (the reopen always after this round's first open)."""
    data, other = (Path(tempfile.mkdtemp(prefix="bench-first-answer-")) for _ in range(2))
    env = dict(os.environ, TORCHSCOPE_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
    cli = [PY, "-m", "diagnostics", "trace", "analyze", str(path), "--no-report", "--quiet", "--data-dir"]
    argv = {"orjson": [PY, "-c", PARSE, str(path)], "orjson again": [PY, "-c", PARSE, str(path)],
            "--help": [PY, "-m", "diagnostics", "--help"], "first open": cli + [str(data)], "reopen": cli + [str(data)],
            "worker open": cli + [str(other), "--timeout", "3600"]}
    envs = {t: dict(env, TORCHSCOPE_DATA_DIR=str(other)) if t == "worker open" else env for t in argv}
    if order.index("reopen") < order.index("first open"):
        order = [t for t in order if t != "reopen"]
        order.insert(order.index("first open") + 1, "reopen")
    first: dict = {}
    try:
        out = {tool: _run(argv[tool], envs[tool], first if tool == "first open" else None) for tool in order}
        out["first answer"] = first["s"]
        return out
    finally:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


def _ratio(rounds: list[dict], a: str, b: str) -> str:
    r = sorted(x[a] / x[b] for x in rounds)
    return f"{statistics.median(r):.2f}x ({r[0]:.2f}-{r[-1]:.2f})"


def measure(files: list[Path], n_rounds: int) -> tuple[list[str], list[float]]:
    rows, loads = [], []
    for path in files:
        rounds = []
        for i in range(n_rounds):
            loads.append(os.getloadavg()[0])
            order = list(TOOLS[i % len(TOOLS):] + TOOLS[:i % len(TOOLS)])
            rounds.append(one_round(path, order))
            print(f"{path.name} round {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in rounds[-1].items()),
                  file=sys.stderr)
        med = {t: statistics.median(r[t] for r in rounds) for t in COLUMNS}
        rows.append(f"| {path.name} | {path.stat().st_size / 2**20:.1f} MB | "
                    + " | ".join(f"{med[t]:.2f} s" for t in COLUMNS)
                    + f" | {_ratio(rounds, 'orjson again', 'orjson')} | {_ratio(rounds, 'first answer', 'orjson')}"
                    f" | {_ratio(rounds, 'first open', 'orjson')}"
                    f" | {_ratio(rounds, 'reopen', '--help')} | {_ratio(rounds, 'worker open', 'orjson')} |")
    return rows, loads


def table(files: list[Path], n_rounds: int, command: str) -> str:
    rows, loads = measure(files, n_rounds)
    head = ("| trace | size | orjson | orjson again | --help | first answer | first open | reopen | worker open "
            f"| A/A (again / orjson) | first answer / orjson (goal <= {FIRST_GOAL}x) | first open / orjson "
            f"| reopen / --help (goal <= {REOPEN_GOAL}x) | worker open / orjson |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    return (f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores; median of "
            f"{n_rounds} rounds (ratios: per round, median and range); load average (1 min) when the rounds "
            f"started: {min(loads):.1f} to {max(loads):.1f}.\n\n"
            f"Command: `{command}`\n\n" + head
            + "\n".join(rows) + "\n")


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    block = f"{SECTION}\n\n{text}\n"
    # up to the next heading: the section's "### Reading" (written by hand) stays
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^###? |\Z)", re.S | re.M)
    DOC.write_text(pattern.sub(lambda m: block + "\n", doc) if pattern.search(doc) else doc.rstrip() + "\n\n\n" + block)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path, default=DEFAULT_FILES)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--write-doc", action="store_true")
    a = ap.parse_args()
    command = " ".join([".venv/bin/python bench/bench_trace_first_answer.py", *sys.argv[1:]])
    text = table(a.files, a.rounds, command.replace(" --write-doc", ""))
    print(text)
    if a.write_doc:
        write_doc(text)


if __name__ == "__main__":
    main()
