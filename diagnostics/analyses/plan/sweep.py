"""Sweeps that stay fast: the largest batch that fits, and a batch x sequence grid, from a few traces.

At a fixed sequence length every tensor a step makes grows linearly with the batch (the same ops run
on tensors with a longer first dimension), so each phase's peak (forward, backward, optimizer) is a
straight line in the batch while the same op holds it. ``Curve`` keeps the traced points of one
setting and sequence length and interpolates each phase's peak piecewise-linearly between them
(extrapolating from the last two); the step's peak is the highest phase. ``max_batch`` traces batch
1 and a larger batch, predicts the boundary from the lines, then traces the predicted largest batch
and the next one: the answer is confirmed by two traces at the boundary, and corrected (the new
points join the curve) when the lines were off. The grid interpolates every cell from the points
its column traced; the rows of the result are traced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnostics.analyses.plan.configs import Config, Setting
from diagnostics.analyses.plan.result import Grid, MaxBatch

#: The second batch traced for a curve (then the boundary's own).
PROBE_BATCH = 8
MAX_ROUNDS = 12
GRID_COLUMNS = 12


@dataclass
class Curve:
    """Traced (batch -> {phase: peak, parts}) points of one setting at one sequence length."""

    setting: Setting
    seq: int | None
    points: dict = field(default_factory=dict)  # batch -> {phase: (bytes, parts)}

    def add(self, batch: int, phases: dict) -> None:
        self.points[int(batch)] = phases

    def _line(self, batch: int) -> tuple[int, int] | None:
        xs = sorted(self.points)
        if not xs:
            return None
        if len(xs) == 1:
            return xs[0], xs[0]
        if batch <= xs[0]:
            return xs[0], xs[1]
        for a, b in zip(xs, xs[1:]):
            if a <= batch <= b:
                return a, b
        return xs[-2], xs[-1]

    def phase_values(self, batch: int) -> dict[str, tuple[float, dict]]:
        line = self._line(batch)
        if line is None:
            return {}
        a, b = line
        pa, pb = self.points[a], self.points[b]
        out = {}
        for ph in pa:
            if ph not in pb:
                continue
            (va, parts_a), (vb, parts_b) = pa[ph], pb[ph]
            t = 0.0 if a == b else (batch - a) / (b - a)
            value = va + (vb - va) * t
            parts = {k: int(round(parts_a.get(k, 0) + (parts_b.get(k, 0) - parts_a.get(k, 0)) * t))
                     for k in set(parts_a) | set(parts_b)}
            out[ph] = (value, parts)
        return out

    def peak(self, batch: int) -> tuple[int, dict, str]:
        """Predicted (peak bytes, parts, phase) at ``batch``; exact at a traced batch."""
        if batch in self.points:
            vals = self.points[batch]
        else:
            vals = self.phase_values(batch)
        ph = max(vals, key=lambda p: vals[p][0])
        return int(round(vals[ph][0])), vals[ph][1], ph

    def largest_under(self, budget: int, limit: int) -> int:
        """The largest batch in [1, limit] whose predicted peak is under ``budget`` (0: none)."""
        lo, hi = 0, limit
        if self.peak(1)[0] > budget:
            return 0
        lo = 1
        while lo < hi:  # peak grows with the batch: bisect on the prediction
            mid = (lo + hi + 1) // 2
            if self.peak(mid)[0] <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo


class SweepFailure(Exception):
    """A sweep's trace failed at ``batch``; ``answer``: the MaxBatch the traces before it support."""

    def __init__(self, batch: int, cause: BaseException, answer: MaxBatch | None = None):
        self.batch, self.cause, self.answer = batch, cause, answer
        super().__init__(f"batch {batch} could not be planned: {str(cause).splitlines()[0] if str(cause) else type(cause).__name__}")


def curve_point(planner, curve: Curve, batch: int) -> tuple[int, bool]:
    """Trace ``batch`` into ``curve``; (device peak, fits). SweepFailure names the batch a trace failed at."""
    try:
        st = planner.run(Config(batch, curve.seq, curve.setting))
    except Exception as e:
        raise SweepFailure(batch, e) from e
    peak, parts = planner.device_peak(st)
    extra = peak - int(st.peak_bytes)
    phases = {ph: (int(v["bytes"]) + extra, {**v["parts"], "workspaces": v["parts"].get("workspaces", 0) + extra})
              for ph, v in st.phase_peaks.items() if ph != "setup"}
    curve.add(batch, phases)
    return peak, planner.fits(peak)


def max_batch(planner, curve: Curve, limit: int) -> MaxBatch:
    """The largest batch that fits (see the module doc), confirmed by traces at the boundary."""
    budget = planner.budget()
    fit: dict[int, int] = {}
    no: dict[int, int] = {}

    def probe(b: int) -> None:
        try:
            peak, ok = curve_point(planner, curve, b)
        except SweepFailure as e:  # answer with what the traces so far support, and say where it stopped
            lo = max(fit, default=0)
            e.answer = MaxBatch(curve.setting.label, curve.seq, lo, fit.get(lo),
                                f"{'at least batch %d fits (traced); ' % lo if lo else ''}{e}", limit)
            raise
        (fit if ok else no)[b] = peak

    probe(1)
    if 1 in no:
        return MaxBatch(curve.setting.label, curve.seq, 0, None, "batch 1 does not fit (traced)", limit)
    if limit > 1:
        probe(min(limit, PROBE_BATCH))
    for _ in range(MAX_ROUNDS):
        lo = max(fit)
        hi = min(no) if no else None
        if lo == limit or (hi is not None and hi == lo + 1):
            break
        guess = curve.largest_under(budget, limit)
        top = (hi - 1) if hi is not None else limit
        guess = min(max(guess, lo + 1), top) if guess > lo else lo
        if guess == lo:  # the lines say lo is the last that fits: the next one checks it
            probe(lo + 1)
            continue
        probe(guess)
        if guess in fit and guess < limit and guess + 1 not in no and guess + 1 not in fit:
            probe(guess + 1)
    lo = max(fit)
    hi = min(no) if no else None
    if not (lo == limit or (hi is not None and hi == lo + 1)):
        while hi is not None and hi - lo > 1:  # not settled by the lines: bisect with traces
            mid = (lo + hi) // 2
            probe(mid)
            lo, hi = max(fit), min(no) if no else None
    if lo == limit:
        checked = f"every batch up to the limit {limit} fits (batch {limit} traced)"
    else:
        checked = f"traced: batch {lo} fits, batch {lo + 1} does not"
    return MaxBatch(curve.setting.label, curve.seq, lo, fit[lo], checked, limit)


def grid_batches(largest: int, limit: int) -> list[int]:
    top = max(2, min(limit, 2 * max(1, largest)))
    out, b = [], 1
    while b <= top and len(out) < GRID_COLUMNS:
        out.append(b)
        b *= 2
    if top not in out and len(out) < GRID_COLUMNS:
        out.append(top)
    return out


def grid(planner, setting: Setting, curves: dict, batches: list[int]) -> Grid:
    """Predicted peak of every (batch, seq) cell from each column's traced points."""
    seqs = sorted(curves, key=lambda s: -1 if s is None else s)
    peaks, fits, traced = [], [], []
    for s in seqs:
        c = curves[s]
        row = tuple(c.peak(b)[0] for b in batches)
        peaks.append(row)
        fits.append(tuple(planner.fits(p) for p in row))
        traced += [(b, s) for b in sorted(c.points)]
    return Grid(setting.label, tuple(batches), tuple(seqs), tuple(peaks), tuple(fits), tuple(traced))


def grid_seqs(requested: list[int], limit: int | None) -> list[int]:
    """The grid's sequence lengths: the requested ones; one asked for gets its half and double beside it."""
    seqs = sorted(set(requested))
    while len(seqs) < 3 and len(set(requested)) < 2 and seqs:
        lo, hi = seqs[0], seqs[-1]
        if limit is None or 2 * hi <= limit:
            seqs.append(2 * hi)
        elif lo // 2 >= 16:
            seqs.insert(0, lo // 2)
        else:
            break
        seqs = sorted(set(seqs))
    return seqs
