"""Human-readable numbers: bytes, counts, FLOPs and durations, with their units."""

from __future__ import annotations


def _sig3(x: float, trim: bool = False) -> str:
    """Three significant digits without scientific notation: 3.00, 15.5, 118, 1020.

    trim drops trailing zeros (1.5 k, 2 M) for counts, where "2.00 M" reads as noise."""
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
    if abs(s) >= 1:
        return f"{s:.2f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"
