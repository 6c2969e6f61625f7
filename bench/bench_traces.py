"""Trace ingest benchmark: TorchScope's load_trace vs json.load, orjson and HTA's TraceAnalysis.

    .venv/bin/python bench/bench_traces.py [--sizes 100,1000] [--runs 3] [--skip-hta] [--reopen]
        [--data DIR] [--write-doc]

1. Generates traces under bench/.data (gitignored): a real torch.profiler CPU trace of a
   Transformer encoder's training steps (record_shapes, profile_memory) of about 100 MB, and a
   ~1 GB one built from it by repeating its steps with shifted timestamps (a real 1 GB capture
   needs more memory and time than this machine should spend). Each also as .json.gz. Every file
   carries "distributedInfo": {"rank": 0} so that HTA accepts it.
2. Creates bench/.venv-hta with HolisticTraceAnalysis 0.5.0 (installed --no-deps plus the
   dependencies its import needs; no torch, HTA does not import it) unless --skip-hta.
3. Times each tool on each file in a fresh subprocess (so peak RSS is that tool's alone), best
   of --runs, and prints a table; --write-doc replaces the "## Trace ingest" section of
   docs/BENCHMARKS.md with it. The tool "job" is the whole `trace analyze` job (the analysis'
   own function: ingest, every view, the timeline, the kept columns) on a cold trace cache,
   compared with orjson.loads of the same file; the tool "cli" is the whole
   `python -m diagnostics trace analyze FILE` process (interpreter, imports, job, report folder)
   on its own cold trace cache.
4. --reopen: the same job (and CLI process, with "cli") again on the cache the cold run left (a
   second open of the unchanged file), each in a fresh process; the ratio goes into the
   "## Trace reopen" section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / ".data"
HTA_VENV = ROOT / "bench" / ".venv-hta"
DOC = ROOT / "docs" / "BENCHMARKS.md"
SECTION = "## Trace ingest"
REOPEN_SECTION = "## Trace reopen"
CACHE_ENV = "BENCH_TRACE_CACHE_DATA"   # the data folder (trace cache) a "job" child uses
HTA_REQUIREMENT = "HolisticTraceAnalysis==0.5.0"
# What HTA 0.5.0 imports (its declared jupyterlab and pytest are not needed to load traces).
HTA_DEPS = ["numpy<2.3", "pandas<3", "plotly", "networkx", "pydot", "pyyaml", "psutil"]
REAL_STEPS = 150          # steps profiled for the ~100 MB real trace
RANK_INFO = b'"distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1},'
PY = sys.executable


# ---- trace generation --------------------------------------------------------------------------

def _profile_real(path: Path, steps: int) -> None:
    """Profile `steps` training steps of a small Transformer encoder on CPU into `path`."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16, 64)
    tmp = path.with_suffix(".raw")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                 schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(tmp))) as prof:
        for _ in range(steps + 1):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            prof.step()
    raw = tmp.read_bytes()
    tmp.unlink()
    brace = raw.index(b"{")
    path.write_bytes(raw[:brace + 1] + b"\n  " + RANK_INFO + raw[brace + 1:])


def _replicate(src: Path, dst: Path, copies: int) -> None:
    """Write `copies` back-to-back copies of src's events as the profiler formatted them.

    The events' bytes are repeated with ts shifted by the trace's span, ProfilerStep#N
    renumbered and ids offset, so the file has the real trace's layout and event mix.
    """
    raw = src.read_bytes()
    start = re.search(rb'"traceEvents"\s*:\s*\[', raw).end()
    end = raw.rindex(b"]")
    head, body, tail = raw[:start], raw[start:end].rstrip(), raw[end:]
    stamps = [float(m) for m in re.findall(rb'"ts": (\d+(?:\.\d+)?)', body)]
    durs = [float(m) for m in re.findall(rb'"dur": (\d+(?:\.\d+)?)', body)]
    span = (max(stamps) + max(durs) - min(stamps)) + 100.0
    steps = [int(m) for m in re.findall(rb'"ProfilerStep#(\d+)"', body)]
    n_steps = max(steps) - min(steps) + 1 if steps else 0
    pattern = re.compile(rb'"ts": (\d+(?:\.\d+)?)|"ProfilerStep#(\d+)"|"External id": (\d+)|'
                         rb'"id": (\d+)')
    with open(dst, "wb") as f:
        f.write(head)
        for k in range(copies):
            def shift(m, k=k):
                if m.group(1):
                    return b'"ts": %.3f' % (float(m.group(1)) + k * span)
                if m.group(2):
                    return b'"ProfilerStep#%d"' % (int(m.group(2)) + k * n_steps)
                if m.group(3):
                    return b'"External id": %d' % (int(m.group(3)) + k * 10_000_000)
                return b'"id": %d' % (int(m.group(4)) + k * 10_000_000)
            if k:
                f.write(b",")
            f.write(pattern.sub(shift, body) if k else body)
        f.write(b"\n" + tail)


def _gzip(src: Path, dst: Path) -> None:
    import gzip
    with open(src, "rb") as fi, gzip.open(dst, "wb", compresslevel=1) as fo:
        while block := fi.read(16 << 20):
            fo.write(block)


def generate(sizes_mb: list[int]) -> dict[str, Path]:
    DATA.mkdir(parents=True, exist_ok=True)
    real = DATA / "encoder_100mb.pt.trace.json"
    if not real.exists():
        t = time.perf_counter()
        _profile_real(real, REAL_STEPS)
        print(f"generated {real.name} ({real.stat().st_size / 1e6:.0f} MB) "
              f"in {time.perf_counter() - t:.0f} s", flush=True)
    files = {}
    for size in sizes_mb:
        if size <= 150:
            path = real
        else:
            path = DATA / f"encoder_{size}mb.pt.trace.json"
            if not path.exists():
                t = time.perf_counter()
                _replicate(real, path, max(1, round(size * 1e6 / real.stat().st_size)))
                print(f"generated {path.name} ({path.stat().st_size / 1e6:.0f} MB) "
                      f"in {time.perf_counter() - t:.0f} s", flush=True)
        gz = path.with_name(path.name + ".gz")
        if not gz.exists():
            _gzip(path, gz)
        files[f"{size}MB json"] = path
        files[f"{size}MB gz"] = gz
    return files


# ---- measuring (each in its own process) -------------------------------------------------------

def _measure(tool: str, path: str) -> None:
    """Child process: load `path` with `tool`, print {"seconds", "peak_rss_mb", "events"}."""
    import resource
    sys.path.insert(0, str(ROOT))

    def cpu_seconds():
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    load = os.getloadavg()[0]
    extra: dict = {}
    cpu0 = cpu_seconds()
    if tool == "torchscope":
        from diagnostics.trace.ingest import load_trace
        t = time.perf_counter()
        n = len(load_trace(path))
    elif tool in ("json", "orjson"):
        import gzip
        import orjson
        opener = gzip.open if path.endswith(".gz") else open
        t = time.perf_counter()
        with opener(path, "rb") as f:
            n = len((json.load(f) if tool == "json" else orjson.loads(f.read()))["traceEvents"])
    elif tool == "job":
        import tempfile

        os.environ["TORCHSCOPE_DATA_DIR"] = os.environ[CACHE_ENV]
        from diagnostics.analyses.trace.job import analyze

        class Ctx:  # what the runner hands the analysis: an artifact folder and a progress callback
            artifact_dir = Path(tempfile.mkdtemp(prefix="bench-trace-job-"))

            def progress(self, fraction, message=""):
                pass

        t = time.perf_counter()
        result = analyze(Ctx(), {"path": path})
        n = result.summary.events   # a TraceResult (diagnostics.analyses.trace.result)
        cache = result.trace_cache
        extra = {"hit": cache.hit, "open_s": cache.open_s, "result": bool(cache.result)}
        import shutil
        shutil.rmtree(Ctx.artifact_dir, ignore_errors=True)
    elif tool == "cli":
        # The whole CLI process, as a user runs it: interpreter, imports, the job, the report folder.
        import tempfile

        out_dir = tempfile.mkdtemp(prefix="bench-trace-cli-")
        env = dict(os.environ, TORCHSCOPE_DATA_DIR=os.environ[CACHE_ENV])
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "diagnostics", "trace", "analyze", path, "--out", out_dir,
                               "--json"], cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t
        if proc.returncode != 0:
            raise SystemExit(f"trace analyze exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        doc = json.loads(proc.stdout)
        n = doc["summary"]["events"]
        cache = doc.get("trace_cache") or {}
        extra = {"hit": cache.get("hit"), "open_s": cache.get("open_s"), "result": bool(cache.get("result")),
                 "child_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
        import shutil
        shutil.rmtree(out_dir, ignore_errors=True)
        print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds() - cpu0,
                          "peak_rss_mb": extra["child_peak_rss_mb"], "events": n, "load": load, **extra}))
        return
    elif tool == "hta":
        import logging
        logging.disable(logging.WARNING)
        from hta.trace_analysis import TraceAnalysis
        t = time.perf_counter()
        ta = TraceAnalysis(trace_files={0: path}, trace_dir=str(Path(path).parent))
        n = len(ta.t.get_trace(0))
    else:
        raise SystemExit(f"unknown tool {tool}")
    seconds = time.perf_counter() - t
    rss = _peak_rss_mb()
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds() - cpu0,
                      "peak_rss_mb": rss, "events": n, "load": load, **extra}))


def _peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss it does not inherit the parent's)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cache_data(path: Path, tool: str = "job") -> Path:
    """The data folder whose trace cache the "job" (or "cli") runs on `path` use (beside the trace)."""
    return path.parent / "trace-cache-data" / (path.name + ("" if tool == "job" else f"-{tool}"))


def _run_tool(tool: str, path: Path, runs: int, timeout: float, cold: bool = True) -> dict:
    """Best of `runs` child runs; peak RSS also sampled here over the child's process tree.
    Tool "job": each run on an empty trace cache (cold) or on the one the runs before left."""
    import psutil
    import shutil

    python = str(HTA_VENV / "bin" / "python") if tool == "hta" else PY
    env = dict(os.environ, **{CACHE_ENV: str(_cache_data(path, tool))})
    best = None
    for _ in range(runs):
        if tool in ("job", "cli") and cold:
            shutil.rmtree(_cache_data(path, tool), ignore_errors=True)
        proc = subprocess.Popen([python, __file__, "--measure", tool, str(path)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tree_peak = 0
        start = time.monotonic()
        try:
            root = psutil.Process(proc.pid)
            while proc.poll() is None:
                if time.monotonic() - start > timeout:
                    proc.kill()
                    return {"error": f"timed out after {timeout:.0f} s"}
                try:
                    rss = root.memory_info().rss + sum(
                        c.memory_info().rss for c in root.children(recursive=True))
                    tree_peak = max(tree_peak, rss)
                except psutil.Error:
                    pass
                time.sleep(0.1)   # psutil scans /proc for children: ~2 ms a sample, not to weigh on what it measures
        except psutil.Error:
            pass
        out, err = proc.communicate()
        if proc.returncode != 0:
            tail = (err.strip().splitlines() or ["?"])[-1]
            return {"error": tail[:200]}
        res = json.loads(out.strip().splitlines()[-1])
        res["peak_rss_mb"] = max(res["peak_rss_mb"], tree_peak / 2**20)
        if best is None or res["seconds"] < best["seconds"]:
            best = res
    return best


def ensure_hta() -> bool:
    python = HTA_VENV / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import hta"],
                                          capture_output=True).returncode == 0:
        return True
    print("creating bench/.venv-hta with " + HTA_REQUIREMENT, flush=True)
    subprocess.run([PY, "-m", "venv", str(HTA_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run(pip + ["--no-deps", HTA_REQUIREMENT, "orjson"], check=True)
    subprocess.run(pip + HTA_DEPS, check=True)
    return subprocess.run([str(python), "-c", "import hta.trace_analysis"]).returncode == 0


# ---- report ------------------------------------------------------------------------------------

COMMAND = ".venv/bin/python bench/bench_traces.py"  # the command line, for the report


def _fmt(res: dict | None, key: str, unit: str) -> str:
    if not res:
        return "-"
    if "error" in res:
        m = re.search(r"timed out after (\d+) s", res["error"])
        return f"> {m.group(1)} s (timed out)" if m and key == "seconds" else "failed" if not m else "-"
    return f"{res[key]:.0f} {unit}" if key == "peak_rss_mb" else f"{res[key]:.2f} {unit}"


def report(files: dict, results: dict, tools: list[str], runs: int) -> str:
    lines = [SECTION, "",
             f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, "
             f"{os.cpu_count()} cores, Python {platform.python_version()}; best of {runs} "
             "run(s), each tool in a fresh process. Time is the load call alone (interpreter "
             "and imports excluded); peak RSS is the process's high-water mark or, when larger, "
             "the peak of the summed RSS of it and its worker processes sampled every 20 ms "
             "(shared pages counted once per process, so this overstates).", "",
             f"Command: `{COMMAND}`", "",
             "| trace | size | events | " +
             " | ".join(f"{t} wall | {t} CPU | {t} RSS" for t in tools) +
             " | HTA / TorchScope wall | HTA / TorchScope RSS | json.load / TorchScope wall |"
             " orjson / job wall | orjson / job CPU | orjson / cli wall | orjson / cli CPU |",
             "|---" * (3 + 3 * len(tools) + 7) + "|"]
    loads = [res["load"] for r in results.values() for res in r.values() if "load" in res]
    if loads:
        lines[2] += (f" Load average (1 min) when the runs started: {min(loads):.1f} to "
                     f"{max(loads):.1f}; above ~1 other work shared the 2 cores, so wall times "
                     "are inflated and CPU seconds (the process and its workers) are the steadier "
                     "figure.")
    for label, path in files.items():
        r = results[label]
        events = next((res["events"] for res in r.values() if res and "events" in res), "-")
        row = [label, f"{path.stat().st_size / 1e6:.0f} MB", f"{events:,}" if events != "-" else "-"]
        for t in tools:
            row += [_fmt(r.get(t), "seconds", "s"), _fmt(r.get(t), "cpu_seconds", "s"),
                    _fmt(r.get(t), "peak_rss_mb", "MB")]

        def ratio(tool, key, base="torchscope"):
            a, b = r.get(tool), r.get(base) or {}
            if a and "error" in a and b and "error" not in b:
                m = re.search(r"timed out after (\d+) s", a["error"])
                return f"> {float(m.group(1)) / b[key]:.0f}x" if m and key == "seconds" else "-"
            if not a or "error" in a or not b or "error" in b:
                return "-"
            return f"{a[key] / b[key]:.1f}x"
        row += [ratio("hta", "seconds"), ratio("hta", "peak_rss_mb"), ratio("json", "seconds"),
                ratio("orjson", "seconds", "job"), ratio("orjson", "cpu_seconds", "job"),
                ratio("orjson", "seconds", "cli"), ratio("orjson", "cpu_seconds", "cli")]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["",
              "The ~100 MB trace is a real torch.profiler capture (150 training steps of a "
              "2-layer Transformer encoder, d_model 64, CPU, record_shapes and profile_memory). "
              "The ~1 GB trace repeats its steps with shifted timestamps, renumbered "
              "ProfilerStep#N and offset ids, byte for byte in the profiler's own layout. "
              "The .gz files are the same traces gzipped (level 1). "
              "HTA is HolisticTraceAnalysis 0.5.0 in its own venv (bench/.venv-hta, default "
              "JSON backend, no ijson); json/orjson parse the whole document (dicts only, no "
              "columns). \"job\" is the whole `trace analyze` job, the analysis' own function "
              "(diagnostics.analyses.trace.job.analyze: ingest, summary, temporal breakdown, top "
              "operators, idle time, launches, the timeline and the kept columns) on an empty trace "
              "cache, so it includes writing the cache entry; the runner's worker start and the "
              "report are not in it.", "",
              "How TorchScope gets there (diagnostics/trace/ingest.py, _chunks.py): the file is "
              "read in 16 MB blocks (gunzipped by ISA-L in a background thread), each block is "
              "cut at its last event boundary and decoded in one msgspec call into structs that "
              "keep only the fields the analyses use, which become numpy columns at once. Peak "
              "memory is the columns (~70 bytes an event) plus a few blocks. A big trace is read "
              "by split helpers that hand their columns back as checked records (never a pickle; "
              "the \"Trace first answer\" section).", ""]
    return "\n".join(lines)


def reopen_report(files: dict, results: dict, runs: int) -> str:
    """The "## Trace reopen" section: the job on a cold cache, then again on the cache it left."""
    lines = [REOPEN_SECTION, "",
             f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores; best of "
             f"{runs} run(s), each in a fresh process, the reopen runs after the first open in the same "
             "benchmark run. \"Job\" is the whole `trace analyze` job (the analysis' function, as in the "
             "ingest table); \"open\" is the part of it that reads the trace (parse and write the cache "
             "entry on the first open; on a reopen, find and read the stored result), as the job reports it "
             "(result key trace_cache; \"stored result\": the reopen returned the analysis kept by the first "
             "open instead of running it again).", "",
             f"Command: `{COMMAND}`", ""]
    loads = [res["load"] for r in results.values() for k, res in r.items()
             if k.startswith(("job", "cli")) and "load" in res]
    if loads:
        lines[2] += (f" Load average (1 min) when the runs started: {min(loads):.1f} to {max(loads):.1f} "
                     "(on 2 cores: wall times are inflated, CPU seconds are the steadier figure).")
    lines += ["| trace | size | tool | first open: wall | CPU | RSS | open | reopen: wall | CPU "
              "| RSS | open | stored result | reopen / first (wall) | reopen / first (CPU) |",
              "|---" * 14 + "|"]
    for label, path in files.items():
        for tool in ("job", "cli"):
            if tool not in results[label]:
                continue
            cold, warm = results[label].get(tool) or {}, results[label].get(f"{tool}_reopen") or {}
            ok = "error" not in cold and "error" not in warm and cold and warm

            def ratio(key):
                return f"{100 * warm[key] / cold[key]:.1f} %" if ok and cold.get(key) else "-"
            row = [label, f"{path.stat().st_size / 1e6:.0f} MB", tool]
            for res in (cold, warm):
                row += [_fmt(res, "seconds", "s"), _fmt(res, "cpu_seconds", "s"), _fmt(res, "peak_rss_mb", "MB"),
                        f"{res['open_s']:.2f} s" if res and res.get("open_s") is not None else "-"]
            row += [str(warm.get("result", "-")).lower(), ratio("seconds"), ratio("cpu_seconds")]
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "The cache (diagnostics/trace/cache.py) keeps the parsed columns as Arrow/Feather and the rest "
              "of the Trace as JSON in <data folder>/trace_cache, one folder per (resolved path, size, mtime in ns, "
              "ingest options, format version), and beside them the job's result, one per (options, stamps of "
              "the other files read, hash of the trace code): a reopen of an unchanged file with the same "
              "options reads that result (and hard-links the files it names into the new run's folder) instead "
              "of parsing and analysing again. Goal (#35): the reopen at most 15 % of the first open.", ""]
    return "\n".join(lines)


def write_doc(section: str, title: str = SECTION) -> None:
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    DOC.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000", help="trace sizes in MB (default 100,1000)")
    ap.add_argument("--runs", type=int, default=3, help="runs per tool and file (best is kept)")
    ap.add_argument("--skip-hta", action="store_true", help="do not install or run HTA")
    ap.add_argument("--tools", default="torchscope,json,orjson,hta")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--reopen", action="store_true",
                    help="also time the trace analyze job's reopen on the cache its first open left "
                         "(adds the tool 'job' when missing)")
    ap.add_argument("--data", default=None, help="folder for the generated traces (default bench/.data)")
    ap.add_argument("--write-doc", action="store_true", help="update docs/BENCHMARKS.md")
    ap.add_argument("--measure", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        _measure(*args.measure)
        return 0
    tools = [t for t in args.tools.split(",") if t]
    if args.skip_hta and "hta" in tools:
        tools.remove("hta")
    if "hta" in tools and not ensure_hta():
        print("HTA could not be installed; leaving it out", flush=True)
        tools.remove("hta")
    global COMMAND, DATA
    COMMAND = ".venv/bin/python bench/bench_traces.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.data:
        DATA = Path(args.data).resolve()
    if args.reopen and "job" not in tools:
        tools.append("job")
    files = generate([int(s) for s in args.sizes.split(",")])
    results: dict = {}
    for label, path in files.items():
        results[label] = {}
        for tool in tools:
            runs = 1 if tool in ("hta", "json") and path.stat().st_size > 200e6 else args.runs
            res = _run_tool(tool, path, runs, args.timeout)
            results[label][tool] = res
            print(f"{label:12s} {tool:10s} {json.dumps(res)}", flush=True)
            if tool in ("job", "cli") and args.reopen:  # now, while the cache the cold run left is there
                res = _run_tool(tool, path, args.runs, args.timeout, cold=False)
                results[label][f"{tool}_reopen"] = res
                print(f"{label:12s} {tool + ' reopen':10s} {json.dumps(res)}", flush=True)
    section = report(files, results, tools, args.runs)
    print("\n" + section)
    if args.reopen:
        reopen = reopen_report(files, results, args.runs)
        print("\n" + reopen)
    (DATA / "results.json").write_text(json.dumps(
        {k: v for k, v in results.items()}, indent=1))
    if args.write_doc:
        write_doc(section)
        if args.reopen:
            write_doc(reopen, REOPEN_SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
