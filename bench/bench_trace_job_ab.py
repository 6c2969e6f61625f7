"""The whole trace job on each trace, two source trees in alternation (ABBA), each run a fresh process.

    .venv/bin/python bench/bench_trace_job_ab.py BEFORE_TREE AFTER_TREE TRACE [TRACE ...]

A tree is a checkout (or `git archive` of a commit) of this repository. Each run calls the trace analysis'
own function (diagnostics.analyses.trace.job.analyze, as bench_traces.py's "job" tool) on a cold trace cache
and prints its CPU seconds (the process's), wall seconds, the critical path's part of the CPU
(critical_path_result: building the step's graph, the path and its what-ifs, writing the marked trace), the
load average and the path's length (the same in both trees when the change keeps the results). Issue #42
measured xDiT SD3.5's critical path with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r'''
import json, os, sys, tempfile, time
from pathlib import Path
os.environ["TORCHSCOPE_DATA_DIR"] = tempfile.mkdtemp(prefix="bench-ab-")
sys.path.insert(0, os.getcwd())
import diagnostics.analyses.trace.job as J
cp_cpu = []
real = J.critical_path_result
def timed(*a, **k):
    c = time.process_time(); r = real(*a, **k); cp_cpu.append(time.process_time() - c); return r
J.critical_path_result = timed
class Ctx:
    artifact_dir = Path(tempfile.mkdtemp(prefix="bench-ab-art-"))
    def progress(self, fraction, message=""): pass
c, t = time.process_time(), time.perf_counter()
r = J.analyze(Ctx(), {"path": sys.argv[1]})
print(json.dumps({"cpu": time.process_time() - c, "wall": time.perf_counter() - t, "cp_cpu": sum(cp_cpu),
                  "load": os.getloadavg()[0], "length_us": r.critical_path.length_us if r.critical_path else None}))
'''


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    trees = {"before": argv[0], "after": argv[1]}
    for trace in argv[2:]:
        for tree in ("before", "after", "after", "before"):
            p = subprocess.run([sys.executable, "-c", CHILD, os.path.abspath(trace)], cwd=trees[tree],
                               capture_output=True, text=True)
            if p.returncode:
                print(f"{os.path.basename(trace)} {tree} failed: {p.stderr.strip()[-500:]}", flush=True)
                continue
            res = json.loads(p.stdout.strip().splitlines()[-1])
            print(os.path.basename(trace), tree,
                  json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
