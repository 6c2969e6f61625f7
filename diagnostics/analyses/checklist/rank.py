"""Fix this first: one list, ranked by the milliseconds per step each item would save.

It merges what was measured about one model: the checklist's findings that carry a measured time
(inference mode, batch size, the DataLoader), the roofline's headroom per operator (a profile's
``roofline`` rows: time above the op's roof), the GPU's idle time per step (a CUDA profile's step
split), and Optimize trials that were faster beyond the noise.
Each entry says how its saving was estimated: ``measured`` (a trial or an interleaved probe timed
both ways), or ``model`` (a roofline bound: what the op would take at the machine's roof). Findings
that warn or fail without a time of their own follow, "not estimated", never a silent 0.
No torch: the page and the report rank results they already have: the checklist's ChecklistResult, a
profile's ProfileResult and Optimize's OptimizeResult, typed (the page decodes the stored runs), read by
attribute (an analysis never imports another's result type).
"""

from __future__ import annotations

from diagnostics.analyses.checklist.rule_form import got, measured
from diagnostics.findings import Finding, FixFirst, rank_fix_first
from diagnostics.units import speedup_text

#: Operators listed from the roofline at most (the rest are summed in the profile's headroom).
TOP_OPS = 5
#: A finding's fix names a training fix with this prefix ("train:activation_checkpointing").
TRAIN = "train:"


def split_fix(ref: str) -> tuple[str, str]:
    """A finding's fix reference -> (mode, fix id): "train:amp" -> ("train", "amp"), "amp" -> ("inference", "amp")."""
    return ("train", ref[len(TRAIN):]) if ref.startswith(TRAIN) else ("inference", ref)


def _trial_mode(optimize) -> str:
    return optimize.mode or "inference"


def trial_evidence(finding: Finding, trials: list) -> str | None:
    """What an Optimize trial of the finding's fix measured (time, peak memory, fidelity), from the
    newest run of the matching mode among ``trials`` (OptimizeResults); None when no such trial ran."""
    if not finding.fix:
        return None
    mode, fix_id = split_fix(finding.fix)
    for optimize in trials:
        if not optimize or _trial_mode(optimize) != mode:
            continue
        rows = {r.fix: r for r in optimize.rows}
        r, base = rows.get(fix_id), rows.get("baseline")
        if r is None or base is None:
            continue
        if r.status != "ok":
            return f"Optimize trial ({mode}): {r.status.replace('_', ' ')}: {r.why or ''}".rstrip(": ")
        step = "step" if mode == "train" else "call"
        parts = [f"{step} {speedup_text(r.speedup, r.speedup_ci, r.verdict or 'no verdict')}" if r.speedup else None]
        if r.peak_bytes and base.peak_bytes:
            change = r.peak_bytes / base.peak_bytes - 1
            parts.append(f"peak memory {base.peak_bytes / 2**20:.1f} -> {r.peak_bytes / 2**20:.1f} MiB ({change:+.0%})")
        if r.grad_cosine is not None:
            parts.append(f"gradient cosine {r.grad_cosine:.6f}")
        elif r.cosine is not None:
            parts.append(f"output cosine {r.cosine:.6f}")
        return f"measured by an Optimize trial ({mode}): " + ", ".join(p for p in parts if p)
    return None


def _entry(title: str, saving_ms: float | None, how: str, source: str, fix: str | None, detail: str) -> FixFirst:
    return FixFirst(title=title, est_saving_ms=saving_ms, how=how, source=source, fix=fix, detail=detail)


def from_findings(checklist, trials: list = ()) -> list[FixFirst]:
    """The checklist's findings that warn or fail (``checklist``: a ChecklistResult), with the time the
    probes measured where they did."""
    out = []
    facts = checklist.facts
    probes = measured(facts)
    inf, probe = got(probes.inference), got(probes.batch_probe)
    loader_s = facts.dataloader.loader_s_per_batch if facts.dataloader else None
    for f in checklist.findings:
        if not f.flagged:
            continue
        saving, how = None, "not estimated"
        if f.id == "inference_mode" and inf:
            saving = (inf.train_grad_forward_s - inf.eval_inference_forward_s) * 1e3
            how = "measured: train-mode forward vs eval + inference_mode, interleaved (per forward)"
        elif f.id == "batch_size" and probe and "more than" in f.evidence:
            p1, p2 = probe.points
            saving = (p1.median_s - p2.median_s * p1.batch_size / p2.batch_size) * 1e3
            how = (f"measured: time for {p1.batch_size} samples at batch {p1.batch_size} vs at batch "
                   f"{p2.batch_size} (interleaved)")
        elif f.id == "dataloader_time" and loader_s:
            saving = loader_s * 1e3
            how = "measured: loading one batch, if it stops overlapping the step (workers, prefetch)"
        measured_by_trial = trial_evidence(f, list(trials))
        out.append(_entry(f.title, None if saving is None else max(0.0, saving), how, f"checklist: {f.id}",
                          f.fix, f.evidence + (f"; {measured_by_trial}" if measured_by_trial else "")))
    return out


def from_roofline(profile) -> list[FixFirst]:
    """The operators furthest above their roof (``profile``: a ProfileResult, or None)."""
    rows = profile.roofline if profile is not None else ()
    out = []
    for r in sorted(rows, key=lambda r: -r.headroom_ms)[:TOP_OPS]:
        if r.headroom_ms <= 0:
            continue
        out.append(_entry(f"{r.op} runs at {r.pct_of_roof:.0f}% of its {r.bound} roof", r.headroom_ms,
                          "model: its time per step minus the time at this machine's roof (profile roofline)",
                          "roofline", None, f"{r.time_ms:.3f} ms per step, {r.roof_ms:.3f} ms at the roof"))
    return out


def from_idle(profile) -> list[FixFirst]:
    """On CUDA, the time per step the GPU ran nothing (the step window minus kernels, copies, sets)."""
    if profile is None or not profile.cuda_ran or not profile.device_split:
        return []
    idle = sorted(max(0.0, r.window_ms - r.kernel_ms - r.memcpy_ms - r.memset_ms) for r in profile.device_split)
    median = idle[len(idle) // 2]
    if median <= 0:
        return []
    return [_entry(f"the GPU is idle {median:.3f} ms per step", median,
                   "model: the step's window minus GPU kernels, copies and sets (profile, median step); "
                   "overlap host work (data loading, Python) with device work to recover it", "profile: idle", None,
                   "see the Profiler's step split")]


def from_trials(optimize) -> list[FixFirst]:
    """The fixes an Optimize run (an OptimizeResult, or None) timed faster beyond the noise."""
    if optimize is None:
        return []
    rows = optimize.rows
    train = _trial_mode(optimize) == "train"
    base = next((r for r in rows if r.fix == "baseline"), None)
    out = []
    for r in rows:
        if base is None or r.fix in ("baseline", "control") or r.verdict != "faster":
            continue
        # the saving from the times the speed-up is the ratio of (geometric means of the rounds)
        base_ms, fix_ms = base.time_ms or base.median_ms, r.time_ms or r.median_ms
        out.append(_entry(f"apply {r.title}" + (" to the training step" if train else ""),
                          base_ms - fix_ms,
                          "measured: Optimize " + ("training-step " if train else "") + "trial, interleaved with "
                          "the baseline", "optimize", (TRAIN if train else "") + r.fix,
                          speedup_text(r.speedup, r.speedup_ci, r.verdict)))
    return out


def fix_first(checklist, profile=None, optimize=None) -> list[FixFirst]:
    """Every entry, those with an estimated saving first (largest first), then the rest. ``checklist``: a
    ChecklistResult; ``profile``: a ProfileResult (or None), ``optimize``: an OptimizeResult, or a list of them
    (the newest inference and training runs), or None."""
    trials = [o for o in (optimize if isinstance(optimize, list) else [optimize]) if o]
    entries = [e for o in trials for e in from_trials(o)] + from_findings(checklist, trials)
    entries += from_roofline(profile) + from_idle(profile)
    return rank_fix_first(entries)
