"""A plain, serializable description of a model and its inputs.

A ``ModelSpec`` says *where* the model comes from (a built-in sample, or an uploaded file and its
kind), *what* inputs to feed it (shapes, dtypes) and *where* to run it (device). It never holds a
module or a tensor, so it crosses process boundaries, goes into SQLite and keys caches.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from diagnostics.errors import SpecError

#: Where a model can come from.
SOURCES = ("sample", "torchscript", "export", "python", "pickle")

#: dtypes an input may have, by the name users type.
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool")

MAX_INPUT_ELEMENTS = 2**31 - 1
#: Integer inputs whose range nobody gave (token or class ids) are drawn from [0, this).
DEFAULT_INT_HIGH = 1000


@dataclass(frozen=True)
class InputSpec:
    """One positional input: its full shape (batch first), dtype and, for integers, the range."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None  # exclusive upper bound for integer inputs (e.g. vocabulary size)

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
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

    def __post_init__(self):
        if self.source not in SOURCES:
            raise SpecError(f"unknown model source {self.source!r}; one of {', '.join(SOURCES)}")
        if self.source != "sample" and not self.path:
            raise SpecError(f"a {self.source} model needs a file path")
        if self.batch_size is not None and int(self.batch_size) <= 0:
            raise SpecError(f"batch size must be positive, got {self.batch_size}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise SpecError(f"unknown device {self.device!r}; use 'cpu' or 'cuda:N'")
        if self.inputs is not None:
            object.__setattr__(
                self,
                "inputs",
                tuple(i if isinstance(i, InputSpec) else InputSpec(**i) for i in self.inputs),
            )

    # -- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["inputs"] = None if self.inputs is None else [
            {"shape": list(i.shape), "dtype": i.dtype, "high": i.high} for i in self.inputs
        ]
        d["extra"] = [list(kv) for kv in self.extra]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        d = dict(d)
        if d.get("inputs") is not None:
            d["inputs"] = tuple(InputSpec(tuple(i["shape"]), i.get("dtype", "float32"), i.get("high"))
                                for i in d["inputs"])
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


def cache_key(spec: ModelSpec, analysis: str, options: dict | None) -> str:
    """A stable key for (spec, analysis, options): the same key means the same computation."""
    payload = json.dumps(
        {"spec": spec.to_dict(), "analysis": analysis, "options": options or {}},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]
