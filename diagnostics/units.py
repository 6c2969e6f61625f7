"""Numbers with their units: the one place that turns a value and a declared unit into text.

Every figure a user reads (metric tiles, report tables, CLI text, CSV headers) is formatted here
from the unit its analysis declared (``diagnostics.declare.Metric.unit``); nothing guesses a
unit from a key's name. ``UNITS`` lists the units an analysis may declare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

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


def interval_text(ci, unit: str = "ratio") -> str:
    """'[1.10, 1.52]' (a ratio's ends without the x), '[-2.1 %, 5.3 %]' for other units; '' without one."""
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    if unit == "ratio":
        return f"[{ci[0]:.2f}, {ci[1]:.2f}]"
    return f"[{format_value(ci[0], unit)}, {format_value(ci[1], unit)}]"


def speedup_text(value, ci=None, verdict: str | None = None, *, unit: str = "ratio",
                 no_interval: str = "no interval") -> str:
    """A measured comparison as it is shown everywhere: 'x1.30 [1.10, 1.52], faster'; without an
    interval 'x1.30 (no interval)', so a figure never stands alone as if it were certain."""
    if value is None:
        return "n/a"
    text = format_value(value, unit)
    iv = interval_text(ci, unit)
    text += f" {iv}" if iv else f" ({no_interval})"
    return text + (f", {verdict}" if verdict else "")


def column_label(label: str, unit: str) -> str:
    """A table header with its unit: 'median (ms)', 'peak (bytes)'; no suffix for plain numbers."""
    suffix = UNITS[unit][1]
    return f"{label} ({suffix})" if suffix and suffix not in ("x",) else label


# ----------------------------------------------------------------------------- compact figures
# Metric tiles and table columns have little room: a figure there is at most four significant
# digits and a short unit ("385.9 MiB", "1.23 ms", "5.6 %"), and a column shows all its rows in
# one scale so that it reads with one unit.

#: the most characters a compact figure with its unit takes ('1023.9 KiB', '-999.9 ms')
COMPACT_WIDTH = 12

#: unit family -> its scales (suffix, size of one in the declared unit), smallest first
_SCALES: dict[str, tuple[tuple[str, float], ...]] = {
    "bytes": (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40)),
    "s": (("µs", 1e-6), ("ms", 1e-3), ("s", 1)),
    "ms": (("µs", 1e-3), ("ms", 1), ("s", 1e3)),
    "us": (("µs", 1), ("ms", 1e3), ("s", 1e6)),
    "count": (("", 1), ("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12)),
    "flop": (("FLOP", 1), ("kFLOP", 1e3), ("MFLOP", 1e6), ("GFLOP", 1e9), ("TFLOP", 1e12), ("PFLOP", 1e15)),
    "flop_per_s": (("FLOP/s", 1), ("kFLOP/s", 1e3), ("MFLOP/s", 1e6), ("GFLOP/s", 1e9), ("TFLOP/s", 1e12),
                   ("PFLOP/s", 1e15)),
    "bytes_per_s": (("B/s", 1), ("kB/s", 1e3), ("MB/s", 1e6), ("GB/s", 1e9), ("TB/s", 1e12)),
    "per_s": (("/s", 1), ("k/s", 1e3), ("M/s", 1e6), ("G/s", 1e9)),
}
#: units shown with one fixed scale: suffix, multiplier from the declared unit, decimals
_FIXED: dict[str, tuple[str, float, int]] = {
    "fraction": ("%", 100.0, 1), "percent": ("%", 1.0, 1), "score": ("/100", 1.0, 0),
}


@dataclass(frozen=True)
class Scale:
    """One scale of a unit: ``value / factor`` is shown with ``decimals`` decimals and ``suffix``."""

    suffix: str
    factor: float
    decimals: int | None = None  # None: chosen per value (compact)

    def header(self, label: str) -> str:
        """A column header with the unit: 'Peak (MiB)'; a count without a unit keeps the plain label."""
        return f"{label} ({self.suffix})" if self.suffix else label

    def number_format(self) -> str:
        """The printf format of a Streamlit NumberColumn for this scale."""
        return f"%.{2 if self.decimals is None else self.decimals}f"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


#: units whose smallest scale counts whole things (bytes, operations): shown without decimals there
_INTEGRAL = ("bytes", "count", "flop", "flop_per_s", "bytes_per_s", "per_s")


def _decimals(x: float) -> int:
    """Decimals for a figure already in its scale: four significant digits at most, three below 10."""
    return 1 if abs(x) >= 10 else 2


def _round_text(x: float, decimals: int) -> str:
    """Half-up rounding of the shortest decimal form: 0.0555 as a percentage is 5.6, not the 5.5
    that binary floating point (5.5499...) gives."""
    d = Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return f"{d:f}"


def scale_of(value, unit: str) -> Scale:
    """The scale ``compact`` shows ``value`` in: the largest whose figure is at least 1, moving up
    when rounding would print 1000 or more (1023.9 KiB is 1.00 MiB, not '1024 KiB')."""
    if unit in _FIXED:
        suffix, mult, dec = _FIXED[unit]
        return Scale(suffix, 1 / mult, dec)
    scales = _SCALES.get(unit)
    if scales is None:
        raise ValueError(f"unit {unit!r} has no scales; compact() shows it as it is")
    a = abs(float(value)) if _is_number(value) else 0.0
    chosen = scales[0]
    for suffix, factor in scales:
        if a / factor >= 1 or factor == scales[0][1]:
            chosen = (suffix, factor)
    i = scales.index(chosen)
    while i + 1 < len(scales):  # rounding up to 1000 moves to the next scale
        x = a / scales[i][1]
        dec = 0 if i == 0 and unit in _INTEGRAL else _decimals(x)
        if float(_round_text(x, dec)) < 1000:
            break
        i += 1
    return Scale(*scales[i])


def compact_parts(value, unit: str, scale: Scale | None = None, *, signed: bool = False,
                  missing: str = "n/a") -> tuple[str, str]:
    """``value`` in ``unit`` as (figure, unit suffix) for a tile: ('385.9', 'MiB'), ('1.23', 'ms'),
    ('5.6', '%'), ('x1.42', ''). ``scale`` forces one (a page or table's shared scale); ``signed``
    prints '+' on gains (deltas). None is ``missing`` ('n/a', or 'not counted' where nothing was counted)."""
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; declare one of {', '.join(UNITS)}")
    if value is None:
        return missing, ""
    if isinstance(value, bool) or unit == "bool":
        return ("yes" if value else "no"), ""
    if isinstance(value, str) or unit == "text" or not isinstance(value, (int, float)):
        return str(value), ""
    if not math.isfinite(value):
        return str(value), ""
    sign = "+" if signed and value > 0 else ""
    if unit == "ratio":
        return f"x{value:.2f}" if abs(value) < 100 else f"x{value:.0f}", ""
    if unit == "number":
        return sign + (f"{value:,.0f}" if float(value).is_integer() and abs(value) < 1e6 else f"{value:.3g}"), ""
    sc = scale or scale_of(value, unit)
    x = value / sc.factor
    if sc.decimals is not None:
        dec = sc.decimals
    elif unit in _INTEGRAL and sc.factor == _SCALES[unit][0][1] and float(value).is_integer():
        dec = 0  # whole bytes, counts: '512 B', '8'
    else:
        dec = _decimals(x)
    if abs(x) >= 1e6:  # past the largest scale: a bogus figure, not 300 digits
        return sign + f"{x:.3g}", sc.suffix
    if abs(x) >= 1000:
        dec = 0
    # a long unit (GFLOP/s) gives up a decimal rather than the tile cutting it: '231 GFLOP/s'
    while dec > 0 and scale is None and len(sign + _round_text(x, dec)) + 1 + len(sc.suffix) > COMPACT_WIDTH:
        dec -= 1
    return sign + _round_text(x, dec), sc.suffix


def compact(value, unit: str, scale: Scale | None = None, *, signed: bool = False, missing: str = "n/a") -> str:
    """``compact_parts`` joined: '385.9 MiB', '1.23 ms', '5.6 %', '12.3 k', 'x1.42', 'n/a'."""
    num, suffix = compact_parts(value, unit, scale, signed=signed, missing=missing)
    if not suffix:
        return num
    return f"{num}{suffix}" if suffix.startswith("/") and unit in ("per_s", "score") else f"{num} {suffix}"


def column_scale(values, unit: str) -> Scale:
    """One scale for a whole column (or a page's figures of one unit): the scale of its largest
    figure, with decimals so that figure shows four significant digits at most (three under 10),
    and at most three decimals for the small ones."""
    nums = [abs(float(v)) for v in values if _is_number(v)]
    if unit in _FIXED:
        return scale_of(0, unit)
    top = max(nums, default=0.0)
    sc = scale_of(top, unit)
    x = top / sc.factor
    base = _SCALES[unit][0][1] == sc.factor and unit not in ("s", "ms", "us")
    if base and all(float(v).is_integer() for v in nums):
        dec = 0
    elif x >= 100:
        dec = 1
    elif x >= 10:
        dec = 2
    else:
        dec = 3 if x < 1 else 2
    return Scale(sc.suffix, sc.factor, dec)


def printable(value) -> str:
    """Text from a run (a model label, a name from a trace, an error) as one line safe to print to a
    terminal: control characters (ESC, CR, newlines, C1 codes, bidi overrides...) written as Python escapes
    (\\x1b, \\n), so a stored string can neither drive the terminal nor forge a line of output."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
