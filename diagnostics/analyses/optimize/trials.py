"""Run the baseline and each fix as a trial in one process, with the same inputs and harness.

Every candidate (the baseline included) is called in eval mode under ``torch.no_grad()`` with the
same inputs, and all are timed together in interleaved rounds (so machine drift hits each alike):
median and p90 latency, throughput, peak memory above the inputs and weights, size
on disk (TorchScript archive for script modules, else the state_dict) and fidelity against the
baseline's outputs. A fix that does not apply or raises gets a row that says why.

Rows are reported as they come (``report(rows, message)``: the job's partial results): each
candidate's row once it is built and checked, then the timed rows while the rounds run (a fix decided
at an interim look with its final figures, the others as "measuring").
"""

from __future__ import annotations

import copy
import io
import json
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from diagnostics.measure.compare import CONTROL, Rounds, Stop, control_problem, timed_rounds
from diagnostics.measure.disturbance import assess, watch
from diagnostics.measure.memory import added_peak_bytes
from diagnostics.measure.timer import timed
from diagnostics.analyses.optimize.catalog import get_fix
from diagnostics.analyses.optimize.fixes import FixNotApplicable, trace
from diagnostics.errors import explain
from diagnostics.inputs import call as call_model



def first_tensor(out) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for o in out:
            t = first_tensor(o)
            if t is not None:
                return t
    if isinstance(out, dict):
        return first_tensor(list(out.values()))
    return None


def fidelity(base, other, classifier: bool) -> dict:
    """How far ``other`` moved from ``base``: max abs error, relative error, cosine, top-1 agreement."""
    a, b = first_tensor(base), first_tensor(other)
    if a is None or b is None:
        return {"max_abs_err": None, "rel_err": None, "cosine": None, "top1_agreement": None}
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if a.shape != b.shape:
        raise ValueError(f"output shape changed: {list(a.shape)} -> {list(b.shape)}")
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    scale = a.abs().max().item() if a.numel() else 0.0
    cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item() if a.numel() else 1.0
    top1 = None
    if classifier and a.dim() >= 2 and a.shape[-1] > 1:
        top1 = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    return {"max_abs_err": diff, "rel_err": diff / scale if scale else None, "cosine": cos, "top1_agreement": top1}


def serialized_bytes(model: nn.Module) -> tuple[int, str]:
    """Bytes of the model on disk: TorchScript archive, or the state_dict saved with torch.save; a
    candidate that is not a plain module (an ONNX Runtime session, say) answers ``serialized()``."""
    own = getattr(model, "serialized", None)
    if callable(own):
        return own()
    buf = io.BytesIO()
    if isinstance(model, torch.jit.ScriptModule):
        torch.jit.save(model, buf)
        return len(buf.getvalue()), "TorchScript archive"
    inner = getattr(model, "_orig_mod", model)
    torch.save(inner.state_dict(), buf)
    return len(buf.getvalue()), "state_dict (torch.save)"


def save_artifact(model: nn.Module, inputs: tuple, directory: Path, name: str, recipe: dict) -> dict:
    """The optimized model as TorchScript where it traces, else state_dict + the recipe as JSON."""
    directory.mkdir(parents=True, exist_ok=True)
    recipe_path = directory / f"{name}.recipe.json"
    recipe_path.write_text(json.dumps(recipe, indent=1, default=str))
    own = getattr(model, "save_to", None)  # a candidate with its own file format (an .onnx file, say)
    if callable(own):
        return {**own(directory, name), "recipe": str(recipe_path)}
    ts = model if isinstance(model, torch.jit.ScriptModule) else None
    why = None
    if ts is None and not hasattr(model, "_orig_mod"):
        try:
            with torch.no_grad():
                ts = trace(model, inputs)  # keyword inputs traced by position
        except Exception as e:  # quantized tensor subclasses, data-dependent control flow...
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    elif ts is None:
        why = "compiled modules are not serialisable; re-apply torch.compile after loading"
    if ts is not None:
        try:
            path = directory / f"{name}.torchscript.pt"
            torch.jit.save(ts, str(path))
            return {"kind": "torchscript", "path": str(path), "recipe": str(recipe_path)}
        except Exception as e:
            why = f"{type(e).__name__}: {str(e)[:120]}"
    path = directory / f"{name}.state_dict.pt"
    torch.save(getattr(model, "_orig_mod", model).state_dict(), str(path))
    return {"kind": "state_dict", "path": str(path), "recipe": str(recipe_path), "why_not_torchscript": why}


def _row(fix: str, title: str, status: str, **kw) -> dict:
    row = {"fix": fix, "title": title, "status": status, "why": None, "notes": [], "params": {},
           "median_ms": None, "p90_ms": None, "throughput_per_s": None, "first_call_ms": None, "peak_bytes": None,
           "size_bytes": None, "size_kind": None, "speedup": None, "size_ratio": None, "max_abs_err": None,
           "rel_err": None, "cosine": None, "top1_agreement": None, "artifact": None,
           "speedup_ci": None, "verdict": None, "confidence": None, "time_ms": None, "rounds": None,
           "losses": None, "loss_rel_diff": None, "grad_cosine": None}  # the last three: training mode
    row.update(kw)
    return row


def fix_rows(fixes: list[str], mode: str, facts: dict, params: dict, rows: list[dict],
             attempt: Callable[[str, object, dict], tuple[dict, object]], *, why_failed: Callable = explain,
             report: Report | None = None, progress: Callable[[float, str], None] | None = None,
             share: tuple[float, float] = (0.05, 0.5), words: tuple[str, str] = ("built", "applying")) -> dict:
    """One row per fix appended to ``rows``, for the inference trials and the training trials alike:
    "not_applicable" with why (the fix's ``applies(facts)``, or the recipe's FixNotApplicable), "failed"
    with ``why_failed(error)`` (torch.OutOfMemoryError is the runner's: raised), else the row
    ``attempt(fix_id, fix, options)`` returns with what it built. Returns {fix id: what was built}.
    ``report`` gets the rows before each fix ("built 2 of 5 fixes"); ``progress`` moves over ``share``."""
    report = report or (lambda rows, message: None)
    progress = progress or (lambda f, m: None)
    built = {}
    for i, fix_id in enumerate(fixes):
        report(rows, f"{words[0]} {i} of {len(fixes)} fixes")
        fix = get_fix(fix_id, mode)
        progress(share[0] + share[1] * i / max(1, len(fixes)), f"{words[1]}: {fix.title}")
        opts = fix.options(params.get(fix_id))
        ok, why = fix.applies(facts)
        if not ok:
            rows.append(_row(fix_id, fix.title, "not_applicable", why=why, params=opts))
            continue
        try:
            row, made = attempt(fix_id, fix, opts)
        except FixNotApplicable as e:
            rows.append(_row(fix_id, fix.title, "not_applicable", why=str(e), params=opts))
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # a failing fix says why; the others still run
            rows.append(_row(fix_id, fix.title, "failed", why=why_failed(e), params=opts))
        else:
            rows.append(row)
            built[fix_id] = made
    return built


def _call(model: nn.Module, inputs: tuple) -> Callable[[], object]:
    def call():
        with torch.no_grad():
            return call_model(model, inputs)
    return call


def prepare(model: nn.Module, inputs: tuple, device: torch.device) -> tuple[dict, object]:
    """First call (compiles, if the fix compiles), peak memory and size on disk; not the latency."""
    call = _call(model, inputs)
    first_ms, out = timed(call, device)
    # a candidate whose memory torch cannot see (an ONNX Runtime session) says so: "not counted", never 0
    peak = added_peak_bytes(call, device) if getattr(model, "peak_counted", True) else None
    size, kind = serialized_bytes(model)
    return {"first_call_ms": first_ms, "peak_bytes": peak, "size_bytes": size, "size_kind": kind}, out


#: While the rounds run, the rows are reported at most this often (and whenever a fix is decided).
REPORT_EVERY_S = 1.0
#: What a job's partial results are given: the rows known so far and what is being done.
Report = Callable[[list[dict], str], None]


def timing_reporter(rows: list[dict], report: Report | None, what: str) -> Callable[[Rounds, list[str]], None] | None:
    """``on_round`` for ``measure.compare.run_rounds``: ``report`` the rows with the figures so far
    after a round in which a fix was decided, and otherwise at most every REPORT_EVERY_S seconds."""
    if report is None:
        return None
    last = [time.monotonic()]

    def on_round(r: Rounds, decided_now: list[str]) -> None:
        if not decided_now and time.monotonic() - last[0] < REPORT_EVERY_S:
            return
        last[0] = time.monotonic()
        report(measuring_rows(rows, r, what), f"timing: round {r.done}, {len(r.decided)} decided")

    return on_round


def measuring_rows(rows: list[dict], r: Rounds, what: str) -> list[dict]:
    """The rows with the rounds' figures so far: a decided fix's are final; the others (and the control)
    are still being measured, so they show the speed-up so far with no interval or verdict yet."""
    out = with_times(copy.deepcopy(rows), r.summary(), {"disturbed": False}, what)
    for row in out:
        if row["fix"] in r.timers and row["fix"] != r.baseline and row["fix"] not in r.decided:
            row.update(speedup_ci=None, verdict=None, measuring=f"round {r.done}")
        row["confidence"] = None
    return out


def time_interleaved(models: dict[str, nn.Module], inputs: tuple, device: torch.device, iters: int,
                     warmup: int, control: bool = False, *, early_stop: bool = False, budget_s: float | None = None,
                     on_round=None) -> tuple[dict[str, dict], dict, Stop]:
    """Latency of every candidate, and its speed-up over the first (the baseline) with an interval
    and a verdict: ``measure.compare.timed_rounds`` over ``iters`` rounds (each a fresh random order and
    its reverse), stopped early when every verdict is decided (``early_stop``) or the time budget is
    spent; ``control`` adds the A/A row. Also what the machine did meanwhile (``measure.disturbance``)
    and how the rounds ended."""
    batch = next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim()), 1)
    calls = {k: _call(m, inputs) for k, m in models.items()}
    with watch() as w:
        r, stop = timed_rounds(calls, device, iters, warmup, batch_size=batch, control=control,
                               early_stop=early_stop, budget_s=budget_s, on_round=on_round)
        times = r.summary()
    base = times[next(iter(models))]
    return times, assess(w.figures, base["cv"]), stop


def run_trials(model: nn.Module, inputs: tuple, device: torch.device | str, fixes: list[str], facts: dict,
               params: dict | None = None, *, iters: int = 10, warmup: int = 2, classifier: bool = True,
               artifact_dir: Path | None = None, early_stop: bool = False, budget_s: float | None = None,
               progress: Callable[[float, str], None] | None = None,
               report: Report | None = None) -> tuple[list[dict], dict, Stop]:
    """Rows: the baseline first, the A/A control, then one per fix in the order given; what the
    machine did while they were timed (``measure.disturbance.assess``); how the timed rounds ended.

    Every candidate is built and checked first (``build_trials``); then all are timed together, one
    call each per round (see ``time_interleaved``). ``report`` gets the rows as they come (the job's
    partial results).
    """
    device = torch.device(device)
    progress = progress or (lambda f, m: None)
    rows, candidates = build_trials(model, inputs, device, fixes, facts, params, classifier=classifier,
                                    artifact_dir=artifact_dir, progress=progress, report=report)
    progress(0.6, f"timing {len(candidates)} candidates and the A/A control in interleaved rounds")
    try:
        times, disturbance, stop = time_interleaved(candidates, inputs, device, iters, warmup, control=True,
                                                    early_stop=early_stop, budget_s=budget_s,
                                                    on_round=timing_reporter(rows, report, "the baseline"))
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # a candidate that ran once but fails when repeated
        raise RuntimeError(f"timing the trials failed: {type(e).__name__}: {e}") from e
    return with_times(rows, times, disturbance, "the baseline"), disturbance, stop


def build_trials(model: nn.Module, inputs: tuple, device: torch.device, fixes: list[str], facts: dict,
                 params: dict | None = None, *, classifier: bool = True, artifact_dir: Path | None = None,
                 progress: Callable[[float, str], None] | None = None,
                 report: Report | None = None) -> tuple[list[dict], dict[str, nn.Module]]:
    """The rows (the baseline first, then one per fix) and the candidates to time (key -> model): each
    candidate built on a copy and checked (first call, peak memory, size, fidelity, artifact); a fix that
    does not apply or fails gets a row that says why and no candidate. ``report`` gets each row as it comes."""
    report_rows = report or (lambda rows, message: None)
    progress = progress or (lambda f, m: None)
    params = params or {}
    base_model = copy.deepcopy(model).eval()
    progress(0.02, "baseline")
    base, base_out = prepare(base_model, inputs, device)
    rows = [_row("baseline", "Baseline (eval, no_grad)", "ok", size_ratio=1.0,
                 **fidelity(base_out, base_out, classifier), **base)]
    candidates = {"baseline": base_model}

    def attempt(fix_id: str, fix, opts: dict) -> tuple[dict, nn.Module]:
        candidate, notes = fix.apply(copy.deepcopy(model), inputs, opts)
        m, out = prepare(candidate, inputs, device)
        row = _row(fix_id, fix.title, "ok", notes=notes, params=opts, **m, **fidelity(base_out, out, classifier))
        row["size_ratio"] = m["size_bytes"] / base["size_bytes"] if base["size_bytes"] else None
        if fix_id == "prune_l1":
            row["notes"].append(f"zero weights: {zero_fraction(candidate):.1%} of Linear/Conv weights")
        if artifact_dir is not None:
            try:
                row["artifact"] = save_artifact(candidate, inputs, Path(artifact_dir), f"optimized_{fix_id}",
                                                {"fix": fix_id, "params": opts, "notes": notes,
                                                 "torch": torch.__version__})
            except Exception as e:
                row["notes"].append(f"could not save the optimized model: {type(e).__name__}: {e}")
        return row, candidate

    candidates.update(fix_rows(fixes, "inference", facts, params, rows, attempt, report=report, progress=progress))
    report_rows(rows, f"built {len(fixes)} of {len(fixes)} fixes; timing")
    return rows, candidates


#: What a timed row takes from the comparison (measure.compare.Rounds.summary); ``decided_at``: the
#: round of the interim look that decided it (None: it ran every round).
TIMED = ("median_ms", "p90_ms", "cv", "throughput_per_s", "time_ms", "speedup", "speedup_ci", "verdict", "rounds",
         "decided_at")


def with_times(rows: list[dict], times: dict[str, dict], disturbance: dict, what: str) -> list[dict]:
    """``rows`` (the baseline first) with the A/A control's row after the baseline and every timed row's
    figures. Each verdict's confidence is "low" when the machine was busy or the control itself read
    anything but "within noise" (the measurement, not the model, is then what the verdicts show)."""
    control = dict(rows[0], fix=CONTROL, title=f"A/A control ({what}, timed as if it were a fix)",
                   notes=["the unchanged baseline: its interval is this run's noise floor"], artifact=None)
    rows.insert(1, control)
    confidence = "low" if disturbance["disturbed"] or control_problem(times) else "normal"
    for row in rows:
        if row["fix"] in times:
            row.update({k: times[row["fix"]].get(k) for k in TIMED})
            row["confidence"] = confidence
    return rows


def zero_fraction(model: nn.Module) -> float:
    total = zeros = 0
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            w = m.weight.detach()
            total += w.numel()
            zeros += int((w == 0).sum())
    return zeros / total if total else 0.0
