"""Analysis "optimize": the baseline and each chosen fix as trials, measured in the same job.

Options: ``fixes`` (list of ids from diagnostics.analyses.optimize.fixes.FIXES; default all), ``params``
({fix_id: {param: value}}), ``iters`` (timed calls per trial, default 10), ``warmup`` (default 2),
``save_artifacts`` (default True). Result: ``rows`` (baseline first; per row median_ms, p90_ms,
throughput_per_s, first_call_ms, peak_bytes, size_bytes, speedup, size_ratio, max_abs_err,
rel_err, cosine, top1_agreement, status ok | not_applicable | failed with ``why``, ``artifact``)
and ``metrics`` (baseline_median_ms, best_fix, best_speedup, trials_ok, trials_failed,
trials_not_applicable). The user's model is never changed: every trial runs on a deep copy.
"""

from __future__ import annotations

from diagnostics.analyses.checklist.facts import environment_facts, forward_facts, static_facts
from diagnostics.errors import TorchScopeError
from diagnostics.analyses.optimize.fixes import FIX_IDS, get_fix
from diagnostics.analyses.optimize.trials import run_trials


def validate_options(options: dict) -> dict:
    opts = dict(options or {})
    fixes = opts.get("fixes") or list(FIX_IDS)
    if not isinstance(fixes, (list, tuple)):
        raise TorchScopeError("option fixes must be a list of fix ids")
    for f in fixes:
        get_fix(f)  # raises naming the unknown fix
    params = opts.get("params") or {}
    for fix_id, p in params.items():
        get_fix(fix_id).options(p)  # raises naming the bad parameter
    for key, lo, hi, default in (("iters", 1, 1000, 10), ("warmup", 0, 100, 2)):
        v = opts.get(key, default)
        if not isinstance(v, int) or not lo <= v <= hi:
            raise TorchScopeError(f"option {key} must be an integer from {lo} to {hi}, got {v!r}")
        opts[key] = v
    opts["fixes"], opts["params"] = list(fixes), params
    return opts


def analyze(ctx, options: dict) -> dict:
    opts = validate_options(options)
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
                      artifact_dir=ctx.artifact_dir if opts.get("save_artifacts", True) else None,
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
