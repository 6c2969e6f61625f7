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
  ``--timeout 3600``, which keeps the worker path), on a fresh data folder of its own (--no-worker: not run);
* **HTA** (--hta): HolisticTraceAnalysis 0.5.0 loading the file (``TraceAnalysis``, bench/.venv-hta, made by
  bench_traces.py's ensure_hta), the whole process; one past --hta-timeout seconds is stopped and shown as
  "> N s".

Ratios: the median over rounds with its range; with 6 rounds or more also the geometric mean with its 95 %
interval (diagnostics.measure.compare.ratio_interval). Goals: first answer <= 2.5x orjson (a typical trace, 1-50 MB; the 1 GB trace: <= 0.25x, "4x orjson"), reopen
<= 1.5x --help. Ratios are per round (same round, same load),
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
sys.path.insert(0, str(ROOT))
from diagnostics.measure.compare import ratio_interval  # noqa: E402
DOC = ROOT / "docs" / "BENCHMARKS.md"
SECTION = "## Trace first answer"
PUBLIC = ROOT / "tests" / "data" / "traces" / "public" / "hta"
DEFAULT_FILES = [PUBLIC / "ns_resolution_rank0.json.gz", PUBLIC / "nccl_allreduce_rank0.json.gz"]
PY = sys.executable
PARSE = ("import gzip, orjson, sys; p = sys.argv[1]; "
         "orjson.loads(gzip.open(p).read() if p.endswith('.gz') else open(p, 'rb').read())")
TOOLS = ("orjson", "orjson again", "--help", "first open", "reopen", "worker open")
#: Read from the first open's own process: when its first line (the Summary) reached stdout.
COLUMNS = TOOLS[:3] + ("first answer",) + TOOLS[3:] + ("HTA",)
HTA_PY = ROOT / "bench" / ".venv-hta" / "bin" / "python"
HTA_LOAD = ("import logging, sys; from pathlib import Path; logging.disable(logging.WARNING); "
            "from hta.trace_analysis import TraceAnalysis; p = Path(sys.argv[1]); "
            "TraceAnalysis(trace_files={0: str(p)}, trace_dir=str(p.parent))")
#: Goals (issue #42): the first answer against a bare parse, the reopen against the CLI's start-up.
FIRST_GOAL, REOPEN_GOAL = 2.5, 1.5


def _run(argv: list[str], env: dict, first: dict | None = None, timeout: float | None = None) -> float:
    """The process' wall time; with ``first`` (a dict), also when its first line reached stdout
    (``first["s"]``): the first answer, the Summary that ``trace analyze`` prints before the other views."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if first is not None:
        line = p.stdout.readline()
        first["s"] = time.perf_counter() - t if line else math.nan
    try:
        _out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:   # (HTA on a big trace) shown as "> timeout"
        p.kill()
        p.communicate()
        return math.inf
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}):\n{err.decode(errors='replace')[-2000:]}")
    return wall


def one_round(path: Path, order: list[str], hta_timeout: float = 600.0) -> dict[str, float]:
    """Every tool once on ``path`` in ``order`` (the reopen always after this round's first open)."""
    data, other = (Path(tempfile.mkdtemp(prefix="bench-first-answer-")) for _ in range(2))
    env = dict(os.environ, TORCHSCOPE_DATA_DIR=str(data), PYTHONPATH=str(ROOT))
    cli = [PY, "-m", "diagnostics", "trace", "analyze", str(path), "--no-report", "--quiet", "--data-dir"]
    argv = {"orjson": [PY, "-c", PARSE, str(path)], "orjson again": [PY, "-c", PARSE, str(path)],
            "--help": [PY, "-m", "diagnostics", "--help"], "first open": cli + [str(data)], "reopen": cli + [str(data)],
            "worker open": cli + [str(other), "--timeout", "3600"], "HTA": [str(HTA_PY), "-c", HTA_LOAD, str(path)]}
    envs = {t: dict(env, TORCHSCOPE_DATA_DIR=str(other)) if t == "worker open" else env for t in argv}
    if order.index("reopen") < order.index("first open"):
        order = [t for t in order if t != "reopen"]
        order.insert(order.index("first open") + 1, "reopen")
    first: dict = {}
    try:
        out = {tool: _run(argv[tool], envs[tool], first if tool == "first open" else None,
                          hta_timeout if tool == "HTA" else None) for tool in order}
        out["first answer"] = first["s"]
        return out
    finally:
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


def _ratio(rounds: list[dict], a: str, b: str) -> str:
    if not all(a in x and b in x for x in rounds):
        return "-"
    r = sorted(x[a] / x[b] for x in rounds)
    if math.isinf(r[0]):
        return "> " + _ratio([{a: min(x[a], x["timeout"]), b: x[b]} for x in rounds], a, b)
    text = f"{statistics.median(r):.2f}x ({r[0]:.2f}-{r[-1]:.2f})" + (" (some > timeout)" if math.isinf(r[-1]) else "")
    point, low, high = ratio_interval(r)   # with 6 rounds or more: the geometric mean and its 95 % interval
    return text if low is None or math.isinf(r[-1]) else text + f"; {point:.2f}x [{low:.2f}, {high:.2f}]"


def _seconds(rounds: list[dict], tool: str) -> str:
    if not all(tool in r for r in rounds):
        return "-"
    v = statistics.median(r[tool] for r in rounds)
    return f"> {rounds[0]['timeout']:.0f} s" if math.isinf(v) else f"{v:.2f} s"


def measure(files: list[Path], n_rounds: int, tools: tuple, hta_timeout: float) -> tuple[list[str], list[float]]:
    rows, loads = [], []
    for path in files:
        rounds = []
        for i in range(n_rounds):
            loads.append(os.getloadavg()[0])
            order = list(tools[i % len(tools):] + tools[:i % len(tools)])
            rounds.append(one_round(path, order, hta_timeout))
            print(f"{path.name} round {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in rounds[-1].items()),
                  file=sys.stderr)
            rounds[-1]["timeout"] = hta_timeout
        rows.append(f"| {path.name} | {path.stat().st_size / 2**20:.1f} MB | "
                    + " | ".join(_seconds(rounds, t) for t in COLUMNS)
                    + f" | {_ratio(rounds, 'orjson again', 'orjson')} | {_ratio(rounds, 'first answer', 'orjson')}"
                    f" | {_ratio(rounds, 'orjson', 'first answer')}"
                    f" | {_ratio(rounds, 'first open', 'orjson')}"
                    f" | {_ratio(rounds, 'reopen', '--help')} | {_ratio(rounds, 'reopen', 'first open')}"
                    f" | {_ratio(rounds, 'worker open', 'orjson')} | {_ratio(rounds, 'HTA', 'first answer')} |")
    return rows, loads


def table(files: list[Path], n_rounds: int, command: str, tools: tuple = TOOLS, hta_timeout: float = 600.0) -> str:
    rows, loads = measure(files, n_rounds, tools, hta_timeout)
    head = ("| trace | size | " + " | ".join(COLUMNS)
            + f" | A/A (again / orjson) | first answer / orjson (goal <= {FIRST_GOAL}x) | orjson / first answer "
            f"(the 1 GB trace's goal >= 4x) | first open / orjson "
            f"| reopen / --help (goal <= {REOPEN_GOAL}x) | reopen / first open (the 1 GB trace's goal <= 0.15x) "
            f"| worker open / orjson | HTA / first answer |\n"
            + "|---" * (len(COLUMNS) + 10) + "|\n")
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
    ap.add_argument("--hta", action="store_true", help="HTA 0.5.0 loading each file, in every round")
    ap.add_argument("--hta-timeout", type=float, default=600.0)
    ap.add_argument("--no-worker", action="store_true", help="no 'worker open' (the old path; slow on 1 GB)")
    a = ap.parse_args()
    tools = tuple(t for t in TOOLS if not (a.no_worker and t == "worker open")) + (("HTA",) if a.hta else ())
    if a.hta:
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_traces import ensure_hta

        if not ensure_hta():
            raise SystemExit("HTA could not be installed into bench/.venv-hta")
    command = " ".join([".venv/bin/python bench/bench_trace_first_answer.py", *sys.argv[1:]])
    text = table(a.files, a.rounds, command.replace(" --write-doc", ""), tools, a.hta_timeout)
    print(text)
    if a.write_doc:
        write_doc(text)


if __name__ == "__main__":
    main()
