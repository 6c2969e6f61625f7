"""Turn the CLI's model arguments into a ModelSpec, the same description the dashboard builds.

``--model`` is a built-in sample name or a file; a file's kind comes from ``--kind`` (checked against
its contents) or from its contents (diagnostics.uploads.detect_kind). Inputs are written in the
engine's one grammar (diagnostics.spec.INPUT_GRAMMAR), such as ``8,3,32,32`` or ``8,64:int64``.
Every problem raises UsageError naming the argument, so the CLI can exit 2 with that message.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from diagnostics.errors import ModelLoadError, SpecError, TorchScopeError
from diagnostics.uploads import check_kind, detect_kind
from dataclasses import replace

from diagnostics.spec import DEFAULT_INT_HIGH, InputSpec, ModelSpec, check_input_order
from diagnostics.spec import parse_input as spec_parse_input

KINDS = ("torchscript", "export", "python", "pickle")


def add_model_args(p, *, default_model: str | None = None, per_rank: bool = False, device: bool = True) -> None:
    """The model description every command takes, as the dashboard's sidebar does: --model, --kind,
    --weights, --trust, --input, --batch-size, --seed, and --device unless ``device`` is False (a
    distributed run picks devices per rank). ``per_rank`` words the inputs and seed for one rank."""
    g = p.add_argument_group("model (the same description as the dashboard's sidebar)")
    g.add_argument("--model", "-m", required=default_model is None and per_rank, default=default_model,
                   metavar="NAME_OR_PATH",
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
    if not per_rank:
        add_hf_args(p)


def add_hf_args(p) -> None:
    """A Hugging Face config instead of --model: built with random weights, nothing downloaded."""
    from diagnostics.hf import DEFAULT_SEQ_LEN, TASKS

    g = p.add_argument_group("Hugging Face config (instead of --model; needs transformers, nothing is downloaded)")
    g.add_argument("--hf", metavar="ARCH[:KEY=VALUE,...]|CONFIG_JSON",
                   help="a transformers architecture and its sizes, e.g. gpt2:n_layer=2,n_embd=128 or "
                        "llama:hidden_size=4096,num_hidden_layers=32, or a config.json file; the model is built "
                        "with random weights")
    g.add_argument("--hf-set", action="append", metavar="KEY=VALUE", default=None,
                   help="set one config key (repeatable; after the --hf keys or file)")
    g.add_argument("--hf-task", choices=TASKS, help="the head and loss (default: from the config's architectures, "
                                                    "else masked-lm for encoders, causal-lm for decoders)")
    g.add_argument("--seq-len", type=int, metavar="N", help=f"tokens per sequence (default {DEFAULT_SEQ_LEN})")
    g.add_argument("--decoder-len", type=int, metavar="N",
                   help="seq2seq-lm (encoder-decoder configs: t5, bart): decoder tokens per sequence, the length of "
                        "decoder_input_ids (default: --seq-len)")
    g.add_argument("--hf-meta", action="store_true",
                   help="build on the meta device even when the model fits: counts only (parameters, FLOPs, "
                        "weight / gradient / optimizer memory), nothing allocated or timed")


class UsageError(TorchScopeError):
    """A bad command line: a missing file, a malformed shape, an unknown sample."""


def parse_input(text: str) -> InputSpec:
    """One --input in the engine's one input grammar (diagnostics.spec.parse_input)."""
    try:
        return spec_parse_input(text)
    except SpecError as e:
        raise UsageError(f"bad --input {e}") from None


def infer_kind(path: Path) -> str:
    """The model kind of ``path`` from its contents (diagnostics.uploads.detect_kind, as the sidebar's
    'Detect from the file')."""
    try:
        return detect_kind(path, str(path))
    except ModelLoadError as e:
        raise UsageError(f"{e}: pass --kind {'|'.join(KINDS)}") from None


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


def hf_spec(hf: str, *, hf_set: list[str] | None = None, hf_task: str | None = None, seq_len: int | None = None,
            hf_meta: bool = False, decoder_len: int | None = None, batch_size: int | None = None, device: str = "cpu", seed: int = 0) -> ModelSpec:
    """A ModelSpec for --hf (an architecture with sizes, or a config.json). The config's keys are
    checked in the worker, where transformers is imported (an unknown key is an error there)."""
    from diagnostics.hf import DEFAULT_SEQ_LEN, HFSettings, parse_hf_arg

    if seq_len is not None and seq_len <= 0:
        raise UsageError(f"bad --seq-len {seq_len}: must be a positive integer")
    if decoder_len is not None and decoder_len < 2:
        raise UsageError(f"bad --decoder-len {decoder_len}: must be at least 2 (the loss predicts each decoder "
                         "token from the ones before it)")
    if batch_size is not None and batch_size <= 0:
        raise UsageError(f"bad --batch-size {batch_size}: must be a positive integer")
    try:
        config, strict = parse_hf_arg(hf, hf_set or ())
        settings = HFSettings(config, hf_task, seq_len or DEFAULT_SEQ_LEN, "on" if hf_meta else "auto", strict,
                              decoder_len)
        return ModelSpec(source="hf", name=str(config["model_type"])[:80], hf=settings.to_json(),
                         batch_size=batch_size, device=normalise_device(device), seed=seed)
    except SpecError as e:
        raise UsageError(f"bad --hf: {e}") from None


def _model_device(args) -> str:
    """--device, or the CPU for a command whose --device is an option of its analysis (the plan's)."""
    device = getattr(args, "device", None)
    return device if isinstance(device, str) and not hasattr(args, "opt_device") else "cpu"


def spec_from_args(args) -> ModelSpec:
    """The ModelSpec of a command's model arguments: --model (sample or file) or --hf."""
    hf = getattr(args, "hf", None)
    hf_only = {"--hf-set": getattr(args, "hf_set", None), "--hf-task": getattr(args, "hf_task", None),
               "--seq-len": getattr(args, "seq_len", None), "--hf-meta": getattr(args, "hf_meta", False),
               "--decoder-len": getattr(args, "decoder_len", None)}
    if hf is None:
        given = [flag for flag, v in hf_only.items() if v]
        if given:
            raise UsageError(f"{', '.join(given)} need --hf (a Hugging Face config)")
        return build_spec(args.model, kind=args.kind, weights=args.weights, trust=args.trust, inputs=args.inputs,
                          batch_size=args.batch_size, device=_model_device(args), seed=args.seed)
    if args.model:
        raise UsageError("--model and --hf are two model sources: give one")
    others = [flag for flag, v in (("--kind", args.kind), ("--weights", args.weights), ("--input", args.inputs),
                                   ("--trust", args.trust)) if v]
    if others:
        raise UsageError(f"{', '.join(others)} do not apply to --hf: its inputs come from the config "
                         "(--seq-len, --batch-size) and its weights are random")
    return hf_spec(hf, hf_set=args.hf_set, hf_task=args.hf_task, seq_len=args.seq_len, hf_meta=args.hf_meta,
                   decoder_len=args.decoder_len,
                   batch_size=args.batch_size, device=_model_device(args), seed=args.seed)


def build_spec(model: str, *, kind: str | None = None, weights: str | None = None, trust: bool = False,
               inputs: list[str] | None = None, batch_size: int | None = None, device: str = "cpu",
               seed: int = 0) -> ModelSpec:
    """A ModelSpec for a sample name or a model file, validated here (files must exist)."""
    if not model:
        raise UsageError("--model (a sample name such as resnet, or a model file) or --hf (a Hugging Face "
                         "config) is required")
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
            if kind is None:
                kind = infer_kind(path)
            elif kind not in KINDS:
                raise UsageError(f"unknown --kind {kind!r}: one of {', '.join(KINDS)}")
            else:
                try:
                    check_kind(path, path.name, kind, lambda found: f"pass --kind {found}, or leave --kind out")
                except ModelLoadError as e:
                    raise UsageError(str(e)) from None
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
