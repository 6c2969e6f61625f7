"""Fix this first: savings from findings, roofline and trials, ranked by ms; never a silent 0."""

import json
from pathlib import Path

import pytest
from msgspec.structs import replace

from diagnostics.analyses.checklist.job import build_result
from diagnostics.analyses.checklist.rank import fix_first
from diagnostics.findings import Finding
from diagnostics.registry import get_analysis
from diagnostics.results import decode
from tests.checklist.sample_facts import healthy, set_path


def _checklist():
    f = healthy()
    for path, value in (("measured.inference.speedup", 1.6), ("measured.inference.speedup_ci", [1.5, 1.7]),
                        ("measured.inference.train_grad_forward_s", 0.016),
                        ("measured.inference.eval_inference_forward_s", 0.010), ("static.channels_last", False)):
        f = set_path(f, path, value)
    return build_result(f, "m", "cpu")


STORED = Path(__file__).resolve().parents[1] / "data" / "stored"


def _stored(file: str, analysis: str, run_id: str):
    """A real stored run's result (tests/data/stored), decoded into its analysis' typed result."""
    row = next(r for r in json.loads((STORED / file).read_text()) if r["id"] == run_id)
    return decode(get_analysis(analysis), json.loads(row["result_json"]))


#: a real CPU profile with a roofline, and real inference / training Optimize runs: the figures below replace theirs
REAL_PROFILE = _stored("runs-7a4be04-more.json", "profile", "20261127-092130-2bef41f4")
REAL_OPTIMIZE = _stored("runs-dbb9a2c.json", "optimize", "20261127-111126-975c8749")
REAL_TRAIN = _stored("runs-dbb9a2c.json", "optimize", "20261127-111140-24c15be4")


def _roof(op, pct_of_roof, bound, time_ms, roof_ms, headroom_ms):
    return replace(REAL_PROFILE.roofline[0], op=op, pct_of_roof=pct_of_roof, bound=bound, time_ms=time_ms,
                   roof_ms=roof_ms, headroom_ms=headroom_ms)


def _trial(base, fix, title, median_ms, verdict=None, speedup=None, speedup_ci=None, **more):
    """A TrialRow of ``base`` (an OptimizeResult) with these figures; untimed fields None."""
    return replace(base.rows[0], fix=fix, title=title, status="ok", why=None, median_ms=median_ms, time_ms=None,
                   verdict=verdict, speedup=speedup, speedup_ci=speedup_ci, peak_bytes=None, cosine=None,
                   grad_cosine=None, **more)


def _split(window_ms, kernel_ms, memcpy_ms, memset_ms):
    return replace(REAL_PROFILE.device_split[0], window_ms=window_ms, kernel_ms=kernel_ms, memcpy_ms=memcpy_ms,
                   memset_ms=memset_ms)


PROFILE = replace(REAL_PROFILE, roofline=(
    _roof("aten::addmm", 25.0, "compute", 4.0, 1.0, 3.0),
    _roof("aten::relu", 90.0, "memory", 1.0, 0.9, 0.1),
    _roof("aten::copy_", 100.0, "memory", 1.0, 1.0, 0.0),
))
OPTIMIZE = replace(REAL_OPTIMIZE, mode="inference", rows=(
    _trial(REAL_OPTIMIZE, "baseline", "Baseline", 10.0),
    _trial(REAL_OPTIMIZE, "control", "A/A", 10.1, "within noise", 0.99),
    _trial(REAL_OPTIMIZE, "channels_last", "channels_last", 5.5, "faster", 1.82, (1.7, 1.9)),
    _trial(REAL_OPTIMIZE, "half", "half", 9.0, "within noise", 1.1),
))


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

    split = (_split(10.0, 6.0, 1.0, 0.0), _split(12.0, 6.0, 1.0, 0.5), _split(9.0, 6.0, 1.0, 0.0))
    (e,) = from_idle(replace(REAL_PROFILE, cuda_ran=True, device_split=split))
    assert e.est_saving_ms == pytest.approx(3.0) and e.title == "the GPU is idle 3.000 ms per step"
    assert from_idle(replace(REAL_PROFILE, cuda_ran=False, device_split=split)) == [] and from_idle(None) == []
    assert from_idle(REAL_PROFILE) == []  # the real CPU profile: no GPU, no idle entry


TRAIN_TRIALS = replace(REAL_TRAIN, mode="train", rows=(
    replace(_trial(REAL_TRAIN, "baseline", "Baseline training step", 60.0), peak_bytes=30 * 2**20),
    _trial(REAL_TRAIN, "control", "A/A", 60.2, "within noise", 1.0),
    replace(_trial(REAL_TRAIN, "activation_checkpointing", "Activation checkpointing", 75.0, "slower", 0.8,
                   (0.76, 0.84)), peak_bytes=18 * 2**20, grad_cosine=1.0),
    replace(_trial(REAL_TRAIN, "fused_optimizer", "Fused / foreach optimizer", 55.0, "faster", 1.09, (1.05, 1.12)),
            peak_bytes=30 * 2**20, grad_cosine=1.0),
))


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


def test_real_stored_runs_rank_from_their_typed_results():
    """The page ranks the model's latest stored profile and Optimize runs, decoded: each entry's figures are
    those of the stored JSON (read here from the plain form, independently of rank.py)."""
    from diagnostics.analyses.checklist.rank import from_roofline, from_trials

    plain_profile = json.loads(next(r for r in json.loads((STORED / "runs-7a4be04-more.json").read_text())
                                    if r["id"] == "20261127-092130-2bef41f4")["result_json"])
    want = sorted((r for r in plain_profile["roofline"] if r["headroom_ms"] > 0), key=lambda r: -r["headroom_ms"])[:5]
    got = from_roofline(REAL_PROFILE)
    assert [(e.title.split(" runs at")[0], e.est_saving_ms) for e in got] == [(r["op"], r["headroom_ms"]) for r in want]
    for run_id, optimize in (("20261127-111126-975c8749", REAL_OPTIMIZE), ("20261127-111140-24c15be4", REAL_TRAIN)):
        plain = json.loads(next(r for r in json.loads((STORED / "runs-dbb9a2c.json").read_text())
                                if r["id"] == run_id)["result_json"])
        base = next(r for r in plain["rows"] if r["fix"] == "baseline")
        # none of these runs timed a fix faster beyond the noise: call every timed fix faster, keeping its times
        timed = {r["fix"] for r in plain["rows"] if r["fix"] not in ("baseline", "control") and r["median_ms"]}
        faster = [r for r in plain["rows"] if r["fix"] in timed]
        assert len(faster) >= 2 and from_trials(optimize) == []
        entries = from_trials(replace(optimize, rows=tuple(replace(r, verdict="faster") if r.fix in timed else r
                                                            for r in optimize.rows)))
        assert [(e.fix.removeprefix("train:"), e.est_saving_ms) for e in entries] == [
            (r["fix"], pytest.approx((base["time_ms"] or base["median_ms"]) - (r["time_ms"] or r["median_ms"])))
            for r in faster]
        assert all(e.fix.startswith("train:") == (plain["mode"] == "train") for e in entries)
    ranked = fix_first(_checklist(), REAL_PROFILE, [REAL_OPTIMIZE, REAL_TRAIN])
    assert [e.est_saving_ms for e in ranked if e.est_saving_ms is not None] == sorted(
        (e.est_saving_ms for e in ranked if e.est_saving_ms is not None), reverse=True)
