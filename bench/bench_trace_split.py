"""The whole trace job on a big trace, read by two processes (load_trace(split=True), as the Trace explorer does)
and by one, beside orjson.loads of the same file: interleaved, each call a fresh process, a random order per
round (diagnostics.measure.compare.Rounds), ratios per round with their 95 % interval.

    .venv/bin/python bench/bench_trace_split.py TRACE [TRACE ...] [--rounds 6]

Issue #42's goal: the 1 GB trace's job at 4x orjson.loads (a quiet machine). orjson.loads' own time varies with
what the page cache and the allocator hold (it allocates ~8 GB for the 1 GB trace), so one run beside it says
little: each round runs all three, and the figures are the rounds' geometric means with intervals.
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

CHILD = r'''
import json, os, sys, tempfile, time
tool, path = sys.argv[1], sys.argv[2]
if tool == "orjson":
    import gzip, orjson
    t, c = time.perf_counter(), time.process_time()
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        doc = orjson.loads(f.read())
    n = len(doc["traceEvents"])
else:
    os.environ["TORCHSCOPE_DATA_DIR"] = tempfile.mkdtemp(prefix="bench-split-")
    from pathlib import Path
    import diagnostics.trace.ingest as ingest
    import diagnostics.analyses.trace.job as J
    if tool == "alone":
        ingest.SPLIT_MIN_BYTES = 1 << 62
    class Ctx:
        artifact_dir = Path(tempfile.mkdtemp(prefix="bench-split-art-"))
        def progress(self, fraction, message=""): pass
    t, c = time.perf_counter(), time.process_time()
    r = J.analyze(Ctx(), {"path": path})
    n = r.summary.events
import resource
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c + ch.ru_utime + ch.ru_stime,
                  "events": n}))
'''


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=6)   # ratio_interval needs 6
    args = ap.parse_args()
    from diagnostics.measure.compare import Rounds, ratio_interval

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    report = {"rounds": args.rounds, "cpus": os.cpu_count(), "loads": [], "traces": {}}
    for path in args.traces:
        cpu: dict[str, list[float]] = {k: [] for k in ("orjson", "split", "alone")}

        def timer(tool: str):
            def once() -> float:
                p = subprocess.run([sys.executable, "-c", CHILD, tool, str(path)], cwd=ROOT, env=env,
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    raise SystemExit(f"{tool} failed: {p.stderr[-1500:]}")
                r = json.loads(p.stdout.strip().splitlines()[-1])
                cpu[tool].append(r["cpu"])
                return r["wall"] * 1e3
            return once

        rounds = Rounds({k: timer(k) for k in cpu}, reverse=False)
        for i in range(args.rounds):
            rounds.run()
            report["loads"].append(os.getloadavg()[0])
            print(f"{path.name}: round {i + 1}/{args.rounds}, load {report['loads'][-1]:.1f}", file=sys.stderr,
                  flush=True)
        ms = rounds.round_ms

        def iv(num: str, den: str, table) -> list:
            point, low, high = ratio_interval([a / b for a, b in zip(table[num], table[den])])
            return [point, low, high]

        report["traces"][path.name] = {
            "bytes": path.stat().st_size,
            "median_wall_s": {k: statistics.median(v) / 1e3 for k, v in ms.items()},
            "median_cpu_s": {k: statistics.median(v) for k, v in cpu.items()},
            "orjson_over_split_wall": iv("orjson", "split", ms), "orjson_over_alone_wall": iv("orjson", "alone", ms),
            "alone_over_split_wall": iv("alone", "split", ms), "orjson_over_split_cpu": iv("orjson", "split", cpu),
            "round_ms": ms, "cpu_s": cpu}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
