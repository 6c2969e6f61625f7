"""The one-click fixes, declared: id, title, what it does, its parameters (declared options) and
when it applies. No torch here, so the page and the CLI list fixes and check their parameters
without loading it; each fix's ``recipe`` names the function in fixes.py (deploy.py for the
deployment trials, static_int8 and onnxruntime) that applies it.

``applies(facts) -> (bool, why_not)`` reads the model's facts as the checklist's sections type them
(``static``: measure.records.StaticFacts, ``env``: Environment, ``forward``: ForwardFacts or None; ``source``:
the model's source, "export" for a .pt2), so a fix that cannot help says why instead of running.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from diagnostics.declare import Option, OptionError
from diagnostics.errors import TorchScopeError
from diagnostics.measure.records import Environment, StaticFacts


def _static(facts) -> StaticFacts:
    return facts["static"]


def _env(facts) -> Environment:
    return facts["env"]


def always(_facts) -> tuple[bool, str]:
    return True, ""


#: Why fixes that change module structure, dtype or memory format cannot apply to a torch.export
#: program (facts["source"] == "export"): its graph was fixed at export time.
EXPORT_STRUCTURE = ("an exported program's graph was fixed at export time: it calls aten ops directly and keeps no "
                    "nn.Conv2d / nn.Linear / nn.BatchNorm2d modules to fuse, swap or prune; apply the fix to the "
                    "nn.Module, then export it again")
EXPORT_DTYPE = ("an exported program's dtypes were fixed at export time: the tensors its graph creates and the casts "
                "it records keep the dtype they were exported with, so 16-bit parameters meet float32 activations "
                "(a dtype mismatch); export a 16-bit copy instead (model.to(torch.bfloat16) before "
                "torch.export.export)")
EXPORT_LAYOUT = ("an exported program's graph was fixed at export time and keeps no nn.Conv2d modules, so whether "
                 "memory format matters cannot be told from it; convert the nn.Module and its example inputs to "
                 "channels_last, then export it again")

def torchscript_why(facts, what: str, kinds: tuple[str, ...]) -> str | None:
    """Why a fix that swaps, fuses or rewrites modules cannot apply to a TorchScript program (its modules
    are compiled code), naming the ones of ``kinds`` it holds; None for a Python model."""
    s = _static(facts)
    if not s.torchscript:
        return None
    held = s.script_types
    found = [f"{held[k]} {k}" for k in kinds if held.get(k)]
    has = f" (its {' and '.join(found)} layers are compiled code)" if found else ""
    return (f"the model is TorchScript{has}: {what} needs the Python nn.Module; apply it to the Python model, "
            "then script or trace it again")


#: Why dynamic int8 cannot quantize an exported program, and what does.
EXPORT_QUANTIZE = ("dynamic int8 swaps nn.Linear / LSTM / GRU modules for quantized ones, and an exported program has "
                   "none to swap: its graph was fixed at export time and calls aten.linear directly (the module count "
                   "sees 0 Linear layers even on an all-Linear model); quantize the exported graph with the static "
                   "int8 fix (PT2E quantizes the graph's linear and conv ops), or apply dynamic int8 to the "
                   "nn.Module, then export it again")


def _exported(facts) -> bool:
    return facts.get("source") == "export"


def applies_half(facts):
    return (False, EXPORT_DTYPE) if _exported(facts) else (True, "")


def applies_channels_last(facts):
    if _exported(facts):
        return False, EXPORT_LAYOUT
    ts = torchscript_why(facts, "converting weights to channels_last", ("Conv2d",))
    if ts:
        return False, ts
    return (True, "") if _static(facts).n_conv2d else (False, "no Conv2d layers: memory format does not matter")


def applies_conv_bn_fusion(facts):
    if _exported(facts):
        return False, EXPORT_STRUCTURE
    ts = torchscript_why(facts, "fusing BatchNorm into the convolution before it", ("Conv2d", "BatchNorm2d"))
    if ts:
        return False, ts
    if not _static(facts).n_batchnorm:
        return False, "no BatchNorm layers"
    forward = facts.get("forward")
    pairs = forward.conv_bn_pairs if forward is not None else None
    if pairs is not None and not pairs:
        return False, "no BatchNorm directly follows a convolution"
    return True, ""


def applies_int8_dynamic(facts):
    if _exported(facts):
        return False, EXPORT_QUANTIZE
    ts = torchscript_why(facts, "dynamic int8 swaps nn.Linear / LSTM / GRU modules for quantized ones and",
                         ("Linear", "LSTM", "GRU"))
    if ts:
        return False, ts
    s = _static(facts)
    if not (s.n_linear or s.n_rnn):
        return False, "no Linear / LSTM / GRU layers to quantize (dynamic quantization leaves convolutions alone)"
    return True, ""


def applies_prune(facts):
    if _exported(facts):
        return False, EXPORT_STRUCTURE
    ts = torchscript_why(facts, "pruning rewrites module weights and", ("Linear", "Conv1d", "Conv2d", "Conv3d"))
    if ts:
        return False, ts
    s = _static(facts)
    return (True, "") if (s.n_linear or s.n_conv) else (False, "no Linear / Conv layers")


def applies_compile(facts):
    env = _env(facts)
    if env.device_type != "cuda" and not env.cxx_compiler:
        return False, "torch.compile on CPU needs a C++ compiler (g++), none found"
    if _static(facts).torchscript:
        return False, "the model is TorchScript"
    return True, ""


def applies_static_int8(facts):
    s = _static(facts)
    # an exported program keeps no nn.Linear / nn.Conv modules, but PT2E quantizes its graph's ops (and
    # says so when it finds none)
    if not (s.n_conv or s.n_linear) and not _exported(facts):
        return False, "no Conv / Linear layers: static int8 quantizes convolutions and linear layers"
    if s.torchscript:
        return False, ("the model is TorchScript: PT2E quantization captures it with torch.export, which does not "
                       "take one")
    if _env(facts).device_type != "cpu":
        return False, "static int8 with the X86 quantizer is for CPU inference"
    return True, ""


@dataclass(frozen=True)
class Fix:
    id: str
    title: str
    description: str
    recipe: str | Callable  # "module:function" (or the function) applying it: fn(model, inputs, params) -> (model', notes)
    applies: Callable[[dict], tuple[bool, str]] = always
    params: tuple[Option, ...] = field(default_factory=tuple)
    #: "inference": the recipe returns a model called under no_grad; "train": the recipe returns a
    #: training step (train_fixes.py) timed against the baseline's step.
    mode: str = "inference"

    def options(self, given: dict | None) -> dict:
        """Defaults merged with ``given``; a bad value raises a message naming the fix and parameter."""
        out = {p.key: p.default for p in self.params}
        for k, v in (given or {}).items():
            p = next((p for p in self.params if p.key == k), None)
            if p is None:
                raise OptionError(f"fix {self.id} has no parameter {k!r}"
                                  + (f"; its parameters: {', '.join(p.key for p in self.params)}" if self.params
                                     else " (it takes none)"))
            try:
                out[k] = p.validate(v)
            except OptionError as e:
                raise OptionError(f"fix {self.id}: {str(e).removeprefix('option ')}") from None
        return out

    def apply(self, model, inputs, params: dict):
        fn = self.recipe
        if isinstance(fn, str):
            module, _, name = fn.partition(":")
            fn = getattr(importlib.import_module(module), name)
        return fn(model, inputs, params)


_R = "diagnostics.analyses.optimize.fixes:"
_D = "diagnostics.analyses.optimize.deploy:"
_AUTO_DTYPE = "auto: float16 on CUDA, bfloat16 on CPU"

FIXES: list[Fix] = [
    Fix("amp", "Automatic mixed precision", "Run under torch.autocast (float16 on CUDA, bfloat16 on CPU by default).",
        _R + "apply_amp", params=(Option("dtype", "choice", "auto", _AUTO_DTYPE,
                                         choices=("auto", "bfloat16", "float16")),)),
    Fix("channels_last", "channels_last memory format", "Weights and 4-D inputs in NHWC.", _R + "apply_channels_last",
        applies_channels_last),
    Fix("conv_bn_fusion", "Conv-BN fusion", "Fold BatchNorm into the preceding convolution (eval mode).",
        _R + "apply_conv_bn_fusion", applies_conv_bn_fusion),
    Fix("int8_dynamic", "Dynamic int8 quantization", "int8 weights (and activations, torchao) for Linear/LSTM layers.",
        _R + "apply_int8_dynamic", applies_int8_dynamic,
        (Option("backend", "choice", "auto", "auto: torchao where it supports the model, torch.ao.quantization "
                "otherwise", choices=("auto", "torchao", "torch.ao")),)),
    Fix("prune_l1", "L1 unstructured pruning", "Zero the smallest-magnitude weights of Linear/Conv layers.",
        _R + "apply_prune_l1", applies_prune, (Option("amount", "float", 0.5, "fraction zeroed", lo=0.0, hi=0.95),)),
    Fix("torch_compile", "torch.compile", "Graph capture and kernel fusion with TorchInductor.",
        _R + "apply_torch_compile", applies_compile,
        (Option("mode", "choice", "default", "torch.compile mode",
                choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs")),)),
    Fix("torchscript", "TorchScript trace + freeze", "torch.jit.trace then torch.jit.freeze.", _R + "apply_torchscript"),
    Fix("inference_mode", "inference_mode", "eval() and torch.inference_mode() around the forward.",
        _R + "apply_inference_mode"),
    Fix("half", "Half precision", "Parameters and inputs in 16-bit floats (no autocast).", _R + "apply_half",
        applies_half, params=(Option("dtype", "choice", "auto", _AUTO_DTYPE, choices=("auto", "float16", "bfloat16")),)),
    Fix("static_int8", "Static int8 quantization (PT2E)", "Post-training static int8: torch.export, the X86 "
        "quantizer, calibration on the example inputs, convert_pt2e.", _D + "apply_static_int8", applies_static_int8),
    Fix("onnxruntime", "ONNX Runtime", "torch.onnx.export, then an ONNX Runtime session (CPU, or CUDA where "
        "installed); the .onnx file to download.", _D + "apply_onnxruntime"),
]
FIX_IDS = [f.id for f in FIXES]


def get_fix(fix_id: str, mode: str = "inference") -> Fix:
    """The fix ``fix_id`` of ``mode`` ("inference" or "train"); a clear error for an unknown id or
    one that exists only in the other mode."""
    table = TRAIN_FIXES if mode == "train" else FIXES
    for f in table:
        if f.id == fix_id:
            return f
    other = FIXES if mode == "train" else TRAIN_FIXES
    if any(f.id == fix_id for f in other):
        raise TorchScopeError(f"fix {fix_id!r} is a{'n inference' if mode == 'train' else ' training'} fix; "
                              f"run it with --mode {'inference' if mode == 'train' else 'train'} (fixes of mode "
                              f"{mode}: {', '.join(f.id for f in table)})")
    raise TorchScopeError(f"unknown fix {fix_id!r}; known: {', '.join(all_fix_ids())}")


def fix_ids(mode: str) -> list[str]:
    return [f.id for f in (TRAIN_FIXES if mode == "train" else FIXES)]


def all_fix_ids() -> list[str]:
    """Every fix id, inference ones first, each once (amp, channels_last, torch_compile are in both)."""
    return list(dict.fromkeys([f.id for f in FIXES] + [f.id for f in TRAIN_FIXES]))


def check_params(params: dict) -> dict:
    """{fix_id: {param: value}}: every fix known, every parameter valid (OptionError naming it)."""
    out = {}
    for fix_id, given in params.items():
        if fix_id not in all_fix_ids():
            raise OptionError(f"option params: unknown fix {fix_id!r}; known: {', '.join(all_fix_ids())}")
        if not isinstance(given, dict):
            raise OptionError(f"option params: the parameters of {fix_id} must be a dict, got {given!r}")
        for table in (FIXES, TRAIN_FIXES):  # a fix of both modes: its parameters must suit each
            fix = next((f for f in table if f.id == fix_id), None)
            if fix is not None and (table is FIXES or not any(f.id == fix_id for f in FIXES) or fix.params):
                fix.options(given)
        out[fix_id] = dict(given)
    return out


# ----------------------------------------------------------------------------- training fixes
def applies_checkpointing(facts):
    if _static(facts).torchscript:
        return False, "the model is TorchScript: its blocks cannot be wrapped"
    return True, ""


def applies_qat(facts):
    s = _static(facts)
    if s.torchscript:
        return False, "the model is TorchScript"
    if not s.n_linear:
        return False, "no Linear layers: torchao's quantization-aware training fake-quantizes Linear layers"
    return True, ""


_T = "diagnostics.analyses.optimize.train_fixes:"
_TRAIN_AMP = "auto: float16 with GradScaler on CUDA, bfloat16 (no scaler needed) on CPU"

TRAIN_FIXES: list[Fix] = [
    Fix("amp", "Mixed-precision training", "Forward and loss under torch.autocast; float16 adds a GradScaler "
        "(loss scaling, inf/NaN steps skipped). Weights and optimizer stay float32.", _T + "train_amp",
        params=(Option("dtype", "choice", "auto", _TRAIN_AMP, choices=("auto", "bfloat16", "float16")),),
        mode="train"),
    Fix("activation_checkpointing", "Activation checkpointing",
        "torch.utils.checkpoint around the blocks that save the most activations for backward (measured): "
        "their activations are recomputed in backward instead of kept.", _T + "train_checkpointing",
        applies_checkpointing,
        (Option("blocks", "int", 0, "how many blocks to wrap (0: every block of the container holding the most "
                "saved activations)", lo=0, hi=10_000),), mode="train"),
    Fix("grad_accumulation", "Gradient accumulation", "The same batch as k micro-batches, gradients summed, one "
        "optimizer step: less activation memory per pass, same effective batch.", _T + "train_accumulation",
        params=(Option("micro_batches", "int", 4, "micro-batches per step (must divide the batch)", lo=2,
                       hi=1024),), mode="train"),
    Fix("fused_optimizer", "Fused / foreach optimizer", "The same optimizer with its fused (one kernel for all "
        "parameters) or foreach (batched per-tensor ops) implementation.", _T + "train_fused_optimizer",
        params=(Option("impl", "choice", "auto", "auto: fused where the device has it, else foreach",
                       choices=("auto", "fused", "foreach")),), mode="train"),
    Fix("torch_compile", "torch.compile (training)", "The model's forward and backward compiled by TorchInductor "
        "(AOTAutograd), and the optimizer step compiled too.", _T + "train_compile", applies_compile,
        mode="train"),
    Fix("channels_last", "channels_last (training)", "Weights, inputs and so gradients in NHWC.",
        _T + "train_channels_last", applies_channels_last, mode="train"),
    Fix("qat_int8", "Quantization-aware training (int8)", "torchao QAT: Linear layers train with fake int8 "
        "activations (per token) and weights (per channel), then convert to int8 (dynamic activations, int8 "
        "weights).", _T + "train_qat", applies_qat, mode="train"),
]
TRAIN_FIX_IDS = [f.id for f in TRAIN_FIXES]
