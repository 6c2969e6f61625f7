"""Numbers with their units: the one place that turns a value and a declared unit into text.

Every figure a user reads (metric tiles, report tables, CLI text, CSV headers) is formatted here
from the unit its analysis declared (``diagnostics.declare.Metric.unit``); nothing guesses a
unit from a key's name. ``UNITS`` lists the units an analysis may declare.
"""

from __future__ import annotations

import math

#: unit -> (what it means, the suffix shown after a column header)
UNITS: dict[str, tuple[str, str]] = {
    "ms": ("milliseconds", "ms"),
    "us": ("microseconds", "µs"),
    "s": ("seconds", "s"),
    "bytes": ("bytes (shown in B / KiB / MiB / GiB)", "bytes"),
    "count": ("a count", ""),
    "flop": ("floating-point operations", "FLOP"),
    "flop_per_s": ("floating-point operations per second", "FLOP/s"),
    "bytes_per_s": ("bytes per second (shown in GB/s)", "B/s"),
    "per_s": ("items (samples) per second", "/s"),
    "fraction": ("a share between 0 and 1, shown as a percentage", "%"),
    "percent": ("a percentage (0-100)", "%"),
    "ratio": ("a ratio, shown as x1.23", "x"),
    "score": ("a score out of 100", "/100"),
    "number": ("a plain number without a unit", ""),
    "bool": ("yes / no", ""),
    "text": ("text", ""),
}


def _sig3(x: float, trim: bool = False) -> str:
    """Three significant digits without scientific notation: 3.00, 15.5, 118, 1020.

    trim drops trailing zeros (1.5 k, 2 M) for counts, where "2.00 M" reads as noise. From a million
    on (a bogus value, past the largest unit) it is 1.23e+308, not 309 digits."""
    if abs(x) >= 1e6:
        return f"{x:.3g}"
    digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    text = f"{x:.{digits}f}"
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def human_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} B" if unit == "B" else f"{_sig3(n)} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def human_count(n: float | None, unit: str = "") -> str:
    if n is None:
        return "n/a"
    n = float(n)
    for suffix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{_sig3(n / scale, trim=True)} {suffix}{unit}".rstrip()
    return f"{n:.0f} {unit}".rstrip()


def human_flops(n: float | None) -> str:
    return human_count(n, "FLOP")


def human_seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    s = float(s)
    if abs(s) >= 1e6:  # 11 days and more: a bogus timestamp, not a duration worth 300 digits
        return f"{s:.3g} s"
    if abs(s) >= 1:
        return f"{s:.2f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def _plain(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.4g}"


def format_value(value, unit: str) -> str:
    """``value`` in ``unit`` as a user reads it: 12.3 ms, 4.00 MiB, 1.5 MFLOP, 87.5 %, x1.42.

    None is "n/a" (not measured); a bool or text is shown as it is. An unknown unit is an error:
    units are declared, never guessed.
    """
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; declare one of {', '.join(UNITS)}")
    if value is None:
        return "n/a"
    if isinstance(value, bool) or unit == "bool":
        return "yes" if value else "no"
    if isinstance(value, str) or unit == "text":
        return str(value)
    if not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if unit == "ms":
        return human_seconds(value / 1e3)
    if unit == "us":
        return human_seconds(value / 1e6)
    if unit == "s":
        return human_seconds(value)
    if unit == "bytes":
        return human_bytes(value)
    if unit == "flop":
        return human_count(value, "FLOP")
    if unit == "flop_per_s":
        return human_count(value, "FLOP/s")
    if unit == "bytes_per_s":
        return f"{value / 1e9:.3g} GB/s"
    if unit == "per_s":
        return f"{human_count(value)}/s"
    if unit == "fraction":
        return f"{100 * value:.1f} %"
    if unit == "percent":
        return f"{value:.1f} %"
    if unit == "ratio":
        return f"x{value:.2f}"
    if unit == "score":
        return f"{value:.1f} / 100"
    return _plain(value)


def column_label(label: str, unit: str) -> str:
    """A table header with its unit: 'median (ms)', 'peak (bytes)'; no suffix for plain numbers."""
    suffix = UNITS[unit][1]
    return f"{label} ({suffix})" if suffix and suffix not in ("x",) else label
