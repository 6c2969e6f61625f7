"""Attach mode does no harm and counts every kind of loop: nothing of ours on the script's model,
optimizer or iterator (it pickles, saves, deep-copies and scripts during and after the window); steps
of a manual update (no torch.optim), its evaluation loop kept out of them; an inference loop without a
DataLoader; a script that fails before its first step told as such. Each runs a real Python: slow."""

from __future__ import annotations

import pytest

from tests.attach.harness import run_attached, run_bare

pytestmark = pytest.mark.slow


def test_nothing_of_ours_is_left_on_the_model_optimizer_or_iterator_during_and_after_the_window(tmp_path):
    bare = run_bare(tmp_path, "harmless.py")
    assert bare.code == 0, bare.stderr[-3000:]
    ran = run_attached(tmp_path, "harmless.py", options=("--at", "4", "--steps", "3"))
    assert ran.code == 0, ran.stderr[-3000:]
    assert ran.script_stdout == bare.stdout.strip()  # the same losses, to the last digit
    r = ran.result
    assert r["steps"] == 12 and r["profiled_steps"] == [4, 6] and r["step_boundary"] == "optimizer"
    checks = ran.self_timing["checks"]
    assert [c["step"] for c in checks] == list(range(1, 13))  # before (1-3), in (4-6), after (7-12) the window
    clean = {"hooks": [], "pickles": True, "saved": True, "deepcopy": True, "scripted": True, "extra_attrs": [],
             "opt_attrs": [], "opt_hooks": 0, "iter_attrs": [], "opt_pickles": True, "compiled": True}
    for c in checks:
        assert {k: c[k] for k in clean} == clean, c
    assert bare.self_timing["checks"] == checks


def test_a_manual_update_is_a_step_and_its_evaluation_loop_is_not(tmp_path, near):
    ran = run_attached(tmp_path, "manual_sgd.py", options=("--at", "4", "--steps", "3"))
    assert ran.code == 0, ran.stderr[-3000:]
    r, own = ran.result, ran.self_timing
    assert r["step_boundary"] == "manual update" and "parameter update" in r["step_boundary_detail"]
    assert r["steps"] == own["batches"] == 24  # the training batches, never the 16 evaluation forwards
    ev = r["evaluation"]
    assert ev["forwards"] == own["eval_forwards"] and ev["periods"] == 2
    near(ev["period_ms"], own["eval_ms"], rel=0.15)
    near(r["step_ms"], own["batch_ms"], rel=0.15)  # within 15 % of the script's own clock
    assert r["breakdown_ms"]["evaluation"] == 0.0 and r["breakdown_ms"]["backward"] > 0
    assert r["bottleneck"]["category"] == "forward"
    bare = run_bare(tmp_path, "manual_sgd.py")
    assert ran.script_stdout == bare.stdout.strip()


def test_an_inference_loop_without_a_dataloader_steps_at_its_models_forward(tmp_path, near):
    ran = run_attached(tmp_path, "infer_loop.py", env={"SECONDS": "4", "FORWARD_MS": "20"})
    assert ran.code == 0, ran.stderr[-3000:]
    r, own = ran.result, ran.self_timing
    assert r["status"] == "ok" and r["step_boundary"] == "forward"
    assert "Sequential.forward" in r["step_boundary_detail"]
    assert r["steps"] == own["iterations"]  # counted from the first forward, not from the fallback's decision
    near(r["step_ms"], own["iter_ms"], rel=0.15)
    assert r["profiled_steps"] is not None and r["trace"]
    assert not any("python -E" in n for n in r["notes"])


def test_a_script_that_fails_before_its_first_step_is_told_so(tmp_path):
    bare = run_bare(tmp_path, "early_crash.py")
    ran = run_attached(tmp_path, "early_crash.py")
    assert ran.code == bare.code == 1
    assert ran.script_stderr.strip() == bare.stderr.strip()
    r = ran.result
    assert r["status"] == "failed" and r["steps"] == 0
    note = " ".join(r["notes"])
    assert "torch was imported" in note and "exited with code 1" in note and "python -E" not in note
