"""The memory plan's accuracy and speed: every case of the corpus (tests/analyses/plan/corpus.py) planned on
fake tensors and measured for real on this CPU, sharded cases against 2 gloo ranks, and the 7B Llama
grid's wall time through the CLI.

    .venv/bin/python bench/bench_plan.py [--write] [--skip-7b] [--skip-sharded]

Error per case = (predicted - measured) / measured. ``--write`` replaces the "Memory plan" section of
docs/BENCHMARKS.md with the tables. The measured peaks are the Memory analysis' own protocol
(diagnostics/analyses/plan/measured.py); timings depend on the machine's load, which is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "analyses" / "plan"))

LLAMA_7B = ("llama:hidden_size=4096,intermediate_size=11008,num_hidden_layers=32,num_attention_heads=32,"
            "vocab_size=32000,max_position_embeddings=4096")
SECTION = "## Memory plan"
SEVEN_B = "### 7B Llama grid"


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def corpus_rows() -> list[dict]:
    import torch

    from corpus import CASES, measure
    from diagnostics.analyses.plan.planner import Planner
    from diagnostics.analyses.plan.targets import resolve
    from diagnostics.intake import load_model

    cpu = resolve("cpu", cpu={"ram_available_bytes": 1 << 36})
    rows = []
    for case in CASES:
        torch.manual_seed(0)
        planner = Planner(load_model(case.spec()), cpu)
        t0 = time.perf_counter()
        st = planner.run(case.config())
        seconds = time.perf_counter() - t0
        measured = measure(case, load_model(case.spec()))
        err = 100 * (st.peak_bytes - measured) / measured
        rows.append({"case": case.id, "predicted": st.peak_bytes, "measured": measured, "error_pct": err,
                     "phase": st.phase, "module": st.module, "trace_s": seconds,
                     "analytic": ", ".join(planner.standins) or "", "probes": planner.scratch.probes})
        print(f"{case.id:45s} {st.peak_bytes:>13,} {measured:>13,} {err:+7.2f} %  {st.phase:9s} {seconds:5.2f} s "
              f"{rows[-1]['analytic']}", flush=True)
    return rows


def sharded_rows() -> list[dict]:
    from diagnostics.analyses.plan.configs import Config, Setting
    from diagnostics.analyses.plan.measured import measured_sharded
    from diagnostics.analyses.plan.planner import Planner
    from diagnostics.analyses.plan.targets import resolve
    from diagnostics.intake import load_model
    from diagnostics.spec import ModelSpec

    cpu = resolve("cpu", cpu={"ram_available_bytes": 1 << 36})
    rows = []
    port = 29611
    for name, batch, seq in (("transformer", 8, 64), ("mlp", 32, None)):
        spec = ModelSpec(source="sample", name=name, batch_size=batch)
        for shard in ("zero1", "zero2", "zero3"):
            config = Config(batch, seq, Setting(shard=shard, ranks=2))
            planner = Planner(load_model(spec), cpu)
            try:
                st = planner.run(config)
            except Exception as e:  # a model FSDP2 cannot wrap per block (the mlp has no repeated blocks)
                print(f"{name} {shard}: {e}")
                continue
            measured = measured_sharded(spec, config, port=port)
            port += 1
            for m in measured:
                pred = st.per_rank.get(m["rank"], st.peak_bytes)
                err = 100 * (pred - m["peak_bytes"]) / m["peak_bytes"]
                rows.append({"case": f"{name}-b{batch}-{shard}x2", "rank": m["rank"], "predicted": pred,
                             "measured": m["peak_bytes"], "error_pct": err})
                print(f"{name} {shard} rank {m['rank']}: {pred:,} vs {m['peak_bytes']:,} ({err:+.2f} %)", flush=True)
    return rows


def llama_7b_seconds() -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds of the command and its worker, the result)."""
    import resource

    cmd = [sys.executable, "-m", "diagnostics", "plan", "--hf", LLAMA_7B, "--batch", "1,2,4,8", "--seq", "2048,4096",
           "--dtype", "bf16", "--optimizer", "adamw", "--device", "H100-80GB", "--json", "--no-report", "-q"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(out.stdout)


def table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for k, _ in cols:
            v = r.get(k)
            cells.append(f"{v:+.2f} %" if k == "error_pct" else f"{v:,}" if isinstance(v, int) and not isinstance(v, bool)
                         else f"{v:.2f}" if isinstance(v, float) else str(v if v is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--skip-7b", action="store_true")
    ap.add_argument("--skip-sharded", action="store_true")
    ap.add_argument("--only-7b", action="store_true", help="time the 7B grid only (with --write: replace that part)")
    args = ap.parse_args()
    import torch

    if args.only_7b:
        wall, cpu, result = llama_7b_seconds()
        print(f"7B grid: {wall:.1f} s wall, {cpu:.1f} s CPU, load {_load()}")
        if args.write:
            _write_7b(wall, cpu, result)
        return
    load_before = _load()
    rows = corpus_rows()
    shard = [] if args.skip_sharded else sharded_rows()
    seven = None if args.skip_7b else llama_7b_seconds()
    errs = [abs(r["error_pct"]) for r in rows]
    within = sum(e <= 5 for e in errs)
    text = [SECTION, "",
            "Command: `.venv/bin/python bench/bench_plan.py --write` (`bench/bench_plan.py`; the cases are "
            "`tests/analyses/plan/corpus.py`).", "",
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; 1/5/15-minute load "
            f"{load_before} before, {_load()} after (shared with other sessions).", "",
            "Each case is planned on fake tensors (the plan's trace, CPU target) and then run for real by the Memory "
            "analysis' protocol (warm-up step, gradients None, the profiler's allocation events over one step plus "
            "the bytes alive before it). Error = (predicted - measured) / measured.", "",
            f"**{within} of {len(rows)} cases within 5 %**; |error| median {statistics.median(errs):.3f} %, "
            f"90th percentile {sorted(errs)[int(0.9 * (len(errs) - 1))]:.3f} %, largest {max(errs):.3f} %.", "",
            table(rows, [("case", "case"), ("predicted", "predicted (B)"), ("measured", "measured (B)"),
                         ("error_pct", "error"), ("phase", "peak in"), ("trace_s", "trace (s)"),
                         ("analytic", "estimated analytically")])]
    if shard:
        text += ["", "Sharded, 2 gloo ranks on this CPU (each rank's own prediction against its own measured peak; "
                 "zero1 = DDP + ZeroRedundancyOptimizer, zero2/zero3 = FSDP2 per block):", "",
                 table(shard, [("case", "case"), ("rank", "rank"), ("predicted", "predicted (B)"),
                               ("measured", "measured (B)"), ("error_pct", "error")])]
    if seven is not None:
        text += ["", seven_b_text(*seven)]
    out = "\n".join(text) + "\n"
    print(out)
    if args.write:
        path = ROOT / "docs" / "BENCHMARKS.md"
        doc = path.read_text()
        if SECTION in doc:
            start = doc.index(SECTION)
            nxt = doc.find("\n## ", start + len(SECTION))
            doc = doc[:start] + out + (doc[nxt + 1:] if nxt != -1 else "")
        else:
            doc = doc.rstrip("\n") + "\n\n" + out
        path.write_text(doc)


def seven_b_text(seconds: float, cpu: float, result: dict) -> str:
    rows7 = result["rows"]
    text = [SEVEN_B, "", f"`python -m diagnostics plan --hf {LLAMA_7B} --batch 1,2,4,8 --seq 2048,4096 "
                 f"--dtype bf16 --optimizer adamw --device H100-80GB --json`: **{seconds:.1f} s** wall end to end, "
                 f"{cpu:.1f} s of CPU (the command and its worker; the rest of the wall time is the machine's other "
                 f"load) ({result['metrics']['traces']} traces, {result['metrics']['trace_seconds']:.1f} s tracing; "
                 f"load {_load()} after). Largest batch: " + "; ".join(
                     f"seq {m['seq']}: {m['max_batch']}" for m in result["max_batch"]) + ".", "",
                 table([{"batch": r["batch"], "seq": r["seq"], "peak_GiB": r["peak_bytes"] / 2**30, "fits": r["fits"],
                         "phase": r["phase"]} for r in rows7],
                       [("batch", "batch"), ("seq", "seq"), ("peak_GiB", "peak (GiB)"), ("fits", "fits H100-80GB"),
                        ("phase", "peak in")])]
    return "\n".join(text)


def _write_7b(wall: float, cpu: float, result: dict) -> None:
    """Replace the 7B part of the Memory plan section (it ends the section)."""
    path = ROOT / "docs" / "BENCHMARKS.md"
    doc = path.read_text()
    start = doc.index(SEVEN_B, doc.index(SECTION))
    nxt = doc.find("\n## ", start)
    path.write_text(doc[:start] + seven_b_text(wall, cpu, result) + "\n" + (doc[nxt:] if nxt != -1 else ""))


if __name__ == "__main__":
    main()
