"""Turn a ModelSpec into a live model and its inputs: samples, uploads, weights.

``load_model(spec)`` is the only place that executes or unpickles what a user gave. Weights are
read with ``weights_only=True``; a full pickled module needs ``spec.trust_pickle`` and is refused
outright, like Python files, in server-safe mode (``TORCHSCOPE_SAFE_MODE=1``).
Every failure raises a ModelLoadError whose message names the problem.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import pickle
import re
import sys
import tempfile
import uuid
import warnings
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from diagnostics.errors import ModelLoadError, ModelRunError, SpecError, TrustError, clean_message, explain
from diagnostics.graph_ops import (check_exported, check_torchscript, inspect_export_archive,
                                   inspect_torchscript_archive)
from diagnostics.inputs import Inputs, from_example, make_inputs, spec_of, specs_of, with_batch
from diagnostics.inputs import describe as describe_inputs
from diagnostics.inputs import with_names
from diagnostics.sandbox import graph_code_refusal
from diagnostics.settings import SAFE_MODE_ENV, safe_mode  # noqa: F401 (re-exported)
from diagnostics.spec import InputSpec, ModelSpec
from diagnostics.uploads import WEIGHTS_NAMES, archive_kind


@dataclass
class LoadedModel:
    """A live model in one process. Never leaves the worker; results take plain data from it."""

    spec: ModelSpec
    model: nn.Module
    input_specs: tuple[InputSpec, ...]  # positional inputs first, then keyword ones (name set)
    inputs: Inputs  # a plain tuple is taken as positional inputs (or named as in input_specs)
    loss_fn: Callable[[object], torch.Tensor]
    loss_name: str
    task: str = "unknown"
    num_classes: int | None = None
    notes: list[str] = field(default_factory=list)
    #: True when no loss was declared and ``default_loss`` stands in for one: analyses
    #: driven by the loss (gradient flow) say so and mark their verdicts low-confidence.
    loss_stand_in: bool = False
    #: Why the model was built on the meta device (a Hugging Face config too big for this machine):
    #: nothing is allocated; only counting analyses (summary, memory, validate) run, on fake tensors.
    meta: str | None = None
    #: The inputs the model itself declares (its example_inputs(), a sample's or a config's), before the
    #: user's edits: an error from a call with fewer names the ones left out.
    declared_inputs: tuple[InputSpec, ...] | None = None

    def __post_init__(self):
        self.inputs = with_names(self.inputs, self.input_specs)

    @property
    def device(self) -> torch.device:
        return torch.device(self.spec.device)

    @property
    def batch_size(self) -> int:
        return self.input_specs[0].shape[0] if self.input_specs and self.input_specs[0].shape else 1

    def make_inputs(self, batch_size: int | None = None, seed: int | None = None) -> Inputs:
        """Fresh random inputs like the declared ones; ``batch_size`` scales every input's first dimension."""
        specs = self.input_specs if batch_size is None else with_batch(self.input_specs, batch_size)
        return make_inputs(specs, "meta" if self.meta else self.spec.device, self.spec.seed if seed is None else seed)

    def call(self, model: nn.Module, inputs=None):
        """``model`` (the loaded one, or a candidate built from it) called with ``inputs`` (default: the
        loaded inputs), keyword inputs by name."""
        inputs = self.inputs if inputs is None else with_names(inputs, self.input_specs)
        return inputs.call(model)

    def forward(self, inputs=None):
        """Run the model once, turning its exception into a ModelRunError that carries it."""
        inputs = self.inputs if inputs is None else with_names(inputs, self.input_specs)
        try:
            return inputs.call(self.model)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # the user's model: any exception is possible
            missing = self.missing_inputs(inputs)
            if missing:
                raise ModelRunError(f"{missing}; its error: {type(e).__name__}: {e}") from e
            shapes = describe_inputs(inputs)
            hint = ""
            if self.spec.source == "export" and "Guard failed" in str(e):
                hint = (" (this .pt2 was exported for fixed input shapes: keep the declared ones, or export "
                        "again with dynamic_shapes)")
            raise ModelRunError(f"the model rejected its inputs ({shapes}): {type(e).__name__}: {e}{hint}") from e


    def missing_inputs(self, inputs) -> str | None:
        """Which of the inputs the model declares a call with ``inputs`` leaves out (its forward's
        parameters past those given), as a sentence; None when it leaves none out."""
        declared = self.declared_inputs or ()
        if len(declared) <= len(inputs):
            return None
        try:
            params = [p for p in inspect.signature(self.model.forward).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        except (TypeError, ValueError):  # a compiled forward without a Python signature
            return None
        given = len(inputs.args)
        left = [(i, p.name) for i, p in enumerate(params)
                if i >= given and p.name not in inputs.kwargs and (i < len(declared) or
                                                                     p.name in {d.name for d in declared})]
        if not left:
            return None
        by_name = {d.name: d for d in declared if d.name}
        where = "example_inputs() gives" if self.spec.source == "python" else "declared inputs give"
        parts = []
        for i, name in left:
            d = by_name.get(name) or (declared[i] if i < len(declared) else None)
            shape = f"; the model's {where} {list(d.shape)} {d.dtype}" if d is not None else ""
            parts.append(f"{name} (forward's parameter {i + 1}{shape})")
        n = len(inputs)
        return (f"the model was called without its input{'s' if len(parts) > 1 else ''} {', '.join(parts)}: "
                f"{n} input{'s' if n != 1 else ''} entered, the model takes {len(declared)}; enter every input "
                "(the sidebar's Inputs, or --input once per input)")


def input_spec_of(t: torch.Tensor, name: str | None = None) -> InputSpec:
    return spec_of(t, name)


#: The seed of the stand-in loss's direction (the same direction on every run and device).
STAND_IN_SEED = 0
STAND_IN_LOSS_NAME = (f"stand-in: the output projected on a fixed random direction (seed {STAND_IN_SEED}), "
                      "averaged over the batch (no loss declared)")


def default_loss(output) -> torch.Tensor:
    """Used when a model declares no loss: the (first) output projected on a fixed random direction,
    averaged over the batch: mean(output * u), u ~ N(0, 1) drawn from ``STAND_IN_SEED`` with the shape of
    one sample (the same u for every sample and batch size).

    Its gradient with respect to the output is u / numel, never degenerate: the mean square used before
    is nearly constant behind a final normalisation (every normalised row has the same mean square), so
    all gradient went to the norm's own scale and the layers before it looked vanishing."""
    if isinstance(output, (tuple, list)):
        output = output[0]
    if isinstance(output, dict):
        output = next(iter(output.values()))
    out = output.float()
    gen = torch.Generator(device=out.device).manual_seed(STAND_IN_SEED)
    u = torch.randn(out.shape[1:], generator=gen, device=out.device)
    return (out * u).mean()


# A mean over the batch: micro-batches of equal size average to the whole batch's value.
default_loss.for_rows = lambda output, start, stop, batch: default_loss(output)


# --------------------------------------------------------------------------- loading by source
#: what a zip archive from torch is, by its member names -> how to load it instead
_ZIP_KINDS = {
    "torchscript": "a TorchScript archive (torch.jit.save): choose that file kind",
    "export": "a torch.export archive: choose 'torch.export archive (.pt2)' as the file kind",
    "torch.save": "a torch.save file: a state_dict goes in the weights slot beside a model definition, and a "
                  "pickled module needs the file kind 'Pickled nn.Module' and 'I trust this file'",
}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _refused_global(e: Exception) -> str:
    """The line of a weights-only unpickling error that names what it refused, without colour codes."""
    text = _ANSI.sub("", str(e))
    line = next((ln.strip() for ln in text.splitlines() if "Unsupported global" in ln), "")
    return line.split(" was not an allowed global")[0]


def _check_zip(path: Path, what: str, expected: str, name: str) -> None:
    if not path.exists():
        raise ModelLoadError(f"file not found: {name}")
    if not zipfile.is_zipfile(path):
        raise ModelLoadError(f"{name} is not a {what}: it is not a zip archive (corrupt or wrong kind of file)")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ModelLoadError(f"{name} is a corrupt or truncated {what}: {e}") from e
    if bad is not None:
        raise ModelLoadError(f"{name} is a corrupt {what}: member {bad!r} fails its checksum")
    with zipfile.ZipFile(path) as z:
        kind = archive_kind(z.namelist())
    if kind not in (expected, "unknown"):
        raise ModelLoadError(f"{name} is not a {what}: it is {_ZIP_KINDS[kind]}")


def _first_line(e: Exception) -> str:
    """The first non-blank line of an error (TorchScript's compile errors start with a newline)."""
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "(no message)")


def _load_torchscript(path: Path, name: str) -> nn.Module:
    _check_zip(path, "TorchScript archive (torch.jit.save)", "torchscript", name)
    graph_code_refusal("TorchScript models")
    if safe_mode():  # before torch.jit.load, which runs every __setstate__ in the archive
        inspect_torchscript_archive(path, name)
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as e:
        raise ModelLoadError(f"{name} is not a loadable TorchScript archive: {type(e).__name__}: "
                             f"{_first_line(e)}") from e
    if safe_mode():
        check_torchscript(module, name)
    return module


class _PickleRefused(Exception):
    pass


class _RefusingPickle:
    """Stands in for the pickle module inside torch.export's archive reader."""

    @staticmethod
    def loads(*_args, **_kwargs):
        raise _PickleRefused("an opaque pickled object")


@contextmanager
def _no_code_in_pickles():
    """torch.export.load unpickles some archive members with full pickle: sample inputs that a
    weights-only load rejects (it then retries with weights_only=False), weights and constants saved
    with use_pickle, opaque objects. A crafted .pt2 can run code that way, so while it loads every
    torch.load is forced weights-only and plain pickle is refused."""
    from torch.export.pt2_archive import _package

    saved_env = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    saved_pickle = getattr(_package, "pickle", None)  # None: this torch's reader does not use it (2.11)
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    if saved_pickle is not None:
        _package.pickle = _RefusingPickle
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = saved_env
        if saved_pickle is not None:
            _package.pickle = saved_pickle


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _load_problems():
    """What torch.export.load logs and warns while it reads an archive. A failed load logs its real
    cause (with the exception) and then raises "check the warnings above", which a job's log hides."""
    kept = _Kept()
    logger = logging.getLogger("torch.export")
    logger.addHandler(kept)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield kept.records, caught
    finally:
        logger.removeHandler(kept)


def _export_load_failure(e: Exception, records: list, caught: list) -> str:
    """The cause of a failed torch.export.load: the exception it logged, else what it logged or warned."""
    logged = next((r.exc_info[1] for r in records if r.exc_info and r.exc_info[1] is not None), None)
    if logged is not None:
        return explain(logged)
    said = [clean_message(r.getMessage(), 300) for r in records] + [clean_message(str(w.message), 300) for w in caught]
    text = explain(e)
    if said:
        text = text.replace(" Please check the warnings above for possible errors.", "") + " (it said: " + \
            "; ".join(dict.fromkeys(x for x in said if x)) + ")"
    return text


def _load_export(path: Path, name: str):
    _check_zip(path, "torch.export archive (.pt2)", "export", name)
    graph_code_refusal("torch.export (.pt2) models")
    if safe_mode():  # before torch.export.load: every target and operator argument of its programs
        inspect_export_archive(path, name)
    records, caught = [], []
    try:
        with _no_code_in_pickles(), _load_problems() as (records, caught):
            ep = torch.export.load(str(path))
    except (_PickleRefused, pickle.UnpicklingError) as e:
        found = _refused_global(e)
        raise TrustError(f"{name} carries pickled objects (sample inputs, weights or constants) that a "
                         f"weights-only load refuses{' (' + found + ')' if found else ''}: loading them could run "
                         "code. TorchScope opens .pt2 archives that hold only tensors and plain values; export "
                         "the model again without custom objects") from e
    except Exception as e:
        raise ModelLoadError(f"{name} is not a loadable torch.export archive (.pt2): "
                             f"{_export_load_failure(e, records, caught)}") from e
    if safe_mode():
        check_exported(ep, name)
    module = ep.module()
    # ExportedProgram.module() makes train() and eval() raise NotImplementedError, and every
    # training or inference analysis calls one. Its graph was traced in one mode, so the flags change
    # nothing it computes: drop the instance overrides and let nn.Module's methods set them.
    for name in ("train", "eval"):
        module.__dict__.pop(name, None)
    example = None
    ex = getattr(ep, "example_inputs", None)
    if ex is not None:
        args, kwargs = ex
        if all(isinstance(a, torch.Tensor) for a in list(args) + list((kwargs or {}).values())):
            example = Inputs(tuple(args), kwargs or {})
    return module, example


_USER_MODULES: list[Path] = []


def _user_module_dir() -> Path:
    """A private folder of this process on sys.path (spawned children inherit sys.path)."""
    if not _USER_MODULES:
        folder = Path(tempfile.mkdtemp(prefix="torchscope-user-modules-"))
        sys.path.insert(0, str(folder))
        importlib.invalidate_caches()
        _USER_MODULES.append(folder)
    return _USER_MODULES[0]


def import_user_file(path: Path, what: str, missing: str = "file not found", name: str | None = None):
    """Import a user's Python file as a fresh module; errors name the file and the problem.

    Refused in server-safe mode (``what`` names the feature in that message)."""
    if safe_mode():
        raise TrustError(f"{what} are disabled on this server (server-safe mode)")
    path = Path(path)
    name = name or path.name
    if not path.exists():
        raise ModelLoadError(f"{missing}: {name}")
    # Imported by name, through a stub in a folder on sys.path that runs the file from where it is:
    # processes this one spawns (DataLoader workers, which unpickle a Dataset by its module's name)
    # can import it too, and tracebacks still name the user's file and lines.
    mod_name = f"torchscope_user_{uuid.uuid4().hex[:8]}"
    source = str(path.resolve())
    try:
        (_user_module_dir() / f"{mod_name}.py").write_text(
            f"_path = {source!r}\nwith open(_path, 'rb') as _file:\n    _code = compile(_file.read(), _path, 'exec')\n"
            "del _file\nexec(_code)\n")
        module = importlib.import_module(mod_name)
    except SyntaxError as e:
        raise ModelLoadError(f"{name} has a syntax error at line {e.lineno}: {e.msg}") from e
    except Exception as e:
        raise ModelLoadError(f"{name} raised while being imported: {type(e).__name__}: {e}") from e
    return module


def _load_python(path: Path, name: str):
    module = import_user_file(path, "Python-file models", name=name)
    if not callable(getattr(module, "build_model", None)):
        raise ModelLoadError(f"{name} defines no build_model() function; it must define "
                             "build_model() -> nn.Module and example_inputs() -> a tuple of tensors, a dict of "
                             "keyword inputs or an (args, kwargs) pair")
    try:
        model = module.build_model()
    except Exception as e:
        raise ModelLoadError(f"build_model() in {name} raised: {type(e).__name__}: {e}") from e
    if not isinstance(model, nn.Module):
        raise ModelLoadError(f"build_model() in {name} returned {type(model).__name__}, not an nn.Module")
    example = None
    if callable(getattr(module, "example_inputs", None)):
        try:
            example = module.example_inputs()
        except Exception as e:
            raise ModelLoadError(f"example_inputs() in {name} raised: {type(e).__name__}: {e}") from e
        try:
            example = from_example(example, f"example_inputs() in {name}")
        except SpecError as e:
            raise ModelLoadError(str(e)) from None
    loss_fn = getattr(module, "loss_fn", None)
    return model, example, loss_fn if callable(loss_fn) else None


def _load_pickle(path: Path, trusted: bool, name: str) -> nn.Module:
    if safe_mode():
        raise TrustError("pickled modules are disabled on this server (server-safe mode); "
                         "upload TorchScript, torch.export (.pt2) or weights instead")
    if not trusted:
        raise TrustError(f"{name} is a full pickle, which can run arbitrary code when loaded; "
                         "turn on 'I trust this file' to load it, or upload TorchScript / .pt2 / weights")
    if not path.exists():
        raise ModelLoadError(f"file not found: {name}")
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as e:
        raise ModelLoadError(f"{name} could not be unpickled (corrupt or truncated?): {type(e).__name__}: {e}") from e
    if not isinstance(obj, nn.Module):
        raise ModelLoadError(f"{name} holds a {type(obj).__name__}, not an nn.Module; "
                             "a state_dict goes in the weights slot next to a model definition")
    return obj


#: safetensors dtypes and their bytes per element (the format's own list).
_SAFETENSORS_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                      "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
#: A safetensors header larger than this is not one (the format's own limit is 100 MB).
_SAFETENSORS_MAX_HEADER = 100_000_000


def _invalid_weights(name: str, why: str, path: Path) -> ModelLoadError:
    kind = ".safetensors file" if path.suffix == ".safetensors" else "weights file"
    return ModelLoadError(f"{name} is not a valid {kind}: {why}")


def check_weights_file(path: Path, name: str) -> None:
    """Refuse at once, before anything is read into memory, a weights file that cannot be one: empty,
    sparse (mostly never written: it reads as zeros, and a 2 GiB one only ran out of memory), a
    .safetensors whose header does not describe its bytes, anything else that is neither a zip
    archive nor a pickle stream (torch.save's two formats)."""
    import json

    st = path.stat()
    if st.st_size == 0:
        raise _invalid_weights(name, "it is empty (0 bytes)", path)
    if st.st_size > (1 << 20) and st.st_blocks * 512 < st.st_size // 2:
        raise _invalid_weights(name, f"it is sparse: {st.st_size / 2**20:,.1f} MiB long, but only "
                                     f"{st.st_blocks * 512 / 2**20:,.1f} MiB of it was ever written (the rest are "
                                     "holes that read as zeros)", path)
    with open(path, "rb") as f:
        head = f.read(8)
        if path.suffix != ".safetensors":
            if not zipfile.is_zipfile(f) and head[:1] != b"\x80":
                raise _invalid_weights(name, f"it is neither a torch.save archive nor a safetensors file (it starts "
                                             f"with the bytes {head.hex(' ')})", path)
            return
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < n <= min(st.st_size - 8, _SAFETENSORS_MAX_HEADER):
            raise _invalid_weights(name, f"its safetensors header length ({n:,} bytes) does not fit in a file of "
                                         f"{st.st_size:,} bytes", path)
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError) as e:
            raise _invalid_weights(name, f"its safetensors header is not JSON ({e})", path) from None
    if not isinstance(header, dict):
        raise _invalid_weights(name, "its safetensors header is not a JSON object", path)
    data, end = st.st_size - 8 - n, 0
    for key, t in header.items():
        if key == "__metadata__":
            continue
        offsets = t.get("data_offsets") if isinstance(t, dict) else None
        shape = t.get("shape") if isinstance(t, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data and isinstance(shape, list)
                and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise _invalid_weights(name, f"tensor {key!r} has no valid shape and data offsets within the file's "
                                         f"{data:,} data bytes", path)
        size = _SAFETENSORS_BYTES.get(t.get("dtype"))
        count = 1
        for d in shape:
            count *= d
        if size is not None and offsets[1] - offsets[0] != count * size:
            raise _invalid_weights(name, f"tensor {key!r} ({t.get('dtype')} {shape}) should take {count * size:,} "
                                         f"bytes, its offsets give {offsets[1] - offsets[0]:,}", path)
        end = max(end, offsets[1])
    if end != data:
        raise _invalid_weights(name, f"its tensors take {end:,} bytes but {data:,} follow the header", path)


def load_state_dict_file(path: Path, name: str | None = None) -> dict[str, torch.Tensor]:
    """Read weights safely: .safetensors, or a state_dict .pt with weights_only=True. Errors call the
    file ``name`` (default: its file name); a file that cannot hold weights is named invalid before
    anything is loaded (``check_weights_file``)."""
    name = name or path.name
    if not path.exists():
        raise ModelLoadError(f"weights file not found: {name}")
    check_weights_file(path, name)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        try:
            return load_file(str(path))
        except Exception as e:
            raise ModelLoadError(f"{name} is not a valid .safetensors file: {e}") from e
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        msg = _ANSI.sub("", str(e)).splitlines()[0] if str(e) else type(e).__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise TrustError(f"{name} is not a plain state_dict: loading it would run pickled code "
                             f"({_refused_global(e) or msg}). Save weights with torch.save(model.state_dict()) "
                             "or safetensors") from e
        raise ModelLoadError(f"{name} could not be read as a state_dict (corrupt or truncated?): {msg}") from e
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ModelLoadError(f"{name} does not hold a state_dict (a dict of name -> tensor)")
    return obj


def apply_weights(model: nn.Module, state: dict[str, torch.Tensor], name: str = "weights") -> None:
    """load_state_dict(strict) with an error that names the first mismatches."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: file {list(state[k].shape)} vs model {list(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {', '.join(unexpected[:3])}"
                        f"{' ...' if len(unexpected) > 3 else ''}")
    if shapes:
        problems.append(f"shape mismatches ({len(shapes)}): {'; '.join(shapes[:3])}{' ...' if len(shapes) > 3 else ''}")
    if problems:
        raise ModelLoadError(f"{name} do not match the model: " + " | ".join(problems))
    model.load_state_dict(state, strict=True)


def load_model(spec: ModelSpec) -> LoadedModel:
    """Build the model and inputs that ``spec`` describes, on ``spec.device``."""
    torch.manual_seed(spec.seed)
    example: Inputs | None = None
    declared: tuple[InputSpec, ...] | None = None
    notes: list[str] = []
    meta = None
    loss_fn, loss_name, task, num_classes = None, STAND_IN_LOSS_NAME, "unknown", None
    path = Path(spec.path) if spec.path else None
    # Errors name the file as the user knows it (spec.name: an upload is stored under a name of ours,
    # e.g. model.ts.pt, that means nothing to them).
    shown = spec.name or (path.name if path else "")

    if spec.source == "sample":
        from sample_models import SAMPLES, task_loss
        if spec.name not in SAMPLES:
            raise ModelLoadError(f"unknown sample model {spec.name!r}; choose one of {', '.join(SAMPLES)}")
        sample = SAMPLES[spec.name]
        model = sample.build()
        declared = sample.inputs
        loss_fn = task_loss(sample.task, sample.num_classes, spec.seed)
        loss_name = "cross-entropy" + (" over the vocabulary" if sample.task == "lm" else "")
        task, num_classes = sample.task, sample.num_classes
    elif spec.source == "hf":
        from diagnostics.hf import HFSettings, build

        built = build(HFSettings.from_json(spec.hf), spec.device, spec.seed)
        model, declared, meta = built.model, tuple(built.input_specs), built.meta_reason
        loss_fn, loss_name, notes = built.loss_fn, built.loss_name, list(built.notes)
        task = "lm" if built.task in ("causal-lm", "masked-lm", "seq2seq-lm") else "classification"
        num_classes = built.num_classes
    elif spec.source == "torchscript":
        model = _load_torchscript(path, shown)
    elif spec.source == "export":
        model, example = _load_export(path, shown)
        notes.append("a torch.export program keeps the train/eval mode it was exported in: Dropout and "
                     "BatchNorm behave that way in every analysis, whatever mode it asks for")
    elif spec.source == "python":
        model, example, user_loss = _load_python(path, shown)
        if user_loss is not None:
            loss_fn, loss_name = user_loss, "loss_fn() from the uploaded file"
    else:
        model = _load_pickle(path, spec.trust_pickle, shown)

    if spec.weights_path:
        weights = Path(spec.weights_path)
        # An uploaded weights file is stored under a name of ours: then it is named by its role.
        ours = weights.name in WEIGHTS_NAMES
        apply_weights(model, load_state_dict_file(weights, "the weights file" if ours else weights.name),
                      "the weights" if ours else weights.name)

    own = declared if declared is not None else (specs_of(example) if example is not None else None)
    if spec.inputs is not None:
        specs = spec.inputs
    elif declared is not None:
        specs = declared
    elif example is not None:
        specs = specs_of(example)
    else:
        raise SpecError(f"{spec.name} declares no example inputs: enter the input shapes in the sidebar")
    if spec.batch_size is not None:
        specs = with_batch(specs, spec.batch_size)

    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecError(f"device {spec.device} was asked for but CUDA is not available here")
    if meta:  # nothing to move: the parameters and inputs stay on the meta device
        return LoadedModel(spec=spec, model=model, input_specs=specs, inputs=make_inputs(specs, "meta", spec.seed),
                           loss_fn=loss_fn, loss_name=loss_name, task=task, num_classes=num_classes,
                           notes=notes, meta=meta, declared_inputs=own)
    try:
        model = model.to(device)
    except Exception as e:
        raise ModelLoadError(f"could not move the model to {spec.device}: {e}") from e
    if example is not None and spec.inputs is None and specs == specs_of(example):
        inputs = example.map(lambda t: t.to(device))  # the user's own values, e.g. valid token ids
    else:
        inputs = make_inputs(specs, spec.device, spec.seed)
    return LoadedModel(spec=spec, model=model, input_specs=specs, inputs=inputs,
                       loss_fn=loss_fn or default_loss, loss_name=loss_name, task=task, num_classes=num_classes,
                       loss_stand_in=loss_fn is None,
                       notes=notes, declared_inputs=own)
