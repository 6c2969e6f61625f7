"""Generate a many-rank job's traces from a real 2-rank capture, with a planted straggler and one late
collective (issue #35's benchmark and its tests).

    .venv/bin/python bench/make_rank_job.py --ranks 64 --mb 250 [--out bench/.data/rank_job] [--workers 2]

1. **Capture** (once, kept in <out>/capture): a real torch.profiler trace of each rank of a 2-process
   DistributedDataParallel training on CPU (gloo), record_shapes on: its collectives are gloo's
   all_reduce annotations (with their tensor sizes) and the c10d calls. The steps whose two ranks
   arrived at every collective within CLEAN_SKEW_US of each other are the template (a loaded machine
   puts noise into some steps; that noise is real, but it would read as late collectives).
2. **Ranks**: rank r copies capture rank r % 2's template steps until the file is about --mb MB
   (timestamps shifted copy after copy, ProfilerStep#N renumbered, ids offset), as host r // 8
   ("node<h>": its own clock, off by up to HOST_CLOCK_MS) with a per-rank jitter of up to JITTER_US.
3. **Planted**: the straggler rank (default ranks - 3) computes STRAGGLER_MS longer before each of
   its collectives, and every other rank waits that long inside it; at one collective (a third of the
   way in) the late rank (default 1) arrives LATE_MS late and every other rank waits for it. Waiting
   is modelled as the profiler would see it: every later event moves, spans around the point grow.

The planted facts go to <out>/<ranks>x<mb>.planted.json (outside the traces' folder).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / ".data" / "rank_job"
CAPTURE_STEPS = 30
CLEAN_SKEW_US = 1500.0
HOST_CLOCK_MS = 5.0
JITTER_US = 30.0
STRAGGLER_MS = 8.0
LATE_MS = 40.0
RANKS_PER_HOST = 8

CAPTURE = r'''
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.profiler import profile, ProfilerActivity, schedule

def main(rank, world, out, steps, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())], nn.Linear(512, 10))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=1, warmup=2, active=steps),
                 on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank{rank}.pt.trace.json")) as prof:
        for _ in range(steps + 3):
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            prof.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    torch.multiprocessing.spawn(main, args=(2, sys.argv[1], int(sys.argv[2]), int(sys.argv[3])), nprocs=2)
'''


def capture(folder: Path, steps: int = CAPTURE_STEPS) -> list[Path]:
    """The two ranks' real traces (made once)."""
    for suffix in (".pt.trace.json", ".pt.trace.json.gz"):
        files = [folder / f"rank{r}{suffix}" for r in (0, 1)]
        if all(f.exists() for f in files):
            return files
    files = [folder / f"rank{r}.pt.trace.json" for r in (0, 1)]
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "capture.py"
    script.write_text(CAPTURE)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, str(script), str(folder), str(steps), str(29500 + os.getpid() % 400)],
                   check=True, env=env, cwd=folder)
    return files


def _load(path: Path) -> dict:
    import gzip

    data = path.read_bytes()
    return orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _own(events: list) -> list:
    """The rank's collectives as the analysis matches them (gloo's annotations), in start order."""
    return sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:")),
                  key=lambda e: e["ts"])


def template(docs: list[dict]) -> dict:
    """The clean run of consecutive steps both ranks hold, and per rank its events and collectives there."""
    steps = []
    for d in docs:
        st = sorted((e for e in d["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
                     and e.get("ph") == "X"), key=lambda e: e["ts"])
        steps.append(st)
    n = min(len(s) for s in steps)
    colls = [_own(d["traceEvents"]) for d in docs]
    per_step = []
    for i in range(n):
        spans = [(s[i]["ts"], s[i]["ts"] + s[i]["dur"]) for s in steps]
        mine = [[c for c in cs if lo <= c["ts"] < hi] for cs, (lo, hi) in zip(colls, spans)]
        if len({len(m) for m in mine}) != 1 or not mine[0]:
            per_step.append(float("inf"))
            continue
        per_step.append(max(abs(a["ts"] - b["ts"]) for a, b in zip(*mine)))
    # longest run of clean steps (at least 3: otherwise the 3 cleanest in a row)
    best, cur = (0, 0), 0
    for i, skew in enumerate(per_step + [float("inf")]):
        if skew <= CLEAN_SKEW_US:
            cur += 1
        else:
            if cur > best[1] - best[0]:
                best = (i - cur, i)
            cur = 0
    if best[1] - best[0] < 3:
        sums = [sum(per_step[i:i + 3]) for i in range(max(1, n - 2))]
        i = int(np.argmin(sums))
        best = (i, i + 3)
    lo_i, hi_i = best
    out = {"steps": hi_i - lo_i, "max_skew_us": max(per_step[lo_i:hi_i]), "ranks": []}
    for d, st, cs in zip(docs, steps, colls):
        lo, hi = st[lo_i]["ts"], st[hi_i - 1]["ts"] + st[hi_i - 1]["dur"]
        ev = [e for e in d["traceEvents"] if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))
              and lo <= e["ts"] < hi]
        meta = [e for e in d["traceEvents"] if e.get("ph") == "M"]
        first_step = int(st[lo_i]["name"].split("#")[1])
        out["ranks"].append({"events": ev, "meta": meta, "lo": lo, "hi": hi, "first_step": first_step,
                             "collectives": [(c["ts"], c["dur"]) for c in cs if lo <= c["ts"] < hi],
                             "head": {k: v for k, v in d.items() if k != "traceEvents"}})
    # one span for both ranks' copies, so their steps stay together
    out["span"] = max(r["hi"] - r["lo"] for r in out["ranks"]) + 50.0
    out["step_count"] = hi_i - lo_i
    return out


def _warp(ts: np.ndarray, dur: np.ndarray, t: float, d: float) -> None:
    """Everything from ``t`` on happens ``d`` later; what spans ``t`` lasts ``d`` longer."""
    after = ts >= t
    spans = ~after & (ts + dur > t)
    ts[after] += d
    dur[spans] += d


def write_rank(args) -> dict:
    """One rank's file (run in a worker process)."""
    tpl, rank, n_ranks, copies, out_dir, plan = args
    t0 = time.perf_counter()
    src = tpl["ranks"][rank % 2]
    ev = src["events"]
    base_ts = np.array([e["ts"] for e in ev], dtype=float)
    base_dur = np.array([float(e.get("dur", 0.0)) for e in ev], dtype=float)
    has_dur = np.array(["dur" in e for e in ev])
    step_of = [int(e["name"].split("#")[1]) - src["first_step"] if str(e.get("name", "")).startswith("ProfilerStep#")
               else -1 for e in ev]
    rng = np.random.default_rng(1000 + rank)
    host = rank // RANKS_PER_HOST
    clock = plan["host_clock_us"][host] + rng.uniform(-JITTER_US, JITTER_US)
    span, k_per_copy = tpl["span"], len(src["collectives"])
    head = dict(src["head"])
    info = dict(head.get("distributedInfo") or {})
    info.update(rank=rank, world_size=n_ranks)
    info["pg_config"] = [dict(c, pg_size=n_ranks, ranks=list(range(n_ranks))) for c in info.get("pg_config") or []]
    head.update(distributedInfo=info, host_name=f"node{host}", traceName=f"rank{rank}.pt.trace.json")
    path = Path(out_dir) / f"rank{rank}.pt.trace.json"
    tmp = path.with_suffix(".tmp")
    delay_total = 0.0
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(head)[:-1] + b', "traceEvents": [\n')
        f.write(b",\n".join(orjson.dumps(m) for m in src["meta"]))
        for c in range(copies):
            ts = base_ts + c * span + delay_total
            dur = base_dur.copy()
            warps = []  # (template time, delay): applied latest first, so earlier ones move them all
            for k, (a, d) in enumerate(src["collectives"]):
                g = c * k_per_copy + k
                at = a + c * span + delay_total
                inside = at + min(1.0, d / 2)
                if plan["straggler_ms"]:
                    warps.append((at if rank == plan["straggler"] else inside, plan["straggler_ms"] * 1e3))
                if g == plan["late_collective"]:
                    warps.append((at if rank == plan["late_rank"] else inside, plan["late_ms"] * 1e3))
            for t, d in sorted(warps, reverse=True):
                _warp(ts, dur, t, d)
            delay_total += sum(d for _, d in warps)
            ts += clock
            parts = []
            for i, e in enumerate(ev):
                e2 = dict(e)
                e2["ts"] = round(float(ts[i]), 3)
                if has_dur[i]:
                    e2["dur"] = round(float(dur[i]), 3)
                if step_of[i] >= 0:
                    e2["name"] = f"ProfilerStep#{1 + c * tpl['step_count'] + step_of[i]}"
                a = e.get("args")
                if a and "External id" in a:
                    e2["args"] = dict(a, **{"External id": a["External id"] + c * 1_000_000})
                if "id" in e and isinstance(e["id"], int):
                    e2["id"] = e["id"] + c * 1_000_000
                parts.append(orjson.dumps(e2))
            f.write(b",\n" + b",\n".join(parts))
        f.write(b"\n]}\n")
    os.replace(tmp, path)
    return {"rank": rank, "bytes": path.stat().st_size, "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb", type=float, default=250.0, help="size of each rank's trace, MB")
    ap.add_argument("--out", default=str(DATA), help="folder (default bench/.data/rank_job)")
    ap.add_argument("--straggler", type=int, default=None, help="the straggler rank (default ranks - 3)")
    ap.add_argument("--late-rank", type=int, default=1)
    ap.add_argument("--straggler-ms", type=float, default=STRAGGLER_MS)
    ap.add_argument("--late-ms", type=float, default=LATE_MS)
    ap.add_argument("--workers", type=int, default=2, help="processes writing ranks at once")
    ap.add_argument("--name", default=None, help="the job folder's name (default <ranks>x<mb>)")
    ap.add_argument("--capture", default=None, help="the 2-rank capture's folder (default <out>/capture; made "
                                                    "when missing)")
    ap.add_argument("--capture-steps", type=int, default=CAPTURE_STEPS, help="profiled steps of a new capture")
    args = ap.parse_args(argv)
    out = Path(args.out)
    files = capture(Path(args.capture) if args.capture else out / "capture", args.capture_steps)
    tpl = template([_load(f) for f in files])
    per_copy = sum(len(orjson.dumps(e)) + 2 for e in tpl["ranks"][0]["events"])
    copies = max(1, round(args.mb * 1e6 / per_copy))
    k = len(tpl["ranks"][0]["collectives"])
    straggler = args.ranks - 3 if args.straggler is None else args.straggler
    rng = np.random.default_rng(7)
    hosts = -(-args.ranks // RANKS_PER_HOST)
    plan = {"ranks": args.ranks, "copies": copies, "steps": copies * tpl["step_count"],
            "collectives_per_rank": copies * k, "template_steps": tpl["step_count"],
            "template_max_skew_us": tpl["max_skew_us"],
            "straggler": straggler, "straggler_ms": args.straggler_ms,
            "late_rank": args.late_rank, "late_ms": args.late_ms,
            "late_collective": (copies * k) // 3, "late_key": f"all_reduce#{(copies * k) // 3}",
            "host_clock_us": [0.0] + [float(x) for x in rng.uniform(-HOST_CLOCK_MS, HOST_CLOCK_MS, hosts - 1) * 1e3]}
    name = args.name or f"{args.ranks}x{args.mb:g}"
    job = out / name
    job.mkdir(parents=True, exist_ok=True)
    for old in job.glob("*.json"):
        old.unlink()
    t = time.perf_counter()
    work = [(tpl, r, args.ranks, copies, str(job), plan) for r in range(args.ranks)]
    if args.workers > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            done = pool.map(write_rank, work, chunksize=1)
    else:
        done = [write_rank(w) for w in work]
    plan["bytes"] = sum(d["bytes"] for d in done)
    plan["seconds"] = time.perf_counter() - t
    plan["folder"] = str(job)
    (out / f"{name}.planted.json").write_text(json.dumps(plan, indent=1))
    print(json.dumps({k: v for k, v in plan.items() if k != "host_clock_us"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
