"""What each trial buys and what it costs, in words: faster / slower beyond the noise, smaller,
less memory, and fidelity lost beyond the user's thresholds. No torch (the page and the report
read it too).

``assess(rows, mode, min_cosine, min_top1)`` sets on every measured row ``flag`` (one of FLAGS: a
fidelity loss outranks everything; gains with costs are a trade-off, e.g. slower but smaller) and
``assessment`` (the reasons, with their numbers): on the job's row dicts (a speed-up below
UNCONFIRMED_SLOWER without an interval is a cost: a label never claims a gain its timing contradicts); ``reassessed`` gives typed rows
(result.TrialRow) assessed again at other thresholds (the page's). ``ranked(rows)`` orders rows of either
kind by what they buy: the baseline and the control first, then gains (fastest first), trade-offs,
regressions and fidelity losses, then rows that did not run.
"""

from __future__ import annotations

from typing import Any

import msgspec

from diagnostics.analyses.optimize.result import TrialRow
from diagnostics.units import speedup_text

FLAGS = ("fidelity_loss", "regression", "trade_off", "gain", "neutral")
#: Size or peak memory this much below the baseline's counts as a gain.
SAVING = 0.10
#: A speed-up below this without a verdict (too few rounds for an interval, e.g. ``--iters 3``) is a cost
#: the label shows: its timing contradicts a gain, so the row is no "gain" (int8_dynamic on DETR measured
#: x0.21 in 3 rounds and was labelled a gain for its size alone).
UNCONFIRMED_SLOWER = 1 - SAVING


def _field(r: dict | TrialRow, key: str) -> Any:
    """A row's field, a job's row dict or a typed row alike (None where it has none)."""
    return r.get(key) if isinstance(r, dict) else getattr(r, key, None)


def _fidelity_problems(r: dict | TrialRow, mode: str, min_cosine: float, min_top1: float) -> list[str]:
    out = []
    grad_cosine, cosine, top1 = _field(r, "grad_cosine"), _field(r, "cosine"), _field(r, "top1_agreement")
    if mode == "train":
        if grad_cosine is not None and grad_cosine < min_cosine:
            out.append(f"gradients moved: cosine {grad_cosine:.4f} < {min_cosine:g}")
    if cosine is not None and cosine < min_cosine:
        out.append(f"outputs moved: cosine {cosine:.4f} < {min_cosine:g}")
    if top1 is not None and top1 < min_top1:
        out.append(f"top-1 agreement {top1:.1%} < {min_top1:.0%}")
    return out


def assess_row(r: dict | TrialRow, base: dict | TrialRow, mode: str, min_cosine: float, min_top1: float) -> dict:
    """``flag`` and ``assessment`` of one measured row against the baseline's."""
    lost = _fidelity_problems(r, mode, min_cosine, min_top1)
    gains, costs = [], []
    verdict, size_ratio = _field(r, "verdict"), _field(r, "size_ratio")
    speedup, ci = _field(r, "speedup"), _field(r, "speedup_ci")
    if verdict in ("faster", "slower"):
        (gains if verdict == "faster" else costs).append(f"{verdict} {speedup_text(speedup, ci)}")
    elif ci is None and speedup is not None and speedup < UNCONFIRMED_SLOWER:
        # no interval, so no verdict: the point estimate alone still contradicts a gain
        rounds = _field(r, "rounds")
        costs.append(f"slower x{speedup:.2f} by its point estimate alone ("
                     f"{'too few rounds' if rounds is None else f'{rounds} rounds, too few'} for an interval: no verdict)")
    if size_ratio is not None and size_ratio < 1 - SAVING:
        gains.append(f"size x{size_ratio:.2f}")
    peak, base_peak = _field(r, "peak_bytes"), _field(base, "peak_bytes")
    if peak and base_peak:
        ratio = peak / base_peak
        if ratio < 1 - SAVING:
            gains.append(f"peak memory x{ratio:.2f}")
        elif ratio > 1 + SAVING:
            costs.append(f"peak memory x{ratio:.2f}")
    flag = ("fidelity_loss" if lost else "trade_off" if gains and costs else "regression" if costs
            else "gain" if gains else "neutral")
    return {"flag": flag, "assessment": lost + costs + gains or ["no change beyond the noise"]}


def assess(rows: list[dict], mode: str = "inference", min_cosine: float = 0.999,
           min_top1: float = 0.99) -> list[dict]:
    """Sets ``flag`` and ``assessment`` on each row (in place; returned for convenience), order kept."""
    base = next((r for r in rows if r["fix"] == "baseline"), {})
    for r in rows:
        if r["fix"] in ("baseline", "control") or r.get("status") != "ok":
            r["flag"], r["assessment"] = None, []
            continue
        r.update(assess_row(r, base, mode, min_cosine, min_top1))
    return rows


def reassessed(rows: tuple[TrialRow, ...], mode: str, min_cosine: float, min_top1: float) -> tuple[TrialRow, ...]:
    """Typed rows assessed again at other fidelity thresholds (no re-run), as ``assess`` does the job's."""
    base = next((r for r in rows if r.fix == "baseline"), None)
    out = []
    for r in rows:
        if r.fix in ("baseline", "control") or r.status != "ok":
            out.append(msgspec.structs.replace(r, flag=None, assessment=()))
        else:
            a = assess_row(r, base if base is not None else {}, mode, min_cosine, min_top1)
            out.append(msgspec.structs.replace(r, flag=a["flag"], assessment=tuple(a["assessment"])))
    return tuple(out)


def ranked(rows):
    """The rows (dicts or typed) ranked by what they buy (see the module docstring); the order in the result
    stays the order the fixes were asked for."""

    def rank(r):
        fix = _field(r, "fix")
        if fix == "baseline":
            return (0, 0.0)
        if fix == "control":
            return (1, 0.0)
        if _field(r, "status") != "ok":
            return (6, 0.0)
        group = {"gain": 2, "neutral": 2, "trade_off": 3, "regression": 4, "fidelity_loss": 4}[_field(r, "flag")]
        return (group, -(_field(r, "speedup") or 0.0))

    return sorted(rows, key=rank)
