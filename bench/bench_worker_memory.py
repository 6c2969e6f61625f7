"""What one rank's map task costs in memory (issue #42): the peak RSS of a fresh worker process running
ranks.summary.rank_summary on one trace, above the same process after its imports, per decoded JSON byte
and per event. The figures behind ranks.executors.MEMORY_PER_JSON_BYTE / WORKER_BASE_BYTES.

    .venv/bin/python bench/bench_worker_memory.py TRACE [TRACE ...] [--tile-mb 5,20,50]

Each trace is measured as it is and, with --tile-mb, tiled: its events copied one span after another
(timestamps shifted, ProfilerStep#N renumbered) into a plain JSON of about that many MB, so that a small
public trace stands for a large rank of the same shape. One fresh process per measurement.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _child(path: str) -> None:
    sys.path.insert(0, str(ROOT))
    from diagnostics.trace.ranks.summary import rank_summary

    base = _status("VmRSS")
    t = time.perf_counter()
    s = rank_summary(path)
    seconds = time.perf_counter() - t
    print(json.dumps({"base_rss": base, "peak_rss": _status("VmHWM"), "seconds": seconds,
                      "events": (s.get("summary") or {}).get("events") or s.get("events")}))


def _read(path: str) -> dict:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def tile(path: str, mb: float, out: str) -> int:
    """``path``'s events copied until the JSON is about ``mb`` MB; returns the event count."""
    doc = _read(path)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    lo = min(float(e["ts"]) for e in timed)
    span = max(float(e["ts"]) + float(e.get("dur") or 0) for e in timed) - lo + 1000.0
    one = len(json.dumps(events))
    copies = max(1, round(mb * 1e6 / one))
    out_events = [e for e in events if e.get("ph") == "M"]
    for k in range(copies):
        for e in events:
            if e.get("ph") == "M":
                continue
            e = dict(e)
            if "ts" in e:
                e["ts"] = float(e["ts"]) + k * span
            name = e.get("name")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                e["name"] = f"ProfilerStep#{k * 1000 + int(name[13:] or 0)}"
            if isinstance(e.get("args"), dict):
                args = dict(e["args"])
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] = args[key] + k * 10_000_000
                e["args"] = args
            if isinstance(e.get("id"), int):
                e["id"] = e["id"] + k * 10_000_000
            out_events.append(e)
    meta = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
    Path(out).write_text(json.dumps({**meta, "traceEvents": out_events}))
    return len(out_events)


def measure(path: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", path], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    raw = Path(path).read_bytes()
    res["json_bytes"] = len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)
    res["file_bytes"] = len(raw)
    res["task_bytes"] = res["peak_rss"] - res["base_rss"]
    res["per_json_byte"] = res["task_bytes"] / res["json_bytes"]
    res["per_event"] = res["task_bytes"] / res["events"] if res.get("events") else None
    sys.path.insert(0, str(ROOT))
    from diagnostics.trace.ranks.executors import WORKER_BASE_BYTES, rank_events, rank_memory

    res["estimated_events"] = rank_events(path)
    res["sized_task_bytes"] = rank_memory(path) - WORKER_BASE_BYTES
    res["sized_over_measured"] = res["sized_task_bytes"] / res["task_bytes"]
    res["base_within_sized"] = res["base_rss"] <= WORKER_BASE_BYTES
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--tile-mb", default="", help="also tile each trace to these sizes (MB, comma-separated)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    print("load:", os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        for p in args.traces:
            runs = [(p, None)]
            for mb in [float(x) for x in args.tile_mb.split(",") if x]:
                out = os.path.join(tmp, f"{Path(p).name}.{mb:g}MB.json")
                tile(p, mb, out)
                runs.append((out, mb))
            for path, mb in runs:
                r = measure(path)
                r.update({"trace": Path(p).name, "tiled_mb": mb})
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
                if mb is not None:
                    os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
