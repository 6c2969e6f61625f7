"""Typed results and their one (de)serialisation.

An analysis' result is a frozen record declared beside its ``Analysis`` (``result=``): a msgspec
Struct deriving from :class:`Result` (or a frozen dataclass), whose ``metrics`` record's fields carry
their units (``declare.metric``) and whose tables are typed rows (``declare.table`` / ``column``).
Torch-free, like the declarations: the dashboard and the CLI read results without loading torch.

One serialisation, used everywhere a result leaves memory:

* ``to_plain(result) -> dict``: JSON-able builtins. The worker sends this across the process
  boundary, the store writes it as JSON (``to_json``), ``--json``, result.json and the page's JSON
  download print it.
* ``decode(analysis, plain) -> result``: the typed result again, checked against its type. The
  runner decodes what the worker sent, History and the page cache decode stored runs.

Stored results of older runs stay readable: keys a type no longer has are ignored, and a field added
later must have a default (``UNSET`` for "not measured here": it is then left out of the plain form,
as the dict results left such keys out); a part whose shape changed is put in its new shape by the type's
``upgrade`` hook before decoding (the profile's timeline). A result that still does not fit raises
:class:`ResultError` naming the field; the stored JSON itself is never touched.

An analysis not converted yet (no ``result`` type) keeps its plain dict: both functions pass it
through, and the generic readers below (``metrics_of``, ``notes_of``, ...) take either.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from diagnostics.declare import Analysis
from diagnostics.errors import TorchScopeError
from diagnostics.spec import InputSpec

__all__ = ["UNSET", "UnsetType", "Record", "Result", "Disturbance", "ModelInput", "Shape", "ResultError", "to_plain",
           "to_json", "decode", "decode_partial", "build", "metrics_of", "notes_of", "model_of", "disturbance_of", "given"]


class ResultError(TorchScopeError):
    """A result that does not fit its analysis' declared type; the message names the analysis and the field."""


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """A typed part of a result: its metrics, a table's row, a nested group of fields."""


class Disturbance(Record, frozen=True, kw_only=True):
    """What the machine did while a timed (exclusive) job ran: diagnostics.measure.disturbance.assess."""

    wall_s: float
    cpu_s: float
    cpu_cores_used: float
    other_processes_cores: float
    cores: int
    torch_threads: int | None = None
    load_avg_1m_start: float | None = None
    load_avg_1m_end: float | None = None
    cv: float | None = None
    disturbed: bool = False
    reasons: tuple[str, ...] = ()
    thresholds: dict[str, float] = {}


#: A tensor's shape as a result writes it: a list of ints, nested like a model's (tuple, list, dict) output;
#: None for what is not a tensor (tensors.shape_of).
Shape = list[Any] | dict[str, Any] | None


class ModelInput(Record, frozen=True, kw_only=True):
    """One of the model's inputs as a result lists it (spec.InputSpec): its shape (batch first) and dtype;
    ``high`` (the bound of random integers) and ``name`` (a keyword input) where the result gives them."""

    shape: tuple[int, ...]
    dtype: str
    high: int | None | UnsetType = UNSET
    name: str | UnsetType = UNSET

    def to_spec(self) -> InputSpec:
        return InputSpec(self.shape, self.dtype, self.high if given(self.high) else None,
                         self.name if given(self.name) else None)


class Result(Record, frozen=True, kw_only=True):
    """The base of every analysis' result type.

    ``model``: the model's label (left unset by runs on files); ``notes``: what the reader must know
    (what was not counted and why; left unset by results that have none); ``disturbance``: set by the
    runner on an exclusive analysis' result; ``timing_cv``: the coefficient of variation of the timed
    samples, which that verdict reads. A subclass redeclares a field it always writes as required
    (``model: str``, ``notes: tuple[str, ...]``). Read them generically with model_of / notes_of."""

    model: str | UnsetType = UNSET
    notes: tuple[str, ...] | UnsetType = UNSET
    disturbance: Disturbance | UnsetType = UNSET
    timing_cv: float | None | UnsetType = UNSET

    @classmethod
    def upgrade(cls, plain: dict) -> dict:
        """``plain`` (a stored or sent result) with the parts stored in an older shape put in this type's shape,
        before it is decoded: the one place a type whose part changed shape reads its old runs (the default:
        nothing to change). It returns a new dict and never touches what was stored."""
        return plain


def given(value) -> bool:
    """A field that holds a value: not UNSET (not measured here) and not None (measured, not available)."""
    return value is not UNSET and value is not None


def _lists(x):
    """Tuples (msgspec writes a tuple field as one) as lists: the plain form is what JSON reads back."""
    if isinstance(x, dict):
        return {k: _lists(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_lists(v) for v in x]
    return x


def _builtin(value):
    """A subclass of str, int or float (torch's TorchVersion, numpy's float64) as its plain value; anything
    else has no place in a result."""
    for kind in (bool, str, int, float):
        if isinstance(value, kind):
            return kind(value)
    raise TypeError(f"a result cannot hold a {type(value).__name__} ({value!r:.80})")


def to_plain(result) -> Any:
    """A result as JSON-able builtins (dicts, lists, numbers, strings, None): fields in declaration order,
    UNSET fields left out. A plain dict (an analysis not converted yet) is returned as it is."""
    if result is None or isinstance(result, dict):
        return result
    return _lists(msgspec.to_builtins(result, enc_hook=_builtin))


def to_json(result, indent: int | None = None) -> str:
    """The result as JSON text: how the store keeps it and what ``--json`` and result.json print.
    (NaN and infinity are written as Python's json writes them, as the store always has.)"""
    return json.dumps(to_plain(result), indent=indent, default=str)


def _decoded(analysis: Analysis, rtype: type | None, plain, what: str):
    """``plain`` as ``rtype`` (None: as it is), checked; a ResultError names the analysis, ``what`` it is
    (its result, its partial result), the type and the field that does not fit."""
    if rtype is None or plain is None or isinstance(plain, rtype):
        return plain
    if not isinstance(plain, dict):
        raise ResultError(f"a {analysis.name} {what} must be a JSON object, not {type(plain).__name__}")
    upgrade = getattr(rtype, "upgrade", None)  # a Result's decode hook: parts stored in an older shape
    try:
        return msgspec.convert(upgrade(plain) if upgrade else plain, rtype)
    except msgspec.ValidationError as e:
        raise ResultError(f"this {analysis.name} {what} does not fit {rtype.__name__}: {e}") from None


def decode(analysis: Analysis, plain):
    """``plain`` (from the worker, the store or a result.json) as ``analysis``' typed result.

    An analysis without a result type gets its plain dict back; a typed result is returned as it is.
    Raises ResultError naming the analysis, the type and the field that does not fit."""
    return _decoded(analysis, analysis.result, plain, "result")


def _unknown(given, kept, path: str) -> list[str]:
    """Keys of ``given`` (a job's plain dict) that its typed form ``kept`` lost, as paths."""
    if isinstance(given, dict) and isinstance(kept, dict):
        out = [f"{path}.{k}" for k in given if k not in kept]
        return out + [p for k in given if k in kept for p in _unknown(given[k], kept[k], f"{path}.{k}")]
    if isinstance(given, (list, tuple)) and isinstance(kept, (list, tuple)):
        return [p for i, (a, b) in enumerate(zip(given, kept)) for p in _unknown(a, b, f"{path}[{i}]")]
    return []


def build(rtype: type, plain: dict):
    """A job's result built from the plain dict it assembled: checked against ``rtype`` like ``decode``, and
    strictly: a key the type does not declare is an error naming it (decode ignores such keys in old
    stored runs; a job writing one is a bug)."""
    try:
        typed = msgspec.convert(plain, rtype)
    except msgspec.ValidationError as e:
        raise ResultError(f"the result does not fit {rtype.__name__}: {e}") from None
    lost = _unknown(plain, to_plain(typed), "$")
    if lost:
        raise ResultError(f"the result has fields {rtype.__name__} does not declare: {', '.join(lost[:5])}")
    return typed


def checked(analysis: Analysis, result):
    """What ``analysis``' job returned, as it will cross the process boundary: encoded and decoded once
    (so the worker, tests and notebooks see the typed result the dashboard will). A typed analysis must
    return its result type (or a plain dict of that shape)."""
    rtype = analysis.result
    if rtype is not None and not isinstance(result, (rtype, dict)):
        raise ResultError(f"{analysis.name} returned a {type(result).__name__}, not its result type {rtype.__name__}")
    return decode(analysis, to_plain(result))


def decode_partial(analysis: Analysis, plain):
    """A running job's partial result (ctx.partial; from the worker's pipe) as ``analysis``' declared
    ``partial`` type; a plain dict where it declares none. Raises ResultError naming the field."""
    return _decoded(analysis, analysis.partial, plain, "partial result")


def checked_partial(analysis: Analysis, partial):
    """What ``analysis``' job reported through ctx.partial, as it will cross the process boundary: encoded
    and decoded once, like the final result (``checked``); a typed analysis reports its ``partial`` type."""
    ptype = analysis.partial
    if ptype is not None and not isinstance(partial, (ptype, dict)):
        raise ResultError(f"{analysis.name} reported a {type(partial).__name__}, not its partial type {ptype.__name__}")
    return decode_partial(analysis, to_plain(partial))


# ---- the generic readers: any result, typed or (not converted yet) a plain dict -------------------------

def metrics_of(result) -> dict:
    """The result's headline metrics, key -> value, in order; a metric not measured (UNSET) is left out."""
    if isinstance(result, dict):
        m = result.get("metrics")
        return m if isinstance(m, dict) else {}
    m = getattr(result, "metrics", None)
    return to_plain(m) if m is not None and m is not UNSET else {}


def notes_of(result) -> tuple[str, ...]:
    """The result's notes (none: ())."""
    notes = result.get("notes") if isinstance(result, dict) else getattr(result, "notes", ())
    return tuple(str(n) for n in notes or () if n)  # UNSET is falsy


def model_of(result) -> str | None:
    """The model's label, for a report's header and a download's name (None: a run on files)."""
    value = result.get("model") if isinstance(result, dict) else getattr(result, "model", None)
    return value if isinstance(value, str) and value else None


def device_of(result) -> str | None:
    value = result.get("device") if isinstance(result, dict) else getattr(result, "device", None)
    return value if isinstance(value, str) and value else None


def disturbance_of(result) -> Disturbance | None:
    """The timed job's disturbance report, typed, or None (not a timed job)."""
    if isinstance(result, dict):
        report = result.get("disturbance")
        return msgspec.convert(report, Disturbance) if isinstance(report, dict) else None
    report = getattr(result, "disturbance", None)
    return report if isinstance(report, Disturbance) else None


def timing_cv_of(result) -> float | None:
    """The CV of a timed job's samples, which its disturbance verdict reads (None: none given)."""
    value = result.get("timing_cv") if isinstance(result, dict) else getattr(result, "timing_cv", None)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def with_disturbance(result, report: dict):
    """The result with the runner's disturbance report (measure.disturbance.assess's dict) in it."""
    if isinstance(result, dict):
        return {**result, "disturbance": report}
    typed = msgspec.convert(report, Disturbance)
    if isinstance(result, msgspec.Struct):
        return msgspec.structs.replace(result, disturbance=typed)
    return dataclasses.replace(result, disturbance=typed)
