"""A plain, serializable description of a model and its inputs.

A ``ModelSpec`` says *where* the model comes from (a built-in sample, or an uploaded file and its
kind), *what* inputs to feed it (shapes, dtypes) and *where* to run it (device). It never holds a
module or a tensor, so it crosses process boundaries, goes into SQLite and keys caches.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, replace

from diagnostics.errors import SpecError

#: Where a model can come from.
SOURCES = ("sample", "torchscript", "export", "python", "pickle", "hf")

#: dtypes an input may have, by the name users type.
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool")

MAX_INPUT_ELEMENTS = 2**31 - 1
#: Integer inputs whose range nobody gave (token or class ids) are drawn from [0, this).
DEFAULT_INT_HIGH = 1000


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class InputSpec:
    """One input: its full shape (batch first), dtype, for integers the range, and for a keyword input
    its name (``model(..., name=tensor)``); ``name`` None is a positional input."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None  # exclusive upper bound for integer inputs (e.g. vocabulary size)
    name: str | None = None  # keyword inputs only

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.name is not None and not (isinstance(self.name, str) and _NAME.fullmatch(self.name)):
            raise SpecError(f"input name {self.name!r} is not a Python identifier (a keyword argument of forward())")
        if self.dtype not in DTYPES:
            raise SpecError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if any(s <= 0 for s in self.shape):
            raise SpecError(f"input shape {list(self.shape)} has a dimension <= 0")
        n = 1
        for s in self.shape:
            n *= s
        if n > MAX_INPUT_ELEMENTS:
            raise SpecError(f"input shape {list(self.shape)} has {n:,} elements, too many")

    def with_batch(self, batch_size: int) -> "InputSpec":
        if not self.shape:
            return self
        return replace(self, shape=(int(batch_size),) + self.shape[1:])

    def to_dict(self) -> dict:
        d = {"shape": list(self.shape), "dtype": self.dtype, "high": self.high}
        if self.name is not None:  # positional inputs serialise as before: their cache keys stay
            d["name"] = self.name
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "InputSpec":
        return cls(tuple(d["shape"]), d.get("dtype", "float32"), d.get("high"), d.get("name"))


def check_input_order(specs) -> None:
    """Positional inputs first, then keyword inputs, each name once: SpecError naming the problem."""
    seen: set[str] = set()
    for n, s in enumerate(specs):
        if s.name is None and seen:
            raise SpecError(f"positional input {n + 1} comes after keyword input(s) "
                            f"{', '.join(sorted(seen))}: give positional inputs first")
        if s.name is not None:
            if s.name in seen:
                raise SpecError(f"keyword input {s.name!r} is given twice")
            seen.add(s.name)


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a model and its inputs in another process."""

    source: str = "sample"
    name: str = "mlp"  # sample name, or a display name for uploads
    path: str | None = None  # stored model file (never the user's file name)
    weights_path: str | None = None  # optional .safetensors / state_dict .pt
    file_sha256: str | None = None  # content hash of path + weights, so caches follow content
    trust_pickle: bool = False
    inputs: tuple[InputSpec, ...] | None = None  # None: the model's own example inputs
    batch_size: int | None = None  # None: the model's default
    device: str = "cpu"
    seed: int = 0
    extra: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    #: source "hf": a transformers config, task, sequence length (diagnostics.hf.HFSettings as JSON)
    hf: str | None = None

    def __post_init__(self):
        if self.source not in SOURCES:
            raise SpecError(f"unknown model source {self.source!r}; one of {', '.join(SOURCES)}")
        if self.source == "hf":
            if not self.hf:
                raise SpecError("a Hugging Face model needs its config (ModelSpec.hf)")
            if self.file_sha256 is None:  # the config's content identifies the model (caches, widget keys)
                object.__setattr__(self, "file_sha256", hashlib.sha256(self.hf.encode()).hexdigest()[:16])
        elif self.source != "sample" and not self.path:
            raise SpecError(f"a {self.source} model needs a file path")
        if self.batch_size is not None and int(self.batch_size) <= 0:
            raise SpecError(f"batch size must be positive, got {self.batch_size}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise SpecError(f"unknown device {self.device!r}; use 'cpu' or 'cuda:N'")
        if self.inputs is not None:
            object.__setattr__(
                self,
                "inputs",
                tuple(i if isinstance(i, InputSpec) else InputSpec.from_dict(i) for i in self.inputs),
            )
            check_input_order(self.inputs)

    # -- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["inputs"] = None if self.inputs is None else [i.to_dict() for i in self.inputs]
        d["extra"] = [list(kv) for kv in self.extra]
        if d.get("hf") is None:
            d.pop("hf", None)  # specs of other sources keep the dict (and cache keys) they had
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        d = dict(d)
        if d.get("inputs") is not None:
            d["inputs"] = tuple(InputSpec.from_dict(i) for i in d["inputs"])
        d["extra"] = tuple(tuple(kv) for kv in d.get("extra") or ())
        known = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelSpec":
        return cls.from_dict(json.loads(text))

    @property
    def label(self) -> str:
        """A short human name: 'resnet (sample)' or 'my_model.pt2 (export)'."""
        return f"{self.name} ({self.source})"


# ----------------------------------------------------------------------------- input grammar
#: How an input is written, wherever it is typed (the CLI's --input, the sidebar's upload form):
#: [NAME=]SHAPE[:DTYPE[:HIGH]], the shape batch first ("8,3,32,32", "8x3x32x32" or "(8, 3, 32, 32)"),
#: HIGH the exclusive upper bound of random integers (token or class ids), NAME a keyword input
#: (forward(..., NAME=tensor)); positional inputs come first, in order.
INPUT_GRAMMAR = "[NAME=]SHAPE[:DTYPE[:HIGH]], e.g. 8,3,32,32 or 8,64:int64 or input_ids=8,64:int64:32000"


def parse_shape(text: str) -> tuple[int, ...]:
    """'8,3,32,32' / '8x3x32x32' / '(8, 3, 32, 32)' -> (8, 3, 32, 32); SpecError naming the shape."""
    body = text.strip().strip("()[] ")
    sep = "x" if re.fullmatch(r"\d+(\s*x\s*\d+)+", body) else ","  # 8x3x32x32, else commas
    parts = [p.strip() for p in body.split(sep)]
    parts = parts[:-1] if len(parts) > 1 and parts[-1] == "" else parts  # a trailing comma: (8,)
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise SpecError(f"shape {text.strip()!r}: dimensions must be positive integers separated by commas, "
                        "batch first, e.g. 8,3,32,32")
    return shape


def parse_input(text: str, default_dtype: str = "float32", default_high: int | None = None) -> InputSpec:
    """One input in the grammar above; integer inputs without a HIGH get ``default_high``.

    Errors are SpecErrors naming the part that is wrong and the whole text ("dtype 'int8' in
    '8,16:int8': ..."); callers prefix where it was typed ("bad --input ...")."""
    name = None
    body = text.strip()
    if "=" in body:
        name, _, body = (p.strip() for p in body.partition("="))
        if not _NAME.fullmatch(name):
            raise SpecError(f"input name {name!r} in {text.strip()!r}: a keyword argument of forward() "
                            f"(a Python identifier); write {INPUT_GRAMMAR}")
    parts = body.split(":")
    if len(parts) > 3 or not parts[0].strip():
        raise SpecError(f"{text.strip()!r}: write {INPUT_GRAMMAR}")
    try:
        shape = parse_shape(parts[0])
    except SpecError as e:
        raise SpecError(f"{e} (in {text.strip()!r})") from None
    dtype = parts[1].strip() if len(parts) > 1 and parts[1].strip() else default_dtype
    if dtype not in DTYPES:
        raise SpecError(f"dtype {dtype!r} in {text.strip()!r}: choose one of {', '.join(DTYPES)}")
    high = default_high if dtype in ("int64", "int32") else None
    if len(parts) == 3:
        try:
            high = int(parts[2])
        except ValueError:
            raise SpecError(f"HIGH {parts[2].strip()!r} in {text.strip()!r}: an integer, the exclusive upper bound "
                            "of random integer values") from None
        if high <= 0:
            raise SpecError(f"HIGH {high} in {text.strip()!r}: must be positive")
    return InputSpec(shape, dtype, high, name)


def parse_inputs(texts, default_dtype: str = "float32", default_high: int | None = None
                 ) -> tuple[InputSpec, ...] | None:
    """Several inputs: a list of texts, or one text with inputs separated by ';'. None when empty
    (the model's own example inputs are used)."""
    if isinstance(texts, str):
        texts = texts.split(";")
    specs = tuple(parse_input(t, default_dtype, default_high) for t in texts if t.strip())
    check_input_order(specs)
    return specs or None


def cache_key(spec: ModelSpec, analysis: str, options: dict | None) -> str:
    """A stable key for (spec, analysis, options): the same key means the same computation."""
    payload = json.dumps(
        {"spec": spec.to_dict(), "analysis": analysis, "options": options or {}},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]
