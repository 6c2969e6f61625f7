"""The memory plan on a real GPU: predicted peaks (fake CUDA tensors, as a machine with this GPU plans; and
fake CPU tensors for the declared H200, as a laptop plans for it) against ``torch.cuda.max_memory_allocated``
of the same real steps. About a minute on an H200.

    python bench/gpu/plan_cuda.py [--json OUT] [--snapshots DIR] [--cases 0,3,5] [--jobs 4]
                                  [--write-calibration [PATH]]

The measurement protocol: every case is measured in a fresh process of its own (``--child``), which loads
the model on the GPU and runs the Memory analysis' protocol (analyses/plan/measured.py: a warm-up step, then
the measured one). Nothing else ever ran on the device in that process, so ``max_memory_allocated`` holds
the step's tensors and what the step's own libraries took (cuBLAS / cuBLASLt workspaces), not what an
earlier case, the calibration or the prediction left (run 1 measured in one process after them: a third
thread's cuBLAS workspace, 32 MiB, and the prediction's copy of the model stayed allocated). The calibration
runs in a process of its own too. Each child also prints what the allocator held when the measured step
started beyond the step's tensors (the workspaces, nothing else in a clean process), the requested and
reserved peaks, and which attention kernel SDPA picked (``torch._fused_sdp_choice``) against the plan's
choice. ``--snapshots DIR`` writes each measured step's allocations, compact (DIR/case-<i>.json.gz).

Needs torch with CUDA; transformers for the Hugging Face cases (skipped without it). Without a GPU it
plans the cases for an H200 on fake CPU tensors and measures nothing (a dry run).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import subprocess
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------- the trace layer, unopened
def _trace_package_without_its_views() -> None:
    """The plan imports one constant from diagnostics.trace (measure.training's step phases); the package's
    __init__ would load its whole trace reader (orjson, msgspec, pandas, pyarrow), which a GPU box may not
    have. Register the package empty, so only the modules imported by name load."""
    import diagnostics  # noqa: F401

    pkg = types.ModuleType("diagnostics.trace")
    pkg.__path__ = [str(ROOT / "diagnostics" / "trace")]
    sys.modules.setdefault("diagnostics.trace", pkg)


# ----------------------------------------------------------------------------- cases
HF = {
    "gpt2": {"model_type": "gpt2", "n_layer": 4, "n_embd": 512, "n_head": 8, "vocab_size": 8000},
    "llama": {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000},
    "bert": {"model_type": "bert", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
             "intermediate_size": 2048, "vocab_size": 8000},
}
CASES = [  # (model, batch, seq, setting); 0-7 as in runs 1 and 2, 8- new in run 3 (not looked at before)
    ("transformer", 32, 256, {}),
    ("transformer", 32, 256, {"dtype": "amp_bf16"}),
    ("transformer", 32, 256, {"checkpointing": "blocks", "optimizer": "sgd"}),
    ("mlp", 4096, None, {"optimizer": "adam"}),
    ("cnn", 64, None, {}),  # cuDNN's convolution workspaces: probed on a GPU, not known to a CPU trace
    ("gpt2", 8, 512, {"dtype": "bf16"}),
    ("llama", 8, 512, {"dtype": "amp_bf16", "optimizer": "adamw_fused"}),
    ("llama", 8, 512, {"dtype": "bf16", "checkpointing": "blocks"}),
    ("gpt2", 8, 512, {"dtype": "amp_fp16"}),
    ("llama", 4, 2048, {"dtype": "bf16", "optimizer": "adamw_fused"}),
    ("bert", 16, 512, {}),  # fp32: memory-efficient attention with dropout
    ("transformer", 64, 128, {"dtype": "amp_fp16", "optimizer": "sgd"}),
    ("mlp", 32768, None, {}),  # bias gradients summed over a large batch: reductions' staging buffers
    ("cnn", 128, None, {"dtype": "amp_bf16"}),
    ("llama", 8, 512, {"mode": "inference", "dtype": "bf16"}),  # prompt into a KV cache, then one token
]


def spec_of(model, batch, seq, device):
    from diagnostics.spec import ModelSpec

    if model in HF:
        from diagnostics.hf import HFSettings

        return ModelSpec(source="hf", name=model, hf=HFSettings(HF[model], seq_len=seq, meta="off").to_json(), batch_size=batch,
                         device=device)
    return ModelSpec(source="sample", name=model, batch_size=batch, device=device)


def config_of(i: int):
    from diagnostics.analyses.plan.configs import Config, Setting

    model, batch, seq, setting = CASES[i]
    return Config(batch, seq, Setting(**setting))


def label_of(i: int) -> str:
    model, batch, seq, _ = CASES[i]
    return f"{i:>2} {model} b{batch}" + (f" s{seq}" if seq else "") + f" {config_of(i).setting.label}"


# ----------------------------------------------------------------------------- children (fresh processes)
BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable", -1: "error"}


def _count_sdpa(counts: dict):
    """F.scaled_dot_product_attention wrapped: each call asks torch._fused_sdp_choice which kernel it runs."""
    import torch
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        choice = int(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa))
        name = BACKENDS.get(choice, str(choice))
        counts[name] = counts.get(name, 0) + 1
        return original(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = sdpa


def _compact(snap: dict) -> dict:
    """A snapshot's device trace, compact: [action, size, address, first frame] per event, and the segments."""
    def frame(e):
        fr = e.get("frames") or []
        return f"{fr[0]['filename'].split('/')[-1]}:{fr[0]['line']} {fr[0]['name']}" if fr else ""

    events = [[e["action"], e["size"], e["addr"], frame(e)] for e in snap["device_traces"][0]
              if e["action"] in ("alloc", "free_requested", "segment_alloc")]
    segments = [[s["total_size"], s["allocated_size"], s["segment_type"]] for s in snap["segments"]]
    return {"events": events, "segments": segments}


def child_measure(i: int, snapshots: str | None) -> dict:
    _trace_package_without_its_views()
    import torch

    from diagnostics.analyses.plan.measured import measured_inference_peak, measured_peak
    from diagnostics.intake import load_model

    model, batch, seq, _ = CASES[i]
    config = config_of(i)
    sdpa: dict = {}
    _count_sdpa(sdpa)
    loaded = load_model(spec_of(model, batch, seq, "cuda"))
    if snapshots:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=400_000)
    fn = measured_inference_peak if config.setting.mode == "inference" else measured_peak
    m = fn(loaded, config)
    stats = torch.cuda.memory_stats()
    if snapshots:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with gzip.open(Path(snapshots) / f"case-{i}.json.gz", "wt") as f:
            json.dump(_compact(snap), f)
    return {"case": i, "measured": m["peak_bytes"], "start": m["baseline_bytes"], "tensors": m["tensor_bytes"],
            "requested_peak": stats.get("requested_bytes.all.peak"), "reserved_peak": stats.get("reserved_bytes.all.peak"),
            "retries": stats.get("num_alloc_retries"), "sdpa": sdpa}


def child_calibrate() -> dict:
    _trace_package_without_its_views()
    from diagnostics.analyses.plan.calibrate import calibrate_cuda

    return calibrate_cuda(0)


def run_child(args: list[str], timeout: float = 300) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr.strip().splitlines() or ["(no output)"])[-1][:300]}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- the parent
def local_target():
    """This GPU as the plan sees it when it is the local one: capacity from the driver, torch's default
    cuBLAS workspaces for its architecture (the calibration child measures them beside)."""
    import torch

    from diagnostics.analyses.plan.targets import Target, cublas_workspace_default

    p = torch.cuda.get_device_properties(0)
    name = torch.cuda.get_device_name(0)
    return Target(name, "cuda", int(torch.cuda.mem_get_info(0)[1]), 1, f"this machine's GPU 0 ({name})", 0,
                  2 * cublas_workspace_default(p.major * 10 + p.minor), "torch's default workspaces")


def plan(i: int, target, on_cpu: bool) -> tuple[int | None, dict, str]:
    """(predicted peak, parts, attention note) of case ``i``; fake CPU tensors when ``on_cpu``."""
    from diagnostics.analyses.plan.planner import Planner
    from diagnostics.analyses.plan.trace import TRACE_DEVICE_ENV
    from diagnostics.intake import load_model

    model, batch, seq, _ = CASES[i]
    if on_cpu:
        os.environ[TRACE_DEVICE_ENV] = "cpu"
    try:
        planner = Planner(load_model(spec_of(model, batch, seq, "cpu")), target)
        st = planner.run(config_of(i))
        peak, parts = planner.device_peak(st)
        note = next((n for n in st.notes if n.startswith("attention traced")), "")
        return peak, parts, note
    finally:
        os.environ.pop(TRACE_DEVICE_ENV, None)


def sdpa_choices() -> list[str]:
    """torch._fused_sdp_choice on this GPU against cuda_kernels.attention_backend, over a grid of inputs."""
    import itertools

    import torch

    from diagnostics.analyses.plan.cuda_kernels import attention_backend, arch_of

    arch = arch_of(local_target())
    out = []
    for dt, (hq, hk), d, mask, p, gqa in itertools.product(
            (torch.float32, torch.float16, torch.bfloat16), ((8, 8), (8, 2)), (64, 128, 80), (False, True),
            (0.0, 0.1), (False, True)):
        if hq != hk and not gqa:
            continue
        q = torch.empty(2, hq, 256, d, device="cuda", dtype=dt, requires_grad=True)
        k = torch.empty(2, hk, 256, d, device="cuda", dtype=dt, requires_grad=True)
        v = torch.empty(2, hk, 256, d, device="cuda", dtype=dt, requires_grad=True)
        m = torch.zeros(2, 1, 256, 256, device="cuda", dtype=dt) if mask else None
        try:
            real = BACKENDS.get(int(torch._fused_sdp_choice(q, k, v, m, p, False, enable_gqa=gqa)), "?")
        except RuntimeError as e:
            real = f"error ({str(e).splitlines()[0][:60]})"
        ours = attention_backend(q, k, v, m, p, gqa, arch)
        if real != ours:
            out.append(f"{str(dt).replace('torch.', '')} heads {hq}/{hk} d{d} mask={mask} dropout={p} gqa={gqa}: "
                       f"torch {real}, plan {ours}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-calibration", nargs="?", const="", metavar="PATH",
                    help="store this GPU's calibration in PATH (default: diagnostics/analyses/plan/calibrations.json)")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--snapshots", metavar="DIR", help="write each measured step's allocations to DIR")
    ap.add_argument("--cases", default="", help="comma-separated case numbers (default: all)")
    ap.add_argument("--jobs", type=int, default=4, help="cases measured at once, each in its own process")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind = args.child[0]
        res = child_calibrate() if kind == "calibrate" else child_measure(int(args.child[1]), args.child[2] if len(args.child) > 2 else None)
        print(json.dumps(res), flush=True)
        return 0

    _trace_package_without_its_views()
    import torch

    from diagnostics.analyses.plan.targets import CALIBRATION_FILE, MIB, resolve

    t_start = time.perf_counter()
    picks = [int(c) for c in args.cases.split(",") if c.strip()] or list(range(len(CASES)))
    have_hf = importlib.util.find_spec("transformers") is not None
    picks = [i for i in picks if CASES[i][0] not in HF or have_hf]
    gpu = torch.cuda.is_available()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: "
          f"{torch.cuda.get_device_name(0) if gpu else 'none (dry run: predictions for an H200 only)'}"
          + ("" if have_hf else "; no transformers: its cases skipped"), flush=True)
    out = {"torch": torch.__version__, "rows": []}
    if args.snapshots:
        Path(args.snapshots).mkdir(parents=True, exist_ok=True)

    # the measurements, each in a fresh process, while this one plans
    pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
    cal_f = pool.submit(run_child, ["calibrate"]) if gpu else None
    measured_f = {i: pool.submit(run_child, ["measure", str(i)] + ([args.snapshots] if args.snapshots else []))
                  for i in picks} if gpu else {}

    declared = resolve("H200")  # what a machine without a GPU plans for an H200 (declared table, default workspaces)
    local = local_target() if gpu else None
    preds = {}
    for i in picks:
        t0 = time.perf_counter()
        row = {}
        for mode, target, on_cpu in (("fake_cuda", local, False), ("fake_cpu", declared, True)):
            if target is None:
                continue
            try:
                row[mode], row[mode + "_parts"], note = plan(i, target, on_cpu)
                if note:
                    row[mode + "_attention"] = note
            except Exception as e:  # one case must not cost the others
                row[mode + "_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        row["plan_s"] = round(time.perf_counter() - t0, 1)
        preds[i] = row
        print(f"planned {label_of(i)} in {row['plan_s']} s", flush=True)

    mismatches = sdpa_choices() if gpu else []
    cal = cal_f.result() if cal_f else None
    head = f"{'case':<46} {'measured':>10} {'fake cuda':>10} {'err':>7} {'fake cpu':>10} {'err':>7} {'held':>7}"
    print("\n" + head + "\n" + "-" * len(head))
    errs = {"fake_cuda": [], "fake_cpu": []}
    for i in picks:
        m = measured_f[i].result() if i in measured_f else {}
        row = {"case": label_of(i), **preds[i], **{k: v for k, v in m.items() if k != "case"}}
        meas = m.get("measured")

        def err(key):
            p = row.get(key)
            if meas is None or p is None:
                return row.get(key + "_error", "")[:7] or ""
            e = 100 * (p - meas) / meas
            errs[key].append(e)
            row[key + "_err_pct"] = round(e, 2)
            return f"{e:+.2f}%"

        def mib(v):
            return "" if v is None else f"{v / MIB:,.1f}"

        held = "" if meas is None else f"{(m['start'] - m['tensors']) / MIB:.1f}"
        print(f"{label_of(i)[:46]:<46} {mib(meas) or m.get('error', '')[:10]:>10} {mib(row.get('fake_cuda')):>10} "
              f"{err('fake_cuda'):>7} {mib(row.get('fake_cpu')):>10} {err('fake_cpu'):>7} {held:>7}", flush=True)
        if m.get("error"):
            print(f"    measurement failed: {m['error']}")
        for key in ("fake_cuda_error", "fake_cpu_error"):
            if row.get(key):
                print(f"    {key}: {row[key]}")
        if m.get("sdpa"):
            print(f"    attention measured: {m['sdpa']}; planned: {row.get('fake_cpu_attention', '-')}")
        out["rows"].append(row)
    print("MiB; err = (predicted - measured) / measured; held = allocated when the measured step started beyond its "
          "tensors (library workspaces)")
    for key, v in errs.items():
        if v:
            print(f"{key}: |err| max {max(abs(x) for x in v):.2f} %, mean {sum(abs(x) for x in v) / len(v):.2f} % "
                  f"over {len(v)} cases")
    if gpu:
        print("SDPA choice, torch vs plan: " + ("all agree" if not mismatches else f"{len(mismatches)} differ"))
        for line in mismatches:
            print("    " + line)
        out["sdpa_mismatches"] = mismatches
    if cal:
        out["calibration"] = cal
        if "error" in cal:
            print(f"calibration failed: {cal['error']}")
        else:
            print(f"calibration (own process): context {cal['context_bytes'] / MIB:.1f} MiB, cuBLAS workspaces "
                  f"(forward + backward threads) {cal['workspace_bytes'] / MIB:.2f} MiB, cuBLASLt "
                  f"{cal['cublaslt_workspace_bytes'] / MIB:.2f} MiB, sm {cal['sm']}, {cal['sms']} SMs, "
                  f"{cal['threads_per_sm']} threads/SM")
            if args.write_calibration is not None:
                path = Path(args.write_calibration) if args.write_calibration else CALIBRATION_FILE
                stored = json.loads(path.read_text()) if path.exists() else {}
                stored[cal["gpu"]] = {k: cal[k] for k in ("context_bytes", "workspace_bytes", "measured_on", "torch")}
                path.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")
                print(f"calibration written to {path}")
    pool.shutdown()
    print(f"total {time.perf_counter() - t_start:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
