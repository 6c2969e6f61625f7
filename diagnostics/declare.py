"""Declarations: an analysis says once what options it takes and what its result holds.

An :class:`Analysis` names its options (:class:`Option`: key, kind, default, bounds, choices, help,
CLI flag), its result type (``result``: a frozen msgspec Struct or dataclass, diagnostics.results),
whose metrics fields carry their unit (``Annotated[float, metric("ms", "Latency")]``: a
:class:`Metric`) and whose tables are typed rows (``Annotated[tuple[Row, ...], table("Layers")]``,
row fields ``Annotated[int, column("count")]``: a :class:`Table` of :class:`Column`), and what
draws the result, by reference: its page ``view``, its ``report`` sections and its CLI ``text``
("module:function", resolved and checked by ui.views and diagnostics.render.layouts when they
are imported; :func:`resolve`). The CLI flags, the dashboard's widgets, option validation, the
report and the text output all read these declarations; nothing else restates a default or
guesses a unit from a key's name.

Plain frozen dataclasses and no torch: the dashboard lists analyses without importing torch.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable

from diagnostics.errors import TorchScopeError
from diagnostics.units import UNITS

#: What an option's value may be.
KINDS = ("int", "float", "bool", "choice", "multi", "str", "path", "list", "dict")


class OptionError(TorchScopeError):
    """An option value that cannot be used; the message names the option and what it accepts."""


@dataclass(frozen=True)
class Option:
    """One option of an analysis.

    ``kind``: int / float (with ``lo`` / ``hi`` bounds, inclusive, or ``gt``: strictly above), bool, choice (one of
    ``choices``), multi (a list of ``choices``), str, path (a file or folder on the server), list
    (of strings), dict (checked by ``check``). ``optional``: None is accepted and means "decide for
    me" (the help says what). ``required``: the analysis cannot run without it. ``flag``: the CLI flag (None: ``--key-with-dashes``; "": no flag of
    its own, still settable with ``--option key=value``). ``check``: an extra torch-free validator
    ``fn(value) -> value`` raising OptionError.
    """

    key: str
    kind: str
    default: Any = None
    help: str = ""
    label: str = ""
    lo: float | None = None
    hi: float | None = None
    gt: float | None = None
    choices: tuple = ()
    optional: bool = False
    required: bool = False
    flag: str | None = None
    unit: str | None = None
    check: Callable[[Any], Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"option {self.key}: unknown kind {self.kind!r}")
        if self.kind in ("choice", "multi") and not self.choices:
            raise ValueError(f"option {self.key}: a {self.kind} option needs choices")
        if self.unit is not None and self.unit not in UNITS:
            raise ValueError(f"option {self.key}: unknown unit {self.unit!r}")

    @property
    def cli_flag(self) -> str | None:
        if self.flag == "":
            return None
        return self.flag or "--" + self.key.replace("_", "-")

    @property
    def title(self) -> str:
        return self.label or self.key.replace("_", " ").capitalize()

    def describe_default(self) -> str:
        if self.default is None:
            return "auto" if self.optional else "none"
        if self.kind == "bool":
            return "on" if self.default else "off"
        if isinstance(self.default, (list, tuple)):
            return ", ".join(map(str, self.default)) or "none"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)

    @staticmethod
    def _num(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else f"{x:g}"

    def accepts(self) -> str:
        """What values are valid, in words (for error messages and help)."""
        if self.kind in ("choice", "multi"):
            what = "one of " if self.kind == "choice" else "a list of "
            return what + ", ".join(map(str, self.choices))
        if self.kind in ("int", "float"):
            noun = "an integer" if self.kind == "int" else "a number"
            if self.gt is not None:
                top = f" and <= {self._num(self.hi)}" if self.hi is not None else ""
                return f"{noun} > {self._num(self.gt)}{top}"
            if self.lo is not None and self.hi is not None:
                return f"{noun} from {self._num(self.lo)} to {self._num(self.hi)}"
            if self.lo is not None:
                return f"{noun} >= {self._num(self.lo)}"
            if self.hi is not None:
                return f"{noun} <= {self._num(self.hi)}"
            return noun
        return {"bool": "true or false", "str": "text", "path": "a path", "list": "a list",
                "dict": "a dict"}[self.kind]

    def _bad(self, value, why: str = "") -> OptionError:
        return OptionError(f"option {self.key}: {why or 'must be ' + self.accepts()}, got {value!r}")

    def validate(self, value):
        """``value`` converted to this option's kind and checked; raises OptionError naming the option."""
        if value is None:
            if self.optional or self.default is None:
                return None
            raise self._bad(value)
        k = self.kind
        if k == "bool":
            if isinstance(value, bool):
                out = value
            elif isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                out = value.lower() in ("true", "1", "yes", "on")
            elif isinstance(value, int) and value in (0, 1):
                out = bool(value)
            else:
                raise self._bad(value)
        elif k in ("int", "float"):
            if isinstance(value, bool):
                raise self._bad(value)
            try:
                num = float(value)
            except (TypeError, ValueError):
                raise self._bad(value) from None
            if not math.isfinite(num):
                raise self._bad(value)
            if k == "int":
                if not num.is_integer():
                    raise self._bad(value)
                out = int(num)
            else:
                out = num
            if ((self.lo is not None and out < self.lo) or (self.hi is not None and out > self.hi)
                    or (self.gt is not None and not out > self.gt)):
                raise self._bad(value)
        elif k == "choice":
            if value not in self.choices:
                raise self._bad(value)
            out = value
        elif k == "multi":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)):
                raise self._bad(value)
            bad = [v for v in items if v not in self.choices]
            if bad:
                raise self._bad(value, f"unknown value{'s' if len(bad) > 1 else ''} "
                                       f"{', '.join(map(repr, bad))}; choose from {', '.join(map(str, self.choices))}")
            out = list(dict.fromkeys(items))
        elif k in ("str", "path"):
            if not isinstance(value, str) or (k == "path" and not value.strip()):
                raise self._bad(value)
            out = value
        elif k == "list":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)):
                raise self._bad(value)
            out = list(items)
        else:  # dict
            if not isinstance(value, dict):
                raise self._bad(value)
            out = dict(value)
        return self.check(out) if self.check is not None else out


class Options(dict):
    """Validated options of one analysis: every declared key is present, with its default when not given.

    Reading a key the analysis did not declare is a bug in the analysis, not a missing value, so it
    raises instead of quietly giving None (``get`` included): what an analysis reads is exactly
    what it declares."""

    def __missing__(self, key):
        raise KeyError(f"option {key!r} is not declared")

    def get(self, key, default=None):
        if key not in self:
            raise KeyError(f"option {key!r} is not declared")
        return super().get(key, default)


@dataclass(frozen=True)
class Metric:
    """A headline figure of a result (``result["metrics"][key]``) with its unit."""

    key: str
    unit: str
    label: str
    help: str = ""
    #: which way is an improvement when two runs are compared: "lower", "higher" or "" (neither: a setting)
    better: str = ""
    #: the keys of the metrics holding this figure's interval (low, high): a measured comparison is never
    #: shown without it (the text, the report and the tiles write "x1.11 [0.24, 38.80], within noise")
    interval: tuple[str, str] | None = None
    #: the key of the metric holding its verdict (faster / slower / within noise), shown beside it
    verdict: str | None = None

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"metric {self.key or repr(self.label)}: unknown unit {self.unit!r}")
        if self.better not in ("", "lower", "higher"):
            raise ValueError(f"metric {self.key or repr(self.label)}: better must be 'lower', 'higher' or '', not {self.better!r}")


@dataclass(frozen=True)
class Column:
    key: str
    unit: str
    label: str = ""

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"column {self.key or repr(self.label)}: unknown unit {self.unit!r}")


@dataclass(frozen=True)
class Table:
    """A list of row dicts in the result at ``path`` (keys joined by '.'), with its columns' units.

    Columns not declared are shown as they are (text, or plain numbers without a unit)."""

    path: str
    title: str
    columns: tuple[Column, ...] = ()

    def rows(self, result: dict) -> list | None:
        node = result
        for part in self.path.split("."):
            if not isinstance(node, dict):
                return None
            node = node.get(part)
        return node if isinstance(node, list) else None

    def unit(self, column: str) -> str | None:
        return next((c.unit for c in self.columns if c.key == column), None)


# ---- what a result's fields declare: a metric's unit, a table's title, a column's unit ----------------
# Annotated metadata: a Metric / Column / Table without its key (or path), which is the field's name.

def metric(unit: str, label: str, help: str = "", *, better: str = "", interval: tuple[str, str] | None = None,
           verdict: str | None = None) -> Metric:
    """A metrics field's declaration: ``latency_ms: Annotated[float | None, metric("ms", "Latency", better="lower")]``.
    ``better``, ``interval`` and ``verdict`` as for :class:`Metric`."""
    return Metric("", unit, label, help, better, interval, verdict)


def column(unit: str, label: str = "") -> Column:
    """A row field's unit: ``peak_bytes: Annotated[int, column("bytes", "peak")]``."""
    return Column("", unit, label)


def table(title: str) -> Table:
    """A table of the result: ``layers: Annotated[tuple[Layer, ...], table("Layers")]``."""
    return Table("", title)


def is_record(tp) -> bool:
    """A typed record: a msgspec Struct or a dataclass (a class, not an instance)."""
    return isinstance(tp, type) and (hasattr(tp, "__struct_fields__") or dataclasses.is_dataclass(tp))


def record_fields(cls) -> list[tuple[str, Any, tuple]]:
    """(name, type without Annotated, its Annotated metadata) of each field of a record type, in order.
    The name is the key in the plain form: a Struct field renamed there (``pass_: int = msgspec.field(name="pass")``,
    a Python keyword) is named as it is written."""
    hints = typing.get_type_hints(cls, include_extras=True)
    names = (cls.__struct_fields__ if hasattr(cls, "__struct_fields__")
             else tuple(f.name for f in dataclasses.fields(cls)))
    encoded = dict(zip(names, getattr(cls, "__struct_encode_fields__", names)))
    out = []
    for name in names:
        hint = hints[name]
        meta: tuple = ()
        if typing.get_origin(hint) is Annotated:
            hint, meta = hint.__origin__, tuple(hint.__metadata__)
        out.append((encoded[name], hint, meta))
    return out


def _present(tp):
    """``tp`` without None and msgspec's UnsetType in a union (``int | None`` -> int)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None) and getattr(a, "__name__", "") != "UnsetType"]
        return rest[0] if len(rest) == 1 else tp
    return tp


def _row_type(tp):
    """The row type of ``tuple[Row, ...]`` / ``list[Row]`` (or None)."""
    tp = _present(tp)
    if typing.get_origin(tp) in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(args) == 1 and is_record(_present(args[0])):
            return _present(args[0])
    return None


def result_metrics(result_type) -> tuple[Metric, ...]:
    """The metrics a result type declares: each field of its ``metrics`` record, with its ``metric(...)``."""
    fields = {name: tp for name, tp, _ in record_fields(result_type)}
    if "metrics" not in fields:
        return ()
    mtype = _present(fields["metrics"])
    if not is_record(mtype):
        raise ValueError(f"{result_type.__name__}.metrics must be a record type (a Struct), not {mtype!r}")
    out = []
    for name, _tp, meta in record_fields(mtype):
        mark = next((m for m in meta if isinstance(m, Metric)), None)
        if mark is None:
            raise ValueError(f"{mtype.__name__}.{name}: a metric without a unit; declare it as "
                             f"Annotated[<type>, metric(unit, label)]")
        out.append(dataclasses.replace(mark, key=name))
    return tuple(out)


def result_tables(result_type, prefix: str = "", depth: int = 0) -> tuple[Table, ...]:
    """The tables a result type declares (fields marked ``table(title)``, in nested records too), with
    the units of their rows' ``column(...)`` fields."""
    out: list[Table] = []
    for name, tp, meta in record_fields(result_type):
        path = prefix + name
        mark = next((m for m in meta if isinstance(m, Table)), None)
        if mark is not None:
            row = _row_type(tp)
            if row is None:
                raise ValueError(f"{result_type.__name__}.{name}: a table must hold typed rows "
                                 f"(tuple[RowType, ...]), not {tp!r}")
            cols = tuple(dataclasses.replace(c, key=n) for n, _t, m in record_fields(row)
                         for c in m if isinstance(c, Column))
            out.append(Table(path, mark.title, cols))
        elif name != "metrics" and depth < 3 and is_record(_present(tp)):
            out += result_tables(_present(tp), path + ".", depth + 1)
    return tuple(out)


class RegistrationError(ImportError):
    """A declared reference (a view, a report layout, a CLI text) that cannot be resolved or does not take
    the analysis' result: raised when the registry of views or layouts is imported, never hidden."""


#: "module.path:function"
_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")
#: The report layout of an analysis that declares none of its own: its notes, details and every table.
GENERIC_REPORT = "diagnostics.render.sections:generic_sections"


def resolve(ref: str, *, what: str, takes: type | None = None) -> Callable:
    """The function ``ref`` ("module:function") names, for ``what`` (e.g. "the view of summary").

    Raises RegistrationError naming ``what`` and ``ref`` when the module does not import (the import
    error with it), has no such function, or (``takes``: the analysis' result type) its first parameter
    is annotated with a type that does not accept ``takes``."""
    module, _, name = ref.partition(":")
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        raise RegistrationError(f"{what}: {ref} cannot be imported ({type(e).__name__}: {e})") from e
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise RegistrationError(f"{what}: {module} has no function {name!r}" if fn is None else
                                f"{what}: {ref} is not a function")
    if takes is not None:
        params = list(inspect.signature(fn).parameters.values())
        if not params:
            raise RegistrationError(f"{what}: {ref} takes no argument; it must take a {takes.__name__}")
        try:
            hint = typing.get_type_hints(fn).get(params[0].name, Any)
        except Exception as e:
            raise RegistrationError(f"{what}: the annotations of {ref} cannot be read ({type(e).__name__}: {e})") from e
        accepted = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        if not any(a is Any or (isinstance(a, type) and issubclass(takes, a)) for a in accepted):
            raise RegistrationError(f"{what}: {ref} takes {getattr(hint, '__name__', hint)}, not the analysis' "
                                    f"result type {takes.__name__}")
    return fn


@dataclass(frozen=True)
class Analysis:
    """One analysis, declared once: what it is called, how it runs, what it takes and returns.

    ``target`` is "module:function", called in the worker as ``fn(ctx, options) -> result`` with
    options already validated here. ``result``: the result's type (a frozen record, torch-free:
    diagnostics.results.Result); its metrics and tables are read from its fields' annotations, so
    ``metrics`` / ``tables`` are not given with it (an analysis not converted yet returns a plain dict
    and declares them here). ``command``: its CLI subcommand (None: no command of its own).
    ``exclusive``: it times the device, so such jobs queue one at a time per device, and its
    result carries ``disturbance`` (was the machine busy meanwhile: measure.disturbance; the CV of
    the samples the analysis puts in its ``timing_cv``).
    What draws it, each "module:function" taking the result, resolved when its registry is imported
    (a missing or broken one is a RegistrationError there, never a fallback): ``view``, the page's
    Streamlit view (ui.views.<module>; required); ``report``, its report's sections (a list of
    render.sections.Section; default: the generic layout); ``text``, its CLI text (default: the
    headline metrics and notes).
    A job that reports what it knows while it runs (ctx.partial: rows as they come) declares the type of
    that ``partial`` result (a record; None: a plain dict) and may declare ``partial_text``, the CLI's
    lines of it ("module:function" taking the partial result and, once the job ends, the final one,
    returning (key, line) pairs, each key printed once).
    """

    name: str
    title: str
    target: str
    options: tuple[Option, ...] = ()
    metrics: tuple[Metric, ...] = ()
    tables: tuple[Table, ...] = ()
    needs_model: bool = True
    exclusive: bool = False
    timeout_s: float = 300.0
    command: str | None = None
    description: str = ""
    result: type | None = None
    view: str = ""
    report: str = GENERIC_REPORT
    text: str = ""
    partial: type | None = None
    partial_text: str = ""

    def __post_init__(self):
        for what in ("view", "report", "text", "partial_text"):
            ref = getattr(self, what)
            if ref and not _REF.match(ref):
                raise ValueError(f"analysis {self.name}: its {what} must be 'module:function', not {ref!r}")
        if not self.view:
            raise ValueError(f"analysis {self.name}: declare its view, the page's view of its result "
                             "(view='ui.views.<module>:<function>')")
        if self.result is not None:
            if not is_record(self.result):
                raise ValueError(f"analysis {self.name}: its result type must be a Struct or a dataclass, "
                                 f"not {self.result!r}")
            derived = result_metrics(self.result), result_tables(self.result)
            # (dataclasses.replace of a declaration passes the derived ones back: those are its own)
            if (self.metrics or self.tables) and (self.metrics, self.tables) != derived:
                raise ValueError(f"analysis {self.name}: its metrics and tables are declared on its result type "
                                 f"{self.result.__name__} (metric(...), table(...), column(...)), not here")
            object.__setattr__(self, "metrics", derived[0])
            object.__setattr__(self, "tables", derived[1])
        if self.partial is not None and not is_record(self.partial):
            raise ValueError(f"analysis {self.name}: its partial result type must be a Struct or a dataclass, "
                             f"not {self.partial!r}")
        keys = [o.key for o in self.options]
        if len(set(keys)) != len(keys):
            raise ValueError(f"analysis {self.name}: an option is declared twice")
        mkeys = [m.key for m in self.metrics]
        if len(set(mkeys)) != len(mkeys):
            raise ValueError(f"analysis {self.name}: a metric is declared twice")
        for m in self.metrics:
            for ref in (*(m.interval or ()), *((m.verdict,) if m.verdict else ())):
                if ref not in mkeys:
                    raise ValueError(f"analysis {self.name}: metric {m.key} refers to {ref!r}, which is not declared")

    def load(self) -> Callable:
        module, _, fn = self.target.partition(":")
        return getattr(importlib.import_module(module), fn)

    def option(self, key: str) -> Option:
        for o in self.options:
            if o.key == key:
                return o
        raise OptionError(f"{self.name} has no option {key!r}; its options: {', '.join(self.option_keys) or 'none'}")

    @property
    def option_keys(self) -> tuple[str, ...]:
        return tuple(o.key for o in self.options)

    def defaults(self) -> dict:
        return {o.key: o.default for o in self.options}

    def validate(self, options: dict | None) -> Options:
        """Every option of this analysis, defaults filled in and each value checked.

        An unknown key is refused with the list of valid ones: a typo must not be silently ignored."""
        options = dict(options or {})
        unknown = [k for k in options if k not in self.option_keys]
        if unknown:
            listed = ", ".join(self.option_keys) if self.options else "(none: it takes no options)"
            raise OptionError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                              f"for {self.name}; valid: {listed}")
        missing = [o for o in self.options if o.required and options.get(o.key) is None]
        if missing:
            o = missing[0]
            raise OptionError(f"option {o.key} is required for {self.name}: {o.help or o.accepts()}")
        return Options({o.key: o.validate(options[o.key]) if o.key in options else copy.deepcopy(o.default)
                        for o in self.options})

    def metric(self, key: str) -> Metric | None:
        return next((m for m in self.metrics if m.key == key), None)

    def companions(self) -> frozenset[str]:
        """The metrics shown folded into another's figure (its interval's ends, its verdict)."""
        return frozenset(k for m in self.metrics for k in (*(m.interval or ()), *((m.verdict,) if m.verdict else ())))

    def table(self, path: str) -> Table | None:
        return next((t for t in self.tables if t.path == path), None)


# ---- options several analyses share, declared once ------------------------------------------------

def _regular_expression(value: str) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise OptionError(f"option comm_kernels: {value!r} is not a regular expression ({e})") from None
    return value


#: The user's pattern for in-house communication kernels, an option of every analysis that reads traces
#: with collectives (trace, distributed, distributed_traces): `--comm-kernels REGEX` on the CLI, the
#: "Communication kernels" field on the pages; diagnostics.trace.classify.use_comm_kernels applies it.
COMM_KERNELS = Option(
    "comm_kernels", "str", None, "a regular expression (searched in GPU kernel names) for in-house "
    "communication kernels that no known family (NCCL, RCCL, MSCCL++, NVSHMEM, expert-parallel dispatch / "
    "combine, custom all-reduce) names; they then count as communication", optional=True,
    flag="--comm-kernels", check=_regular_expression)
