"""Trimmed result samples (tests/data/tiles, hand-written rows in chart tests) as typed results: a required
field a sample leaves out gets an empty value of its type (None where the type allows it), in nested records
and in tables' rows too; then the sample is decoded as the page decodes a stored run."""

from __future__ import annotations

import types
import typing

import msgspec

from diagnostics.declare import is_record, record_fields
from diagnostics.registry import ANALYSES
from diagnostics.results import decode

_EMPTY = {tuple: [], list: [], dict: {}, str: "", int: 0, float: 0.0, bool: False}


def _row_type(tp):
    if typing.get_origin(tp) in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(args) == 1 and is_record(args[0]):
            return args[0]
    return None


def filled(tp, plain: dict) -> dict:
    """``plain`` completed for the record type ``tp``."""
    required = {f.name for f in msgspec.structs.fields(tp) if f.required}
    out = dict(plain)
    for name, ftype, _ in record_fields(tp):
        union = typing.get_args(ftype) if typing.get_origin(ftype) in (typing.Union, types.UnionType) else ()
        inner = next((a for a in union if a is not type(None) and a is not msgspec.UnsetType), ftype)
        row = _row_type(inner)
        if is_record(inner) and isinstance(out.get(name), dict):
            out[name] = filled(inner, out[name])
        elif row is not None and isinstance(out.get(name), list):
            out[name] = [filled(row, r) if isinstance(r, dict) else r for r in out[name]]
        elif name in required and name not in out:
            out[name] = (None if type(None) in union else filled(inner, {}) if is_record(inner)
                         else _EMPTY.get(typing.get_origin(inner) or inner))
    return out


def typed(analysis: str, plain: dict):
    """The trimmed sample ``plain`` as ``analysis``' typed result (a dict where it has no result type)."""
    decl = ANALYSES[analysis]
    return decode(decl, plain if decl.result is None else filled(decl.result, plain))
