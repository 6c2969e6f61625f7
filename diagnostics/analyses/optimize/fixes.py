"""How each one-click fix is applied: ``apply_<fix>(model, example_inputs, params) -> (model', notes)``.

What the fixes are (ids, titles, parameters, when they apply) is declared in catalog.py.

``apply`` may change the module it is given: callers pass a deep copy (see ``run_fix``), so the
user's model never changes. A fix that changes how inputs must be fed (memory format, dtype,
autocast, inference mode) wraps the module so the result is still called with the original
inputs and returns float32 outputs, which keeps the trial harness and the fidelity check uniform.
"""

from __future__ import annotations

import copy
import io
import os
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from diagnostics.analyses.optimize.catalog import get_fix
from diagnostics.errors import TorchScopeError
from diagnostics.inputs import as_inputs, call


class FixNotApplicable(TorchScopeError):
    """The fix cannot run on this model / device; the message says why."""



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

    def forward(self, *args, **kwargs):
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = self.inner(*args, **kwargs)
        return to_float32(out)


class InputCastModule(nn.Module):
    """Feeds ``inner`` floating inputs in ``dtype`` and/or 4-D inputs in channels_last; float32 outputs."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype | None = None, channels_last: bool = False):
        super().__init__()
        self.inner, self.dtype, self.channels_last = inner, dtype, channels_last

    def _cast(self, a):
        if isinstance(a, torch.Tensor):
            if self.dtype is not None and a.is_floating_point():
                a = a.to(self.dtype)
            if self.channels_last and a.dim() == 4:
                a = a.contiguous(memory_format=torch.channels_last)
        return a

    def forward(self, *args, **kwargs):
        return to_float32(self.inner(*(self._cast(a) for a in args), **{k: self._cast(v) for k, v in kwargs.items()}))


class InferenceModeModule(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        with torch.inference_mode():
            return self.inner(*args, **kwargs)


KEYWORDS_TRACED = ("keyword inputs ({names}) traced by position (TorchScript archives take positional inputs only): "
                   "the archive takes them after the positional ones, in that order")


class KeywordsByPosition(nn.Module):
    """``inner`` called with its last inputs by keyword: torch.jit.trace feeds positional inputs only."""

    def __init__(self, inner: nn.Module, n_args: int, names: tuple[str, ...]):
        super().__init__()
        self.inner, self.n_args, self.names = inner, n_args, tuple(names)

    def forward(self, *xs):
        return self.inner(*xs[:self.n_args], **dict(zip(self.names, xs[self.n_args:])))


class ScriptedWithKeywords(nn.Module):
    """A TorchScript module traced through KeywordsByPosition, called like the model (keyword inputs by
    name); its size and artifact are the TorchScript archive's."""

    def __init__(self, scripted, n_args: int, names: tuple[str, ...]):
        super().__init__()
        self.scripted, self.n_args, self.names = scripted, n_args, tuple(names)

    def forward(self, *args, **kwargs):
        return self.scripted(*args, *(kwargs[n] for n in self.names))

    def serialized(self) -> tuple[int, str]:
        buf = io.BytesIO()
        torch.jit.save(self.scripted, buf)
        return len(buf.getvalue()), "TorchScript archive"

    def save_to(self, directory, name: str) -> dict:
        path = Path(directory) / f"{name}.torchscript.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.jit.save(self.scripted, str(path))
        return {"kind": "torchscript", "path": str(path), "inputs_by_position": list(self.names)}


def trace(model: nn.Module, inputs, **kw):
    """torch.jit.trace at ``inputs``; keyword inputs are traced by position (KeywordsByPosition), so
    the traced module takes every input positionally, keyword ones last, in their order."""
    inputs = as_inputs(inputs)
    if not inputs.names:
        return torch.jit.trace(model, inputs.args, check_trace=False, **kw)
    return torch.jit.trace(KeywordsByPosition(model, len(inputs.args), inputs.names), tuple(inputs),
                           check_trace=False, **kw)


def _device_of(model: nn.Module, inputs: tuple) -> torch.device:
    for t in list(model.parameters()) + [x for x in inputs if isinstance(x, torch.Tensor)]:
        return t.device
    return torch.device("cpu")




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
    from diagnostics.measure.structure import BATCHNORM, forward_facts

    model.eval()
    n_bn = sum(isinstance(m, BATCHNORM) for m in model.modules())
    try:
        from torch.fx.experimental.optimization import fuse

        fused = fuse(model, inplace=True)
        left = sum(isinstance(m, BATCHNORM) for m in fused.modules())
        return fused, [f"torch.fx fuse: {n_bn - left} of {n_bn} BatchNorm layers folded into their convolutions"]
    except Exception as e:  # models torch.fx cannot trace (data-dependent control flow, ...)
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    pairs = forward_facts(model, inputs).conv_bn_pairs
    n = _fuse_pairs(model, pairs)
    model.eval()
    return model, [f"torch.fx could not trace the model ({why}); fused {n} Conv -> BN pairs found by tensor identity "
                   "with torch.nn.utils.fusion.fuse_conv_bn_eval (assumes each such conv output feeds only its BN)"]



def _torchao_quantize(model, skip: set[str] = frozenset()):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(model, Int8DynamicActivationInt8WeightConfig(),
              filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn not in skip)
    return model


def conv1d_to_linear(model: nn.Module) -> int:
    """Replace transformers' Conv1D layers (GPT-2: a Linear with its weight stored (in, out)) by the
    equivalent nn.Linear, so quantizers that know Linear quantize them; returns how many."""
    from diagnostics.measure.structure import is_hf_conv1d

    n = 0
    for name, m in list(model.named_modules()):
        if not is_hf_conv1d(m):
            continue
        nx, nf = m.weight.shape
        lin = nn.Linear(nx, nf, bias=getattr(m, "bias", None) is not None, device=m.weight.device,
                        dtype=m.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(m.weight.t())
            if lin.bias is not None:
                lin.bias.copy_(m.bias)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, lin)
        n += 1
    return n


def tied_linears(model: nn.Module) -> dict[str, str]:
    """Linear layers whose weight shares its storage with another module's parameter (a language
    model's head tied to its embedding): name -> the other holder's name."""
    owners: dict = {}
    for name, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            owners.setdefault(p.untyped_storage().data_ptr(), []).append((name, m, pname))
    out = {}
    for holders in owners.values():
        if len(holders) < 2:
            continue
        for name, m, pname in holders:
            if isinstance(m, nn.Linear) and pname == "weight":
                other = next(f"{n}.{q}" for n, mm, q in holders if mm is not m)
                out[name] = other
    return out


def apply_int8_dynamic(model, inputs, opts):
    dev = _device_of(model, inputs)
    model.eval()
    backend = opts["backend"]
    has_rnn = any(isinstance(m, (nn.LSTM, nn.GRU)) for m in model.modules())
    notes = []
    converted = conv1d_to_linear(model)
    if converted:
        notes.append(f"{converted} transformers Conv1D layers turned into the equivalent nn.Linear first, so they "
                     "quantize")
    tied = tied_linears(model)
    if tied:
        notes.append("left in float, tied to another parameter (an int8 copy would add bytes, the float original "
                     "stays): " + ", ".join(f"{k} (tied to {v})" for k, v in list(tied.items())[:3]))
    if not any(isinstance(m, nn.Linear) and n not in tied for n, m in model.named_modules()) and not has_rnn:
        raise FixNotApplicable("every Linear layer's weight is tied to another parameter: nothing to quantize "
                               "without growing the model")
    if backend in ("auto", "torchao") and not (backend == "auto" and has_rnn and dev.type == "cpu"):
        try:
            import torchao  # noqa: F401

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return _torchao_quantize(model, set(tied)), notes + [
                    f"torchao {torchao.__version__}: int8 dynamic activations, int8 weights (Linear layers)"]
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
    types = (nn.Linear,) + ((nn.LSTM, nn.GRU) if has_rnn else ())
    spec = {n: torch.ao.quantization.default_dynamic_qconfig for n, m in model.named_modules()
            if isinstance(m, types) and n not in tied}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8)
    notes.append("torch.ao.quantization.quantize_dynamic: int8 weights for "
                 + ", ".join(sorted(t.__name__ for t in types)))
    return q, notes


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



def apply_torch_compile(model, inputs, opts):
    model.eval()
    mode = opts["mode"]
    compiled = torch.compile(model, mode=None if mode == "default" else mode)
    return compiled, [f"torch.compile(mode={mode!r}); the first call compiles (its time is reported apart)"]



class FlatOutputs(nn.Module):
    """Returns the tensors of ``inner``'s output as one flat tuple, in order (a dict's or a
    transformers ModelOutput's values, nested tuples and lists); anything else (a DynamicCache) is
    left out. torch.jit.trace takes nothing but tensors and tuples / lists / dicts of them."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        from diagnostics.tensors import iter_tensors

        return tuple(iter_tensors(self.inner(*args, **kwargs)))


def _left_out(out, path: str = "output") -> list[str]:
    """The parts of an output FlatOutputs drops: 'past_key_values (DynamicCache)'."""
    if isinstance(out, torch.Tensor) or out is None:
        return []
    if isinstance(out, (tuple, list)):
        return [x for i, v in enumerate(out) for x in _left_out(v, f"{path}[{i}]")]
    if isinstance(out, dict):
        return [x for k, v in out.items() for x in _left_out(v, str(k))]
    return [f"{path} ({type(out).__name__})"]


def _is_dict_output_error(e: Exception) -> bool:
    return "Encountering a dict at the output of the tracer" in str(e)


def apply_torchscript(model, inputs, opts):
    """torch.jit.trace (strict) + freeze. A dict output (strict trace refuses it) is traced with
    strict=False; an output holding something else than tensors and containers of them (a
    transformers ModelOutput with a DynamicCache) through FlatOutputs. The notes say which."""
    model.eval()
    notes = []
    if isinstance(model, torch.jit.ScriptModule):
        scripted, how = model, "already TorchScript"
    else:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            try:
                scripted, how = trace(model, inputs), "torch.jit.trace"
            except RuntimeError as strict_error:
                scripted = None
                if _is_dict_output_error(strict_error):
                    try:
                        scripted = trace(model, inputs, strict=False)
                        how = "torch.jit.trace(strict=False)"
                        notes.append("traced with strict=False: the model returns a dict, which a strict trace "
                                     "refuses; valid while the dict's keys do not depend on the inputs")
                    except RuntimeError:
                        scripted = None
                if scripted is None:
                    out = call(model, inputs)
                    dropped = _left_out(out)
                    from diagnostics.tensors import iter_tensors

                    n = sum(1 for _ in iter_tensors(out))
                    try:
                        scripted = trace(FlatOutputs(model), inputs)
                    except Exception:
                        raise strict_error from None  # the trace's own reason says more than the wrapper's
                    how = "torch.jit.trace through an output-flattening wrapper"
                    notes.append(f"traced through an output-flattening wrapper: the {type(out).__name__} output "
                                 f"becomes a tuple of its {n} tensor{'s' if n != 1 else ''}, in order"
                                 + (f"; left out (not tensors): {', '.join(dropped[:4])}" if dropped else ""))
    frozen = torch.jit.freeze(scripted.eval())
    python_calls = python_ops(frozen)
    if python_calls:
        name, site = python_calls[0]
        raise FixNotApplicable(
            f"the model calls the Python autograd Function {name}{f' (in {site})' if site else ''}: "
            "torch.jit.trace cannot record it, so the TorchScript program would call back into Python and "
            "could not be saved; script the function (@torch.jit.script), or try torch.compile or torch.export")
    notes.insert(0, f"{how} + torch.jit.freeze (weights folded as constants)")
    names = as_inputs(inputs).names
    if names and not isinstance(model, torch.jit.ScriptModule):
        frozen = ScriptedWithKeywords(frozen, len(as_inputs(inputs).args), names)
        notes.append(KEYWORDS_TRACED.format(names=", ".join(names)))
    return frozen, notes


def python_ops(scripted) -> list[tuple[str, str | None]]:
    """(name, file.py:LINE) of every Python call a traced program kept (prim::PythonOp: a custom
    torch.autograd.Function), the site being the innermost frame of the trace outside torch."""
    from diagnostics.measure.dynamo import is_torch_frame

    found = []
    graph = getattr(scripted, "graph", None)
    for node in graph.findAllNodes("prim::PythonOp", True) if graph is not None else ():
        site = None
        for line in str(node.sourceRange()).splitlines():
            m = re.match(r"(.+?)\((\d+)\): \S+$", line.strip())
            if m and not is_torch_frame(m.group(1)):
                site = f"{os.path.basename(m.group(1))}:{m.group(2)}"
                break
        found.append((node.pyname(), site))
    return found


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



def run_fix(fix_id: str, model: nn.Module, inputs: tuple, options: dict | None = None) -> tuple[nn.Module, list[str]]:
    """Apply a fix to a deep copy of ``model``; the given model is never changed."""
    fix = get_fix(fix_id)
    return fix.apply(copy.deepcopy(model), inputs, fix.options(options))
