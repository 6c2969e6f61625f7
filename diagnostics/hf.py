"""Hugging Face intake: a transformers config -> a model with random weights, its inputs and loss.

A user gives a config (a ``config.json``, or an architecture name plus sizes: ``gpt2:n_layer=2``)
and a task; the model is built with ``AutoModelFor<Task>.from_config`` (random weights, nothing is
downloaded), wrapped so that it takes one positional tensor, and comes with example inputs and the
task's loss:

- ``causal-lm``: ``input_ids`` (int64 in [0, vocab)), the next-token cross-entropy with the inputs as
  labels, the loss ``model(input_ids, labels=input_ids).loss`` gives. The wrapper returns
  ``(logits, input_ids)`` so the loss reads the labels from the output, whatever batch ran.
- ``masked-lm``: the same inputs, cross-entropy of every position against its own token.
- ``sequence-classification`` / ``image-classification``: logits, cross-entropy against fixed
  pseudo-random labels (sample_models.task_loss); images are ``pixel_values`` (float32, N, C, H, W).

A config too big for this machine (weights + gradients + AdamW state over half its free memory, or
``meta="on"``) is built on the meta device: nothing is allocated; parameters are counted exactly
and FLOPs by running the forward pass on fake tensors (see the summary and memory analyses).
- ``seq2seq-lm`` (encoder-decoder configs: T5, BART, ...): keyword inputs ``input_ids`` (batch x seq_len)
  and ``decoder_input_ids`` (batch x decoder_len, default seq_len); the wrapper returns
  ``(logits, decoder_input_ids)`` and the loss is the decoder's next-token cross-entropy (logits at
  position i against decoder token i + 1), exactly ``model(input_ids=..., decoder_input_ids=d,
  labels=L).loss`` with ``L = d`` shifted left by one and its last position ignored (-100): the
  convention of training, where the decoder inputs are the labels shifted right.
transformers is an optional dependency: without it, a clear error says how to install it.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from diagnostics.errors import ModelLoadError, SpecError

TASKS = ("causal-lm", "masked-lm", "seq2seq-lm", "sequence-classification", "image-classification")
#: Short architecture names the sidebar offers (any transformers model_type is accepted).
ARCHITECTURES = ("gpt2", "llama", "mistral", "mixtral", "qwen2", "bert", "roberta", "distilbert", "vit", "t5", "bart")
#: What "meta" may be: auto (meta when the model would not fit), on (always), off (never).
META_MODES = ("auto", "on", "off")
DEFAULT_SEQ_LEN = 128
DEFAULT_BATCH = 2
#: Bytes per fp32 parameter of a training step with AdamW: weights 4 + gradients 4 + state 8.
TRAIN_BYTES_PER_PARAM = 16
#: Keys of a config.json that describe the file, not the model: accepted and not checked.
METADATA_KEYS = {"model_type", "architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype",
                 "auto_map", "_commit_hash", "_attn_implementation_autoset", "name_or_path"}
_LM_TASKS = ("causal-lm", "masked-lm", "seq2seq-lm")
_SUFFIX_TASK = (("ForConditionalGeneration", "seq2seq-lm"), ("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"), ("ForMaskedLM", "masked-lm"),
                ("ForSequenceClassification", "sequence-classification"),
                ("ForImageClassification", "image-classification"))
INSTALL_HINT = "pip install transformers"


def require_transformers():
    try:
        import transformers
    except ImportError as e:
        raise ModelLoadError(f"Hugging Face configs need the transformers package, which is not installed here: "
                             f"{INSTALL_HINT} ({e})") from e
    return transformers


# ----------------------------------------------------------------------------- the spec part
@dataclass(frozen=True)
class HFSettings:
    """What a ModelSpec of source "hf" carries (as canonical JSON in ``ModelSpec.hf``)."""

    config: dict = field(default_factory=dict)  # model_type plus the keys the user set
    task: str | None = None  # None: from the config's architectures / model_type
    seq_len: int = DEFAULT_SEQ_LEN
    meta: str = "auto"
    strict: bool = True  # unknown config keys are an error (typed by hand), else a note (a config.json)
    decoder_len: int | None = None  # seq2seq-lm: decoder tokens per sequence (None: seq_len)

    def __post_init__(self):
        if not isinstance(self.config, dict) or not self.config.get("model_type"):
            raise SpecError("a Hugging Face config needs a model_type (e.g. gpt2, llama, bert, vit)")
        if self.task is not None and self.task not in TASKS:
            raise SpecError(f"unknown Hugging Face task {self.task!r}: one of {', '.join(TASKS)}")
        if int(self.seq_len) <= 0:
            raise SpecError(f"sequence length must be positive, got {self.seq_len}")
        if self.meta not in META_MODES:
            raise SpecError(f"meta must be one of {', '.join(META_MODES)}, got {self.meta!r}")
        if self.decoder_len is not None and int(self.decoder_len) < 2:
            raise SpecError(f"decoder length must be at least 2 (the loss predicts each decoder token from the "
                            f"ones before it), got {self.decoder_len}")

    def to_json(self) -> str:
        d = {"config": self.config, "task": self.task, "seq_len": int(self.seq_len), "meta": self.meta,
             "strict": bool(self.strict)}
        if self.decoder_len is not None:  # only when set: other specs keep their JSON (and cache keys)
            d["decoder_len"] = int(self.decoder_len)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "HFSettings":
        try:
            d = json.loads(text)
        except (TypeError, ValueError) as e:
            raise SpecError(f"the Hugging Face settings are not valid JSON: {e}") from None
        return cls(config=d.get("config") or {}, task=d.get("task"), seq_len=int(d.get("seq_len") or DEFAULT_SEQ_LEN),
                   meta=d.get("meta") or "auto", strict=bool(d.get("strict", True)),
                   decoder_len=None if d.get("decoder_len") is None else int(d["decoder_len"]))

    @property
    def label(self) -> str:
        return str(self.config["model_type"])


def parse_value(text: str):
    """'4096' -> 4096, '0.1' -> 0.1, 'true' -> True, 'null' -> None, '[1,2]' -> [1, 2], else the text."""
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        low = text.lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("none", "null"):
            return None
        return text


def parse_assignments(text: str, where: str = "--hf") -> dict:
    """'n_layer=2,n_embd=128' -> {'n_layer': 2, 'n_embd': 128}; SpecError naming a bad part."""
    out = {}
    for part in re.split(r",(?=\s*[A-Za-z_][\w.]*\s*=)", text):
        if not part.strip():
            continue
        if "=" not in part:
            raise SpecError(f"{where}: {part.strip()!r} is not KEY=VALUE (e.g. n_layer=2)")
        key, value = part.split("=", 1)
        key = key.strip()
        if not re.fullmatch(r"[A-Za-z_]\w*", key):
            raise SpecError(f"{where}: {key!r} is not a config key name")
        out[key] = parse_value(value)
    return out


def read_config_json(data: bytes | str, name: str = "config.json") -> dict:
    """A config.json's dict; SpecError naming the file when it is not a JSON object with a model_type."""
    try:
        d = json.loads(data)
    except (UnicodeDecodeError, ValueError) as e:
        raise SpecError(f"{name} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise SpecError(f"{name} holds a JSON {type(d).__name__}, not an object of config keys")
    if not d.get("model_type"):
        raise SpecError(f"{name} has no model_type key: a transformers config.json names its architecture "
                        "(e.g. \"model_type\": \"llama\")")
    return d


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False where the system refuses to look it up (an ARCH:KEY=VALUE spec
    longer than a file name may be, 255 bytes: ``OSError: [Errno 36] File name too long``)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def parse_hf_arg(text: str, sets: list[str] | tuple = ()) -> tuple[dict, bool]:
    """``--hf`` (ARCH[:KEY=VALUE,...] or a config.json path) plus ``--hf-set KEY=VALUE`` -> (config
    dict, strict): keys typed by hand are checked strictly; a file's unknown keys are only noted."""
    text = (text or "").strip()
    if not text:
        raise SpecError("--hf needs an architecture (e.g. gpt2 or llama:hidden_size=4096) or a config.json path")
    path = Path(text).expanduser()
    if text.endswith(".json") or _is_file(path):
        if not _is_file(path):
            raise SpecError(f"config file not found: {text}")
        config, strict = read_config_json(path.read_bytes(), path.name), False
    else:
        arch, _, rest = text.partition(":")
        config = {"model_type": arch.strip(), **parse_assignments(rest)}
        strict = True
    for s in sets or ():
        config.update(parse_assignments(s, "--hf-set"))
    return config, strict


# ----------------------------------------------------------------------------- building
def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def make_config(config: dict, strict: bool = True):
    """A transformers config object from ``config``; (config, notes). Unknown keys are an error when
    ``strict`` (a typo would silently be ignored by transformers), else listed in the notes."""
    require_transformers()
    from transformers import CONFIG_MAPPING

    model_type = str(config.get("model_type") or "")
    if model_type not in CONFIG_MAPPING:
        raise ModelLoadError(f"unknown Hugging Face model_type {model_type!r}{_suggest(model_type, CONFIG_MAPPING.keys())}; "
                             f"e.g. {', '.join(ARCHITECTURES)}")
    cls = CONFIG_MAPPING[model_type]
    defaults = cls()
    known = set(defaults.to_dict()) | set(getattr(cls, "attribute_map", {}) or {}) | set(vars(defaults))
    keys = {k: v for k, v in config.items() if k not in METADATA_KEYS or k == "architectures"}
    unknown = [k for k in keys if k not in known and not hasattr(defaults, k) and k not in METADATA_KEYS]
    notes = []
    if unknown:
        if strict:
            raise ModelLoadError("; ".join(f"unknown {model_type} config key {k!r}{_suggest(k, known)}"
                                           for k in unknown))
        notes.append(f"config keys {model_type} does not know, kept as attributes: {', '.join(unknown)}")
    try:
        cfg = cls(**keys)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except Exception as e:
        raise ModelLoadError(f"invalid {model_type} config: {type(e).__name__}: {e}") from e
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False  # a training-style forward: no KV cache in the outputs
    return cfg, notes


def _mappings():
    from transformers.models.auto import modeling_auto as ma

    return {"causal-lm": ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "masked-lm": ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
            "seq2seq-lm": ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
            "sequence-classification": ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
            "image-classification": ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES}


def tasks_of(model_type: str) -> list[str]:
    """The tasks transformers has a head for with this model_type, in TASKS order."""
    require_transformers()
    return [t for t, names in _mappings().items() if model_type in names]


def choose_task(cfg, task: str | None) -> str:
    """``task``, checked; else from the config's architectures, else the model_type's heads
    (seq2seq-LM for encoder-decoder configs; masked-LM before causal-LM: encoders such as BERT have
    both, decoders only causal-LM)."""
    model_type = cfg.model_type
    have = tasks_of(model_type)
    if task is not None:
        if task == "sequence-classification" and getattr(cfg, "is_encoder_decoder", False):
            # T5 / BART classify from the decoder's state at an <eos> token, with decoder inputs made from
            # input_ids: random ids have no <eos> (BART refuses) and T5's config lacks a decoder start token.
            raise ModelLoadError(f"{model_type} is an encoder-decoder: its sequence-classification head reads the "
                                 "decoder's state at <eos> tokens, which random token ids do not have; use the "
                                 "seq2seq-lm task (input_ids and decoder_input_ids)")
        if task not in have:
            raise ModelLoadError(f"{model_type} has no {task} head in transformers; its tasks: "
                                 f"{', '.join(have) or 'none of ' + ', '.join(TASKS)}")
        return task
    for arch in getattr(cfg, "architectures", None) or []:
        for suffix, t in _SUFFIX_TASK:
            if str(arch).endswith(suffix) and t in have:
                return t
    if getattr(cfg, "is_encoder_decoder", False) and "seq2seq-lm" in have:
        return "seq2seq-lm"
    for t in ("image-classification", "masked-lm", "causal-lm", "sequence-classification"):
        if t in have:
            return t
    raise ModelLoadError(f"{model_type} has no causal-LM, masked-LM, seq2seq-LM, sequence- or image-classification head in "
                         "transformers: TorchScope cannot pick inputs and a loss for it")


def _auto_class(task: str):
    import transformers

    return {"causal-lm": transformers.AutoModelForCausalLM, "masked-lm": transformers.AutoModelForMaskedLM,
            "seq2seq-lm": transformers.AutoModelForSeq2SeqLM,
            "sequence-classification": transformers.AutoModelForSequenceClassification,
            "image-classification": transformers.AutoModelForImageClassification}[task]


def build_hf_model(cfg, task: str, meta: bool = False):
    """``AutoModelFor<task>.from_config(cfg)`` (random weights), on the meta device when ``meta``."""
    import torch

    try:
        if meta:
            with torch.device("meta"):
                return _auto_class(task).from_config(cfg)
        return _auto_class(task).from_config(cfg)
    except Exception as e:
        raise ModelLoadError(f"transformers could not build {cfg.model_type} for {task}: {type(e).__name__}: {e}") from e


def _task_model_class():
    from torch import nn

    class HFTaskModel(nn.Module):
        """A transformers model behind one positional tensor (input_ids or pixel_values), or, for
        seq2seq-lm, the keyword inputs input_ids and decoder_input_ids. Language models return (logits,
        the ids the loss predicts), so the loss has its labels whatever batch ran."""

        def __init__(self, model, task: str):
            super().__init__()
            self.model = model
            self.task = task

        def forward(self, x=None, input_ids=None, decoder_input_ids=None):
            if self.task == "seq2seq-lm":
                if decoder_input_ids is None:
                    raise TypeError("a seq2seq-lm model needs decoder_input_ids= (keyword inputs input_ids= and "
                                    "decoder_input_ids=)")
                logits = self.model(input_ids=input_ids if input_ids is not None else x,
                                    decoder_input_ids=decoder_input_ids, return_dict=False)[0]
                return logits, decoder_input_ids
            if self.task == "image-classification":
                return self.model(pixel_values=x, return_dict=False)[0]
            logits = self.model(input_ids=x, return_dict=False)[0]
            return (logits, x) if self.task in _LM_TASKS else logits

    return HFTaskModel


def lm_loss(task: str):
    """The loss transformers computes with ``labels=input_ids``: shifted for causal-LM, not for masked-LM;
    for seq2seq-LM the decoder's next token (``labels`` = decoder ids shifted left, last one ignored)."""
    import torch.nn.functional as F

    def loss_fn(output):
        logits, ids = output
        if task in ("causal-lm", "seq2seq-lm"):
            logits, ids = logits[:, :-1], ids[:, 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids.reshape(-1))

    # Each micro-batch's output carries its own labels; a mean over equal micro-batches is the batch's.
    loss_fn.for_rows = lambda output, start, stop, batch: loss_fn(output)
    return loss_fn


def vocab_size(cfg) -> int:
    v = getattr(cfg, "vocab_size", None)
    if not v:
        raise ModelLoadError(f"{cfg.model_type} config has no vocab_size: cannot draw token ids")
    return int(v)


def example_input_specs(cfg, task: str, seq_len: int, batch: int = DEFAULT_BATCH,
                        decoder_len: int | None = None) -> tuple:
    """The model's InputSpecs: token ids for text, pixel_values for images (one positional input);
    for seq2seq-lm the keyword inputs input_ids (batch, seq_len) and decoder_input_ids (batch, decoder_len)."""
    from diagnostics.spec import InputSpec

    if task == "image-classification":
        size = getattr(cfg, "image_size", 224)
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        return (InputSpec((batch, int(getattr(cfg, "num_channels", 3)), int(h), int(w)), "float32"),)
    limit = getattr(cfg, "max_position_embeddings", None)
    if limit and seq_len > int(limit):
        raise SpecError(f"sequence length {seq_len} is longer than the config's max_position_embeddings "
                        f"({limit}): lower it or raise that key")
    if task != "seq2seq-lm":
        if decoder_len is not None:
            raise SpecError(f"a decoder length applies to the seq2seq-lm task (encoder-decoder configs), not {task}")
        return (InputSpec((batch, int(seq_len)), "int64", vocab_size(cfg)),)
    decoder_len = int(seq_len if decoder_len is None else decoder_len)
    if decoder_len < 2:
        raise SpecError(f"decoder length must be at least 2 (the loss predicts each decoder token from the ones "
                        f"before it), got {decoder_len}")
    if limit and decoder_len > int(limit):
        raise SpecError(f"decoder length {decoder_len} is longer than the config's max_position_embeddings "
                        f"({limit}): lower it or raise that key")
    return (InputSpec((batch, int(seq_len)), "int64", vocab_size(cfg), "input_ids"),
            InputSpec((batch, decoder_len), "int64", vocab_size(cfg), "decoder_input_ids"))


def _free_bytes(device: str) -> int:
    import psutil
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return int(psutil.virtual_memory().available)


@dataclass
class HFBuilt:
    model: object  # the HFTaskModel
    task: str
    input_specs: tuple  # InputSpecs: one positional input, or seq2seq-lm's two keyword inputs
    loss_fn: object
    loss_name: str
    num_classes: int | None
    meta_reason: str | None
    notes: list[str]


def count_unique_params(model) -> int:
    from diagnostics.tensors import unique_params

    return sum(p.numel() for p in unique_params(model))


def build(settings: HFSettings, device: str = "cpu", seed: int = 0) -> HFBuilt:
    """Build what ``settings`` describe; on the meta device when it would not fit (see the module doc)."""
    from sample_models import task_loss

    cfg, notes = make_config(settings.config, strict=settings.strict)
    task = choose_task(cfg, settings.task)
    specs = example_input_specs(cfg, task, int(settings.seq_len), decoder_len=settings.decoder_len)
    meta_reason = None
    if settings.meta == "on":
        meta_reason = "built on the meta device as asked (meta=on)"
    elif settings.meta == "auto":
        probe = build_hf_model(cfg, task, meta=True)
        n = count_unique_params(probe)
        need, free = TRAIN_BYTES_PER_PARAM * n, _free_bytes(device)
        if need > free // 2:
            from diagnostics.units import human_bytes

            meta_reason = (f"built on the meta device: its {n:,} parameters need {human_bytes(need)} for fp32 weights, "
                           f"gradients and AdamW state, more than half of the {human_bytes(free)} free on {device}")
        else:
            del probe
    import torch

    torch.manual_seed(seed)
    inner = build_hf_model(cfg, task, meta=meta_reason is not None)
    # Named after what it wraps, so summaries say which transformers class runs (HFTaskModel[GPT2LMHeadModel]).
    wrapper = _task_model_class()
    model = type(f"HFTaskModel[{type(inner).__name__}]", (wrapper,), {"__doc__": wrapper.__doc__})(inner, task)
    if meta_reason:
        notes.append(meta_reason + ": parameters, FLOPs and weight / gradient / optimizer-state memory are "
                     "counted exactly; activations and timings are not measured")
    if task in _LM_TASKS:
        loss_fn, loss_name, num_classes = lm_loss(task), {
            "causal-lm": "causal-LM cross-entropy (next token, labels = input_ids)",
            "masked-lm": "masked-LM cross-entropy (every position against its own token, labels = input_ids)",
            "seq2seq-lm": "seq2seq-LM cross-entropy (the decoder's next token: labels = decoder_input_ids "
                          "shifted left, the last position ignored)"}[task], vocab_size(cfg)
    else:
        num_classes = int(getattr(cfg, "num_labels", 2))
        loss_fn, loss_name = task_loss("classification", num_classes, seed), \
            f"cross-entropy over {num_classes} classes (fixed random labels)"
    notes.insert(0, f"{type(inner).__name__} built from a {cfg.model_type} config with random weights (task "
                    f"{task}; nothing downloaded)")
    return HFBuilt(model=model, task=task, input_specs=specs, loss_fn=loss_fn, loss_name=loss_name,
                   num_classes=num_classes, meta_reason=meta_reason, notes=notes)
