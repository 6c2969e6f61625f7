"""Fix this first: savings from findings, roofline and trials, ranked by ms; never a silent 0."""

import pytest

from diagnostics.analyses.checklist.job import build_result
from diagnostics.analyses.checklist.rank import fix_first
from diagnostics.findings import Finding
from tests.checklist.sample_facts import healthy, set_path


def _checklist():
    f = healthy()
    for path, value in (("measured.inference.speedup", 1.6), ("measured.inference.speedup_ci", [1.5, 1.7]),
                        ("measured.inference.train_grad_forward_s", 0.016),
                        ("measured.inference.eval_inference_forward_s", 0.010), ("static.channels_last", False)):
        f = set_path(f, path, value)
    return build_result(f, "m", "cpu")


PROFILE = {"roofline": [
    {"op": "aten::addmm", "pct_of_roof": 25.0, "bound": "compute", "time_ms": 4.0, "roof_ms": 1.0, "headroom_ms": 3.0},
    {"op": "aten::relu", "pct_of_roof": 90.0, "bound": "memory", "time_ms": 1.0, "roof_ms": 0.9, "headroom_ms": 0.1},
    {"op": "aten::copy_", "pct_of_roof": 100.0, "bound": "memory", "time_ms": 1.0, "roof_ms": 1.0, "headroom_ms": 0.0},
]}
OPTIMIZE = {"rows": [
    {"fix": "baseline", "title": "Baseline", "median_ms": 10.0, "verdict": None},
    {"fix": "control", "title": "A/A", "median_ms": 10.1, "verdict": "within noise", "speedup": 0.99},
    {"fix": "channels_last", "title": "channels_last", "median_ms": 5.5, "verdict": "faster", "speedup": 1.82,
     "speedup_ci": [1.7, 1.9]},
    {"fix": "half", "title": "half", "median_ms": 9.0, "verdict": "within noise", "speedup": 1.1},
]}


def test_the_list_is_ranked_by_milliseconds_and_says_how_each_was_estimated():
    r = _checklist()
    ranked = fix_first(r, PROFILE, OPTIMIZE)
    ms = [e.est_saving_ms for e in ranked if e.est_saving_ms is not None]
    assert ms == sorted(ms, reverse=True)
    inf, trial = ranked[0], ranked[1]
    assert inf.source == "checklist: inference_mode" and inf.est_saving_ms == pytest.approx(6.0)
    assert inf.how.startswith("measured") and inf.fix == "inference_mode"
    assert trial.title == "apply channels_last" and trial.est_saving_ms == pytest.approx(4.5)
    assert trial.how.startswith("measured: Optimize trial") and trial.fix == "channels_last"
    assert trial.detail == "x1.82 [1.70, 1.90], faster"  # the speed-up with its interval and verdict
    roof = next(e for e in ranked if e.source == "roofline")
    assert roof.est_saving_ms == 3.0 and roof.how.startswith("model") and "25% of its compute roof" in roof.title
    assert not any(e.fix in ("control", "half") for e in ranked)  # the noise floor and a no-verdict fix
    assert not any("aten::copy_" in e.title for e in ranked)  # at its roof: nothing to gain
    # warnings without a time of their own come last, "not estimated", not 0
    tail = [e for e in ranked if e.est_saving_ms is None]
    assert tail and ranked[-len(tail):] == tail and all(e.how == "not estimated" for e in tail)
    assert any(e.source == "checklist: channels_last" for e in tail)


def test_the_checklist_result_carries_its_own_list_and_the_markdown_shows_it():
    from diagnostics.analyses.checklist.report import build_markdown

    r = _checklist()
    assert list(r.fix_first) == fix_first(r)
    md = build_markdown(r)
    assert "## Fix this first" in md and "| 1 | eval() + inference_mode for inference | 6.000 |" in md


def test_gpu_idle_time_of_a_cuda_profile_is_an_entry():
    from diagnostics.analyses.checklist.rank import from_idle

    split = [{"window_ms": 10.0, "kernel_ms": 6.0, "memcpy_ms": 1.0, "memset_ms": 0.0},
             {"window_ms": 12.0, "kernel_ms": 6.0, "memcpy_ms": 1.0, "memset_ms": 0.5},
             {"window_ms": 9.0, "kernel_ms": 6.0, "memcpy_ms": 1.0, "memset_ms": 0.0}]
    (e,) = from_idle({"cuda_ran": True, "device_split": split})
    assert e.est_saving_ms == pytest.approx(3.0) and e.title == "the GPU is idle 3.000 ms per step"
    assert from_idle({"cuda_ran": False, "device_split": split}) == [] and from_idle(None) == []


TRAIN_TRIALS = {"mode": "train", "rows": [
    {"fix": "baseline", "title": "Baseline training step", "status": "ok", "median_ms": 60.0, "peak_bytes": 30 * 2**20,
     "verdict": None},
    {"fix": "control", "title": "A/A", "status": "ok", "median_ms": 60.2, "verdict": "within noise", "speedup": 1.0},
    {"fix": "activation_checkpointing", "title": "Activation checkpointing", "status": "ok", "median_ms": 75.0,
     "speedup": 0.8, "speedup_ci": [0.76, 0.84], "verdict": "slower", "peak_bytes": 18 * 2**20, "grad_cosine": 1.0},
    {"fix": "fused_optimizer", "title": "Fused / foreach optimizer", "status": "ok", "median_ms": 55.0,
     "speedup": 1.09, "speedup_ci": [1.05, 1.12], "verdict": "faster", "peak_bytes": 30 * 2**20,
     "grad_cosine": 1.0},
]}


def test_training_trials_feed_the_findings_that_recommend_them():
    from diagnostics.analyses.checklist.rank import split_fix, trial_evidence

    assert split_fix("train:activation_checkpointing") == ("train", "activation_checkpointing")
    assert split_fix("amp") == ("inference", "amp")
    finding = Finding("saved_activations", "Saved activations fit", "memory", "warn", "",
                      fix="train:activation_checkpointing")
    note = trial_evidence(finding, [OPTIMIZE, TRAIN_TRIALS])
    # the training trial measured it (the inference run has no such row): 30 -> 18 MiB is -40%
    assert note == ("measured by an Optimize trial (train): step x0.80 [0.76, 0.84], slower, peak memory 30.0 -> "
                    "18.0 MiB (-40%), gradient cosine 1.000000")
    # an inference fix is not answered by a training trial of the same id
    assert trial_evidence(Finding("tensor_cores", "AMP", "compute", "warn", "", fix="amp"), [TRAIN_TRIALS]) is None
    ranked = fix_first(_checklist(), None, [OPTIMIZE, TRAIN_TRIALS])
    fused = next(e for e in ranked if e.fix == "train:fused_optimizer")
    assert fused.title == "apply Fused / foreach optimizer to the training step"
    assert fused.est_saving_ms == pytest.approx(5.0) and fused.how.startswith("measured: Optimize training-step")
    assert any(e.fix == "channels_last" for e in ranked)  # both modes' trials are read


def test_memory_findings_offer_the_checkpointing_trial():
    from diagnostics.analyses.checklist.rules import RULES

    fixes = {r.id: r.fix for r in RULES}
    assert fixes["saved_activations"] == fixes["peak_memory"] == "train:activation_checkpointing"
