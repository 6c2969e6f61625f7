"""Attach mode on the training loops of frameworks (tests/attach/scripts/hf_trainer.py: transformers' Trainer,
through accelerate's AcceleratedOptimizer; lightning_train.py: Lightning's closure-based optimizer.step): each
runs bare and attached with the same seed and must end with the same exit code, print the same losses to the
last digit, save the same weights and leave nothing on its model and optimizer; a step is one optimizer step
(the framework's own count), gradient accumulation's micro-batches and evaluation forwards are not steps, and
a step's time agrees with the script's own clock. Each test runs two real Pythons importing a framework
(about 10 s each, side by side): slow."""

from __future__ import annotations

import math
import re
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.attach.harness import run_attached, run_bare
from tests.attach.test_attach_corpus import _same_checkpoint

pytestmark = pytest.mark.slow
#: The Trainer's own throughput figures, the only part of its stdout that may differ between two runs.
HF_TIMINGS = re.compile(r"'((?:train|eval)_(?:runtime|samples_per_second|steps_per_second))': '[^']*'")


def _both(tmp_path: Path, script: str, env: dict, options=(), expect: int = 0):
    """The script bare and attached, side by side (each its own folder): the frameworks' imports take seconds."""
    (tmp_path / "bare").mkdir()
    (tmp_path / "attached").mkdir()
    with ThreadPoolExecutor(2) as pool:
        b = pool.submit(run_bare, tmp_path / "bare", script, env=env, cwd=tmp_path / "bare")
        a = pool.submit(run_attached, tmp_path / "attached", script, options=options, env=env,
                        cwd=tmp_path / "attached")
        bare, ran = b.result(), a.result()
    assert bare.code == expect, bare.stderr[-3000:]
    assert ran.code == bare.code, ran.stderr[-3000:]
    return bare, ran


def _losses(stdout: str) -> list[str]:
    return re.findall(r"loss (\S+)", stdout)


def _own_clock(ran, own_ms: list[float], rel: float = 0.5, abs_ms: float = 5.0) -> None:
    """The median step time outside the profiled window (start-up aside) against the script's own clock over
    the same steps: the same order of magnitude, ours a little longer (it holds the batch's fetch and the
    framework's work between its callbacks)."""
    window = ran.result["profiled_steps"] or [0, -1]
    rows = [r for r in ran.result["step_table"] if r["step"] > 1 and not window[0] <= r["step"] <= window[1]]
    ours = statistics.median(r["step_ms"] for r in rows)
    theirs = statistics.median(own_ms[r["step"] - 1] for r in rows)
    assert abs(ours - theirs) <= rel * theirs + abs_ms, (ours, theirs)


def _steps_numbered_once(r: dict) -> None:
    steps = [row["step"] for row in r["step_table"]]
    assert steps == sorted(set(steps)) and steps[0] == 1, steps


def test_hf_trainer_steps_are_its_optimizer_steps_with_accumulation_and_evaluation_and_it_trains_as_bare(tmp_path):
    env = {"MAX_STEPS": "6", "ACCUM": "2", "EVAL_STEPS": "2"}
    bare, ran = _both(tmp_path, "hf_trainer.py", env, options=("--at", "3", "--steps", "2"))
    assert HF_TIMINGS.sub(r"\1 T", ran.script_stdout) == HF_TIMINGS.sub(r"\1 T", bare.stdout.strip())
    assert len(_losses(bare.stdout)) == 6 + 3 + 1  # steps, evaluations, the mean: to the last digit (above)
    weights = [tmp_path / d / "hf_out" / "model.safetensors" for d in ("bare", "attached")]
    assert weights[0].read_bytes() == weights[1].read_bytes()  # tensor for tensor, byte for byte
    own, r = ran.self_timing, ran.result
    assert own["leftovers"] == bare.self_timing["leftovers"]  # accelerate's AcceleratedOptimizer and the model
    assert own["leftovers"]["hooks"] == [] and own["leftovers"]["pickles"] is True
    assert own["leftovers"]["opt_hooks"] == 0 and own["leftovers"]["deepcopy"] is True
    assert r["steps"] == own["optimizer_steps"] == 6  # 12 micro-batches, 6 optimizer steps
    assert r["step_boundary"] == "optimizer" and r["step_boundary_detail"] == "the optimizer's step (AdamW)"
    # eval_strategy="steps" every 2 steps: 3 evaluations of 2 batches, none of them a step
    assert own["evaluations"] == r["evaluation"]["periods"] == 3
    assert r["evaluation"]["forwards"] == own["eval_batches"] == 6
    assert r["profiled_steps"] == [3, 4] and not r["errors"]
    assert r["notes"] == []  # its imports took seconds before the first batch: no 'DataLoader batch' fallback
    _steps_numbered_once(r)
    assert r["step_table"][0]["step_ms"] < 1000  # the micro-batch counted before the first optimizer step: dropped
    _own_clock(ran, own["step_ms"])


def test_lightning_closure_steps_with_accumulation_and_validation_and_the_gradients_are_the_closures(tmp_path):
    env = {"MAX_STEPS": "6", "ACCUM": "2", "VAL_EVERY": "4"}
    bare, ran = _both(tmp_path, "lightning_train.py", env, options=("--at", "3", "--steps", "2"))
    assert ran.script_stdout == bare.stdout.strip()
    assert len(_losses(bare.stdout)) == 12 + 8  # training batches, validation batches
    for name in ("weights.pt", "last.ckpt"):
        _same_checkpoint(tmp_path / "bare" / "lightning_out" / name, tmp_path / "attached" / "lightning_out" / name)
    own, r = ran.self_timing, ran.result
    assert own["leftovers"] == bare.self_timing["leftovers"]
    assert own["leftovers"]["hooks"] == [] and own["leftovers"]["pickles"] is True
    assert own["leftovers"]["opt_hooks"] == 0
    assert own["train_batches"] == 12 and r["steps"] == own["optimizer_steps"] == 6
    assert r["step_boundary"] == "optimizer" and r["step_boundary_detail"] == "the optimizer's step (Adam)"
    # Lightning's sanity check (2 validation batches before training: they look like an inference loop until
    # the first training forward), then validation every 4 training batches (2 optimizer steps): 4 periods of 2
    # batches, none of them a step
    assert r["evaluation"]["periods"] == 4 and r["evaluation"]["forwards"] == own["val_batches"] == 8
    assert r["notes"] == ["the 2 forwards under no_grad / in eval mode before training began were an evaluation "
                          "(a validation before the first step), not steps"]
    assert r["profiled_steps"] == [3, 4] and not r["errors"]
    _steps_numbered_once(r)
    # forward and backward ran inside optimizer.step (its closure): timed as such, not as the optimizer's
    b = r["breakdown_ms"]
    assert b["forward"] > 0 and b["backward"] > 0 and b["optimizer"] < b["forward"] + b["backward"] + b["host"]
    # the gradient statistics read the gradients the step's closure computed (the two micro-batches' sum, the
    # script's own norms at on_before_optimizer_step), not the previous step's
    got = {(s["step"], s["layer"]): s["grad_norm"] for s in r["gradients"]["steps"]}
    assert sorted({s for s, _ in got}) == [3, 4]
    for (step, layer), norm in got.items():
        mine = own["grad_norms"][step - 1]
        expected = math.sqrt(sum(v * v for k, v in mine.items() if k.startswith(f"{layer}.")))
        assert norm == pytest.approx(expected, rel=1e-5), (step, layer)
    # its own clock times each training batch: a step is two of them
    _own_clock(ran, [a + b for a, b in zip(own["step_ms"][::2], own["step_ms"][1::2])])


def test_a_closure_of_its_own_lbfgs_counts_optimizer_steps_and_reads_the_first_calls_gradients(tmp_path):
    bare, ran = _both(tmp_path, "closure_lbfgs.py", {"STEPS": "8"}, options=("--at", "3", "--steps", "3"))
    assert ran.script_stdout == bare.stdout.strip() and len(_losses(bare.stdout)) == 8
    own, r = ran.self_timing, ran.result
    assert own["leftovers"] == bare.self_timing["leftovers"] and own["leftovers"]["opt_hooks"] == 0
    assert sum(own["closure_calls"]) > own["steps"]  # several forwards and backwards inside each step
    assert r["steps"] == own["steps"] == 8 and r["step_boundary"] == "optimizer"
    assert r["step_boundary_detail"] == "the optimizer's step (LBFGS)" and r["profiled_steps"] == [3, 5]
    got = {(s["step"], s["layer"]): s["grad_norm"] for s in r["gradients"]["steps"]}
    assert sorted({s for s, _ in got}) == [3, 4, 5]
    for (step, layer), norm in got.items():
        mine = own["grad_norms"][step - 1]
        expected = math.sqrt(sum(v * v for k, v in mine.items() if k.startswith(f"{layer}.")))
        assert norm == pytest.approx(expected, rel=1e-5), (step, layer)


def test_a_closure_that_raises_ends_the_script_as_bare_with_its_own_traceback(tmp_path):
    bare, ran = _both(tmp_path, "closure_lbfgs.py", {"STEPS": "8", "CRASH_AT": "5"}, expect=1)
    assert "RuntimeError: the closure failed in step 5" in bare.stderr
    assert ran.script_stderr == bare.stderr.strip()  # line for line: our closure wrapper's frame is not in it
    assert ran.script_stdout == bare.stdout.strip() and len(_losses(bare.stdout)) == 4
    assert ran.result["exit_code"] == 1 and ran.result["steps"] == 4 and not ran.result["errors"]
