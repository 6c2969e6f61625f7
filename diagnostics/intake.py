"""Turn a ModelSpec into a live model and its inputs: samples, uploads, weights.

``load_model(spec)`` is the only place that executes or unpickles what a user gave. Weights are
read with ``weights_only=True`` (``diagnostics.weights``); a full pickled module needs ``spec.trust_pickle`` and is refused
outright, like Python files, in server-safe mode (``TORCHSCOPE_SAFE_MODE=1``).
Every failure raises a ModelLoadError whose message names the problem.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import pickle
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
from diagnostics.weights import apply_weights, load_state_dict_file, refused_global


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
        found = refused_global(e)
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


@dataclass
class _Built:
    """What a model's source gives before inputs and device: the model, its example or declared inputs,
    its loss and task when it knows them, notes, and why it stays on the meta device (hf only)."""

    model: nn.Module
    example: Inputs | None = None
    declared: tuple[InputSpec, ...] | None = None
    notes: list[str] = field(default_factory=list)
    meta: str | None = None
    loss_fn: Callable | None = None
    loss_name: str = STAND_IN_LOSS_NAME
    task: str = "unknown"
    num_classes: int | None = None


def _build_sample(spec: ModelSpec) -> _Built:
    from sample_models import SAMPLES, task_loss
    if spec.name not in SAMPLES:
        raise ModelLoadError(f"unknown sample model {spec.name!r}; choose one of {', '.join(SAMPLES)}")
    sample = SAMPLES[spec.name]
    return _Built(sample.build(), declared=sample.inputs, loss_fn=task_loss(sample.task, sample.num_classes, spec.seed),
                  loss_name="cross-entropy" + (" over the vocabulary" if sample.task == "lm" else ""),
                  task=sample.task, num_classes=sample.num_classes)


def _build_hf(spec: ModelSpec) -> _Built:
    from diagnostics.hf import HFSettings, build

    built = build(HFSettings.from_json(spec.hf), spec.device, spec.seed)
    task = "lm" if built.task in ("causal-lm", "masked-lm", "seq2seq-lm") else "classification"
    return _Built(built.model, declared=tuple(built.input_specs), meta=built.meta_reason, loss_fn=built.loss_fn,
                  loss_name=built.loss_name, notes=list(built.notes), task=task, num_classes=built.num_classes)


def _build_from_source(spec: ModelSpec, path: Path | None, shown: str) -> _Built:
    """The model as ``spec.source`` makes it: a sample, a transformers config, or an uploaded file."""
    if spec.source == "sample":
        return _build_sample(spec)
    if spec.source == "hf":
        return _build_hf(spec)
    if spec.source == "torchscript":
        return _Built(_load_torchscript(path, shown))
    if spec.source == "export":
        model, example = _load_export(path, shown)
        return _Built(model, example=example,
                      notes=["a torch.export program keeps the train/eval mode it was exported in: Dropout and "
                             "BatchNorm behave that way in every analysis, whatever mode it asks for"])
    if spec.source == "python":
        model, example, user_loss = _load_python(path, shown)
        if user_loss is not None:
            return _Built(model, example=example, loss_fn=user_loss, loss_name="loss_fn() from the uploaded file")
        return _Built(model, example=example)
    return _Built(_load_pickle(path, spec.trust_pickle, shown))


def _apply_spec_weights(model: nn.Module, spec: ModelSpec) -> None:
    weights = Path(spec.weights_path)
    # An uploaded weights file is stored under a name of ours: then it is named by its role.
    ours = weights.name in WEIGHTS_NAMES
    apply_weights(model, load_state_dict_file(weights, "the weights file" if ours else weights.name),
                  "the weights" if ours else weights.name)


def _input_specs(spec: ModelSpec, built: _Built) -> tuple[InputSpec, ...]:
    """The inputs to make: the spec's own, else what the model declares or its example's shapes; at the
    spec's batch size when it sets one."""
    if spec.inputs is not None:
        specs = spec.inputs
    elif built.declared is not None:
        specs = built.declared
    elif built.example is not None:
        specs = specs_of(built.example)
    else:
        raise SpecError(f"{spec.name} declares no example inputs: enter the input shapes in the sidebar")
    if spec.batch_size is not None:
        specs = with_batch(specs, spec.batch_size)
    return specs


def load_model(spec: ModelSpec) -> LoadedModel:
    """Build the model and inputs that ``spec`` describes, on ``spec.device``."""
    torch.manual_seed(spec.seed)
    path = Path(spec.path) if spec.path else None
    # Errors name the file as the user knows it (spec.name: an upload is stored under a name of ours,
    # e.g. model.ts.pt, that means nothing to them).
    shown = spec.name or (path.name if path else "")
    built = _build_from_source(spec, path, shown)
    model, example, loss_fn = built.model, built.example, built.loss_fn
    if spec.weights_path:
        _apply_spec_weights(model, spec)

    own = built.declared if built.declared is not None else (specs_of(example) if example is not None else None)
    specs = _input_specs(spec, built)
    device = torch.device(spec.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecError(f"device {spec.device} was asked for but CUDA is not available here")
    if built.meta:  # nothing to move: the parameters and inputs stay on the meta device
        return LoadedModel(spec=spec, model=model, input_specs=specs, inputs=make_inputs(specs, "meta", spec.seed),
                           loss_fn=loss_fn, loss_name=built.loss_name, task=built.task,
                           num_classes=built.num_classes, notes=built.notes, meta=built.meta, declared_inputs=own)
    try:
        model = model.to(device)
    except Exception as e:
        raise ModelLoadError(f"could not move the model to {spec.device}: {e}") from e
    if example is not None and spec.inputs is None and specs == specs_of(example):
        inputs = example.map(lambda t: t.to(device))  # the user's own values, e.g. valid token ids
    else:
        inputs = make_inputs(specs, spec.device, spec.seed)
    return LoadedModel(spec=spec, model=model, input_specs=specs, inputs=inputs,
                       loss_fn=loss_fn or default_loss, loss_name=built.loss_name, task=built.task,
                       num_classes=built.num_classes, loss_stand_in=loss_fn is None,
                       notes=built.notes, declared_inputs=own)
