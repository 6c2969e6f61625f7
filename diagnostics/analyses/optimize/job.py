"""Analysis "optimize": the baseline and each chosen fix as trials, measured in the same job.

Options are declared in this package's ``__init__`` (fixes, params, iters, warmup, save_artifacts)
and arrive validated. Result: result.OptimizeResult, built from the trials' rows (baseline first, the
A/A control, one per fix); while it runs, OptimizePartial (the rows so far). The user's model is never
changed: every trial runs on a deep copy.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

from diagnostics.analyses.optimize import ANALYSIS
from diagnostics.analyses.optimize.result import OptimizePartial, OptimizeResult
from diagnostics.measure.environment import environment_facts
from diagnostics.measure.structure import forward_facts, static_facts
from diagnostics.analyses.optimize.assess import assess
from diagnostics.analyses.optimize.catalog import fix_ids, get_fix
from diagnostics.analyses.optimize.train_trials import run_train_trials
from diagnostics.analyses.optimize.trials import run_trials
from diagnostics.measure.compare import CONTROL, METHOD, control_problem, too_few_rounds
from diagnostics.measure.dynamo import empty_cache_codegen
from diagnostics.results import build



def _model_facts(loaded) -> dict:
    """What the fixes ask of the model: its structure, the device, its source, one hooked forward (on a copy)."""
    facts = {"static": static_facts(loaded.model), "env": environment_facts(loaded.device),
             "source": loaded.spec.source}
    try:
        facts["forward"] = forward_facts(copy.deepcopy(loaded.model), loaded.inputs)
    except Exception:
        facts["forward"] = None
    return facts


def _run(ctx, loaded, opts: dict, fixes: list[str], facts: dict, timing: dict):
    """The baseline, the A/A control and each fix as trials (training steps or inference calls):
    (rows, disturbance, the stop)."""
    # torch.compile on the worker's empty compiler cache, without inductor's one-off probes (measure.dynamo)
    with empty_cache_codegen() if "torch_compile" in fixes else nullcontext():
        if opts["mode"] == "train":
            return run_train_trials(loaded.model, loaded.inputs, loaded.device, loaded.loss_fn, fixes, facts,
                                    opts["params"], optimizer=opts["optimizer"], lr=opts["lr"],
                                    steps=opts["train_steps"], **timing)
        return run_trials(loaded.model, loaded.inputs, loaded.device, fixes, facts, opts["params"],
                          artifact_dir=ctx.artifact_dir if opts["save_artifacts"] else None, **timing)


def _metrics(rows: list[dict], threads: int) -> dict:
    """The baseline's figures, the best fix that is surely faster (and keeps fidelity), the control, counts."""
    ok = [r for r in rows if r["status"] == "ok" and r["fix"] not in ("baseline", CONTROL)]
    faster = [r for r in ok if r["verdict"] == "faster" and r["flag"] != "fidelity_loss"]
    best = max(faster, key=lambda r: r["speedup"] or 0, default=None)
    control = next(r for r in rows if r["fix"] == CONTROL)
    best_ci = (best or {}).get("speedup_ci") or [None, None]
    control_ci = control["speedup_ci"] or [None, None]
    return {
        "baseline_median_ms": rows[0]["median_ms"],
        "baseline_size_bytes": rows[0]["size_bytes"],
        "baseline_peak_bytes": rows[0]["peak_bytes"],
        "best_fix": best["fix"] if best else None,
        "best_speedup": best["speedup"] if best else None,
        "best_speedup_ci_low": best_ci[0],
        "best_speedup_ci_high": best_ci[1],
        "control_speedup": control["speedup"],
        "control_ci_low": control_ci[0],
        "control_ci_high": control_ci[1],
        "control_verdict": control["verdict"],
        "fixes_faster": len(faster),
        "fixes_slower": sum(r["verdict"] == "slower" for r in ok),
        "fixes_fidelity_loss": sum(r["flag"] == "fidelity_loss" for r in ok),
        "trials_ok": len(ok),
        "trials_failed": sum(r["status"] == "failed" for r in rows),
        "trials_not_applicable": sum(r["status"] == "not_applicable" for r in rows),
        "threads": threads,
    }


def _notes(loaded, opts: dict, threads: int, rows: list[dict], stop, disturbance: dict) -> list[str]:
    """How the trials ran, what limits the measurement, and whether the machine was busy."""
    control = next(r for r in rows if r["fix"] == CONTROL)
    measurement = [n for n in (too_few_rounds(stop.run), stop.note(), control_problem({CONTROL: control})) if n]
    return (([_train_note(loaded, opts, threads)] if opts["mode"] == "train" else [
             f"Every candidate runs in eval mode under torch.no_grad() with the same inputs and "
             f"{threads} torch threads, on {loaded.device}. Timing: {opts['warmup']} warm-up "
             f"calls each, then {opts['iters']} {METHOD}. The A/A control row times the baseline against "
             "itself: its interval is this run's noise floor. Peak memory is what one call allocates above the "
             "weights and inputs."])
            + measurement
            + ([f"The machine was busy while the trials were timed: {'; '.join(disturbance['reasons'])}. "
                "The verdicts are low-confidence."] if disturbance["disturbed"] else []))


def analyze(ctx, options: dict) -> OptimizeResult:
    opts = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    loaded = ctx.loaded
    ctx.progress(0.05, "reading the model")
    facts = _model_facts(loaded)
    classifier = getattr(loaded, "task", "unknown") in ("classification", "lm")
    train = opts["mode"] == "train"
    fixes = opts["fixes"] or fix_ids(opts["mode"])
    for f in fixes:
        get_fix(f, opts["mode"])  # a fix of the other mode: a clear error before any work
    progress = lambda f, m: ctx.progress(0.1 + 0.85 * f, m)  # noqa: E731

    def report(rows: list[dict], stage: str) -> None:  # the rows known so far: the page and the CLI show them
        ctx.partial(build(OptimizePartial, {
            "model": loaded.spec.label, "mode": opts["mode"], "iters": opts["iters"], "stage": stage,
            "fixes": list(fixes), "rows": assess(copy.deepcopy(rows), opts["mode"], opts["min_cosine"], opts["min_top1"])}))

    timing = {"iters": opts["iters"], "warmup": opts["warmup"], "early_stop": opts["early_stop"],
              "budget_s": opts["time_budget_s"] or None, "classifier": classifier, "progress": progress,
              "report": report}
    rows, disturbance, stop = _run(ctx, loaded, opts, fixes, facts, timing)
    rows = assess(rows, opts["mode"], opts["min_cosine"], opts["min_top1"])
    import torch

    threads = torch.get_num_threads()
    return build(OptimizeResult, {
        "model": loaded.spec.label,
        "device": str(loaded.device),
        "batch_size": loaded.batch_size,
        "task": getattr(loaded, "task", "unknown"),
        "iters": opts["iters"],
        "timing_stop": stop.to_dict(),
        "mode": opts["mode"],
        "loss": loaded.loss_name if train else None,
        "optimizer": opts["optimizer"] if train else None,
        "train_steps": opts["train_steps"] if train else None,
        "threads": threads,
        "rows": rows,
        "timing_disturbance": disturbance,
        "timing_cv": rows[0].get("cv"),
        "metrics": _metrics(rows, threads),
        "notes": _notes(loaded, opts, threads, rows, stop, disturbance),
    })


def _train_note(loaded, opts: dict, threads: int) -> str:
    return (f"Training mode: every candidate trains a copy of the model from the same initial state (same seed) "
            f"with {opts['optimizer']} (lr {opts['lr']:g}) on the same batch, loss: {loaded.loss_name}, "
            f"{threads} torch threads, on {loaded.device}. Fidelity: {opts['train_steps']} steps; the loss after "
            "each against the baseline's (largest relative difference), the cosine of the gradients after the "
            "first step, and the trained model's outputs (eval mode) against the trained baseline's. Peak memory: "
            "one more step, with parameters, buffers, inputs and optimizer state resident before it (as the "
            f"memory analysis measures a training peak). Timing: {opts['warmup']} warm-up steps each, then "
            f"{opts['iters']} {METHOD}; the A/A control row is this run's noise floor.")
