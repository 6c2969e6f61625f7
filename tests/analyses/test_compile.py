"""The torch.compile explorer against torch._dynamo.explain run directly on the same model."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from diagnostics.analyses.compile.result import CompilePartial
from diagnostics.errors import TorchScopeError
from diagnostics.measure.compare import VERDICTS
from diagnostics.measure.dynamo import parse_recompile, suggestion
from diagnostics.results import to_json, to_plain
from diagnostics.runner import Job, execute
from diagnostics.spec import InputSpec, ModelSpec
from sample_models import mlps

ROOT = Path(__file__).resolve().parents[2]
MLPS = ROOT / "sample_models" / "mlps.py"


def _line_of(fragment: str) -> int:
    return next(i for i, line in enumerate(MLPS.read_text().splitlines(), 1) if fragment in line)


@pytest.fixture(scope="module")
def breaky(tmp_path_factory):
    return execute(Job("compile", ModelSpec(name="graph_break_mlp"),
                       {"backend": "eager", "rounds": 6, "warmup": 1}), tmp_path_factory.mktemp("c"))


def test_breaks_graphs_and_ops_are_dynamos_own(breaky):
    torch.manual_seed(0)
    model = mlps.GraphBreakMLP().eval()
    torch._dynamo.reset()
    with torch.no_grad():
        ref = torch._dynamo.explain(model)(torch.randn(32, 64))
    torch._dynamo.reset()
    m = breaky.metrics
    assert m.graph_count == ref.graph_count == 3
    assert m.graph_break_count == ref.graph_break_count == 2
    assert m.op_count == ref.op_count
    assert [g.ops for g in breaky.graphs] == [
        sum(1 for n in g.graph.nodes if n.op in ("call_function", "call_method", "call_module")) for g in ref.graphs]
    assert [b.reason for b in breaky.graph_breaks] == [str(r.reason).strip() for r in ref.break_reasons]


def test_every_break_names_its_source_line_and_a_rewrite(breaky):
    by_loc = {b.location: b for b in breaky.graph_breaks}
    item, numpy = f"mlps.py:{_line_of('h.mean().item() > 0.5')}", f"mlps.py:{_line_of('.numpy()).mean())')}"
    assert set(by_loc) == {item, numpy}
    assert by_loc[item].code.startswith("if h.mean().item() > 0.5:")
    assert by_loc[item].reason.startswith("Unsupported Tensor.item() call")
    assert "torch.where" in by_loc[item].suggestion and by_loc[item].count == 1
    assert by_loc[numpy].code.startswith("scale = float(np.abs(")
    assert by_loc[numpy].suggestion


def test_compile_time_recompiles_fullgraph_and_the_interleaved_comparison(breaky):
    m = breaky.metrics
    assert m.compile_time_s == pytest.approx(sum(f.seconds for f in breaky.compile_frames))
    assert m.compile_time_s > 0 and len(breaky.compile_frames) == 3  # one frame per graph
    assert m.first_call_ms > m.compiled_ms > 0 and m.eager_ms > 0
    low, high = m.speedup_ci_low, m.speedup_ci_high
    assert low <= m.speedup <= high and m.verdict in VERDICTS
    # the speed-up is the ratio of the two times shown, and an A/A control ran beside them
    assert m.speedup == pytest.approx(m.eager_ms / m.compiled_ms)
    assert breaky.timing["control"].rounds == 6 and breaky.timing["control"].verdict in VERDICTS
    # the batch x2 probe recompiles every frame on the new shape
    assert m.recompiles == len(breaky.recompiles) >= 1
    assert any("size mismatch" in g for r in breaky.recompiles for g in r.guard_failures)
    assert all("mark_dynamic" in r.advice for r in breaky.recompiles)
    assert m.fullgraph_ok is False and breaky.fullgraph_error
    assert m.generated_kernels is None and any("inductor backend only" in n for n in breaky.notes)
    assert isinstance(breaky.torch_version, str) and type(breaky.torch_version) is str  # not torch's TorchVersion
    json.loads(to_json(breaky))


def test_a_clean_model_is_one_graph(tmp_path):
    r = execute(Job("compile", ModelSpec(name="mlp"), {"backend": "eager", "rounds": 2, "recompile_probe": False}),
                tmp_path)
    m = r.metrics
    assert (m.graph_count, m.graph_break_count, m.fullgraph_ok, m.recompiles) == (1, 0, True, 0)
    # two rounds give no interval: no verdict beyond the noise, and the result says why
    assert m.speedup_ci_low is None and m.verdict == "within noise"
    assert any("2 rounds: no 95% interval" in n for n in r.notes)
    assert r.graph_breaks == () and r.graphs[0].modules == ("fc1", "act1", "fc2", "act2", "head")


def test_torchscript_is_refused_by_name(tmp_path):
    path = tmp_path / "lin.ts.pt"
    torch.jit.save(torch.jit.script(nn.Linear(4, 2)), str(path))
    spec = ModelSpec(source="torchscript", name="lin.ts.pt", path=str(path), inputs=(InputSpec((2, 4)),))
    with pytest.raises(TorchScopeError, match="a TorchScript model cannot be compiled with torch.compile"):
        execute(Job("compile", spec, {"backend": "eager"}), tmp_path)


def test_recompile_messages_and_suggestions_are_read():
    r = parse_recompile("Recompiling function forward in /x/m.py:12\n    triggered by the following guard failure(s):\n"
                        "    - 0/0: tensor 'x' dtype mismatch. expected Float, actual Double")
    assert r == {"function": "forward", "where": "/x/m.py:12",
                 "guard_failures": ["0/0: tensor 'x' dtype mismatch. expected Float, actual Double"],
                 "advice": "the input dtype or device changed: cast inputs to one dtype / device before the "
                           "compiled call"}
    assert "print" in suggestion("Failed to trace builtin operator `print`")
    assert suggestion("something entirely new") is None


@pytest.mark.slow
def test_the_cli_compiles_with_inductor_and_lists_the_breaks(tmp_path):
    env = {"TORCHSCOPE_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "diagnostics", "compile", "--model", "graph_break_mlp", "--rounds", "3",
                        "--json", "--no-report"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout)
    assert [b["location"] for b in r["graph_breaks"]] == [
        f"mlps.py:{_line_of('h.mean().item() > 0.5')}", f"mlps.py:{_line_of('.numpy()).mean())')}"]
    assert r["metrics"]["graph_count"] == 3 and r["metrics"]["generated_kernels"] >= 1
    assert re.match(r"(faster|slower|within noise)$", r["metrics"]["verdict"])


class LazyScale(nn.Module):
    """Reads a Python float from its input on its first call only (a lazily set scale): Dynamo on a
    freshly built model saw a graph break there that no later call has."""

    def __init__(self):
        super().__init__()
        self.fc, self.scale = nn.Linear(4, 4), None

    def forward(self, x):
        if self.scale is None:
            self.scale = float(x.abs().max())
        return self.fc(x) * 2


def test_dynamo_sees_the_model_after_one_warm_up_call():
    from diagnostics.inputs import Inputs
    from diagnostics.measure.dynamo import explain

    fresh = LazyScale().eval()
    with torch.no_grad():
        ex = explain(fresh, Inputs((torch.randn(2, 4),)))
    assert fresh.scale is not None  # the warm-up ran it eagerly
    assert ex["graph_count"] == 1 and ex["graph_break_count"] == 0 and ex["graph_breaks"] == []


def test_breaks_and_recompiles_are_reported_before_the_compile_and_the_timing(tmp_path):
    """The job's partial results (ctx.partial): Dynamo's graphs and breaks first, then fullgraph and the
    recompiles of the light pass, then the compile time; each what the final result holds."""
    partials, progress = [], []
    r = execute(Job("compile", ModelSpec(name="graph_break_mlp"), {"backend": "eager", "rounds": 2, "warmup": 0}),
                tmp_path, progress=lambda f, m: progress.append(m), partial=lambda p: partials.append((len(progress), p)))
    assert all(isinstance(p, CompilePartial) for _, p in partials)  # typed, as they crossed the worker's pipe
    stages = [p.stage for _, p in partials]
    assert stages == ["explain", "dynamo", "compiled"]
    first = partials[0][1]
    assert first.graph_breaks == r.graph_breaks and first.graphs == r.graphs
    assert to_plain(first.metrics) == {k: getattr(r.metrics, k) for k in ("graph_count", "graph_break_count",
                                                                         "break_sites", "op_count")}
    assert first.recompiles is None  # not known yet: the page says "checking"
    dyn = partials[1][1]
    assert dyn.recompiles == r.recompiles and dyn.metrics.recompiles == r.metrics.recompiles == 3
    assert dyn.metrics.fullgraph_ok is False and dyn.fullgraph_error == r.fullgraph_error
    compiled = partials[2][1]
    assert compiled.compile_time_s == r.metrics.compile_time_s
    # all before the timed rounds: the page shows them while eager and compiled are timed
    timing_started = next(i for i, m in enumerate(progress) if m.startswith("eager vs compiled"))
    assert all(at <= timing_started for at, _ in partials)


def test_the_training_comparison_runs_forward_and_backward_on_both_and_leaves_the_weights():
    """Compile's training comparison runs the one training step without an optimizer (measure.training.Step):
    the eager and compiled arms each a zero_grad, forward, loss and backward, the weights unchanged."""
    from types import SimpleNamespace

    from diagnostics.analyses.compile.job import _train_comparison

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(6, 4)
    calls = []
    loaded = SimpleNamespace(inputs=(x,), loss_name="sum of squares",
                             loss_fn=lambda out: (calls.append(1), out.pow(2).sum())[1])
    before = [p.detach().clone() for p in model.parameters()]
    torch._dynamo.reset()
    r = _train_comparison(model, loaded, {"backend": "eager", "mode": "default", "dynamic": "auto", "rounds": 2,
                                          "warmup": 1}, torch.device("cpu"))
    torch._dynamo.reset()
    assert r.eager_ms > 0 and r.compiled_ms > 0 and r.verdict in ("faster", "slower", "within noise")
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # no optimizer step
    want = torch.autograd.grad(model(x).pow(2).sum(), list(model.parameters()))
    assert all(torch.allclose(p.grad, g) for p, g in zip(model.parameters(), want))  # cleared before each backward
    assert len(calls) >= 1 + 2 * (2 + 1)  # the compiling call, then each arm's warm-up and rounds at least
