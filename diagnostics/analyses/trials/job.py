"""A trials folder (diagnostics/attach/trials.py wrote its ``trials.json``: every run of the script, each
candidate's time per round) -> the TrialsResult. The figures:

* ``speedup``, ``speedup_ci``, ``verdict``: measure.compare's ratio of the baseline's round times over the
  candidate's (geometric mean, exact interval), judged beside the A/A control's interval: the same functions
  the Optimize page's rows come from;
* ``step_ms``: the geometric mean of the candidate's round times (a round's time: the mean timed step of its run);
* ``loss_max_rel_diff`` / ``grad_norm_max_rel_diff``: the candidate's first run against the baseline's first run,
  step by step over the warm-up steps (the script's own seed: a deterministic script gives 0 for the control);
* ``peak_bytes``: the median over the candidate's runs (CUDA: the allocator's peak over the timed steps; CPU: the
  process' peak resident memory);
* ``warmup_extra_ms``: the candidate's warm-up steps beyond the baseline's (a compile's time is here, never in
  ``step_ms``).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from diagnostics.analyses.trials.result import FixTrial, TrialsMetrics, TrialsResult
from diagnostics.errors import TorchScopeError
from diagnostics.measure.compare import CONTROL, METHOD, VERDICTS, control_problem, geometric_mean, ratio_summary

RECORD = "trials.json"
BASELINE = "baseline"


def analyze(ctx, options) -> TrialsResult:
    """The registered analysis: (re-)read a trials folder."""
    ctx.progress(0.1, "reading the trials folder")
    return analyse_folder(options["folder"])


def analyse_folder(folder) -> TrialsResult:
    path = Path(folder) / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TorchScopeError(f"{path} cannot be read as a trials record: {e}") from None
    return build_result(record, str(folder))


def _finite(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


def max_rel_diff(a, b) -> float | None:
    """The largest |a_i - b_i| / |b_i| over the steps both have (None: no common step; inf: one side non-finite)."""
    pairs = list(zip(a or (), b or ()))
    if not pairs:
        return None
    out = 0.0
    for x, y in pairs:
        if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
            if x is not None and y is not None and not math.isfinite(x) and not math.isfinite(y):
                continue
            return math.inf
        out = max(out, abs(x - y) / max(abs(y), 1e-12))
    return out


def _median(xs):
    xs = _finite(xs)
    return statistics.median(xs) if xs else None


def _failure(runs: list[dict]) -> str | None:
    for r in runs:
        if r.get("error") and not r.get("stopped"):  # a run cut short by Stop is no failure of the fix
            return r["error"]
    return None


def _row(key: str, fixes: tuple[str, ...], runs: list[dict], round_ms: list, base_ms: list, noise, ref: dict | None,
         base_warmup: float | None, stopped: bool) -> FixTrial:
    outs = [r["outcome"] for r in runs if r.get("outcome")]
    first = outs[0] if outs else None
    applicable, reason, change = True, None, None
    if fixes:
        states = [(first or {}).get("fixes", {}).get(f) or {} for f in fixes]
        na = [(f, s) for f, s in zip(fixes, states) if s.get("applicable") is False]
        if first is not None and na:
            applicable = len(na) < len(fixes)
            reason = "; ".join(f"{f}: {s.get('reason')}" for f, s in na) if len(fixes) > 1 else na[0][1].get("reason")
        elif first is None:
            applicable = None
        changes = [s.get("change") for s in states if s.get("change")]
        change = "; ".join(changes) or None
    failure = _failure(runs)
    losses = tuple(first["losses"]) if first and first.get("losses") is not None else None
    norms = tuple(first["grad_norms"]) if first and first.get("grad_norms") is not None else None
    loss_diff = max_rel_diff(losses, (ref or {}).get("losses")) if key != BASELINE else 0.0
    norm_diff = max_rel_diff(norms, (ref or {}).get("grad_norms")) if key != BASELINE else 0.0
    warm = _median([sum(o.get("warmup_ms") or [math.nan]) for o in outs])
    peak = _median([o.get("peak_bytes") for o in outs])
    timed = _finite(round_ms)
    step_ms = geometric_mean(timed) if timed else None
    summary = {"speedup": None, "speedup_ci": None, "verdict": None}
    if key == BASELINE:
        summary = {"speedup": 1.0, "speedup_ci": None, "verdict": None}
    elif timed:
        summary = ratio_summary(base_ms[:len(round_ms)], round_ms, None if key == CONTROL else noise)
    verdict = summary["verdict"]
    diverged = (losses is not None and ref and ref.get("losses") and loss_diff == math.inf
                and all(math.isfinite(x) for x in ref["losses"] if x is not None))
    if applicable is False:
        verdict = "not applicable"
    elif failure:
        verdict, reason = "failed", failure
    elif diverged:
        verdict = "diverged"
        reason = "its losses became non-finite where the baseline's are finite: " + ", ".join(f"{x:g}" for x in losses)
    elif not timed and stopped:
        verdict = "stopped"
    if applicable is False:  # it ran only to find that out: its figures are the baseline's
        losses = norms = loss_diff = norm_diff = warm = peak = None
    return FixTrial(
        fix=key, title=key if key not in (BASELINE, CONTROL) else ("baseline (the script as it is)" if key == BASELINE
                                                                    else "control (baseline again: A/A)"),
        applicable=applicable, reason=reason, verdict=verdict,
        speedup=summary["speedup"] if verdict not in ("not applicable", "failed") else None,
        speedup_ci=tuple(summary["speedup_ci"]) if summary.get("speedup_ci") and verdict not in (
            "not applicable", "failed") else None,
        step_ms=step_ms if applicable is not False else None,
        peak_bytes=int(peak) if peak is not None else None,
        loss_max_rel_diff=None if loss_diff is None or math.isinf(loss_diff) else loss_diff,
        grad_norm_max_rel_diff=None if norm_diff is None or math.isinf(norm_diff) else norm_diff,
        warmup_extra_ms=(warm - base_warmup) if warm is not None and base_warmup is not None and key != BASELINE else None,
        rounds=len(timed), round_ms=tuple(None if x is None or not math.isfinite(x) else float(x) for x in round_ms),
        losses=losses, grad_norms=norms, change=change)


def build_result(record: dict, folder: str = "") -> TrialsResult:
    """The result of a trials record (see diagnostics/attach/trials.py for its keys)."""
    fixes = tuple(record["fixes"])
    runs = record.get("runs", [])
    round_ms = {k: [math.nan if v is None else v for v in vs] for k, vs in record.get("round_ms", {}).items()}
    stopped = record.get("status") == "stopped"
    by_key: dict[str, list[dict]] = {}
    for r in runs:
        by_key.setdefault(r["key"], []).append(r)
    base_runs = by_key.get(BASELINE, [])
    ref = next((r["outcome"] for r in base_runs if r.get("outcome") and r["outcome"].get("done")), None)
    base_ms = round_ms.get(BASELINE, [])
    noise = None
    if CONTROL in round_ms and _finite(round_ms[CONTROL]):
        noise = ratio_summary(base_ms[:len(round_ms[CONTROL])], round_ms[CONTROL])["speedup_ci"]
    base_warm = _median([sum(r["outcome"].get("warmup_ms") or [math.nan]) for r in base_runs if r.get("outcome")])
    rows = [_row(k, () if k in (BASELINE, CONTROL) else (k,), by_key.get(k, []), round_ms.get(k, []), base_ms, noise,
                 ref, base_warm, stopped)
            for k in [BASELINE, CONTROL, *fixes]]
    combo = None
    c = record.get("combination")
    if c:
        cms = {k: [math.nan if v is None else v for v in vs] for k, vs in c["round_ms"].items()}
        combo = _row(c["key"], tuple(c["fixes"]), by_key.get(c["key"], []), cms.get(c["key"], []),
                     cms.get(BASELINE, []), noise, ref, base_warm, stopped)
    notes = list(record.get("notes", []))
    problem = control_problem({r.fix: {"verdict": r.verdict, "speedup": r.speedup, "speedup_ci": r.speedup_ci}
                               for r in rows if r.verdict in VERDICTS})
    if problem:
        notes.insert(0, problem)
    faster = [r for r in rows[2:] if r.verdict == "faster"]
    best = max(faster + ([combo] if combo and combo.verdict == "faster" else []), key=lambda r: r.speedup, default=None)
    changes = tuple(f"{r.fix}: {r.change}" for r in faster + ([combo] if combo and combo.verdict == "faster" else [])
                    if r.change)
    control = rows[1]
    device = ref.get("device") if ref else None
    metrics = TrialsMetrics(
        baseline_step_ms=rows[0].step_ms, best_fix=best.fix if best else None,
        best_speedup=best.speedup if best else None,
        best_ci_low=best.speedup_ci[0] if best and best.speedup_ci else None,
        best_ci_high=best.speedup_ci[1] if best and best.speedup_ci else None,
        control_speedup=control.speedup, control_ci_low=control.speedup_ci[0] if control.speedup_ci else None,
        control_ci_high=control.speedup_ci[1] if control.speedup_ci else None, control_verdict=control.verdict,
        fixes_faster=len(faster), fixes_slower=sum(r.verdict == "slower" for r in rows[2:]),
        fixes_not_applicable=sum(r.verdict == "not applicable" for r in rows[2:]),
        fixes_failed=sum(r.verdict in ("failed", "diverged") for r in rows[2:]), runs=len(runs))
    method = (f"each round runs the script once per candidate, each run a fresh process in a random order per round; a "
              f"run's time is the mean of its {record.get('steps')} timed steps after {record.get('warmup')} warm-up "
              f"steps. " + METHOD.replace("each timing every candidate twice in a fresh random order and its reverse",
                                          "each running every candidate once in a fresh random order"))
    return TrialsResult(
        command=tuple(record.get("command", ())), cwd=record.get("cwd", ""), fixes=fixes,
        status=record.get("status", "ok"), steps=int(record.get("steps", 0)), warmup=int(record.get("warmup", 0)),
        rounds=int(record.get("rounds", 0)), device=device, trials=tuple(rows), combination=combo, changes=changes,
        method=method, metrics=metrics, notes=tuple(notes), folder=folder or record.get("folder", ""),
        model=(ref or {}).get("model") or "script")
