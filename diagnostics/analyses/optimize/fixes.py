"""The one-click fixes: each a function ``apply(model, example_inputs, options) -> (model', notes)``
and a check ``applies(facts) -> (bool, why_not)``.

``apply`` may change the module it is given: callers pass a deep copy (see ``run_fix``), so the
user's model never changes. A fix that changes how inputs must be fed (memory format, dtype,
autocast, inference mode) wraps the module so the result is still called with the original
inputs and returns float32 outputs, which keeps the trial harness and the fidelity check uniform.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from diagnostics.errors import TorchScopeError


class FixNotApplicable(TorchScopeError):
    """The fix cannot run on this model / device; the message says why."""


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "choice" | "float"
    default: object
    choices: tuple = ()
    lo: float | None = None
    hi: float | None = None
    help: str = ""


@dataclass(frozen=True)
class Fix:
    id: str
    title: str
    description: str
    apply: Callable[[nn.Module, tuple, dict], tuple[nn.Module, list[str]]]
    applies: Callable[[dict], tuple[bool, str]]
    params: tuple[Param, ...] = field(default_factory=tuple)

    def options(self, given: dict | None) -> dict:
        """Defaults merged with ``given``; bad values raise a message naming the parameter."""
        out = {p.name: p.default for p in self.params}
        for k, v in (given or {}).items():
            p = next((p for p in self.params if p.name == k), None)
            if p is None:
                raise TorchScopeError(f"fix {self.id} has no parameter {k!r}")
            if p.kind == "choice" and v not in p.choices:
                raise TorchScopeError(f"fix {self.id}: {k} must be one of {', '.join(map(str, p.choices))}, got {v!r}")
            if p.kind == "float":
                try:
                    v = float(v)
                except (TypeError, ValueError):
                    raise TorchScopeError(f"fix {self.id}: {k} must be a number, got {v!r}") from None
                if not (p.lo <= v <= p.hi):
                    raise TorchScopeError(f"fix {self.id}: {k} must be between {p.lo} and {p.hi}, got {v}")
            out[k] = v
        return out


# ----------------------------------------------------------------------------- wrappers
def to_float32(out):
    if isinstance(out, torch.Tensor):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, (tuple, list)):
        return type(out)(to_float32(o) for o in out)
    if isinstance(out, dict):
        return {k: to_float32(v) for k, v in out.items()}
    return out


class AutocastModule(nn.Module):
    """Runs ``inner`` under torch.autocast; float32 outputs."""

    def __init__(self, inner: nn.Module, device_type: str, dtype: torch.dtype):
        super().__init__()
        self.inner, self.device_type, self.dtype = inner, device_type, dtype

    def forward(self, *args):
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = self.inner(*args)
        return to_float32(out)


class InputCastModule(nn.Module):
    """Feeds ``inner`` floating inputs in ``dtype`` and/or 4-D inputs in channels_last; float32 outputs."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype | None = None, channels_last: bool = False):
        super().__init__()
        self.inner, self.dtype, self.channels_last = inner, dtype, channels_last

    def forward(self, *args):
        xs = []
        for a in args:
            if isinstance(a, torch.Tensor):
                if self.dtype is not None and a.is_floating_point():
                    a = a.to(self.dtype)
                if self.channels_last and a.dim() == 4:
                    a = a.contiguous(memory_format=torch.channels_last)
            xs.append(a)
        return to_float32(self.inner(*xs))


class InferenceModeModule(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        with torch.inference_mode():
            return self.inner(*args)


def _device_of(model: nn.Module, inputs: tuple) -> torch.device:
    for t in list(model.parameters()) + [x for x in inputs if isinstance(x, torch.Tensor)]:
        return t.device
    return torch.device("cpu")


def _ok(_facts) -> tuple[bool, str]:
    return True, ""


def _static(facts) -> dict:
    return facts.get("static") or {}


def _env(facts) -> dict:
    return facts.get("env") or {}


# ----------------------------------------------------------------------------- the fixes
def apply_amp(model, inputs, opts):
    dev = _device_of(model, inputs)
    dtype = opts["dtype"]
    if dtype == "auto":
        dtype = "float16" if dev.type == "cuda" else "bfloat16"
    model.eval()
    notes = [f"torch.autocast('{dev.type}', dtype=torch.{dtype}); outputs cast back to float32"]
    if dev.type == "cpu" and dtype == "float16":
        notes.append("float16 autocast on CPU covers few ops and is rarely faster")
    return AutocastModule(model, dev.type, getattr(torch, dtype)), notes


def apply_channels_last(model, inputs, opts):
    model.eval()
    model = model.to(memory_format=torch.channels_last)
    return InputCastModule(model, channels_last=True), ["weights and 4-D inputs in torch.channels_last"]


def applies_channels_last(facts):
    return (True, "") if _static(facts).get("n_conv2d") else (False, "no Conv2d layers: memory format does not matter")


def _fuse_pairs(model: nn.Module, pairs: list[list[str]]) -> int:
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    mods = dict(model.named_modules())
    n = 0
    for conv_name, bn_name in pairs:
        conv, bn = mods.get(conv_name), mods.get(bn_name)
        if conv is None or bn is None:
            continue
        fused = fuse_conv_bn_eval(conv, bn)
        for name, new in ((conv_name, fused), (bn_name, nn.Identity())):
            parent_name, _, attr = name.rpartition(".")
            setattr(mods[parent_name] if parent_name else model, attr, new)
        n += 1
    return n


def apply_conv_bn_fusion(model, inputs, opts):
    from diagnostics.analyses.checklist.facts import BATCHNORM, forward_facts

    model.eval()
    n_bn = sum(isinstance(m, BATCHNORM) for m in model.modules())
    try:
        from torch.fx.experimental.optimization import fuse

        fused = fuse(model, inplace=True)
        left = sum(isinstance(m, BATCHNORM) for m in fused.modules())
        return fused, [f"torch.fx fuse: {n_bn - left} of {n_bn} BatchNorm layers folded into their convolutions"]
    except Exception as e:  # models torch.fx cannot trace (data-dependent control flow, ...)
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    pairs = forward_facts(model, inputs)["conv_bn_pairs"]
    n = _fuse_pairs(model, pairs)
    model.eval()
    return model, [f"torch.fx could not trace the model ({why}); fused {n} Conv -> BN pairs found by tensor identity "
                   "with torch.nn.utils.fusion.fuse_conv_bn_eval (assumes each such conv output feeds only its BN)"]


def applies_conv_bn_fusion(facts):
    if not _static(facts).get("n_batchnorm"):
        return False, "no BatchNorm layers"
    pairs = (facts.get("forward") or {}).get("conv_bn_pairs")
    if pairs is not None and not pairs:
        return False, "no BatchNorm directly follows a convolution"
    return True, ""


def _torchao_quantize(model):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    return model


def apply_int8_dynamic(model, inputs, opts):
    dev = _device_of(model, inputs)
    model.eval()
    backend = opts["backend"]
    has_rnn = any(isinstance(m, (nn.LSTM, nn.GRU)) for m in model.modules())
    notes = []
    if backend in ("auto", "torchao") and not (backend == "auto" and has_rnn and dev.type == "cpu"):
        try:
            import torchao  # noqa: F401

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return _torchao_quantize(model), [f"torchao {torchao.__version__}: int8 dynamic activations, "
                                                  "int8 weights (Linear layers)"]
        except ImportError:
            if backend == "torchao":
                raise FixNotApplicable("torchao is not installed")
            notes.append("torchao is not installed")
        except Exception as e:
            if backend == "torchao":
                raise
            notes.append(f"torchao failed ({type(e).__name__}: {str(e)[:100]})")
    if dev.type != "cpu":
        raise FixNotApplicable("torch.ao dynamic quantization runs on CPU only" + (f"; {notes[0]}" if notes else ""))
    types = {nn.Linear} | ({nn.LSTM, nn.GRU} if has_rnn else set())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.ao.quantization.quantize_dynamic(model, types, dtype=torch.qint8)
    notes.append("torch.ao.quantization.quantize_dynamic: int8 weights for "
                 + ", ".join(sorted(t.__name__ for t in types)))
    return q, notes


def applies_int8_dynamic(facts):
    s = _static(facts)
    if not (s.get("n_linear") or s.get("n_rnn")):
        return False, "no Linear / LSTM / GRU layers to quantize (dynamic quantization leaves convolutions alone)"
    return True, ""


def apply_prune_l1(model, inputs, opts):
    from torch.nn.utils import prune

    amount = float(opts["amount"])
    model.eval()
    n = 0
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            prune.l1_unstructured(m, "weight", amount=amount)
            prune.remove(m, "weight")  # make the zeros permanent: a plain weight again
            n += 1
    return model, [f"L1 unstructured pruning of {amount:.0%} of the weights in {n} Linear/Conv layers; weights stay "
                   "dense (zeros), so size on disk and speed change only with sparse kernels"]


def applies_prune(facts):
    s = _static(facts)
    return (True, "") if (s.get("n_linear") or s.get("n_conv")) else (False, "no Linear / Conv layers")


def apply_torch_compile(model, inputs, opts):
    model.eval()
    mode = opts["mode"]
    compiled = torch.compile(model, mode=None if mode == "default" else mode)
    return compiled, [f"torch.compile(mode={mode!r}); the first call compiles (its time is reported apart)"]


def applies_compile(facts):
    env = _env(facts)
    if env.get("device_type") != "cuda" and not env.get("cxx_compiler"):
        return False, "torch.compile on CPU needs a C++ compiler (g++), none found"
    if _static(facts).get("torchscript"):
        return False, "the model is TorchScript"
    return True, ""


def apply_torchscript(model, inputs, opts):
    model.eval()
    if isinstance(model, torch.jit.ScriptModule):
        scripted, how = model, "already TorchScript"
    else:
        with torch.no_grad():
            scripted, how = torch.jit.trace(model, inputs, check_trace=False), "torch.jit.trace"
    frozen = torch.jit.freeze(scripted.eval())
    return frozen, [f"{how} + torch.jit.freeze (weights folded as constants)"]


def apply_inference_mode(model, inputs, opts):
    model.eval()
    return InferenceModeModule(model), ["forward under torch.inference_mode() (no autograd bookkeeping)"]


def apply_half(model, inputs, opts):
    dev = _device_of(model, inputs)
    dtype = opts["dtype"]
    if dtype == "auto":
        dtype = "float16" if dev.type == "cuda" else "bfloat16"
    model.eval()
    model = model.to(getattr(torch, dtype))
    notes = [f"parameters and floating inputs in {dtype}; outputs cast back to float32"]
    if dev.type == "cpu" and dtype == "float16":
        notes.append("float16 on CPU is emulated for many ops")
    return InputCastModule(model, dtype=getattr(torch, dtype)), notes


FIXES: list[Fix] = [
    Fix("amp", "Automatic mixed precision", "Run under torch.autocast (float16 on CUDA, bfloat16 on CPU by default).",
        apply_amp, _ok, (Param("dtype", "choice", "auto", ("auto", "bfloat16", "float16"),
                               help="auto: float16 on CUDA, bfloat16 on CPU"),)),
    Fix("channels_last", "channels_last memory format", "Weights and 4-D inputs in NHWC.", apply_channels_last,
        applies_channels_last),
    Fix("conv_bn_fusion", "Conv-BN fusion", "Fold BatchNorm into the preceding convolution (eval mode).",
        apply_conv_bn_fusion, applies_conv_bn_fusion),
    Fix("int8_dynamic", "Dynamic int8 quantization", "int8 weights (and activations, torchao) for Linear/LSTM layers.",
        apply_int8_dynamic, applies_int8_dynamic,
        (Param("backend", "choice", "auto", ("auto", "torchao", "torch.ao"),
               help="auto: torchao where it supports the model, torch.ao.quantization otherwise"),)),
    Fix("prune_l1", "L1 unstructured pruning", "Zero the smallest-magnitude weights of Linear/Conv layers.",
        apply_prune_l1, applies_prune, (Param("amount", "float", 0.5, lo=0.0, hi=0.95, help="fraction zeroed"),)),
    Fix("torch_compile", "torch.compile", "Graph capture and kernel fusion with TorchInductor.", apply_torch_compile,
        applies_compile, (Param("mode", "choice", "default",
                                ("default", "reduce-overhead", "max-autotune-no-cudagraphs")),)),
    Fix("torchscript", "TorchScript trace + freeze", "torch.jit.trace then torch.jit.freeze.", apply_torchscript, _ok),
    Fix("inference_mode", "inference_mode", "eval() and torch.inference_mode() around the forward.",
        apply_inference_mode, _ok),
    Fix("half", "Half precision", "Parameters and inputs in 16-bit floats (no autocast).", apply_half, _ok,
        (Param("dtype", "choice", "auto", ("auto", "float16", "bfloat16"),
               help="auto: float16 on CUDA, bfloat16 on CPU"),)),
]
FIX_IDS = [f.id for f in FIXES]


def get_fix(fix_id: str) -> Fix:
    for f in FIXES:
        if f.id == fix_id:
            return f
    raise TorchScopeError(f"unknown fix {fix_id!r}; known: {', '.join(FIX_IDS)}")


def run_fix(fix_id: str, model: nn.Module, inputs: tuple, options: dict | None = None) -> tuple[nn.Module, list[str]]:
    """Apply a fix to a deep copy of ``model``; the given model is never changed."""
    fix = get_fix(fix_id)
    return fix.apply(copy.deepcopy(model), inputs, fix.options(options))
