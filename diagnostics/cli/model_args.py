"""Turn the CLI's model arguments into a ModelSpec, the same description the dashboard builds.

``--model`` is a built-in sample name or a file; a file's kind comes from ``--kind`` or is inferred
from its extension (a ``.pt`` is sniffed: diagnostics.uploads.sniff_kind). Inputs are written in the
engine's one grammar (diagnostics.spec.INPUT_GRAMMAR), such as ``8,3,32,32`` or ``8,64:int64``.
Every problem raises UsageError naming the argument, so the CLI can exit 2 with that message.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from diagnostics.errors import SpecError, TorchScopeError
from diagnostics.uploads import sniff_kind
from dataclasses import replace

from diagnostics.spec import DEFAULT_INT_HIGH, InputSpec, ModelSpec, check_input_order
from diagnostics.spec import parse_input as spec_parse_input

#: Extension -> model kind (".pt"/".pth" are sniffed, see infer_kind).
KIND_BY_EXT = {
    ".pt2": "export",
    ".py": "python",
    ".pkl": "pickle",
    ".pickle": "pickle",
    ".ts": "torchscript",
    ".jit": "torchscript",
    ".zip": "torchscript",
}
SNIFFED_EXTS = (".pt", ".pth")
KINDS = ("torchscript", "export", "python", "pickle")


def add_model_args(p, *, default_model: str | None = None, per_rank: bool = False, device: bool = True) -> None:
    """The model description every command takes, as the dashboard's sidebar does: --model, --kind,
    --weights, --trust, --input, --batch-size, --seed, and --device unless ``device`` is False (a
    distributed run picks devices per rank). ``per_rank`` words the inputs and seed for one rank."""
    g = p.add_argument_group("model (the same description as the dashboard's sidebar)")
    g.add_argument("--model", "-m", required=default_model is None, default=default_model, metavar="NAME_OR_PATH",
                   help="a built-in sample (e.g. mlp, cnn, resnet, transformer"
                        + (f"; default {default_model}" if default_model else "") + ") or a model file: TorchScript "
                        "(.pt/.ts), torch.export (.pt2), Python file with build_model() (.py) or pickled module "
                        "(with --trust)")
    g.add_argument("--kind", choices=KINDS, help="the model file's kind, when its extension does not tell")
    g.add_argument("--weights", metavar="PATH", help="weights to load into the model: .safetensors or a "
                                                     "state_dict .pt (read with weights_only=True)")
    g.add_argument("--trust", action="store_true", help="allow loading a pickled module (runs code from the file)")
    g.add_argument("--input", "-i", action="append", metavar="[NAME=]SHAPE[:DTYPE[:HIGH]]", dest="inputs",
                   help=f"one input{' per rank' if per_rank else ''}, batch first, e.g. 8,3,32,32 or "
                        "8,64:int64 (repeat for several inputs; HIGH bounds random integers); NAME= makes it a "
                        "keyword input, forward(NAME=tensor), e.g. input_ids=2,16:int64:32000, given after the "
                        "positional ones. Default: the model's own example inputs")
    g.add_argument("--batch-size", "-b", type=int, metavar="N",
                   help="per-rank batch size (default: the model's)" if per_rank else
                   "override the batch dimension of every input")
    if device:
        g.add_argument("--device", "-d", default="cpu", help="cpu (default), cuda or cuda:N")
    g.add_argument("--seed", type=int, default=0, help="seed for the random inputs and weights (default 0"
                                                       + ("; rank R adds R)" if per_rank else ")"))


class UsageError(TorchScopeError):
    """A bad command line: a missing file, a malformed shape, an unknown sample."""


def parse_input(text: str) -> InputSpec:
    """One --input in the engine's one input grammar (diagnostics.spec.parse_input)."""
    try:
        return spec_parse_input(text)
    except SpecError as e:
        raise UsageError(f"bad --input {e}") from None


def infer_kind(path: Path) -> str:
    """The model kind of ``path`` from its extension; .pt/.pth archives are sniffed for TorchScript."""
    ext = path.suffix.lower()
    if ext in KIND_BY_EXT:
        return KIND_BY_EXT[ext]
    if ext in SNIFFED_EXTS:
        kind = sniff_kind(path)  # a legacy (non-zip) or zip torch.save file: a pickle
        return kind if kind in ("torchscript", "export") else "pickle"
    raise UsageError(f"cannot tell what kind of model {path} is from its extension {ext or '(none)'!r}: "
                     f"pass --kind {'|'.join(KINDS)}")


def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _sample_inputs(name: str):
    from sample_models import SAMPLES

    return SAMPLES[name].inputs if name in SAMPLES else None


def sample_names() -> list[str]:
    from sample_models import SAMPLES

    return list(SAMPLES)


def normalise_device(device: str) -> str:
    device = (device or "cpu").strip().lower()
    if device == "cuda":
        return "cuda:0"  # the dashboard names GPUs cuda:N; the same name keeps cache keys shared
    if device == "gpu":
        return "cuda:0"
    return device


def build_spec(model: str, *, kind: str | None = None, weights: str | None = None, trust: bool = False,
               inputs: list[str] | None = None, batch_size: int | None = None, device: str = "cpu",
               seed: int = 0) -> ModelSpec:
    """A ModelSpec for a sample name or a model file, validated here (files must exist)."""
    if not model:
        raise UsageError("--model is required: a sample name (e.g. resnet) or a model file")
    path = Path(model).expanduser()
    parsed = tuple(parse_input(t) for t in inputs or [])
    try:
        check_input_order(parsed)
    except SpecError as e:
        raise UsageError(f"bad --input: {e}") from None
    if batch_size is not None and batch_size <= 0:
        raise UsageError(f"bad --batch-size {batch_size}: must be a positive integer")
    weights_path = None
    if weights:
        weights_path = Path(weights).expanduser()
        if not weights_path.is_file():
            raise UsageError(f"weights file not found: {weights}")
    try:
        if path.is_file() or kind is not None:
            if not path.is_file():
                raise UsageError(f"model file not found: {model}")
            kind = kind or infer_kind(path)
            if kind not in KINDS:
                raise UsageError(f"unknown --kind {kind!r}: one of {', '.join(KINDS)}")
            digest = file_digest(path) + (file_digest(weights_path)[:16] if weights_path else "")
            specs = tuple(i if i.high is not None or i.dtype not in ("int64", "int32")
                          else replace(i, high=DEFAULT_INT_HIGH) for i in parsed) or None
            return ModelSpec(source=kind, name=path.name[:80], path=str(path.resolve()),
                             weights_path=str(weights_path.resolve()) if weights_path else None,
                             file_sha256=digest, trust_pickle=trust, inputs=specs, batch_size=batch_size,
                             device=normalise_device(device), seed=seed)
        if any(c in model for c in "/\\") or Path(model).suffix != "":
            raise UsageError(f"model file not found: {model}")  # a path, not a sample name
        names = sample_names()
        if model not in names:
            raise UsageError(f"unknown model {model!r}: not a file and not a built-in sample "
                             f"({', '.join(names)})")
        specs = None
        if parsed:
            declared = _sample_inputs(model) or ()
            specs = tuple(
                i if i.high is not None or i.dtype not in ("int64", "int32")
                else replace(i, high=declared[n].high if n < len(declared) and declared[n].high
                             else DEFAULT_INT_HIGH)
                for n, i in enumerate(parsed))
        return ModelSpec(source="sample", name=model, weights_path=str(weights_path.resolve()) if weights_path
                         else None, file_sha256=file_digest(weights_path)[:16] if weights_path else None,
                         inputs=specs, batch_size=batch_size, device=normalise_device(device), seed=seed)
    except SpecError as e:
        raise UsageError(str(e)) from None
