"""Analysis "checklist": collect facts about the model, run every rule, score, write reports.

Options: ``purpose`` ("training" | "inference"), ``iters`` (timed repetitions), ``profile_steps``,
``dataloader`` (batch_size, num_workers, pin_memory, prefetch_factor, persistent_workers),
``dataset_path`` (a Python file with build_dataset(); refused in server-safe mode).
Result: ``findings`` (Finding dicts in RULES order), ``by_category``, ``score``, ``counts``,
``thresholds``, ``facts`` and ``metrics`` (score and counts). ``report.md`` / ``report.html`` are
written to the artifact folder.
"""

from __future__ import annotations

from diagnostics.analyses.checklist.facts import collect_facts
from diagnostics.analyses.checklist.report import build_markdown
from diagnostics.analyses.checklist.rules import CATEGORIES, STATUSES, THRESHOLDS, evaluate, score
from diagnostics.errors import TorchScopeError

PURPOSES = ("training", "inference")


def validate_options(options: dict) -> dict:
    opts = dict(options or {})
    purpose = opts.setdefault("purpose", "training")
    if purpose not in PURPOSES:
        raise TorchScopeError(f"unknown purpose {purpose!r}; use one of {', '.join(PURPOSES)}")
    for key, lo, hi in (("iters", 1, 100), ("profile_steps", 1, 20)):
        if key in opts:
            v = opts[key]
            if not isinstance(v, int) or not lo <= v <= hi:
                raise TorchScopeError(f"option {key} must be an integer from {lo} to {hi}, got {v!r}")
    dl = opts.get("dataloader")
    if dl is not None:
        if not isinstance(dl, dict):
            raise TorchScopeError("option dataloader must be a dict of DataLoader settings")
        for key in ("batch_size", "num_workers", "prefetch_factor"):
            v = dl.get(key)
            if v is not None and (not isinstance(v, int) or v < (1 if key != "num_workers" else 0)):
                raise TorchScopeError(f"DataLoader {key} must be a non-negative integer, got {v!r}")
    return opts


def build_result(facts: dict, model_label: str, device: str) -> dict:
    findings = evaluate(facts)
    counts = {s: sum(f.status == s for f in findings) for s in STATUSES}
    by_category = {c: [f.id for f in findings if f.category == c] for c in CATEGORIES}
    sc = score(findings)
    return {
        "model": model_label,
        "device": device,
        "purpose": facts.get("purpose"),
        "score": sc,
        "counts": counts,
        "findings": [f.to_dict() for f in findings],
        "by_category": by_category,
        "thresholds": [{"name": n, "value": v, "meaning": m} for n, v, m in THRESHOLDS],
        "facts": facts,
        "metrics": {"score": sc, "pass": counts["pass"], "warn": counts["warn"], "fail": counts["fail"],
                    "not_applicable": counts["not_applicable"],
                    "applicable": counts["pass"] + counts["warn"] + counts["fail"]},
        "notes": [f"{k}: {v}" for k, v in facts.get("errors", {}).items()],
    }


def analyze(ctx, options: dict) -> dict:
    opts = validate_options(options)
    loaded = ctx.loaded
    facts = collect_facts(loaded, opts, lambda f, m: ctx.progress(0.05 + 0.85 * f, m))
    ctx.progress(0.95, "evaluating rules")
    result = build_result(facts, loaded.spec.label, str(loaded.device))
    (ctx.artifact_dir / "checklist_report.md").write_text(build_markdown(result))
    return result
