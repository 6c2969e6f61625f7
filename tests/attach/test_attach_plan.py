"""``run --plan``: the attached script's own job planned in its process (analyses/plan/attached.py), its as-run
row against the peak the run measured, the script unchanged; the spec's checks; the job's reading of plan.json."""

import json
import os
import subprocess
import sys
from pathlib import Path

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
    ((), 1024, 512, "fp32"), (("--activations", "--own-loss"), 192, 2048, "fp32"),
    (("--activations", "--amp"), 192, 2048, "amp_bf16"),
], ids=["optimizer peak", "backward peak, the script's own loss", "bf16 autocast"])
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
    if "--own-loss" in args:  # a loss the plan does not replay: the stand-in, said so (and the row within 5 %)
        assert plan["loss"].startswith("the mean of the model's first floating output (a stand-in: the script's "
                                       "loss, autograd nodes SumBackward0, PowBackward0, SubBackward0"), plan["loss"]
    else:
        nodes = "NllLossBackward0, LogSoftmaxBackward0" + (", ToCopyBackward0" if "--amp" in args else "")
        assert plan["loss"].startswith(f"the script's cross_entropy (recognised from its autograd nodes: {nodes})"), \
            plan["loss"]
    # what the script held, read from its tensors, against its layer sizes: weights, gradients, Adam's 2 buffers
    held = plan["held_bytes"]
    assert held["parameters"] == held["gradients"] == _params_bytes(width)
    assert abs(held["optimizer state"] - 2 * _params_bytes(width)) <= 4 * 8  # + one step scalar per parameter
    assert held["inputs"] == batch * 256 * 4
    own, double = plan["rows"]
    assert own["as_run"] and own["scale"] == "1x" and own["batch"] == batch and own["dtype"] == dtype
    assert double["scale"] == "2x" and double["batch"] == 2 * batch and double["peak_bytes"] > own["peak_bytes"]
    # the measured peak: held + the allocator's median per-step peak above the step's start (the steps after the
    # window's first, when there are several)
    per_step = ran.result["memory"]["alloc_peak_bytes_per_step"]
    alloc = sorted(per_step[1:] or per_step)
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
    none = {"batch": [], "seq": [], "seq_input": "", "dtype": [], "device": "", "shard": [], "ranks": None,
            "probe": False}
    assert parse_spec(None) == none
    assert parse_spec("batch=2x,0.5x,64; dtype=bf16;device=H100-80GB;probe=yes") == {
        **none, "batch": [("x", 2.0), ("x", 0.5), ("n", 64)], "dtype": ["bf16"], "device": "H100-80GB", "probe": True}
    assert parse_spec("seq=2x,1024;shard=zero1,fsdp,ranks=8") == {
        **none, "seq": [("x", 2.0), ("n", 1024)], "shard": ["zero1", "zero3"], "ranks": 8}
    assert parse_spec("seq=decoder_input_ids=0.5x;shard=zero2;ranks=4") == {
        **none, "seq": [("x", 0.5)], "seq_input": "decoder_input_ids", "shard": ["zero2"], "ranks": 4}
    for text, words in [("batch", "is not KEY=VALUE"),
                        ("colour=red", "unknown key 'colour'"), ("batch=0x", "batch '0x' is neither"),
                        ("batch=two", "batch 'two' is neither"), ("dtype=fp64", "dtype 'fp64' is not one of"),
                        ("device=H900", "unknown device 'H900'"), ("probe=maybe", "probe='maybe': yes"),
                        ("seq=long", "seq 'long' is neither a multiple of the script's sequence length"),
                        ("seq=-2x", "seq '-2x' is neither"), ("seq=1.5=2x", "'1.5' is not an input's name"),
                        ("seq=ids=", "no lengths after ids="),
                        ("shard=zero4,ranks=8", "shard 'zero4' is not one of zero1, zero2, zero3, fsdp"),
                        ("shard=zero3", r"shard=zero3 needs the number of ranks: add ranks=N"),
                        ("shard=zero3,ranks=1", "ranks='1': give the number of ranks, 2 or more"),
                        ("shard=zero3,rank=8", "'rank=8' is neither a sharding"),
                        ("ranks=8", "ranks=8 without shard=")]:
        with pytest.raises(OptionError, match=words):
            parse_spec(text)


def test_with_seq_varies_token_inputs_each_from_its_own_length_or_the_one_named():
    from diagnostics.analyses.plan.attached import with_seq
    from diagnostics.spec import InputSpec

    specs = (InputSpec((4, 3000), "float32"), InputSpec((4, 16), "int64", name="input_ids"),
             InputSpec((4, 8), "int64", name="decoder_input_ids"))
    shapes = lambda got: [s.shape for s in got]  # noqa: E731
    assert shapes(with_seq(specs, ("x", 2.0))) == [(4, 3000), (4, 32), (4, 16)]  # each token input its own x2
    assert shapes(with_seq(specs, ("n", 64))) == [(4, 3000), (4, 64), (4, 64)]
    assert shapes(with_seq(specs, ("x", 0.5), "input1")) == [(4, 1500), (4, 16), (4, 8)]  # the audio alone
    assert shapes(with_seq(specs, ("n", 5), "decoder_input_ids")) == [(4, 3000), (4, 16), (4, 5)]
    with pytest.raises(OptionError, match=r"seq=labels=: labels is not an input with a length .* input1 \[4, 3000\]"):
        with_seq(specs, ("x", 2.0), "labels")
    with pytest.raises(OptionError, match=r"seq=: the model takes no token input .*input1 \[4, 3000\] float32; "
                                          r"name one: seq=NAME=2x"):
        with_seq(specs[:1], ("x", 2.0))


def test_loss_of_replays_the_loss_the_script_made_after_the_model():
    """Each recognised loss, run on real tensors, against torch's own function (targets: zeros, as the plan's)."""
    from torch.nn import functional as F

    from diagnostics.analyses.plan.attached import loss_of

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    fn, what = loss_of(["NllLossBackward0", "LogSoftmaxBackward0", "ViewBackward0"])
    assert "the script's cross_entropy" in what
    assert fn({"logits": logits}).item() == pytest.approx(
        F.cross_entropy(logits.view(-1, 7), torch.zeros(10, dtype=torch.long)).item())
    fn, what = loss_of(["NllLossBackward0"])  # log-softmax inside the model
    assert "the script's nll_loss" in what
    assert fn(logits).item() == pytest.approx(F.nll_loss(logits.view(-1, 7), torch.zeros(10, dtype=torch.long)).item())
    fn, what = loss_of(["MseLossBackward0"])
    assert "the script's mse_loss" in what and fn((logits,)).item() == pytest.approx(logits.pow(2).mean().item())
    fn, what = loss_of([])
    assert what.startswith("the model's own loss") and fn(logits).item() == pytest.approx(logits.mean().item())
    fn, what = loss_of(["SumBackward0", "PowBackward0"])
    assert "a stand-in: the script's loss, autograd nodes SumBackward0, PowBackward0 after the model" in what
    assert "no backward of the script was seen" in loss_of(None)[1]
    with pytest.raises(OptionError, match="the model's output holds no floating-point tensor"):
        loss_of([])[0]((torch.zeros(3, dtype=torch.long),))


def test_run_plan_bad_spec_is_a_usage_error_before_the_script_runs(tmp_path):
    marker = tmp_path / "ran"
    p = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--no-report", "--plan",
                        "seq=2x;shard=zero4,ranks=8", "--",
                        sys.executable, "-c", f"open({str(marker)!r}, 'w')"], cwd=tmp_path, env=env_for(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--plan: shard 'zero4' is not one of zero1, zero2, zero3, fsdp" in p.stderr
    assert not marker.exists()


def test_job_reads_plan_json_checked(tmp_path):
    # the window's first step (400: it frees tensors made before profiling, unseen) is left out: median of 150, 210, 200
    memory = {"peak_bytes": None, "alloc_peak_bytes_per_step": [400, 150, 210, 200]}
    assert _plan(tmp_path, memory, asked=False) is None  # no plan asked for
    assert "the plan is made at the first torch.optim optimizer step's end, and this process had none" in \
        _plan(tmp_path, memory, asked=True)["error"]
    rows = [{"scale": "1x", "batch": 4, "dtype": "fp32", "as_run": True, "peak_bytes": 1210}]
    (tmp_path / "plan.json").write_text(json.dumps({"held_bytes": {"parameters": 800, "inputs": 100}, "rows": rows}))
    got = _plan(tmp_path, memory)
    assert got["measured_peak_bytes"] == 800 + 100 + 200 and got["gap_pct"] == pytest.approx(10.0)
    assert "the profiled steps after the first" in got["measured_how"]
    got = _plan(tmp_path, {"peak_bytes": None, "alloc_peak_bytes_per_step": [210]})   # one step: that one
    assert got["measured_peak_bytes"] == 800 + 100 + 210 and "the one profiled step" in got["measured_how"]
    # CUDA: max_memory_allocated (reset at each step's start) is the whole peak
    got = _plan(tmp_path, {"peak_bytes": 1000, "alloc_peak_bytes_per_step": []})
    assert got["measured_peak_bytes"] == 1000 and "max_memory_allocated" in got["measured_how"]
    (tmp_path / "plan.json").write_text(json.dumps({"rows": [{"scale": 1}]}))
    assert "plan.json is not a plan this version writes" in _plan(tmp_path, memory)["error"]
    os.remove(tmp_path / "plan.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "plan.json")
    assert "plan.json" in _plan(tmp_path, memory)["error"]  # a link is never followed



def _plan_lm():
    sys.path.insert(0, str(Path(__file__).parent / "scripts"))
    try:
        import plan_lm
    finally:
        sys.path.pop(0)
    return plan_lm


def _lm_step_peak(seq: int) -> int:
    """plan_lm.py's training step (Adam, its cross-entropy) run for real at ``seq`` tokens in this process, its
    peak measured by the CPU allocator's events (measure.memory.measure_peak) above what the step starts with."""
    from diagnostics.measure.memory import measure_peak

    plan_lm = _plan_lm()

    model = plan_lm.build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ids, mask, labels = plan_lm.batch(seq)

    def step():
        plan_lm.step_loss(model, ids, mask, labels).backward()
        opt.step()

    step()  # Adam's state now exists
    opt.zero_grad()
    nbytes = lambda ts: sum(t.untyped_storage().nbytes() for t in ts)  # noqa: E731
    held = nbytes(model.parameters()) + nbytes(v for s in opt.state.values() for v in s.values()) + \
        nbytes([ids, mask, labels])
    return int(measure_peak(step, "cpu", held).peak_bytes)


@pytest.mark.slow
def test_run_plan_of_a_keyword_called_lm_with_its_own_loss_at_2x_length_and_zero3(tmp_path):
    """plan_lm.py: model(input_ids=..., attention_mask=...), cross-entropy computed by the script over a 2,000-token
    vocabulary. One attached run checked for the keyword inputs, the loss replayed, the as-run row against the
    run's peak, the seq=2x row against the step run for real at 128 tokens, the zero3 row's shards in closed form."""
    ran = run_attached(tmp_path, "plan_lm.py", "12", options=("--plan", "seq=2x;shard=zero3,ranks=4"))
    assert ran.code == 0, ran.stderr
    plan = ran.result["plan"]
    assert plan["error"] is None, plan
    assert plan["inputs"] == ["input_ids [8, 64] int64", "attention_mask [8, 64] int64"]
    assert plan["loss"].startswith("the script's cross_entropy (recognised from its autograd nodes: NllLossBackward0, "
                                   "LogSoftmaxBackward0, ViewBackward0)"), plan["loss"]
    own, longer, zero3 = plan["rows"]
    assert own["as_run"] and not longer["as_run"] and not zero3["as_run"]
    assert abs(own["peak_bytes"] - plan["measured_peak_bytes"]) <= 0.05 * plan["measured_peak_bytes"], plan
    # seq=2x: both token inputs at 128, the step's peak against the same step run for real at that length
    assert longer["seq"] == "2x" and longer["inputs"] == ["input_ids [8, 128] int64", "attention_mask [8, 128] int64"]
    real = _lm_step_peak(128)
    assert abs(longer["peak_bytes"] - real) <= 0.05 * real, (longer["peak_bytes"], real)
    # zero3 over 4 ranks: each parameter's first dimension split in 4 (FSDP2 pads it to a multiple of 4); Adam keeps
    # two buffers per shard and one fp32 step counter per parameter
    params = list(_lm_params_shapes())
    shard = 4 * sum(-(-shape[0] // 4) * int(torch.Size(shape[1:]).numel()) for shape in params)
    assert zero3["shard"] == "zero3" and zero3["ranks"] == 4 and set(zero3["per_rank"]) == {"0", "3"}
    assert zero3["parameter_bytes"] == zero3["gradient_bytes"] == shard
    assert zero3["state_bytes"] == 2 * shard + 4 * len(params)
    assert plan["held_bytes"]["optimizer state"] == 2 * 4 * sum(torch.Size(s).numel() for s in params) + 4 * len(params)
    assert zero3["peak_bytes"] < own["peak_bytes"]
    said = [line for line in ran.stderr.splitlines() if "memory plan" in line]
    assert "seq 2x (input_ids [8, 128] int64; attention_mask [8, 128] int64)" in said[1]
    assert "batch 8 (1x per rank)" in said[2] and "zero3 x4 ranks" in said[2]


def _lm_params_shapes():
    """plan_lm.py's parameter shapes, from its sizes (embedding, per block qkv / out / MLP, head)."""
    m = _plan_lm()
    LAYERS, VOCAB, WIDTH = m.LAYERS, m.VOCAB, m.WIDTH  # noqa: N806

    yield (VOCAB, WIDTH)
    for _ in range(LAYERS):
        yield from [(3 * WIDTH, WIDTH), (3 * WIDTH,), (WIDTH, WIDTH), (WIDTH,), (4 * WIDTH, WIDTH), (4 * WIDTH,),
                    (WIDTH, 4 * WIDTH), (WIDTH,)]
    yield from [(VOCAB, WIDTH), (VOCAB,)]


def test_the_agent_records_keyword_inputs_and_the_loss_made_after_the_model(tmp_path):
    """What the guest keeps for the plan: shapes, dtypes and names (no tensor), and the names of the autograd nodes
    between the backward's start and the model's output."""
    from tests.attach.test_attach_unit import _agent

    agent = _agent(tmp_path)
    model = torch.nn.Linear(4, 3)
    x, mask = torch.randn(2, 4), torch.ones(2, 5, dtype=torch.long)
    agent.plan_capture(model, ())  # called by keyword only: nothing positional
    out = model(x)
    agent.plan_outputs(model, {"x": x, "attention_mask": mask, "return_dict": True, "labels": None}, out)
    ref, tensors, cast, others = agent.plan_calls[id(model)]
    assert ref() is model and cast is None and others == 1  # return_dict (None is not counted)
    assert tensors == [((2, 4), "float32", "x"), ((2, 5), "int64", "attention_mask")]
    agent.plan_capture(model, (x,))  # the next call: positional, the last keyword ones standing until its end
    assert agent.plan_calls[id(model)][1] == [((2, 4), "float32"), ((2, 4), "float32", "x"),
                                              ((2, 5), "int64", "attention_mask")]
    loss = torch.nn.functional.cross_entropy(out.view(-1, 3) * 2, torch.zeros(2, dtype=torch.long))
    agent.loss_capture((loss,), {})
    # newest first
    assert agent.loss_ops == ["NllLossBackward0", "LogSoftmaxBackward0", "MulBackward0", "ViewBackward0"]
    agent.loss_ops = None
    agent.loss_capture((), {"tensors": [out.sum()]})
    assert agent.loss_ops == ["SumBackward0"]
    agent.loss_ops = None
    agent.loss_capture((out,), {})  # the backward starts from the model's output: its own loss
    assert agent.loss_ops == []
