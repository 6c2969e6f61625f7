"""Analysis "optimize": the baseline and each chosen fix as trials, measured in the same job.

Options are declared in this package's ``__init__`` (fixes, params, iters, warmup, save_artifacts)
and arrive validated. Result: ``rows`` (baseline first; per row median_ms, p90_ms,
throughput_per_s, first_call_ms, peak_bytes, size_bytes, speedup, size_ratio, max_abs_err,
rel_err, cosine, top1_agreement, status ok | not_applicable | failed with ``why``, ``artifact``)
and ``metrics`` (baseline_median_ms, best_fix, best_speedup, trials_ok, trials_failed,
trials_not_applicable). The user's model is never changed: every trial runs on a deep copy.
"""

from __future__ import annotations

from diagnostics.analyses.optimize import ANALYSIS
from diagnostics.measure.environment import environment_facts
from diagnostics.measure.structure import forward_facts, static_facts
from diagnostics.analyses.optimize.trials import run_trials



def analyze(ctx, options: dict) -> dict:
    options = ANALYSIS.validate(options)  # idempotent: the runner validated them too
    opts = options
    loaded = ctx.loaded
    ctx.progress(0.05, "reading the model")
    import copy

    facts = {"static": static_facts(loaded.model), "env": environment_facts(loaded.device)}
    try:
        facts["forward"] = forward_facts(copy.deepcopy(loaded.model), loaded.inputs)
    except Exception:
        facts["forward"] = None
    classifier = getattr(loaded, "task", "unknown") in ("classification", "lm")
    rows = run_trials(loaded.model, loaded.inputs, loaded.device, opts["fixes"], facts, opts["params"],
                      iters=opts["iters"], warmup=opts["warmup"], classifier=classifier,
                      artifact_dir=ctx.artifact_dir if opts["save_artifacts"] else None,
                      progress=lambda f, m: ctx.progress(0.1 + 0.85 * f, m))
    ok = [r for r in rows[1:] if r["status"] == "ok"]
    best = max(ok, key=lambda r: r["speedup"] or 0, default=None)
    return {
        "model": loaded.spec.label,
        "device": str(loaded.device),
        "batch_size": loaded.batch_size,
        "task": getattr(loaded, "task", "unknown"),
        "iters": opts["iters"],
        "rows": rows,
        "metrics": {
            "baseline_median_ms": rows[0]["median_ms"],
            "baseline_size_bytes": rows[0]["size_bytes"],
            "best_fix": best["fix"] if best else None,
            "best_speedup": best["speedup"] if best else None,
            "trials_ok": len(ok),
            "trials_failed": sum(r["status"] == "failed" for r in rows),
            "trials_not_applicable": sum(r["status"] == "not_applicable" for r in rows),
        },
        "notes": ["Every candidate runs in eval mode under torch.no_grad() with the same inputs; latency is "
                  f"the median / p90 of {opts['iters']} calls after {opts['warmup']} warm-up calls on "
                  f"{loaded.device}. Peak memory is what one call allocates above the weights and inputs."],
    }
