"""Deployment trials for the optimize analysis: post-training static int8 quantization (PT2E with
the X86 quantizer) and ONNX Runtime.

Same contract as fixes.py: ``apply_<fix>(model, example_inputs, params) -> (candidate, notes)``,
``FixNotApplicable`` when the fix cannot run on this model (the message says why and what to do).
A candidate that is not a plain torch module says its own size (``serialized()``) and saves its
own artifact (``save_to(directory, name)``); trials.py honours both.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import re
import shutil
import tempfile
import threading
import warnings
import weakref
from pathlib import Path

import torch
from torch import nn
from torch.utils import _pytree as pytree

from diagnostics.analyses.optimize.fixes import FixNotApplicable
from diagnostics.inputs import as_inputs
from diagnostics.inputs import call as call_model

#: calibration batches besides the example inputs themselves (static_int8)
CALIBRATION_PERTURBATIONS = 4
#: relative size of the Gaussian noise added to floating inputs for each extra calibration batch
CALIBRATION_NOISE = 0.1
#: above this many parameter bytes the ONNX weights go to a side file (protobuf caps one file at 2 GiB)
ONNX_EXTERNAL_DATA_BYTES = 1536 * 2 ** 20
#: the longest error cause a message quotes
CAUSE_CHARS = 200


# ----------------------------------------------------------------------------- errors, short
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _root(e: BaseException) -> BaseException:
    seen = set()
    while e.__cause__ is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__
    return e


def brief_error(e: BaseException, limit: int = CAUSE_CHARS) -> str:
    """The innermost cause of ``e`` in one line: its type, its first line (no tensor dumps, no colour
    codes) and the model's file:line when the exporter names one."""
    root = _root(e)
    lines = [ln.strip() for ln in _ANSI.sub("", str(root)).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    first = re.split(r"\btensor\(|\bParameter containing", first)[0].rstrip(" :,(")  # no tensor values
    first = re.sub(r"\s*\((unhinted|Size-like symbols):[^)]*\)\.?", "", first)  # symbolic-shape asides
    where = next((m.group(1) for ln in lines if (m := re.match(r"Caused by: \((.+)\)$", ln))), None)
    text = f"{type(root).__name__}: {first}" + (f" [at {where}]" if where else "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _remedy(e: BaseException) -> str:
    text = _ANSI.sub("", f"{e}\n{_root(e)}")
    if "data-dependent" in text or "GuardOnDataDependent" in type(_root(e)).__name__:
        return ("the forward branches on a tensor's value: express the branch with torch.where or torch.cond so "
                "torch.export can capture it")
    if "register a pytree" in text or "not a known type" in text or "translating node return" in text:
        return ("the forward returns something other than tensors: wrap the model so it returns a tensor or a "
                "tuple of tensors (e.g. a dict / ModelOutput -> its logits)")
    if "No ONNX function found" in text:
        return ("an operator has no ONNX translation: replace it, or give torch.onnx.export a "
                "custom_translation_table")
    return "see torch.export's list of what it cannot capture (pytorch.org/docs/stable/generated/exportdb)"


@contextlib.contextmanager
def _quiet():
    """Exporters warn a lot (deprecations, tracer notes); the row's notes say what matters."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _thread_lock_for_tqdm() -> None:
    """torch.fx's Interpreter (convert_pt2e's constant folding, the ONNX exporter's passes) builds a
    disabled tqdm bar, and tqdm's first bar makes a multiprocessing lock: a named semaphore that a job's
    worker leaves behind when it ends, so the CLI warns of a "leaked semaphore" at exit. A job runs in
    one process: a thread lock does."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    if getattr(tqdm, "_lock", None) is None:
        tqdm.set_lock(threading.RLock())


def _device_of(model: nn.Module, inputs: tuple) -> torch.device:
    for t in [x for x in inputs if isinstance(x, torch.Tensor)] + list(model.parameters()):
        return t.device
    return torch.device("cpu")


# ----------------------------------------------------------------------------- ONNX Runtime
def _import_onnx():
    try:
        import onnxruntime as ort
    except ImportError:
        raise FixNotApplicable("onnxruntime is not installed (pip install onnxruntime)") from None
    for pkg in ("onnx", "onnxscript"):
        try:
            __import__(pkg)
        except ImportError:
            raise FixNotApplicable(f"{pkg} is not installed (pip install {pkg}): torch.onnx.export needs it") from None
    return ort


def export_onnx(model: nn.Module, inputs: tuple, path: Path) -> str:
    """Write ``model`` as ONNX to ``path``; say how. FixNotApplicable (cause and remedy) if it cannot.

    nn.Modules go through ``torch.onnx.export(dynamo=True)``: torch.export captures the graph, so a
    Python branch on a tensor's value is refused rather than silently frozen to the branch the example
    took (what the legacy TorchScript-based exporter does). ScriptModules, which torch.export does not
    take, go through the legacy exporter: their graph already holds their control flow."""
    script = isinstance(model, torch.jit.ScriptModule)
    args, kwargs = as_inputs(inputs).args, as_inputs(inputs).kwargs  # keyword inputs by name
    big = sum(p.numel() * p.element_size() for p in model.parameters()) > ONNX_EXTERNAL_DATA_BYTES
    try:
        with _quiet():
            if script:
                torch.onnx.export(model, args, str(path), kwargs=kwargs or None, dynamo=False)
                return ("torch.onnx.export(dynamo=False), the TorchScript exporter: the only one that takes a "
                        "ScriptModule")
            torch.onnx.export(model, args, str(path), kwargs=kwargs or None, dynamo=True, external_data=big,
                              verbose=False)
            return ("torch.onnx.export(dynamo=True): torch.export captures the graph, onnxscript translates it"
                    + (" (weights in a side file: over protobuf's 2 GiB)" if big else ""))
    except FixNotApplicable:
        raise
    except Exception as e:
        step = type(e).__name__
        stage = ("torch.export could not capture the model" if step == "TorchExportError" else
                 "the captured graph could not be translated to ONNX" if step == "ConversionError" else
                 "torch.onnx.export failed")
        raise FixNotApplicable(f"{stage} ({brief_error(e)}); {_remedy(e)}") from None


class OnnxRuntimeModule(nn.Module):
    """An ONNX Runtime session that is called like the model: ``forward(*args, **kwargs)`` feeds the
    tensor inputs (positional ones, then keyword ones, as the export flattened them), as numpy arrays,
    by the session's input names in order and returns torch tensors on the
    inputs' device (floating ones as float32), in the model's own output structure where it matches.

    ``serialized()`` is the .onnx file's size (plus its weights side file, if any), ``save_to`` copies
    it into an artifact folder. The exported file lives in a private temp folder removed with this object."""

    #: ONNX Runtime allocates outside torch: its peak memory is not counted (trials show None)
    peak_counted = False

    def __init__(self, path: Path, session, device: torch.device, out_spec=None):
        super().__init__()
        self.path, self.session, self.device, self.out_spec = Path(path), session, torch.device(device), out_spec
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.path.parent), True)

    def files(self) -> list[Path]:
        """The .onnx file first, then its weights side files (the export's folder holds nothing else)."""
        return [self.path] + sorted(p for p in self.path.parent.iterdir() if p != self.path and p.is_file())

    def forward(self, *inputs, **kwargs):
        tensors = [x for x in list(inputs) + list(kwargs.values()) if isinstance(x, torch.Tensor)]
        if len(tensors) != len(self.input_names):
            raise ValueError(f"the ONNX graph takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), "
                             f"got {len(tensors)} tensors")
        feed = {n: t.detach().cpu().numpy() for n, t in zip(self.input_names, tensors)}
        outs = []
        for o in self.session.run(self.output_names, feed):
            t = torch.from_numpy(o)
            outs.append((t.float() if t.is_floating_point() else t).to(self.device))
        if self.out_spec is not None and self.out_spec.num_leaves == len(outs):
            return pytree.tree_unflatten(outs, self.out_spec)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def serialized(self) -> tuple[int, str]:
        files = self.files()
        return sum(os.path.getsize(p) for p in files), "ONNX file" + (" + weights file" if len(files) > 1 else "")

    def save_to(self, directory: Path, name: str) -> dict:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        dest = directory / f"{name}.onnx"
        if len(self.files()) == 1:
            shutil.copyfile(self.path, dest)
            return {"kind": "onnx", "path": str(dest)}
        import onnx  # weights in a side file: re-save so the file names the side file's new name

        data = f"{name}.onnx.data"
        onnx.save_model(onnx.load(str(self.path)), str(dest), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=data)
        return {"kind": "onnx", "path": str(dest), "data_path": str(directory / data)}


def _onnx_facts(path: Path) -> tuple[int | None, int]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    return opset, len(proto.graph.node)


def apply_onnxruntime(model, inputs, opts):
    ort = _import_onnx()
    model.eval()
    _thread_lock_for_tqdm()
    dev = _device_of(model, inputs)
    tmp = Path(tempfile.mkdtemp(prefix="torchscope_onnx_"))
    try:
        path = tmp / "model.onnx"
        how = export_onnx(model, inputs, path)
        with torch.no_grad():
            reference = call_model(model, inputs)
        leaves, spec = pytree.tree_flatten(reference)
        spec = spec if leaves and all(isinstance(x, torch.Tensor) for x in leaves) else None
        so = ort.SessionOptions()
        threads = torch.get_num_threads()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        # Spinning intra-op threads keep their cores busy after each call, which would slow whatever
        # the interleaved rounds time next (the baseline, the other fixes): off, for a fair comparison.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers, provider_note = ["CPUExecutionProvider"], None
        if dev.type == "cuda":
            if "CUDAExecutionProvider" in ort.get_available_providers():
                providers = [("CUDAExecutionProvider", {"device_id": dev.index or 0}), "CPUExecutionProvider"]
            else:
                provider_note = ("the model is on CUDA but this onnxruntime has no CUDA provider (pip install "
                                 "onnxruntime-gpu): the session runs on the CPU, so this row compares CPU with GPU")
        try:
            session = ort.InferenceSession(str(path), so, providers=providers)
        except Exception as e:
            raise RuntimeError(f"ONNX Runtime could not load the exported model: {brief_error(e)}") from None
        candidate = OnnxRuntimeModule(path, session, dev, spec)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    opset, n_nodes = _onnx_facts(path)
    used = session.get_providers()
    notes = [f"{how}; opset {opset}, {n_nodes} ONNX nodes; shapes fixed to the example inputs' (serving other "
             "shapes needs dynamic_shapes at export)",
             f"ONNX Runtime {ort.__version__}, {used[0]}, graph optimizations: all; intra_op_num_threads={threads} "
             "(= torch.get_num_threads(), so both use the same cores), threads do not spin-wait between calls "
             "(allow_spinning=0: spinning would steal cores from the candidates timed after it; ONNX Runtime's own "
             "default spins and may be faster called back to back)",
             "inputs go in as numpy arrays (Tensor.numpy(): shared memory on CPU), outputs come back as float32 "
             "torch tensors" + (" on the GPU: the copies through the host are in the timing" if dev.type == "cuda"
                                else ""),
             "peak memory counts torch's allocations only: ONNX Runtime's own memory arena is not seen, so the "
             "peak column understates this row",
             "size: the .onnx file" + (" and its weights file" if len(candidate.files()) > 1 else " (weights inside)")
             + "; download it from the artifacts"]
    if provider_note:
        notes.insert(2, provider_note)
    return candidate, notes


# ----------------------------------------------------------------------------- static int8 (PT2E)
_Q = "quantized_decomposed."
_WEIGHTED = {"aten.conv1d.default": "conv1d", "aten.conv2d.default": "conv2d", "aten.conv3d.default": "conv3d",
             "aten.conv_transpose2d.input": "conv_transpose2d", "aten.linear.default": "linear"}


def _target(node) -> str:
    return str(node.target) if node.op == "call_function" else ""


def quantized_op_counts(gm: torch.fx.GraphModule) -> dict:
    """What a converted PT2E graph quantizes, counted from its nodes: conv/linear ops whose input and
    weight both come through dequantize nodes (by type, and how many there are in all), the modules
    whose conv/linear ops stayed float, the quantize / dequantize nodes, and the other ops fed int8
    activations."""
    weighted, total = collections.Counter(), collections.Counter()
    fed, left_float = collections.Counter(), collections.Counter()
    qd = collections.Counter(_target(n).removeprefix(_Q) for n in gm.graph.nodes if _target(n).startswith(_Q))
    for n in gm.graph.nodes:
        t = _target(n)
        if not t or t.startswith(_Q):
            continue
        srcs = [_target(a) for a in n.all_input_nodes]
        if t in _WEIGHTED:
            total[_WEIGHTED[t]] += 1
            args = [_target(a) if isinstance(a, torch.fx.Node) else "" for a in n.args[:2]]
            if len(args) == 2 and all(a.startswith(_Q + "dequantize") for a in args):
                weighted[_WEIGHTED[t]] += 1
            else:
                stack = n.meta.get("nn_module_stack") or {}
                left_float[next(reversed(stack.values()))[0] if stack else "(top level)"] += 1
        elif any(s.startswith(_Q + "dequantize") for s in srcs):
            fed[t.removeprefix("aten.").split(".")[0]] += 1
    return {"quantized": dict(weighted), "weighted_ops": dict(total), "qdq": dict(qd), "int8_fed": dict(fed),
            "left_float": dict(left_float)}


def _counted(c: dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def _perturbed(inputs, k: int):
    """The k-th deterministic variation of the example inputs: floating tensors plus Gaussian noise
    of CALIBRATION_NOISE times their std (a fixed seed per k), integer tensors (token ids) rolled by k
    along their last dimension; anything else unchanged."""
    g = torch.Generator().manual_seed(1000 + k)

    def vary(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1:
            noise = torch.randn(x.shape, generator=g, dtype=torch.float32).to(device=x.device, dtype=x.dtype)
            x = x + CALIBRATION_NOISE * x.detach().std() * noise
        elif isinstance(x, torch.Tensor) and x.dtype in (torch.int32, torch.int64) and x.dim():
            x = torch.roll(x, shifts=k, dims=-1)
        return x
    return as_inputs(inputs).map(vary)  # positional and keyword inputs alike, in order


def _drop_unused_attributes(gm: torch.fx.GraphModule) -> int:
    """Parameters and buffers the graph no longer reads (the float weights that convert_pt2e replaced
    by int8 copies), removed so the module's size is what it runs with; how many went."""
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    called = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    dropped = 0
    for name, _ in list(gm.named_parameters(remove_duplicate=False)) + list(gm.named_buffers(remove_duplicate=False)):
        if name in read or any(name.startswith(c + ".") for c in called):
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = gm.get_submodule(owner_name) if owner_name else gm
        if owner._parameters.pop(attr, None) is not None or owner._buffers.pop(attr, None) is not None:
            dropped += 1
    return dropped


class Int8GraphModule(nn.Module):
    """The converted PT2E graph, called like the model; saved as a torch.export program (.pt2), which
    ``torch.export.load`` (and TorchScope's model loader) reads back."""

    def __init__(self, graph_module: torch.fx.GraphModule, example_inputs):
        super().__init__()
        self.graph_module = graph_module
        self._example = as_inputs(example_inputs)  # for save_to's export; not state

    def forward(self, *inputs, **kwargs):
        return self.graph_module(*inputs, **kwargs)

    def serialized(self) -> tuple[int, str]:
        buf = io.BytesIO()
        torch.save(self.graph_module.state_dict(), buf)
        return len(buf.getvalue()), "state_dict (torch.save)"

    def save_to(self, directory: Path, name: str) -> dict:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.pt2"
        with _quiet():
            torch.export.save(torch.export.export(self.graph_module, self._example.args, self._example.kwargs),
                              str(path))
        return {"kind": "pt2", "path": str(path)}


def _import_pt2e():
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    except ImportError as e:
        raise FixNotApplicable(f"torchao's PT2E quantization is not available (pip install torchao): {e}") from None
    return prepare_pt2e, convert_pt2e, xiq


def _batch_norm_nodes(gm: torch.fx.GraphModule) -> int:
    return sum("batch_norm" in _target(n) for n in gm.graph.nodes)


def _capture_and_prepare(model, inputs, prepare_pt2e, xiq):
    """Captured and annotated (observers in); how it was captured; BatchNorm ops in the captured graph.

    Non-strict capture first (torch.export's default). The quantizer's pattern matching can refuse
    its graph where one module is called twice (a shared ReLU); strict (Dynamo) capture names each
    call apart, so it is the second try."""
    errors = []
    for strict in (False, True):
        try:
            gm = torch.export.export(model, as_inputs(inputs).args, as_inputs(inputs).kwargs, strict=strict).module()
            n_bn = _batch_norm_nodes(gm)
            quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
            return prepare_pt2e(gm, quantizer), f"torch.export.export(strict={strict})", n_bn
        except Exception as e:
            errors.append(e)
    raise FixNotApplicable(f"torch.export / prepare_pt2e could not capture the model ({brief_error(errors[0])}; "
                           f"strict capture failed too); {_remedy(errors[0])}")


def apply_static_int8(model, inputs, opts):
    prepare_pt2e, convert_pt2e, xiq = _import_pt2e()
    dev = _device_of(model, inputs)
    if dev.type != "cpu":
        raise FixNotApplicable(f"the X86 quantizer targets CPU inference; the model is on {dev.type}")
    if isinstance(model, torch.jit.ScriptModule):
        raise FixNotApplicable("the model is TorchScript: PT2E captures the model with torch.export, which does not "
                               "take a ScriptModule")
    model.eval()
    _thread_lock_for_tqdm()
    with _quiet():
        prepared, how, n_bn = _capture_and_prepare(model, inputs, prepare_pt2e, xiq)
        with torch.no_grad():
            call_model(prepared, inputs)
            for k in range(1, CALIBRATION_PERTURBATIONS + 1):
                call_model(prepared, _perturbed(inputs, k))
        converted = convert_pt2e(prepared)
    counts = quantized_op_counts(converted)
    n_quantized, n_weighted = sum(counts["quantized"].values()), sum(counts["weighted_ops"].values())
    if not n_quantized:
        raise FixNotApplicable("the X86 quantizer found no convolution or linear op to quantize in the captured graph"
                               + (f" ({n_weighted} such ops, none annotated)" if n_weighted else
                                  " (none is called in the forward)"))
    dropped = _drop_unused_attributes(converted)
    converted.recompile()
    qdq = counts["qdq"]
    notes = [f"PT2E: {how} -> prepare_pt2e(X86InductorQuantizer, default config: int8 per-channel symmetric "
             "weights, uint8 per-tensor affine activations) -> calibration -> convert_pt2e",
             f"calibration: {1 + CALIBRATION_PERTURBATIONS} batches, the example inputs and "
             f"{CALIBRATION_PERTURBATIONS} deterministic variations (floats + {CALIBRATION_NOISE:g} std Gaussian "
             "noise, token ids rolled); activation ranges fit these inputs: calibrate on real data before deploying",
             f"quantized: {n_quantized} of {n_weighted} conv/linear ops ({_counted(counts['quantized'])}); "
             f"{qdq.get('quantize_per_tensor.default', 0)} quantize_per_tensor / "
             f"{qdq.get('dequantize_per_tensor.default', 0)} dequantize_per_tensor activation nodes, "
             f"{qdq.get('dequantize_per_channel.default', 0)} int8 weights (dequantize_per_channel)"
             + (f"; other ops fed int8 activations: {_counted(counts['int8_fed'])}" if counts["int8_fed"] else "")]
    if counts["left_float"]:
        shown = sorted(counts["left_float"].items())
        notes.append(f"left in float32 (the quantizer did not annotate them): {n_weighted - n_quantized} conv/linear "
                     "ops in " + ", ".join(f"{k} ({v})" for k, v in shown[:6]) + (", ..." if len(shown) > 6 else ""))
    if n_bn:
        notes.append(f"BatchNorm: {n_bn - _batch_norm_nodes(converted)} of {n_bn} ops folded into the convolution "
                     "before them")
    if dropped:
        notes.append(f"the float copies of {dropped} replaced tensors dropped (the graph reads the int8 ones): the "
                     "size is what it runs with")
    notes += ["runs the reference quantize / dequantize ops eagerly: on CPU usually slower than float. The int8 speed "
              "comes only when inductor lowers the graph (torch.compile with freezing, onednn int8 kernels, x86 with "
              "VNNI / AMX), which this trial does not do",
              "artifact: the converted graph as a torch.export program (.pt2)"]
    return Int8GraphModule(converted, inputs), notes
