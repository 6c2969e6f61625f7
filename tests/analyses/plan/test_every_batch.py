"""Every batch of a plan is answered, or says why it was not: kernel scratch of ops too large to probe is
taken on a line through two smaller probes (the CNN sample at batch 64+ used to fail the whole plan with
"TypeError: cannot unpack non-iterable int object"), and one configuration that fails leaves the others
standing."""

import pytest
import torch
from torch import nn

from diagnostics.analyses.plan import scratch as scratch_mod
from diagnostics.analyses.plan.configs import Config, Setting
from diagnostics.analyses.plan.planner import Planner
from diagnostics.analyses.plan.targets import resolve
from diagnostics.errors import TorchScopeError
from diagnostics.intake import LoadedModel, default_loss, load_model
from diagnostics.spec import InputSpec, ModelSpec

CPU = resolve("cpu", cpu={"ram_available_bytes": 1 << 36})


def test_an_op_over_the_probe_limit_gets_its_scratch_from_two_smaller_probes(monkeypatch):
    """The CNN's convolutions and batch norms at batch 64, probed whole and then with a 2 MiB limit (which
    cuts every probe to a few rows): the step's kernel scratch and peak agree within 0.5 %."""
    loaded = load_model(ModelSpec(name="cnn"))
    whole = Planner(loaded, CPU).run(Config(64, None, Setting()))
    monkeypatch.setattr(scratch_mod, "PROBE_LIMIT_BYTES", 2 * 2**20)
    planner = Planner(loaded, CPU)
    cut = planner.run(Config(64, None, Setting()))
    assert not planner.scratch.skipped
    assert whole.parts["workspaces"] > 1 << 20  # oneDNN's reorders: the part the line must get right
    assert cut.parts["workspaces"] == pytest.approx(whole.parts["workspaces"], rel=0.005)
    assert cut.peak_bytes == pytest.approx(whole.peak_bytes, rel=0.005)


def test_an_op_that_cannot_be_cut_is_named_as_not_counted(monkeypatch):
    monkeypatch.setattr(scratch_mod, "PROBE_LIMIT_BYTES", 1024)
    s = scratch_mod.Scratch("cpu")
    aten = torch.ops.aten
    x = torch.randn(64, 64)
    assert s.measure(aten._grouped_mm.default, (x, x), {}, None) == (0, None)
    assert any("_grouped_mm" in k and "not cut into rows" in k for k in s.skipped)


def _analyze(tmp_path, loaded, options):
    from diagnostics.analyses.plan.job import analyze
    from diagnostics.runner import AnalysisContext, Job

    ctx = AnalysisContext(Job("plan", loaded.spec, options), tmp_path)
    ctx._loaded = loaded
    return analyze(ctx, options)


def test_the_cnn_sample_plans_every_batch_when_its_probes_are_cut(tmp_path, monkeypatch):
    """`plan --model cnn --batch 1,8,64`, with the probe limit low enough that batch 8 and 64 are over it."""
    monkeypatch.setattr(scratch_mod, "PROBE_LIMIT_BYTES", 2 * 2**20)
    result = _analyze(tmp_path, load_model(ModelSpec(name="cnn")),
                      {"batch": "1,8,64", "sweep": False, "device": "cpu:64GiB"})
    assert [r.batch for r in result.rows] == [1, 8, 64]
    assert all(not r.error and r.peak_bytes > 0 and r.how == "traced" for r in result.rows)
    assert result.rows[0].peak_bytes < result.rows[1].peak_bytes < result.rows[2].peak_bytes


def _fails_from(batch: int) -> LoadedModel:
    """A chain whose loss cannot be traced from ``batch`` rows on (no analytic stand-in exists for a loss)."""
    torch.manual_seed(0)

    def loss(out):
        if out.shape[0] >= batch:
            raise RuntimeError(f"this loss takes fewer than {batch} rows")
        return default_loss(out)

    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
    return LoadedModel(ModelSpec(name="chain"), model, (InputSpec((8, 32)),), (torch.randn(8, 32),), loss, "mse")


def test_a_failing_batch_says_which_and_why_while_the_others_are_answered(tmp_path):
    from diagnostics.render.charts.plan import plan_text

    result = _analyze(tmp_path, _fails_from(64), {"batch": "8,64,100", "device": "cpu:64GiB", "max_batch": 256,
                                                  "optimizer": ["sgd"]})
    ok, bad, bad2 = result.rows
    assert not ok.error and ok.peak_bytes > 0 and ok.fits
    for r in (bad, bad2):
        assert r.how == "failed" and not r.fits and r.peak_bytes == 0
        assert "during forward: RuntimeError: this loss takes fewer than 64 rows" in r.error
    assert any(n.startswith("batch 64 (fp32, sgd) could not be planned") for n in result.notes)
    # the sweep stops where a trace fails and answers with the batches traced before it
    m = result.max_batch[0]
    assert 8 <= m.max_batch < 64 and "could not be planned" in m.checked
    assert result.metrics.min_peak_bytes == ok.peak_bytes  # failed rows are not peaks of 0
    text = plan_text(result)
    assert "failed: the memory plan cannot trace this model" in text


def test_a_plan_where_nothing_can_be_answered_raises_the_first_failure(tmp_path):
    with pytest.raises(TorchScopeError, match="fewer than 4 rows"):
        _analyze(tmp_path, _fails_from(4), {"batch": "8", "device": "cpu:64GiB", "sweep": False})
