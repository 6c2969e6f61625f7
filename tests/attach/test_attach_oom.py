"""An attached script that dies of out-of-memory: it ends exactly as bare (exit code, traceback), and the result
says where (step, part), what it asked for, what held memory by category and by module (against the model's
layer sizes), and the planner's budget answer; a crash that is not an OOM is not reported as one."""

import json
from concurrent.futures import ThreadPoolExecutor

import msgspec
import pytest
from diagnostics.analyses.attach.protocol import oom_kind, requested_bytes
from diagnostics.analyses.attach.result import OutOfMemory
from diagnostics.render.charts.attach import oom_lines
from tests.attach.harness import run_attached, run_bare

#: keeps the boundary the optimizer's on a loaded machine (a slow first step is not an inference loop)
OPTIONS = ("--fallback-after", "120")
CPU_MESSAGE = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
               "to allocate 1125899906842624 bytes. Error code 12 (Cannot allocate memory)")


def _linear(i: int, o: int) -> int:
    return 4 * (i * o + o)


#: oom_forward.py's tensors in fp32, from its layer sizes: body = Linear(32, 64), BatchNorm1d(64), Linear(64, 64)
BODY_PARAMS = _linear(32, 64) + 4 * 2 * 64 + _linear(64, 64)
BODY_BUFFERS = 4 * 2 * 64 + 8  # running mean and var, num_batches_tracked (int64)
HEAD_PARAMS = _linear(64, 4)
#: Adam: exp_avg and exp_avg_sq per parameter, and a float32 step scalar per parameter tensor
BODY_STATE, HEAD_STATE = 2 * BODY_PARAMS + 4 * 6, 2 * HEAD_PARAMS + 4 * 2


def test_the_allocators_messages_are_told_apart_and_their_sizes_read():
    assert oom_kind("RuntimeError", CPU_MESSAGE) == "cpu"
    assert requested_bytes(CPU_MESSAGE) == (1 << 50, True)
    cuda = ("CUDA out of memory. Tried to allocate 3.20 GiB. GPU 0 has a total capacity of 79.10 GiB of which "
            "1.05 GiB is free.")
    assert oom_kind("OutOfMemoryError", cuda) == "cuda"
    assert requested_bytes(cuda) == (round(3.2 * 2**30), False)
    assert requested_bytes("CUDA out of memory. Tried to allocate 512 B.") == (512, True)
    for not_oom in ("the loss went bad at step 12", "memory format not supported", "expected out of range"):
        assert oom_kind("RuntimeError", not_oom) is None
    assert requested_bytes("the loss went bad") == (None, False)


def test_an_oom_in_forward_ends_as_bare_and_says_what_held_memory_and_what_would_fit(tmp_path):
    (tmp_path / "bare").mkdir()
    with ThreadPoolExecutor(2) as pool:  # side by side: the test stays short
        bare_run = pool.submit(run_bare, tmp_path / "bare", "oom_forward.py")
        # the window after the failure: step 7 is not profiled (the rest is then RSS less the tensors counted)
        ran = run_attached(tmp_path, "oom_forward.py", options=(*OPTIONS, "--at", "50"))
        bare = bare_run.result()
    assert bare.code == ran.code == 1
    assert "DefaultCPUAllocator: can't allocate memory" in bare.stderr
    assert ran.script_stderr == bare.stderr.strip()  # the same traceback, line for line
    assert ran.script_stdout == bare.stdout.strip()
    r = ran.result
    assert r["status"] == "failed" and r["step_boundary"] == "optimizer" and r["steps"] == 6
    oom = r["memory"]["oom"]
    assert oom["kind"] == "cpu" and oom["step"] == 7 and oom["phase"] == "forward" and oom["module"] == "Net"
    assert 0 < oom["seconds"] < 30
    assert oom["requested_bytes"] == (1 << 48) * 4 and oom["requested_exact"]
    held = oom["held_bytes"]
    assert held["parameters"] == BODY_PARAMS + HEAD_PARAMS
    assert held["buffers"] == BODY_BUFFERS
    assert held["gradients"] == BODY_PARAMS + HEAD_PARAMS  # zeroed, not freed
    assert held["optimizer_state"] == BODY_STATE + HEAD_STATE
    counted = sum(v for k, v in held.items() if k != "activations and temporaries")
    assert held["activations and temporaries"] == oom["total_bytes"] - counted > 0
    assert "resident memory (RSS)" in oom["total_how"]
    assert oom["by_module"] == [
        {"module": "body", "parameters": BODY_PARAMS, "buffers": BODY_BUFFERS, "gradients": BODY_PARAMS,
         "optimizer_state": BODY_STATE},
        {"module": "head", "parameters": HEAD_PARAMS, "buffers": 0, "gradients": HEAD_PARAMS,
         "optimizer_state": HEAD_STATE}]
    # the planner's answer for this machine's memory: the step fits (the sentinel is not the model's own)
    fit = oom["plan"]
    assert oom.get("plan_error") is None, oom
    with open("/proc/meminfo") as f:
        mem_total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert 0 < fit["budget_bytes"] <= mem_total and fit["budget_source"]
    assert fit["device_kind"] == "cpu" and fit["optimizer"] == "adam" and fit["batch"] == 16
    assert fit["fits"] and fit["checkpoint_modules"] == [] and fit["predicted_peak_bytes"] > counted - BODY_BUFFERS
    # the CLI's block
    said = [line for line in ran.stderr.splitlines() if line.startswith("[torchscope]")]
    assert "[torchscope] Out of memory at step 7 (forward, in Net): 1024 TiB requested (CPU allocator)" in said
    assert any(line.startswith("[torchscope] held: parameters 26.0 KiB, buffers 520 B") for line in said)
    assert any(line.startswith("[torchscope] held by body: ") for line in said)
    assert any(line.startswith("[torchscope] planner: the step (fp32, adam, batch 16) fits in ") for line in said)


@pytest.mark.parametrize("where", ["data", "backward", "optimizer"])
def test_an_oom_in_a_profiled_steps_data_backward_or_optimizer_is_placed_there_with_the_allocators_view(tmp_path,
                                                                                                      where):
    ran = run_attached(tmp_path, "oom_forward.py", options=(*OPTIONS, "--at", "4", "--steps", "3"),
                       env={"OOM_IN": where, "OOM_AT": "5"})
    assert ran.code == 1 and "DefaultCPUAllocator: can't allocate memory" in ran.stderr
    r = ran.result
    oom = r["memory"]["oom"]
    assert oom["step"] == 5 and oom["phase"] == where and oom["requested_bytes"] == 1 << 50
    held = oom["held_bytes"]
    assert held["parameters"] == BODY_PARAMS + HEAD_PARAMS and held["optimizer_state"] == BODY_STATE + HEAD_STATE
    # the failing step was profiled: the rest is the allocator's view of the step (its activations: tens of KiB),
    # not the process' resident memory (hundreds of MiB with torch loaded)
    assert "allocator's view" in oom["total_how"]
    rest = held["activations and temporaries"]
    assert rest < 1 << 20 and oom["total_bytes"] == sum(held.values())
    assert rest > 0 or where == "data"  # the batch is fetched first: nothing of the step is held yet
    assert "the profiled window was cut short: the script died of out-of-memory in step 5" in r["notes"]
    assert not any("differ from the profiled steps" in n for n in r["notes"])  # step 5 is in the trace, unfinished


def test_an_oom_before_the_first_optimizer_step_says_why_there_is_no_plan(tmp_path):
    ran = run_attached(tmp_path, "oom_forward.py", options=OPTIONS, env={"OOM_AT": "1"})
    assert ran.code == 1
    oom = ran.result["memory"]["oom"]
    assert oom["step"] == 1 and oom["phase"] == "forward" and oom.get("plan") is None
    assert "no optimizer step was seen" in oom["plan_error"]
    assert oom["held_bytes"]["optimizer_state"] == 0 and oom["held_bytes"]["gradients"] == 0
    assert oom["held_bytes"]["parameters"] == BODY_PARAMS + HEAD_PARAMS


def test_a_crash_that_is_not_an_oom_is_not_reported_as_one(tmp_path):
    ran = run_attached(tmp_path, "crash.py", options=OPTIONS, env={"CRASH_AT": "3"})
    assert ran.code == 1 and "RuntimeError: the loss went bad at step 3" in ran.stderr
    assert ran.result["memory"]["oom"] is None
    assert not list((tmp_path / "store").rglob("oom.json"))
    assert "Out of memory" not in ran.stderr


def test_the_block_for_a_step_that_does_not_fit_names_the_checkpointing_or_what_else_is_needed():
    base = {"why": "OutOfMemoryError: CUDA out of memory.", "step": 4, "kind": "cuda", "phase": "backward",
            "inside": None, "module": None, "requested_bytes": 3 << 30, "requested_exact": False,
            "held_bytes": {"parameters": 1 << 30, "gradients": 1 << 30, "optimizer_state": 2 << 30,
                           "activations and temporaries": 5 << 30},
            "total_bytes": 9 << 30, "total_how": "torch.cuda.memory_allocated()", "by_module": []}
    fit = {"device": "H100", "device_kind": "cuda", "budget_bytes": 10 << 30, "budget_source": "total_memory",
           "configuration": "fp32, adamw", "batch": 8, "unconstrained_peak_bytes": 12 << 30}

    def lines(**kw):
        return oom_lines(msgspec.convert({**base, "plan": {**fit, **kw}}, OutOfMemory))

    got = lines(fits=True, checkpoint_modules=["layers.0", "layers.1"], predicted_peak_bytes=9 << 30)
    assert got[0] == "Out of memory at step 4 (backward): about 3.00 GiB requested (CUDA allocator)"
    assert "planner: checkpoint layers.0, layers.1 (--checkpoint-modules layers.0,layers.1) to fit" in got[-1]
    got = lines(fits=False, smallest_peak_bytes=11 << 30,
                needed=[{"change": "micro-batch 4 x 2 (gradient accumulation)", "peak_bytes": 8 << 30}])
    assert "the smallest peak reachable is 11.0 GiB" in got[-1] and "micro-batch 4 x 2" in got[-1]
    # a run stored before the report: the CUDA snapshot's record alone, one line
    legacy = msgspec.convert({"why": "CUDA out of memory on device 0", "step": 3, "snapshot": "oom_snapshot.pickle"},
                             OutOfMemory)
    assert oom_lines(legacy) == ["Out of memory at step 3: CUDA out of memory on device 0; snapshot oom_snapshot.pickle"]


def _stored_oom_run(tmp_path, oom: dict):
    from diagnostics.analyses.attach.job import analyse_run
    from tests.attach.test_attach_unit import _step, _write_run

    _write_run(tmp_path, [_step(n, {"forward": 2.0, "backward": 3.0, "host": 1.0}) for n in range(1, 7)], {})
    (tmp_path / "proc-1234" / "oom.json").write_text(json.dumps(oom))
    return analyse_run(tmp_path, exit_code=1, command=["python", "t.py"])


OOM_DOC = {"kind": "cpu", "why": "RuntimeError: " + CPU_MESSAGE, "step": 7, "phase": "backward", "inside": None,
           "module": None, "requested_bytes": 1 << 50, "requested_exact": True,
           "held_bytes": {"parameters": 4096, "buffers": 0, "gradients": 4096, "optimizer_state": 8192,
                          "activations and temporaries": 1 << 20},
           "total_bytes": 16384 + (1 << 20), "total_how": "RSS", "by_module": [
               {"module": "encoder", "parameters": 4096, "buffers": 0, "gradients": 4096, "optimizer_state": 8192}],
           "plan": {"device": "cpu", "device_kind": "cpu", "budget_source": "MemTotal (/proc/meminfo)",
                    "optimizer": "adam", "notes": ["kernel scratch is not counted"],
                    "fit": {"budget_bytes": 1 << 30, "configuration": "fp32, adam", "batch": 8,
                            "unconstrained_peak_bytes": 2 << 30, "checkpoint_modules": ["encoder"],
                            "predicted_peak_bytes": 900 << 20, "recompute_ms": None, "recompute_flops": 10, "fits": True,
                            "smallest_peak_bytes": None, "needed": [], "candidates": [], "timing": "not measured",
                            "method": "m", "traces": 3}}}


def test_a_stored_runs_oom_report_is_read_back_typed_and_a_bad_one_is_named(tmp_path):
    result = _stored_oom_run(tmp_path / "good", OOM_DOC)
    oom = result.memory.oom
    assert oom.phase == "backward" and oom.requested_bytes == 1 << 50 and oom.by_module[0].module == "encoder"
    assert oom.plan.checkpoint_modules == ("encoder",) and oom.plan.budget_bytes == 1 << 30
    assert oom.plan.budget_source == "MemTotal (/proc/meminfo)" and oom.plan.notes == ("kernel scratch is not counted",)
    bad = _stored_oom_run(tmp_path / "bad", {**OOM_DOC, "step": "seven"})
    assert bad.memory.oom is None and any("oom.json is not an out-of-memory report" in n for n in bad.notes)


def test_the_view_shows_the_oom_block_and_the_modules_table(tmp_path):
    from streamlit.testing.v1 import AppTest

    from diagnostics.results import to_json

    path = tmp_path / "result.json"
    path.write_text(to_json(_stored_oom_run(tmp_path / "run", OOM_DOC)))

    def page(path):
        import json as _json

        from ui import views

        views.show_stored("attach", _json.loads(open(path).read()))

    at = AppTest.from_function(page, default_timeout=60, kwargs={"path": str(path)}).run()
    assert not at.exception, [e.value for e in at.exception]
    block = " ".join(e.value for e in at.error).replace("\\", "")  # shown as written: markdown escaped
    assert "Out of memory at step 7 (backward): 1024 TiB requested (CPU allocator)" in block, block
    assert "held: parameters 4.00 KiB, buffers 0 B, gradients 4.00 KiB, optimizer state 8.00 KiB" in block
    assert "held by encoder: 16.0 KiB" in block
    assert "planner: checkpoint encoder (--checkpoint-modules encoder) to fit the step (fp32, adam, batch 8)" in block
    assert any("Held at the out-of-memory error, by module" in m.value for m in at.markdown)
    assert len(at.dataframe) >= 1


def _blocks():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)) for _ in range(4)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(512, 64)).sum().backward()
    opt.step()
    return model, opt


def test_the_budget_answer_in_process_checkpoints_to_fit_a_tight_budget_and_leaves_the_model_as_it_was(monkeypatch):
    import torch

    from diagnostics.analyses.plan import attached

    model, opt = _blocks()
    before = [t.clone() for t in [*model.parameters(), *(p.grad for p in model.parameters()),
                                  *(v for s in opt.state.values() for v in s.values())]]
    inputs = [((512, 64), "float32")]
    peak = attached.fit_in_process(model, opt, inputs, None, "cpu")["fit"]["unconstrained_peak_bytes"]
    budget = int(0.75 * peak)
    monkeypatch.setattr(attached, "process_memory_limit", lambda: (budget, "a test's budget"))
    out = attached.fit_in_process(model, opt, inputs, None, "cpu")
    fit = out["fit"]
    assert out["budget_source"] == "a test's budget" and out["optimizer"] == "sgd" and fit["budget_bytes"] == budget
    assert fit["fits"] and fit["checkpoint_modules"] and fit["predicted_peak_bytes"] <= budget < peak
    assert set(fit["checkpoint_modules"]) <= {"0", "1", "2", "3"} and "not measured" in fit["timing"]
    # (nothing fits: fit_budget's smallest peak and what else, tests/analyses/plan/test_fit_budget.py)
    after = [*model.parameters(), *(p.grad for p in model.parameters()),
             *(v for s in opt.state.values() for v in s.values())]
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_the_script_optimizer_is_named_as_the_planner_models_it_or_refused_by_name():
    import torch
    from torch import nn

    from diagnostics.analyses.plan.attached import optimizer_name
    from diagnostics.declare import OptionError

    ps = list(nn.Linear(2, 2).parameters())
    assert optimizer_name(torch.optim.SGD(ps, lr=0.1)) == "sgd_nomomentum"
    assert optimizer_name(torch.optim.SGD(ps, lr=0.1, momentum=0.5)) == "sgd"
    assert optimizer_name(torch.optim.Adam(ps)) == "adam" and optimizer_name(torch.optim.AdamW(ps)) == "adamw"
    with pytest.raises(OptionError, match="the script's Adam with amsgrad is not one of them"):
        optimizer_name(torch.optim.Adam(ps, amsgrad=True))
    with pytest.raises(OptionError, match="the script's RMSprop is not one of them"):
        optimizer_name(torch.optim.RMSprop(ps))


def test_the_memory_the_process_may_use_is_the_least_limit_and_says_which(monkeypatch):
    import resource

    from diagnostics.analyses.plan.attached import process_memory_limit

    free, which = process_memory_limit()
    assert free > 0 and which
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1 << 20, resource.RLIM_INFINITY))
    assert process_memory_limit() == (1 << 20, "RLIMIT_AS: the process' address-space limit (torch's libraries "
                                               "count in it)")


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_a_cuda_oom_ends_as_bare_and_reads_the_allocators_own_figures(tmp_path):
    import torch

    bare = run_bare(tmp_path, "oom_forward.py", "--cuda")
    ran = run_attached(tmp_path, "oom_forward.py", "--cuda", options=OPTIONS)
    assert bare.code == ran.code == 1 and "OutOfMemoryError" in bare.stderr
    assert ran.script_stderr == bare.stderr.strip()
    oom = ran.result["memory"]["oom"]
    assert oom["kind"] == "cuda" and oom["step"] == 7 and oom["phase"] == "forward"
    assert oom["requested_bytes"] == 1 << 50 and oom["requested_exact"]  # the out-of-memory observer's figure
    held = oom["held_bytes"]
    assert held["parameters"] == held["gradients"] == BODY_PARAMS + HEAD_PARAMS
    # Adam keeps its step counters on the host (neither fused nor capturable): only its two buffers are on the GPU
    assert held["optimizer_state"] == 2 * (BODY_PARAMS + HEAD_PARAMS)
    assert "memory_allocated" in oom["total_how"] and oom["total_bytes"] >= sum(
        v for k, v in held.items() if k != "activations and temporaries")
    fit = oom["plan"]
    total = torch.cuda.get_device_properties(0).total_memory
    assert fit["device_kind"] == "cuda" and fit["budget_bytes"] <= total and "total_memory" in fit["budget_source"]
    assert fit["fits"]
