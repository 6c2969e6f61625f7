"""GPU check of attach mode (``python -m diagnostics run``), one command, about a minute on one GPU:

    python bench/gpu/attach_cuda.py [--out DIR]

1. A CUDA training script (written below) runs with the bootstrap in its environment, as `run` starts
   it: a DataLoader whose samples sleep (the GPU idles while the host waits for data), a model on the
   GPU, and one ``loss.item()`` per step on a known line (a device sync). Steps 5-7 are profiled.
   Checked from the run folder with the standard library only (the GPU machine may lack the trace
   layer's orjson / msgspec): the trace has CUDA kernels inside ProfilerStep#5..7; per step the GPU is
   idle for part of it and busy (kernels) for part; the idle time overlaps the main thread's
   data_wait phase (placed on the trace's clock by the ProfilerStep ranges); the sync is located at
   the script's ``.item()`` line with a wait > 0; per-step CUDA peak memory and the window's memory
   snapshot are written.
2. A script that runs out of GPU memory (a per-process memory fraction keeps it small): its own
   OutOfMemoryError traceback and exit code 1 pass through, and the bootstrap dumps the allocator's
   snapshot (oom_snapshot.pickle) before it dies.
3. When the engine's analysis can be imported (orjson, psutil...), the same run folder is analysed as
   `run` does and its GPU figures printed (idle per step and its causes, kernel time, the sync finding).

Prints one JSON summary; exit 0 when every check holds, 1 otherwise. Needs only torch to run the checks.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOOT = ROOT / "diagnostics" / "attach" / "bootstrap"

TRAIN = '''
import time, torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self): return 100000
    def __getitem__(self, i):
        time.sleep(0.001)  # 32 samples: ~32 ms of host time per batch, the GPU waits meanwhile
        return torch.randn(1024), i % 10

model = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 1024), nn.GELU()) for _ in range(8)], nn.Linear(1024, 10)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=32)):
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    for _ in range(4):
        loss = loss_fn(model(x), y)
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    value = loss.item()  # SYNC-LINE
    if step == 14:
        break
print("trained", round(value, 3))
'''

OOM = '''
import torch
torch.cuda.set_per_process_memory_fraction(0.05)  # about 4-7 GiB: the allocator refuses beyond it
model = torch.nn.Linear(4096, 4096).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for step in range(1000):
    model(torch.randn(64, 4096, device="cuda")).sum().backward()
    opt.step()
    kept.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))  # 256 MiB more every step
'''


def run_attached(script: Path, run_dir: Path, config: dict) -> subprocess.CompletedProcess:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "TORCHSCOPE_ATTACH_DIR": str(run_dir),
           "PYTHONPATH": str(BOOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    return subprocess.run([sys.executable, str(script)], cwd=script.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap(a, b):
    """Total length of the intersection of two unions of intervals."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def check_training(work: Path) -> dict:
    script = work / "attach_cuda_train.py"
    script.write_text(TRAIN)
    sync_line = next(i for i, line in enumerate(TRAIN.splitlines(), start=1) if "SYNC-LINE" in line)
    run_dir = work / "run"
    p = run_attached(script, run_dir, {"at": 5, "steps": 3})
    checks: dict = {"exit_code": p.returncode, "stdout": p.stdout.strip()[-200:]}
    proc = next(run_dir.glob("proc-*"))
    meta = json.loads((proc / "meta.json").read_text())
    steps = [json.loads(line) for line in (proc / "steps.jsonl").read_text().splitlines() if line.strip()]
    doc = json.loads(gzip.decompress((run_dir / "trace.json.gz").read_bytes()))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "kernel"]
    gpu = union([(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")])
    prof_steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in ev
                  if str(e.get("name", "")).startswith("ProfilerStep#")}
    segs = json.loads((proc / "segments.json").read_text())["segments"]
    marks = {s[2]: s[0] for s in segs if len(s) == 3}
    offsets = sorted(prof_steps[n][0] - marks[n] * 1e6 for n in prof_steps if n in marks)
    offset = offsets[len(offsets) // 2] if offsets else None
    pts = sorted((s[0], s[1]) for s in segs)
    data_wait = union([(t * 1e6 + offset, t2 * 1e6 + offset) for (t, ph), (t2, _) in zip(pts, pts[1:])
                       if ph == "data_wait" and t2 > t]) if offset is not None else []
    per_step = []
    for n, (lo, hi) in sorted(prof_steps.items()):
        busy = overlap(gpu, [[lo, hi]])
        idle = union([(lo, hi)])
        idle_ivs = []
        cur = lo
        for s, e in gpu:
            if e <= lo or s >= hi:
                continue
            if s > cur:
                idle_ivs.append([cur, min(s, hi)])
            cur = max(cur, e)
        if cur < hi:
            idle_ivs.append([cur, hi])
        per_step.append({"step": n, "step_ms": (hi - lo) / 1e3, "gpu_busy_ms": busy / 1e3,
                         "kernel_ms": overlap(union(kernels), [[lo, hi]]) / 1e3,
                         "gpu_idle_ms": sum(e - s for s, e in idle_ivs) / 1e3,
                         "idle_in_data_wait_ms": overlap(idle_ivs, data_wait) / 1e3})
        del idle
    syncs = {}
    for r in steps:
        for loc, c, ms in r.get("syncs") or []:
            a = syncs.setdefault(loc, [0, 0.0])
            a[0] += c
            a[1] += ms
    where = f"{script}:{sync_line}"
    complete = [r for r in steps if not r.get("partial")]  # the last .item() falls in the unfinished step
    peaks = [r.get("mem") for r in complete if r.get("p")]
    checks.update({
        "steps_seen": len(complete), "window": meta.get("window"), "trace_steps": sorted(prof_steps),
        "cuda_in_meta": meta.get("cuda"), "device": meta.get("device_name"), "per_step": per_step,
        "syncs": {k: {"calls": v[0], "ms": round(v[1], 3)} for k, v in syncs.items()},
        "peak_bytes_per_profiled_step": peaks, "snapshot": (meta.get("exports") or {}).get("snapshot"),
    })
    ok = {
        "script exit 0": p.returncode == 0,
        "profiled steps 5-7 in the trace": sorted(prof_steps) == [5, 6, 7] and meta.get("window") == [5, 7],
        "kernels in every profiled step": all(s["kernel_ms"] > 0 for s in per_step),
        "GPU idle in every profiled step": all(s["gpu_idle_ms"] > 0 for s in per_step),
        "idle placed in data_wait": offset is not None and all(s["idle_in_data_wait_ms"] > 0 for s in per_step),
        "sync located at the .item() line": where in syncs and syncs[where][0] >= len(complete) - 1
        and syncs[where][1] > 0,
        "peak memory per profiled step": len(peaks) == 3 and all(isinstance(b, int) and b > 0 for b in peaks),
        "memory snapshot written": bool(checks["snapshot"]) and (run_dir / str(checks["snapshot"])).exists(),
        "parts sum to the step time in every step": all(
            abs(sum(r["ms"].values()) - ((r["t1"] - r["t0"]) * 1e3 - r.get("tool_ms", 0.0))) < 1e-6 * (r["t1"] - r["t0"]) * 1e3
            + 1e-6 for r in complete),
        "only the script's syncs (none of ours)": set(syncs) == {where},
    }
    if checks["snapshot"] and (run_dir / checks["snapshot"]).exists():
        snap = pickle.loads((run_dir / checks["snapshot"]).read_bytes())
        ok["snapshot has segments and traces"] = bool(snap.get("segments")) and bool(snap.get("device_traces"))
    checks["ok"] = ok
    checks["run_dir"] = str(run_dir)
    return checks


def check_oom(work: Path) -> dict:
    script = work / "attach_cuda_oom.py"
    script.write_text(OOM)
    run_dir = work / "oom"
    p = run_attached(script, run_dir, {"at": 2, "steps": 2})
    proc = next(run_dir.glob("proc-*"), None)
    meta = json.loads((proc / "meta.json").read_text()) if proc and (proc / "meta.json").exists() else {}
    oom = meta.get("oom") or {}
    snap = run_dir / "oom_snapshot.pickle"
    ok = {"exit code 1": p.returncode == 1,
          "its own OutOfMemoryError traceback": "OutOfMemoryError" in p.stderr and "attach_cuda_oom.py" in p.stderr
          and "agent.py" not in p.stderr,
          "OOM snapshot written": snap.exists() and snap.stat().st_size > 0,
          "OOM recorded with its step": bool(oom) and isinstance(oom.get("step"), int)}
    # the OOM report (proc-<pid>/oom.json): the failing 256 MiB, asked for outside every part of the step (host),
    # the Linear's weights counted, the budget answer against the process' memory fraction of total_memory
    report = json.loads((proc / "oom.json").read_text()) if proc and (proc / "oom.json").exists() else {}
    held = report.get("held_bytes") or {}
    plan = (report.get("plan") or {}).get("fit") or {}
    ok.update({"OOM report: kind cuda, phase host": report.get("kind") == "cuda" and report.get("phase") == "host",
               "OOM report: 256 MiB requested, exact": report.get("requested_bytes") == 256 << 20
               and report.get("requested_exact") is True,
               "OOM report: parameters counted": held.get("parameters") == 4 * (4096 * 4096 + 4096),
               "OOM report: the kept tensors in the rest": (held.get("activations and temporaries") or 0) >= 256 << 20,
               "OOM report: a budget answer against the memory fraction": bool(plan) and "memory fraction" in
               (report.get("plan") or {}).get("budget_source", "")})
    oom = {**oom, "report": report}
    if snap.exists():
        data = pickle.loads(snap.read_bytes())
        ok["OOM snapshot has segments"] = bool(data.get("segments"))
    return {"exit_code": p.returncode, "oom": oom, "stderr_tail": p.stderr.strip()[-400:], "ok": ok}


def engine_analysis(run_dir: str) -> dict:
    """The `run` command's own analysis of the same folder, when its dependencies are installed here."""
    sys.path.insert(0, str(ROOT))
    try:
        from diagnostics.analyses.attach.job import analyse_run
        from diagnostics.results import to_plain
    except Exception as e:  # orjson / msgspec / psutil missing on this machine: the stdlib checks stand
        return {"skipped": f"{type(e).__name__}: {e}"}
    try:
        r = to_plain(analyse_run(run_dir, exit_code=0))  # its plain form, as result.json holds it
    except ImportError as e:  # the trace layer's orjson / msgspec missing here
        return {"skipped": f"{type(e).__name__}: {e}"}
    return {"step_ms": r["step_ms"], "breakdown_ms": r["breakdown_ms"], "bottleneck": r["bottleneck"],
            "gpu": {k: v for k, v in (r["gpu"] or {}).items() if k != "steps"}, "syncs": r["syncs"][:3],
            "findings": [(f["id"], f["status"]) for f in r["findings"]], "notes": r["notes"],
            "ok": {"GPU idle per step with causes": bool(r["gpu"] and r["gpu"]["idle_ms_per_step"]
                                                         and r["gpu"]["idle_causes_ms_per_step"]),
                   "sync finding fires": any(f["id"] == "device_syncs" and f["status"] in ("warn", "fail", "pass")
                                             for f in r["findings"])}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="keep the run folders here (default: a temporary folder)")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    work = Path(args.out or tempfile.mkdtemp(prefix="attach-cuda-"))
    work.mkdir(parents=True, exist_ok=True)
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    out["training"] = check_training(work)
    out["oom"] = check_oom(work)
    out["engine"] = engine_analysis(out["training"]["run_dir"])
    failed = [f"{part}: {name}" for part in ("training", "oom", "engine")
              for name, good in (out[part].get("ok") or {}).items() if not good]
    out["failed"] = failed
    print(json.dumps(out, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
