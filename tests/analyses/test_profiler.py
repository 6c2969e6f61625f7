"""Profiler job: operator totals against the exported trace, trace files, steps, latency, modules."""

import gzip
import json
import zipfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from diagnostics.analyses.profile import ANALYSIS
from diagnostics.analyses.profile import job as profiler
from diagnostics.trace import profiler_tables as pt
from diagnostics.trace.records.timeline import Timeline
from diagnostics.intake import LoadedModel
from diagnostics.results import UNSET, decode, given, to_json
from diagnostics.runner import AnalysisContext, Job
from diagnostics.spec import InputSpec, ModelSpec


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 5))


def loss_fn(out):
    return out.float().pow(2).mean()


def run_profile(model, inputs, options, tmp_path, device="cpu"):
    spec = ModelSpec(name="handmade", device=device)
    ctx = AnalysisContext(Job("profile", spec, options), tmp_path)
    ctx._loaded = LoadedModel(spec, model, tuple(InputSpec(tuple(t.shape)) for t in inputs), inputs, loss_fn, "mse")
    seen = []
    ctx._progress = lambda f, m: seen.append((f, m))
    result = profiler.analyze(ctx, options)
    return result, seen


SMALL = {"wait": 1, "warmup": 1, "active": 2, "latency_warmup": 2, "latency_iters": 15}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model = small_model()
    d = tmp_path_factory.mktemp("profile-train")
    result, progress = run_profile(model, (torch.randn(2, 3, 8, 8),), {**SMALL, "mode": "train"}, d)
    return model, result, progress, d


def independent_op_totals(trace: dict) -> dict:
    """Per op name: calls, total and self time (µs) from the trace's own events, nested per thread.

    Like torch's EventList, an op whose parent has the same name and no other child is one call
    recorded twice (the outer one is kept, it adopts the inner one's children).
    """
    evs = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    evs = list({(e["name"], e["ts"], e["dur"], e["tid"]): e for e in evs}.values())
    by_tid = defaultdict(list)
    for e in evs:
        by_tid[e["tid"]].append(e)
    out = defaultdict(lambda: {"calls": 0, "total": 0.0, "self": 0.0})
    for lane in by_tid.values():
        lane.sort(key=lambda e: (e["ts"], -e["dur"]))
        parent = [-1] * len(lane)
        stack = []
        for i, e in enumerate(lane):
            while stack and e["ts"] >= lane[stack[-1]]["ts"] + lane[stack[-1]]["dur"]:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
        children = defaultdict(list)
        for i, p in enumerate(parent):
            children[p].append(i)
        dropped = set()
        changed = True
        while changed:
            changed = False
            for i in range(len(lane)):
                p = parent[i]
                if i in dropped or p < 0 or lane[p]["name"] != lane[i]["name"] or children[p] != [i]:
                    continue
                children[p] = children[i]
                for c in children[i]:
                    parent[c] = p
                dropped.add(i)
                changed = True
        for i, e in enumerate(lane):
            if e["cat"] != "cpu_op" or i in dropped:
                continue
            o = out[e["name"]]
            o["calls"] += 1
            o["total"] += e["dur"]
            o["self"] += e["dur"] - sum(lane[c]["dur"] for c in children[i])
    return out


def test_operator_totals_match_the_exported_trace(trained):
    _, result, _, d = trained
    trace = json.loads(Path(result.artifacts.trace_json).read_text())
    ref = independent_op_totals(trace)
    ops = {r.name: r for r in result.operators}
    assert {"aten::conv2d", "aten::addmm", "aten::convolution_backward"} <= set(ops)
    assert set(ops) == set(ref)
    for name, r in ops.items():
        assert r.calls == ref[name]["calls"], name
        assert r.cpu_total_ms == pytest.approx(ref[name]["total"] / 1e3, rel=1e-3, abs=2e-3), name
        assert r.self_cpu_ms == pytest.approx(ref[name]["self"] / 1e3, rel=1e-3, abs=2e-3), name
    # two active steps, one conv per step
    assert ops["aten::conv2d"].calls == 2
    assert result.metrics.self_cpu_total_ms == pytest.approx(sum(r.self_cpu_ms for r in result.operators))
    shapes = {r.input_shapes for r in result.operators_by_shape if r.name == "aten::conv2d"}
    assert any("[2, 3, 8, 8]" in s for s in shapes)


def test_trace_artifacts_parse_and_carry_rank(trained):
    _, result, _, d = trained
    art = result.artifacts
    assert {Path(p).name for p in (art.trace_json, art.trace_json_gz, art.tb_zip)} == {"trace.json", "trace.json.gz", "tb_trace.zip"}
    trace = json.loads(Path(art.trace_json).read_text())
    assert trace["traceEvents"]
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"aten::conv2d", "aten::addmm", "forward", "backward", "optimizer"} <= names
    assert trace["distributedInfo"]["rank"] == 0 and trace["distributedInfo"]["world_size"] == 1
    assert json.loads(gzip.decompress(Path(art.trace_json_gz).read_bytes())) == trace
    with zipfile.ZipFile(art.tb_zip) as z:
        members = z.namelist()
        assert len(members) == 1 and members[0].startswith("tb_trace/") and members[0].endswith(".pt.trace.json")
        assert json.loads(z.read(members[0])) == trace
    assert decode(ANALYSIS, json.loads(to_json(result))) == result  # typed, and back through its JSON


def test_step_breakdown_adds_up_to_the_step_time(trained):
    _, result, _, _ = trained
    trace = json.loads(Path(result.artifacts.trace_json).read_text())
    step_events = {int(e["name"].split("#")[1]): e["dur"] / 1e3 for e in trace["traceEvents"]
                   if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")}
    forward = sorted(e["dur"] / 1e3 for e in trace["traceEvents"] if e.get("name") == "forward")
    assert len(result.steps) == 2 == result.metrics.profiled_steps
    for s in result.steps:
        parts = s.zero_grad_ms + s.forward_ms + s.backward_ms + s.optimizer_ms + s.other_ms
        assert parts == pytest.approx(s.step_ms, rel=1e-6)
        assert s.step_ms == pytest.approx(step_events[s.step], rel=1e-9)
        assert s.backward_ms > 0 and s.optimizer_ms > 0
    assert sorted(s.forward_ms for s in result.steps) == pytest.approx(forward)
    for row in result.device_split:
        total = sum(getattr(row, f"{c}_ms") for c in pt.SPLIT_CATEGORIES)
        assert total == pytest.approx(row.window_ms, rel=1e-6)
        assert row.kernel_ms == 0 and row.cpu_exec_ms > 0  # no GPU here


def test_latency_stats_are_numpy_statistics_of_the_samples(trained):
    _, result, progress, _ = trained
    lat = result.latency
    s = np.array(lat.samples_ms)
    assert len(s) == SMALL["latency_iters"] and (s > 0).all()
    assert lat.median_ms == pytest.approx(np.median(s))
    assert lat.p90_ms == pytest.approx(np.percentile(s, 90))
    assert lat.p99_ms == pytest.approx(np.percentile(s, 99))
    assert lat.std_ms == pytest.approx(np.std(s))
    assert lat.mean_ms == pytest.approx(np.mean(s))
    assert lat.samples_per_s == pytest.approx(2 / (np.median(s) / 1e3))
    assert result.metrics.latency_median_ms == lat.median_ms
    assert lat.cv == pytest.approx(np.std(s) / np.mean(s)) and result.timing_cv == lat.cv
    # the profiler's own cost: profiled and unprofiled steps interleaved, the geometric mean of the rounds'
    # ratios minus 1, with its interval (issue #31: "-59.9 %" from a latency measured at another moment)
    o, m = result.profiler_overhead, result.metrics
    prof, plain = np.array(o.profiled_round_ms), np.array(o.unprofiled_round_ms)
    assert len(prof) == len(plain) == o.rounds == 6
    assert m.profiler_overhead_pct == pytest.approx(100 * (np.exp(np.mean(np.log(prof / plain))) - 1))
    assert m.profiler_overhead_ci_low <= m.profiler_overhead_pct <= m.profiler_overhead_ci_high
    assert any("profiling step 3/4 (active)" in m for _, m in progress)


def test_module_times_forward_and_backward(trained, no_hooks_left):
    model, result, _, _ = trained
    mods = {m.name: m for m in result.modules}
    assert mods["0"].type == "Conv2d" and mods["3"].type == "Linear"
    assert mods["0"].parent == "(model)" and mods["(model)"].parent is None
    for name in ("0", "3"):
        assert mods[name].calls == 2
        assert mods[name].forward_ms > 0 and mods[name].backward_ms > 0
    root = mods["(model)"]
    assert root.forward_ms >= sum(mods[n].forward_ms for n in ("0", "1", "2", "3")) - 1e-9
    assert root.backward_ms == pytest.approx(sum(m.backward_self_ms for m in result.modules
                                                    if m.name != "(backward, no module)"))
    # the module ranges in the trace are the forward times
    trace = json.loads(Path(result.artifacts.trace_json).read_text())
    conv = sum(e["dur"] for e in trace["traceEvents"] if e.get("name") == "module::0") / 1e3
    assert mods["0"].forward_ms == pytest.approx(conv)
    no_hooks_left(model)
    assert model.training


def test_inference_mode_runs_eval_without_backward(tmp_path, no_hooks_left):
    model = small_model()
    seen_training = []
    model[0].register_forward_hook(lambda m, i, o: seen_training.append((m.training, torch.is_inference_mode_enabled())))
    result, _ = run_profile(model, (torch.randn(2, 3, 8, 8),), {**SMALL, "record_shapes": False}, tmp_path)
    assert seen_training and all(t == (False, True) for t in seen_training)
    assert model.training
    assert all(s.backward_ms == 0 and s.forward_ms > 0 for s in result.steps)
    assert result.operators_by_shape is None
    assert result.mode == "inference" and result.loss is None
    model[0]._forward_hooks.clear()
    no_hooks_left(model)


def test_with_stack_keeps_python_frames_out_of_the_operator_table(tmp_path):
    result, _ = run_profile(small_model(), (torch.randn(2, 3, 8, 8),),
                            {**SMALL, "with_stack": True, "latency_iters": 2}, tmp_path)
    names = [r.name for r in result.operators]
    assert "aten::linear" in names and "aten::conv2d" in names
    frames = [n for n in names if ".py(" in n or n.startswith("<built-in") or n.startswith("nn.Module:")]
    assert not frames, frames
    # The frames are still in the trace, where with_stack put them.
    trace = json.loads(Path(result.artifacts.trace_json).read_text())
    assert any(e.get("cat") == "python_function" for e in trace["traceEvents"])


@pytest.mark.parametrize("options, message", [
    ({"mode": "bogus"}, "option mode: must be one of inference, train, got 'bogus'"),
    ({"active": 0}, "option active: must be an integer from 1 to 200, got 0"),
    ({"optimizer": "lion"}, "option optimizer: must be one of sgd, adamw, got 'lion'"),
    ({"warmup": "x"}, "option warmup: must be an integer from 0 to 200, got 'x'"),
    ({"wait": 100, "active": 150}, "the schedule runs 251 steps ((wait + warmup + active) x repeat); keep it at most 200"),
    ({"activities": ["tpu"]}, "option activities: unknown value 'tpu'; choose from cpu, cuda"),
    ({"colour": 1}, "unknown option 'colour' for profile; valid: mode, optimizer"),
])
def test_bad_options_are_named(options, message):
    from diagnostics.analyses.profile import ANALYSIS
    from diagnostics.declare import OptionError

    with pytest.raises(OptionError) as e:
        profiler.resolve_options(ANALYSIS.validate(options))
    assert message in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_activity_without_cuda_is_refused():
    from diagnostics.analyses.profile import ANALYSIS
    from diagnostics.declare import OptionError

    with pytest.raises(OptionError, match="CUDA is not available"):
        profiler.resolve_options(ANALYSIS.validate({"activities": ["cpu", "cuda"]}))


def test_a_failing_loss_is_reported_with_its_error(tmp_path, no_hooks_left):
    model = small_model()
    spec = ModelSpec(name="handmade")
    ctx = AnalysisContext(Job("profile", spec, {}), tmp_path)
    x = torch.randn(2, 3, 8, 8)
    ctx._loaded = LoadedModel(spec, model, (InputSpec((2, 3, 8, 8)),), (x,), lambda out: out.view(7, -1), "my loss")
    from diagnostics.errors import ModelRunError
    with pytest.raises(ModelRunError, match=r"the loss \(my loss\) failed on the model's output: RuntimeError"):
        profiler.analyze(ctx, {**SMALL, "mode": "train"})
    assert model.training
    no_hooks_left(model)


def test_training_a_frozen_model_is_refused(tmp_path):
    model = small_model().requires_grad_(False)
    from diagnostics.errors import TorchScopeError

    with pytest.raises(TorchScopeError, match="needs trainable parameters"):
        run_profile(model, (torch.randn(2, 3, 8, 8),), {**SMALL, "mode": "train"}, tmp_path)
    assert model.training


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_run_has_kernels_and_a_device_split(tmp_path):
    model = small_model().cuda()
    result, _ = run_profile(model, (torch.randn(8, 3, 8, 8, device="cuda"),), {**SMALL, "mode": "train"}, tmp_path,
                            device="cuda")
    assert result.cuda_ran and result.config["activities"] == ["cpu", "cuda"]
    assert result.kernels and all(k.calls > 0 and k.total_us > 0 for k in result.kernels)
    assert sum(r.kernel_ms for r in result.device_split) > 0
    assert result.metrics.peak_device_memory_bytes > 0
    assert any(r.self_device_ms > 0 for r in result.operators)
    # kernels are rows of the kernel table, not operators: the operators' self device time is the
    # kernels' time once (memcpy / memset aside), not twice
    assert not {r.name for r in result.operators} & {k.name for k in result.kernels}
    # (double counted it read 2.0x the kernel time; memcpy / memset, outside the kernel table, are a few us)
    assert result.metrics.self_device_total_ms < 1.5 * result.metrics.kernel_time_ms


def test_operator_rows_leave_out_device_side_rows():
    """On CUDA key_averages has a row per kernel too (device_type CUDA), whose time the launching
    operator's self device time already holds: the operator table keeps only the CPU-side rows."""
    from types import SimpleNamespace as NS

    from diagnostics.analyses.profile.job import operator_rows

    def row(key, dev, self_dev):
        return NS(key=key, is_user_annotation=False, device_type=NS(name=dev), count=2, self_cpu_time_total=10.0,
                  cpu_time_total=20.0, self_device_time_total=self_dev, device_time_total=self_dev,
                  self_cpu_memory_usage=0, cpu_memory_usage=0, self_device_memory_usage=0, device_memory_usage=0,
                  input_shapes=[])

    rows = operator_rows([row("aten::mm", "CPU", 500.0), row("sm90_xmma_gemm_bf16bf16", "CUDA", 500.0),
                          row("cudaLaunchKernel", "CPU", 0.0)])
    assert [r["name"] for r in rows] == ["aten::mm", "cudaLaunchKernel"]
    assert sum(r["self_device_ms"] for r in rows) == 0.5


def test_timeline_comes_from_the_trace_explorer_engine(trained):
    _, result, _, _ = trained
    tl = result.timeline  # the trace layer's Timeline record, as the Trace explorer's results hold it
    assert isinstance(tl, Timeline)
    steps = sorted((e for e in tl.events if e.name.startswith("ProfilerStep#")), key=lambda e: e.start_us)
    assert [round(e.dur_us / 1e3, 6) for e in steps] == [round(s.step_ms, 6) for s in result.steps]
    assert tl.shown == len(tl.events) <= tl.in_range
    assert {e.lane for e in tl.events} == {l.lane for l in tl.lanes}
    # record_shapes on: the drawn operators carry their input shapes
    assert any(given(e.shapes) and e.shapes.startswith("[[") for e in tl.events if e.name.startswith("aten::"))


def test_a_torchscript_model_says_why_it_has_no_module_times(tmp_path):
    """TorchScript modules take no Python hooks: with_modules on still gives no module rows, and the
    result says why (not "turn with_modules on")."""
    scripted = torch.jit.script(small_model())
    result, _ = run_profile(scripted, (torch.randn(2, 3, 8, 8),), {**SMALL, "with_modules": True, "roofline": False},
                            tmp_path)
    assert result.config["with_modules"] is True and result.modules == ()
    assert "TorchScript model" in result.modules_note and "with_modules was on" in result.modules_note
    assert result.modules_note in result.notes
    assert any(r.name == "aten::conv2d" for r in result.operators)  # the rest was measured

    (tmp_path / "p").mkdir()
    (tmp_path / "o").mkdir()
    plain, _ = run_profile(small_model(), (torch.randn(2, 3, 8, 8),), {**SMALL, "roofline": False}, tmp_path / "p")
    assert plain.modules and plain.modules_note is None
    off, _ = run_profile(small_model(), (torch.randn(2, 3, 8, 8),), {**SMALL, "with_modules": False,
                                                                     "roofline": False}, tmp_path / "o")
    assert off.modules == () and "it was off" in off.modules_note


# ----------------------------------------------------------------------------- FLOPs not counted
@torch.library.custom_op("torchscope_test::profile_mystery", mutates_args=())
def profile_mystery(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


class Mystery(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 256))

    def forward(self, x):
        return profile_mystery(x, self.w)


def test_ops_the_flop_count_cannot_see_are_listed_with_their_share_of_measured_time(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), Mystery())
    r, _ = run_profile(model, (torch.randn(64, 256),), dict(SMALL, latency_iters=3), tmp_path)
    (row,) = r.flops_not_counted
    assert row.op == "torchscope_test::profile_mystery" and row.calls == 1 and row.modules == ("1",)
    ops = {o.name: o for o in r.operators}
    steps = len(r.steps)
    # its time includes the aten::mm it runs (issue #31: an op's work is in its children)
    mystery = ops["torchscope_test::profile_mystery"]
    assert row.time_ms == pytest.approx(mystery.cpu_total_ms / steps)
    assert row.time_ms > mystery.self_cpu_ms / steps
    linear = ops["aten::linear"].cpu_total_ms / steps  # the only other op with work: shares of their sum
    assert row.pct_of_time == pytest.approx(100.0 * row.time_ms / (row.time_ms + linear), rel=0.05)
    assert 0 < row.pct_of_time < 100
    assert r.metrics.model_flops_per_step == 2 * 64 * 256 * 256  # the Linear only: a lower bound
    note = next(n for n in r.notes if n.startswith("FLOPs not counted for torchscope_test::profile_mystery"))
    assert f"{row.pct_of_time:.1f}% of measured op time" in note and "lower bounds" in note
    mods = {m.name: m for m in r.modules}
    assert mods["1"].flops is None and mods["1"].mfu is None
    assert mods["1"].flops_not_counted == "torchscope_test::profile_mystery"
    assert mods["0"].flops_not_counted is None and mods["0"].flops == 2 * 64 * 256 * 256
    roof = {x.op: x for x in r.roofline}
    assert roof["torchscope_test::profile_mystery"].flops_not_counted is True
    assert roof["aten::addmm"].flops_not_counted is False


# ----------------------------------------------------------------------------- optional parts
def test_a_weight_norm_parametrization_gets_its_roofline(tmp_path):
    """The roofline's FLOP pass runs under inference_mode, where torch's module tracker broke on the
    parametrization ("'ParametrizedConv1d' object has no attribute 'weight'", the job failed blaming the inputs)."""
    torch.manual_seed(0)
    from tests.measure.test_flops import WeightNormConv  # wav2vec2 / HuBERT's positional convolution

    r, _ = run_profile(WeightNormConv(), (torch.randn(2, 12, 16),), SMALL, tmp_path)
    conv, head = 2 * (2 * 16 * 12) * (4 * 5), 2 * (2 * 12) * 16 * 4
    assert r.metrics.model_flops_per_step == conv + head
    assert r.roofline_unavailable is UNSET


def test_an_optional_part_that_fails_leaves_the_job_standing(tmp_path, monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("the counter met something new\nwith a second line")

    monkeypatch.setattr(profiler, "count_ops", broken)
    r, _ = run_profile(small_model(), (torch.randn(2, 3, 8, 8),), SMALL, tmp_path)
    assert r.metrics.latency_median_ms > 0 and r.operators  # the rest of the job is there
    assert r.roofs is None and r.metrics.mfu is None and r.metrics.model_flops_per_step is None
    assert r.roofline_unavailable == "RuntimeError: the counter met something new with a second line"
    assert "roofline not available: RuntimeError: the counter met something new with a second line" in r.notes
