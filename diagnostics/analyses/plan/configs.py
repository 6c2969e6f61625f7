"""What a plan varies, by name (no torch): dtypes, checkpointing, sharding, modes, and one configuration.

A :class:`Config` is one training step (or one inference pass) to predict: batch, sequence length,
dtype, optimizer, activation checkpointing, sharding over ranks, optimizer-state offload. A
:class:`Setting` is a Config without its batch and sequence length: what the sweeps fit curves for.
The lists of values the options take are parsed here (``"1,2,4,8"``), so the CLI, the page and the
job read them one way.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace

from diagnostics.declare import OptionError
from diagnostics.measure.optimizers import ALL_OPTIMIZERS, DESCRIPTION


@dataclass(frozen=True)
class DType:
    """A precision recipe: the dtype parameters are kept in, and autocast's compute dtype (None: none)."""

    name: str
    param: str  # torch dtype name of the parameters (and of float buffers)
    autocast: str | None
    label: str


DTYPES = {d.name: d for d in [
    DType("fp32", "float32", None, "fp32 weights and compute"),
    DType("bf16", "bfloat16", None, "bf16 weights and compute"),
    DType("fp16", "float16", None, "fp16 weights and compute"),
    DType("amp_bf16", "float32", "bfloat16", "fp32 weights, bf16 autocast"),
    DType("amp_fp16", "float32", "float16", "fp32 weights, fp16 autocast (mixed precision)"),
    DType("fp8", "bfloat16", "float8", "bf16 weights, fp8 matmuls (torchao Float8Linear)"),
]}
#: KV-cache element types for inference.
KV_DTYPES = ("model", "fp32", "bf16", "fp16", "fp8")
KV_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
PARAM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

CHECKPOINTING = {
    "none": "no activation checkpointing",
    "blocks": "every block (each repeated layer of the model) checkpointed",
    "selected": "the blocks named by checkpoint_modules checkpointed",
}
SHARDING = {
    "none": "one device holds everything",
    "zero1": "ZeRO-1: optimizer state sharded over the ranks (DDP + torch's ZeroRedundancyOptimizer)",
    "zero2": "ZeRO-2: optimizer state and gradients sharded (FSDP2, parameters kept gathered after forward)",
    "zero3": "ZeRO-3: parameters, gradients and optimizer state sharded (FSDP2 fully_shard per block)",
}
MODES = ("train", "inference")
OPTIMIZER_NAMES = ALL_OPTIMIZERS


@dataclass(frozen=True)
class Setting:
    """Everything of a configuration but its batch and sequence length."""

    dtype: str = "fp32"
    optimizer: str = "adamw"
    checkpointing: str = "none"
    shard: str = "none"
    ranks: int = 1
    offload: bool = False
    mode: str = "train"
    kv_dtype: str = "model"
    #: the input a sequence length applies to ("": every token input; see parse_seq)
    seq_input: str = ""

    @property
    def label(self) -> str:
        if self.mode == "inference":
            kv = "" if self.kv_dtype == "model" else f", KV {self.kv_dtype}"
            return f"inference {self.dtype}{kv}"
        parts = [self.dtype, self.optimizer]
        if self.checkpointing != "none":
            parts.append(f"checkpoint {self.checkpointing}")
        if self.shard != "none":
            parts.append(f"{self.shard} x{self.ranks}")
        if self.offload:
            parts.append("optimizer state on the CPU")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Setting":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class Config:
    """One configuration to predict: a Setting at one batch and sequence length (None: no token input)."""

    batch: int
    seq: int | None
    setting: Setting

    def with_size(self, batch: int, seq: int | None) -> "Config":
        return replace(self, batch=int(batch), seq=seq)

    def to_dict(self) -> dict:
        return {"batch": self.batch, "seq": self.seq, **self.setting.to_dict()}


# ----------------------------------------------------------------------------- option parsing
def parse_sizes(text, what: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8] (sorted, once each); '' -> []. OptionError naming ``what`` otherwise."""
    if text is None:
        return []
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if isinstance(text, (list, tuple)):
        text = ",".join(map(str, text))
    if not isinstance(text, str):
        raise OptionError(f"option {what}: give whole numbers separated by commas, e.g. 1,2,4, got {text!r}")
    out = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise OptionError(f"option {what}: {part!r} is not a whole number (give e.g. 1,2,4,8)") from None
        if n <= 0:
            raise OptionError(f"option {what}: {n} must be at least 1")
        out.append(n)
    return sorted(set(out))


def sizes_option(what: str):
    """An Option ``check`` that keeps the text but refuses what parse_sizes refuses: '1, 2,4' -> '1,2,4'."""

    def check(value):
        return ",".join(map(str, parse_sizes(value, what)))

    return check


def parse_seq(text) -> tuple[str, list[int]]:
    """The seq option: '2048,4096' -> ('', [2048, 4096]): lengths for every token input;
    'decoder_input_ids=16,32' -> ('decoder_input_ids', [16, 32]): for that input alone (any input with a
    second dimension: tokens, audio samples, frames), every other input keeping its own."""
    if isinstance(text, str) and "=" in text:
        name, _, sizes = text.partition("=")
        name = name.strip()
        if not name.isidentifier():
            raise OptionError(f"option seq: {name!r} is not an input's name (give NAME=LENGTHS, e.g. "
                              "decoder_input_ids=16,32, or lengths alone for every token input)")
        out = parse_sizes(sizes, "seq")
        if not out:
            raise OptionError(f"option seq: no lengths after {name}= (e.g. {name}=16,32)")
        return name, out
    return "", parse_sizes(text, "seq")


def seq_option(value):
    """The seq option's ``check``: refuses what parse_seq refuses, keeps the text tidy ('x= 2,1' -> 'x=1,2')."""
    name, sizes = parse_seq(value)
    return (f"{name}=" if name else "") + ",".join(map(str, sizes))


#: units the budget option takes (bytes per unit); a number alone is bytes
BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "kib": 2**10, "mb": 10**6, "mib": 2**20, "gb": 10**9, "gib": 2**30,
              "tb": 10**12, "tib": 2**40}


def parse_bytes(text, what: str = "budget") -> int | None:
    """'6GiB' -> 6 * 2**30, '500 MB' -> 500e6, '123456' -> 123456; '' -> None; OptionError naming ``what``."""
    import re

    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = str(text)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in BYTE_UNITS:
        raise OptionError(f"option {what}: {text!r} is not an amount of memory (give e.g. 6GiB, 500MB or bytes)")
    n = int(float(m.group(1)) * BYTE_UNITS[unit])
    if n <= 0:
        raise OptionError(f"option {what}: {text!r} must be more than 0 bytes")
    return n


def budget_option(value):
    """The budget option's ``check``: refuses what parse_bytes refuses, keeps the text as given."""
    parse_bytes(value)
    return str(value or "").strip()


def describe_optimizer(name: str) -> str:
    return DESCRIPTION.get(name, name)


def settings_of(options) -> list[Setting]:
    """Every Setting the options ask for (their product), with ranks checked against the sharding."""
    shards = list(options["shard"])
    ranks = options["ranks"]
    sharded = [s for s in shards if s != "none"]
    if sharded and ranks is None:
        raise OptionError(f"sharding {', '.join(sharded)} needs the number of ranks: give --ranks N (2 or more)")
    if sharded and ranks < 2:
        raise OptionError(f"sharding {', '.join(sharded)} over {ranks} rank does nothing: give --ranks 2 or more")
    if options["offload"] and options["mode"] == "inference":
        raise OptionError("offload moves optimizer state to the CPU: it applies to training, not inference")
    if "selected" in options["checkpointing"] and not (options["checkpoint_modules"] or "").strip():
        raise OptionError("checkpointing 'selected' needs checkpoint_modules: module names or patterns, e.g. "
                          "--checkpoint-modules 'model.model.layers.0,model.model.layers.1' or 'layers.*'")
    seq_input = parse_seq(options.get("seq", ""))[0]
    if options["mode"] == "inference":
        return [Setting(dtype=d, optimizer="none", checkpointing="none", shard="none", ranks=1, offload=False,
                        mode="inference", kv_dtype=options["kv_dtype"], seq_input=seq_input) for d in options["dtype"]]
    out = []
    for d, o, c, s in itertools.product(options["dtype"], options["optimizer"], options["checkpointing"], shards):
        out.append(Setting(dtype=d, optimizer=o, checkpointing=c, shard=s, ranks=1 if s == "none" else int(ranks),
                           offload=bool(options["offload"]), mode="train", seq_input=seq_input))
    return out
