"""``run --plan``: the attached script's own job planned in its process (analyses/plan/attached.py), its as-run
row against the peak the run measured, the script unchanged; the spec's checks; the job's reading of plan.json."""

import json
import os
import subprocess
import sys

import pytest
import torch

from diagnostics.analyses.attach.job import _plan
from diagnostics.analyses.plan.attached import parse_spec
from diagnostics.declare import OptionError
from tests.attach.harness import env_for, run_attached, run_bare


def _params_bytes(width: int) -> int:
    """plan_mlp.py's parameters in fp32, counted from its layer sizes (Linear: in x out + out)."""
    sizes = [(256, width), (width, width), (width, width), (width, 10)]
    return 4 * sum(i * o + o for i, o in sizes)


@pytest.mark.slow
@pytest.mark.parametrize("args,width,batch,dtype", [
    ((), 1024, 512, "fp32"), (("--activations",), 192, 2048, "fp32"), (("--activations", "--amp"), 192, 2048, "amp_bf16"),
], ids=["optimizer peak", "backward peak", "bf16 autocast"])
def test_run_plan_as_run_row_within_5pct_of_measured_and_script_unchanged(tmp_path, args, width, batch, dtype):
    bare = run_bare(tmp_path, "plan_mlp.py", *args)
    assert bare.code == 0, bare.stderr
    ran = run_attached(tmp_path, "plan_mlp.py", *args, options=("--plan", "batch=2x"))
    assert ran.code == 0, ran.stderr
    # the script's own output: the same losses to the last digit; no module of ours left in its process
    assert ran.script_stdout == bare.script_stdout and "loss" in bare.script_stdout
    # the script's objects as bare: parameters and Adam's state to the bit, no hook, no attribute, it pickles;
    # and no module of ours left in its process
    assert ran.self_timing == bare.self_timing and ran.self_timing["engine_modules"] == []
    assert ran.self_timing["hooks"] == 0 and ran.self_timing["pickles"]
    plan = ran.result["plan"]
    assert plan["error"] is None, plan
    assert plan["optimizer"] == "Adam" and plan["dtype"] == dtype and plan["batch"] == batch
    assert plan["inputs"] == [f"[{batch}, 256] float32"]
    # what the script held, read from its tensors, against its layer sizes: weights, gradients, Adam's 2 buffers
    held = plan["held_bytes"]
    assert held["parameters"] == held["gradients"] == _params_bytes(width)
    assert abs(held["optimizer state"] - 2 * _params_bytes(width)) <= 4 * 8  # + one step scalar per parameter
    assert held["inputs"] == batch * 256 * 4
    own, double = plan["rows"]
    assert own["as_run"] and own["scale"] == "1x" and own["batch"] == batch and own["dtype"] == dtype
    assert double["scale"] == "2x" and double["batch"] == 2 * batch and double["peak_bytes"] > own["peak_bytes"]
    # the measured peak: held + the allocator's median per-step peak above the step's start
    alloc = sorted(ran.result["memory"]["alloc_peak_bytes_per_step"])
    assert plan["measured_peak_bytes"] == sum(held.values()) + alloc[len(alloc) // 2]
    assert abs(own["peak_bytes"] - plan["measured_peak_bytes"]) <= 0.05 * plan["measured_peak_bytes"], plan
    assert plan["gap_pct"] == pytest.approx(100 * (own["peak_bytes"] / plan["measured_peak_bytes"] - 1))
    said = [line for line in ran.stderr.splitlines() if "memory plan" in line]
    assert len(said) == 2 and f"batch {batch} (1x), {dtype}, Adam" in said[0] and "this run measured" in said[0]
    assert f"batch {2 * batch} (2x)" in said[1]


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: max_memory_allocated of the profiled steps")
def test_run_plan_on_cuda_within_5pct_of_max_memory_allocated(tmp_path):
    ran = run_attached(tmp_path, "plan_mlp.py", "--cuda", options=("--plan",))
    assert ran.code == 0, ran.stderr
    plan, memory = ran.result["plan"], ran.result["memory"]
    assert plan["error"] is None and plan["device_kind"] == "cuda", plan
    assert memory["cuda"] and plan["measured_peak_bytes"] == memory["peak_bytes"] == max(memory["peak_bytes_per_step"])
    own = plan["rows"][0]
    assert abs(own["peak_bytes"] - plan["measured_peak_bytes"]) <= 0.05 * plan["measured_peak_bytes"], plan


@pytest.mark.slow
def test_run_plan_probe_counts_a_cnns_kernel_scratch(tmp_path):
    """conv_blocks.py (convolutions, batch norm): their CPU kernels' own buffers are counted only with probe=yes
    (without, the as-run row was 9 % low on this machine, and the plan's note says what it leaves out)."""
    ran = run_attached(tmp_path, "conv_blocks.py", options=("--plan", "probe=yes"))
    assert ran.code == 0, ran.stderr
    plan = ran.result["plan"]
    assert plan["error"] is None and "measured by running those ops once on real tensors" in plan["notes"][0]
    own = plan["rows"][0]
    assert own["parts"]["workspaces"] > 0  # the probed scratch
    assert abs(own["peak_bytes"] - plan["measured_peak_bytes"]) <= 0.05 * plan["measured_peak_bytes"], plan


@pytest.mark.slow
def test_run_plan_of_a_gan_plans_the_module_its_first_optimizer_trains_and_says_so(tmp_path):
    """gan_accumulate.py: a generator and a discriminator (each a Linear), the discriminator's SGD steps first."""
    ran = run_attached(tmp_path, "gan_accumulate.py", options=("--plan",))
    assert ran.code == 0, ran.stderr
    plan = ran.result["plan"]
    assert plan["error"] is None and plan["optimizer"] == "SGD" and plan["rows"][0]["peak_bytes"] > 0
    assert any("the script trained 2 modules with parameters before its first optimizer step (Linear, Linear): the "
               "plan is of Linear, the one its first optimizer (SGD) trains" in n for n in plan["notes"]), plan["notes"]


@pytest.mark.slow
def test_run_plan_without_an_optimizer_says_why(tmp_path):
    ran = run_attached(tmp_path, "manual_sgd.py", options=("--plan",))
    assert ran.code == 0, ran.stderr
    assert "had none (no optimizer, a manual update" in ran.result["plan"]["error"]
    assert "memory plan: not made" in ran.stderr


def test_split_argv_takes_plans_spec_only_when_it_is_key_value():
    from diagnostics.cli.attach import split_argv

    assert split_argv(["--plan", "batch=2x", "python", "t.py"]) == (["--plan", "batch=2x"], ["python", "t.py"])
    assert split_argv(["--plan", "python", "t.py", "--lr=1"]) == (["--plan"], ["python", "t.py", "--lr=1"])
    assert split_argv(["--plan", "--", "python", "t.py"]) == (["--plan"], ["python", "t.py"])


def test_parse_spec():
    assert parse_spec(None) == {"batch": [], "dtype": [], "device": "", "probe": False}
    assert parse_spec("batch=2x,0.5x,64; dtype=bf16;device=H100-80GB;probe=yes") == {
        "batch": [("x", 2.0), ("x", 0.5), ("n", 64)], "dtype": ["bf16"], "device": "H100-80GB", "probe": True}
    for text, words in [("seq=4096", "seq= is not planned for an attached run yet"),
                        ("shard=zero3", "shard= is not planned"), ("batch", "is not KEY=VALUE"),
                        ("colour=red", "unknown key 'colour'"), ("batch=0x", "batch '0x' is neither"),
                        ("batch=two", "batch 'two' is neither"), ("dtype=fp64", "dtype 'fp64' is not one of"),
                        ("device=H900", "unknown device 'H900'"),
                        ("probe=maybe", "probe='maybe': yes")]:
        with pytest.raises(OptionError, match=words):
            parse_spec(text)


def test_run_plan_bad_spec_is_a_usage_error_before_the_script_runs(tmp_path):
    marker = tmp_path / "ran"
    p = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--no-report", "--plan", "seq=4096", "--",
                        sys.executable, "-c", f"open({str(marker)!r}, 'w')"], cwd=tmp_path, env=env_for(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--plan: seq= is not planned for an attached run yet" in p.stderr
    assert not marker.exists()


def test_job_reads_plan_json_checked(tmp_path):
    memory = {"peak_bytes": None, "alloc_peak_bytes_per_step": [100, 300, 200]}
    assert _plan(tmp_path, memory, asked=False) is None  # no plan asked for
    assert "the plan is made at the first torch.optim optimizer step's end, and this process had none" in \
        _plan(tmp_path, memory, asked=True)["error"]
    rows = [{"scale": "1x", "batch": 4, "dtype": "fp32", "as_run": True, "peak_bytes": 1210}]
    (tmp_path / "plan.json").write_text(json.dumps({"held_bytes": {"parameters": 800, "inputs": 100}, "rows": rows}))
    got = _plan(tmp_path, memory)
    assert got["measured_peak_bytes"] == 800 + 100 + 200 and got["gap_pct"] == pytest.approx(10.0)
    # CUDA: max_memory_allocated (reset at each step's start) is the whole peak
    got = _plan(tmp_path, {"peak_bytes": 1000, "alloc_peak_bytes_per_step": []})
    assert got["measured_peak_bytes"] == 1000 and "max_memory_allocated" in got["measured_how"]
    (tmp_path / "plan.json").write_text(json.dumps({"rows": [{"scale": 1}]}))
    assert "plan.json is not a plan this version writes" in _plan(tmp_path, memory)["error"]
    os.remove(tmp_path / "plan.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "plan.json")
    assert "plan.json" in _plan(tmp_path, memory)["error"]  # a link is never followed

