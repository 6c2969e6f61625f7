"""The memory plan on a real GPU: calibrate the CUDA context and cuBLAS workspaces, then predicted peaks
(fake CUDA tensors; and fake CPU tensors with CUDA's rounding, as a machine without a GPU plans) against
``torch.cuda.max_memory_allocated`` of the same real steps. Under two minutes on an H100 / H200.

    python bench/gpu/plan_cuda.py [--write-calibration [PATH]] [--json OUT]

Prints one table. ``--write-calibration`` stores the measured context and workspaces for this GPU model in
diagnostics/analyses/plan/calibrations.json, or PATH in that file's format (commit it there: plans for that
GPU then use it). Needs torch with
CUDA; transformers is optional (its cases are skipped without it); streamlit, plotly, pandas, pyarrow, orjson
and msgspec are not needed (the trace reader is not loaded).
Without a GPU it plans the same cases for an H100 on fake CPU tensors and measures nothing (a dry run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types
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
}
CASES = [  # (model, batch, seq, setting)
    ("transformer", 32, 256, {}),
    ("transformer", 32, 256, {"dtype": "amp_bf16"}),
    ("transformer", 32, 256, {"checkpointing": "blocks", "optimizer": "sgd"}),
    ("mlp", 4096, None, {"optimizer": "adam"}),
    ("cnn", 64, None, {}),  # cuDNN workspaces: not in the prediction (said in its notes)
    ("gpt2", 8, 512, {"dtype": "bf16"}),
    ("llama", 8, 512, {"dtype": "amp_bf16", "optimizer": "adamw_fused"}),
    ("llama", 8, 512, {"dtype": "bf16", "checkpointing": "blocks"}),
    ("llama", 8, 512, {"dtype": "fp8"}),  # torchao Float8Linear: needs torchao and an fp8 GPU (H100 / H200)
]


def spec_of(model, batch, seq, device):
    from diagnostics.spec import ModelSpec

    if model in HF:
        from diagnostics.hf import HFSettings

        return ModelSpec(source="hf", name=model, hf=HFSettings(HF[model], seq_len=seq, meta="off").to_json(), batch_size=batch,
                         device=device)
    return ModelSpec(source="sample", name=model, batch_size=batch, device=device)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-calibration", nargs="?", const="", metavar="PATH",
                    help="store this GPU's calibration in PATH (default: diagnostics/analyses/plan/calibrations.json)")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    _trace_package_without_its_views()
    import torch

    from diagnostics.analyses.plan.configs import Config, Setting
    from diagnostics.analyses.plan.planner import Planner
    from diagnostics.analyses.plan.targets import CALIBRATION_FILE, MIB, Target, resolve
    from diagnostics.analyses.plan.trace import TRACE_DEVICE_ENV
    from diagnostics.intake import load_model

    t_start = time.perf_counter()
    gpu = torch.cuda.is_available()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: "
          f"{torch.cuda.get_device_name(0) if gpu else 'none (dry run: predictions only)'}"
          )
    have_hf = importlib.util.find_spec("transformers") is not None
    out = {"torch": torch.__version__, "rows": []}
    if gpu:
        from diagnostics.analyses.plan.calibrate import calibrate_cuda

        cal = calibrate_cuda(0)
        out["calibration"] = cal
        print(f"calibration: context {cal['context_bytes'] / MIB:.1f} MiB, cuBLAS workspaces (forward + backward "
              f"threads) {cal['workspace_bytes'] / MIB:.1f} MiB, per extra thread {cal['workspace_per_handle_bytes'] / MIB:.1f}"
              f" MiB, total {cal['total_bytes'] / MIB:,.0f} MiB")
        target = Target(cal["gpu"], "cuda", cal["total_bytes"], 1, "torch.cuda.mem_get_info", cal["context_bytes"],
                        cal["workspace_bytes"], "measured by this script")
        if args.write_calibration is not None:
            path = Path(args.write_calibration) if args.write_calibration else CALIBRATION_FILE
            stored = json.loads(CALIBRATION_FILE.read_text()) if CALIBRATION_FILE.exists() else {}
            stored[cal["gpu"]] = {k: cal[k] for k in ("context_bytes", "workspace_bytes", "measured_on", "torch")}
            path.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")
            print(f"calibration written to {path}")
    else:
        target = resolve("H100-80GB")
    device = "cuda" if gpu else "cpu"
    head = f"{'case':<44} {'measured':>12} {'fake cuda':>12} {'err':>8} {'fake cpu':>12} {'err':>8}  s"
    print(head + "\n" + "-" * len(head))
    for model, batch, seq, setting in CASES:
        if model in HF and not have_hf:
            print(f"{model}: skipped (no transformers)")
            continue
        config = Config(batch, seq, Setting(**setting))
        label = f"{model} b{batch}" + (f" s{seq}" if seq else "") + f" {config.setting.label}"
        t0 = time.perf_counter()
        row = {"case": label}
        try:
            loaded = load_model(spec_of(model, batch, seq, device))
            preds = {}
            for mode in (("cuda", "cpu") if gpu else ("cpu",)):
                if mode == "cpu":
                    os.environ[TRACE_DEVICE_ENV] = "cpu"
                else:
                    os.environ.pop(TRACE_DEVICE_ENV, None)
                planner = Planner(loaded, target)
                preds[mode] = planner.device_peak(planner.run(config))[0]
            os.environ.pop(TRACE_DEVICE_ENV, None)
            measured = None
            if gpu:
                from diagnostics.analyses.plan.measured import measured_peak

                del loaded
                torch.cuda.empty_cache()
                measured = measured_peak(load_model(spec_of(model, batch, seq, "cuda")), config)["peak_bytes"]
                torch.cuda.empty_cache()
        except Exception as e:  # one case must not cost the others
            print(f"{label:<44} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            row["error"] = f"{type(e).__name__}: {e}"
            out["rows"].append(row)
            continue
        row.update({"measured": measured, "fake_cuda": preds.get("cuda"), "fake_cpu": preds["cpu"]})

        def err(p):
            return "" if measured is None or p is None else f"{100 * (p - measured) / measured:+.2f}%"

        def mib(v):
            return "" if v is None else f"{v / MIB:,.1f}M"

        print(f"{label[:44]:<44} {mib(measured):>12} {mib(preds.get('cuda')):>12} {err(preds.get('cuda')):>8} "
              f"{mib(preds['cpu']):>12} {err(preds['cpu']):>8}  {time.perf_counter() - t0:.1f}", flush=True)
        out["rows"].append(row)
    print(f"total {time.perf_counter() - t_start:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
