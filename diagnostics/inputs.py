"""A model's inputs, positional and by keyword: the one place that makes, scales, describes and feeds them.

The structure is a tuple of ``spec.InputSpec``: positional inputs first (``name`` None), then keyword
inputs (``name`` set), as ``example_inputs()`` declares them:

* a tensor or a tuple of tensors: positional inputs, ``model(*args)``;
* a dict of name -> tensor: keyword inputs, ``model(**kwargs)`` (encoder-decoder and audio models:
  ``input_ids=``, ``decoder_input_ids=``, ``input_features=``);
* an ``(args, kwargs)`` pair: both, ``model(*args, **kwargs)``.

The live tensors are an ``Inputs``: a tuple of every tensor (positional ones, then keyword ones) that
knows which of them are keywords. Code that counts or moves tensors iterates it like a tuple; code
that runs the model calls ``call(model, inputs)`` (or ``inputs.call(model)``), never ``model(*inputs)``,
which would pass keyword inputs by position. A plain tuple is accepted everywhere (positional inputs).
"""

from __future__ import annotations

from typing import Callable

import torch

from diagnostics.errors import SpecError
from diagnostics.spec import InputSpec, check_input_order

DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class Inputs(tuple):
    """Every input tensor, positional ones first; the last ``len(names)`` are keyword inputs."""

    def __new__(cls, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        self = super().__new__(cls, tuple(args) + tuple(kwargs.values()))
        self.names = tuple(kwargs)
        return self

    @property
    def args(self) -> tuple:
        return tuple(self[:len(self) - len(self.names)])

    @property
    def kwargs(self) -> dict:
        return dict(zip(self.names, self[len(self) - len(self.names):]))

    def call(self, model):
        return model(*self.args, **self.kwargs)

    def map(self, fn: Callable) -> "Inputs":
        """The same structure with ``fn`` applied to every element (tensor or not)."""
        return Inputs([fn(x) for x in self.args], {k: fn(v) for k, v in self.kwargs.items()})

    def labelled(self) -> list[tuple[str, object]]:
        """(label, tensor) per input: 'input 1', 'input 2' ... for positional ones, the name for keywords."""
        return [(f"input {n + 1}", x) for n, x in enumerate(self.args)] + list(self.kwargs.items())

    def __repr__(self) -> str:
        return f"Inputs(args={self.args!r}, kwargs={self.kwargs!r})"


def as_inputs(inputs) -> Inputs:
    """An Inputs from an Inputs, a tuple / list of positional inputs, a tensor or a dict of keyword inputs."""
    if isinstance(inputs, Inputs):
        return inputs
    if isinstance(inputs, torch.Tensor):
        return Inputs((inputs,))
    if isinstance(inputs, dict):
        return Inputs((), inputs)
    return Inputs(tuple(inputs))


def with_names(inputs, specs) -> Inputs:
    """``inputs`` as an Inputs whose last tensors are keyword inputs named as in ``specs``."""
    if isinstance(inputs, Inputs) and inputs.names:
        return inputs
    names = [s.name for s in specs if s.name is not None]
    flat = tuple(inputs)
    if not names:
        return Inputs(flat)
    if len(flat) < len(names):
        raise SpecError(f"{len(flat)} input tensors for {len(specs)} declared inputs")
    return Inputs(flat[:len(flat) - len(names)], dict(zip(names, flat[len(flat) - len(names):])))


def call(model, inputs):
    """``model`` called with ``inputs``: positional ones by position, keyword ones by name."""
    return as_inputs(inputs).call(model)


def kwargs_of(inputs) -> dict:
    return as_inputs(inputs).kwargs


def tensors(inputs) -> list[torch.Tensor]:
    return [x for x in as_inputs(inputs) if isinstance(x, torch.Tensor)]


# ----------------------------------------------------------------------------- specs <-> tensors
def make_inputs(specs, device: str = "cpu", seed: int = 0) -> Inputs:
    """Deterministic random tensors for the given input specs (positional ones, then keyword ones)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in specs:
        dt = DTYPES[s.dtype]
        if dt.is_floating_point:
            t = torch.randn(s.shape, generator=g).to(dt)
        elif dt == torch.bool:
            t = torch.randint(0, 2, s.shape, generator=g).bool()
        else:
            t = torch.randint(0, s.high or 2, s.shape, generator=g).to(dt)
        out.append(t.to(device))
    return with_names(out, specs)


def spec_of(t: torch.Tensor, name: str | None = None) -> InputSpec:
    """The InputSpec of a tensor: shape, dtype, and for integers max + 1 as the range."""
    if not isinstance(t, torch.Tensor):
        raise SpecError(f"example input {name or ''} is a {type(t).__name__}, not a tensor".replace("  ", " "))
    if t.dtype not in DTYPE_NAMES:
        raise SpecError(f"example input{' ' + name if name else ''} of dtype {t.dtype} is not supported")
    high = int(t.max().item()) + 1 if (not t.dtype.is_floating_point and t.dtype != torch.bool and t.numel()) else None
    return InputSpec(tuple(t.shape), DTYPE_NAMES[t.dtype], high, name)


def specs_of(inputs) -> tuple[InputSpec, ...]:
    inputs = as_inputs(inputs)
    return tuple(spec_of(t) for t in inputs.args) + tuple(spec_of(t, k) for k, t in inputs.kwargs.items())


EXAMPLE_FORMS = ("a tensor, a tuple of tensors (positional inputs), a dict of name -> tensor (keyword inputs) "
                 "or an (args, kwargs) pair")


def from_example(example, where: str = "example_inputs()") -> Inputs:
    """What an ``example_inputs()`` returned, as an Inputs; SpecError naming what is wrong."""
    if isinstance(example, torch.Tensor):
        return Inputs((example,))
    if isinstance(example, dict):
        args, kwargs = (), example
    elif (isinstance(example, (tuple, list)) and len(example) == 2 and isinstance(example[0], (tuple, list))
          and isinstance(example[1], dict)):
        args, kwargs = tuple(example[0]), example[1]
    elif isinstance(example, (tuple, list)):
        args, kwargs = tuple(example), {}
    else:
        raise SpecError(f"{where} returned a {type(example).__name__}; it must return {EXAMPLE_FORMS}")
    for n, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise SpecError(f"{where}: positional input {n + 1} is a {type(a).__name__}, not a tensor; "
                            f"return {EXAMPLE_FORMS}")
    for k, v in kwargs.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise SpecError(f"{where}: keyword input name {k!r} is not a Python identifier")
        if not isinstance(v, torch.Tensor):
            raise SpecError(f"{where}: keyword input {k!r} is a {type(v).__name__}, not a tensor; "
                            f"return {EXAMPLE_FORMS}")
    return Inputs(args, kwargs)


# ----------------------------------------------------------------------------- batch
def with_batch(specs, batch_size: int) -> tuple[InputSpec, ...]:
    """Every input's first dimension set to ``batch_size`` (positional and keyword alike; scalars stay)."""
    out = tuple(s.with_batch(batch_size) for s in specs)
    check_input_order(out)
    return out


def batch_of(specs) -> int:
    """The batch size: the first input's first dimension (1 for no inputs or a scalar first input)."""
    return specs[0].shape[0] if specs and specs[0].shape else 1


def rows(inputs, start: int, stop: int, batch: int) -> Inputs:
    """Rows [start, stop) of every tensor whose first dimension is the batch; others as they are."""
    def cut(x):
        return x[start:stop] if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == batch else x
    return as_inputs(inputs).map(cut)


# ----------------------------------------------------------------------------- text
def describe(inputs) -> str:
    """'[2, 16] int64, decoder_input_ids=[2, 8] int64': shapes and dtypes as the user gave them."""
    inputs = as_inputs(inputs)

    def one(t):
        if not isinstance(t, torch.Tensor):
            return type(t).__name__
        return f"{list(t.shape)} {DTYPE_NAMES.get(t.dtype, t.dtype)}"
    return ", ".join([one(t) for t in inputs.args] + [f"{k}={one(t)}" for k, t in inputs.kwargs.items()])


def spec_text(s: InputSpec) -> str:
    """An InputSpec in the input grammar: 'input_ids=2,16:int64:100'."""
    text = ",".join(map(str, s.shape)) + f":{s.dtype}" + (f":{s.high}" if s.high is not None else "")
    return f"{s.name}={text}" if s.name else text
