"""What each trial buys and what it costs, in words: faster / slower beyond the noise, smaller,
less memory, and fidelity lost beyond the user's thresholds. No torch (the page and the report
read it too).

``assess(rows, mode, min_cosine, min_top1)`` sets on every measured row ``flag`` (one of FLAGS: a
fidelity loss outranks everything; gains with costs are a trade-off, e.g. slower but smaller) and
``assessment`` (the reasons, with their numbers); ``ranked(rows)`` orders them by what they buy:
the baseline and the control first, then gains (fastest first), trade-offs, regressions and
fidelity losses, then rows that did not run.
"""

from __future__ import annotations

from diagnostics.units import speedup_text

FLAGS = ("fidelity_loss", "regression", "trade_off", "gain", "neutral")
#: Size or peak memory this much below the baseline's counts as a gain.
SAVING = 0.10


def _fidelity_problems(r: dict, mode: str, min_cosine: float, min_top1: float) -> list[str]:
    out = []
    if mode == "train":
        if r.get("grad_cosine") is not None and r["grad_cosine"] < min_cosine:
            out.append(f"gradients moved: cosine {r['grad_cosine']:.4f} < {min_cosine:g}")
    if r.get("cosine") is not None and r["cosine"] < min_cosine:
        out.append(f"outputs moved: cosine {r['cosine']:.4f} < {min_cosine:g}")
    if r.get("top1_agreement") is not None and r["top1_agreement"] < min_top1:
        out.append(f"top-1 agreement {r['top1_agreement']:.1%} < {min_top1:.0%}")
    return out


def assess_row(r: dict, base: dict, mode: str, min_cosine: float, min_top1: float) -> dict:
    lost = _fidelity_problems(r, mode, min_cosine, min_top1)
    gains, costs = [], []
    if r.get("verdict") in ("faster", "slower"):
        (gains if r["verdict"] == "faster" else costs).append(f"{r['verdict']} {speedup_text(r['speedup'], r.get('speedup_ci'))}")
    if r.get("size_ratio") is not None and r["size_ratio"] < 1 - SAVING:
        gains.append(f"size x{r['size_ratio']:.2f}")
    if r.get("peak_bytes") and base.get("peak_bytes"):
        ratio = r["peak_bytes"] / base["peak_bytes"]
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


def ranked(rows: list[dict]) -> list[dict]:
    """The rows ranked by what they buy (see the module docstring); the order in the result stays
    the order the fixes were asked for."""

    def rank(r: dict):
        if r["fix"] == "baseline":
            return (0, 0.0)
        if r["fix"] == "control":
            return (1, 0.0)
        if r.get("status") != "ok":
            return (6, 0.0)
        group = {"gain": 2, "neutral": 2, "trade_off": 3, "regression": 4, "fidelity_loss": 4}[r["flag"]]
        return (group, -(r.get("speedup") or 0.0))

    return sorted(rows, key=rank)
