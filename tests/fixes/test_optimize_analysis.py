"""The optimize analysis end to end, and torch.compile as a fix (CPU needs a C++ compiler)."""

import json
import shutil

import pytest
import torch
from torch import nn

from diagnostics.errors import TorchScopeError
from diagnostics.analyses.optimize.fixes import run_fix
from diagnostics.results import to_json
from diagnostics.runner import Job, execute
from diagnostics.spec import ModelSpec


def test_optimize_on_the_sample_cnn(tmp_path):
    r = execute(Job("optimize", ModelSpec(name="cnn", batch_size=2),
                    {"fixes": ["conv_bn_fusion", "int8_dynamic", "prune_l1"], "params": {"prune_l1": {"amount": 0.25}},
                     "iters": 6, "warmup": 1}), tmp_path)
    json.loads(to_json(r))
    rows = {row.fix: row for row in r.rows}
    assert list(rows) == ["baseline", "control", "conv_bn_fusion", "int8_dynamic", "prune_l1"]
    assert all(row.status == "ok" for row in rows.values()), [row.why for row in rows.values()]
    assert rows["conv_bn_fusion"].max_abs_err < 1e-3 and rows["conv_bn_fusion"].top1_agreement == 1.0
    assert rows["prune_l1"].params == {"amount": 0.25}
    assert any("zero weights: 25.0%" in n for n in rows["prune_l1"].notes)
    assert rows["prune_l1"].size_ratio == pytest.approx(1.0, abs=0.01)  # dense zeros: same size on disk
    m = r.metrics
    assert m.trials_ok == 3 and m.baseline_median_ms == rows["baseline"].median_ms
    # "faster" counts fixes that keep fidelity: pruning half the weights moves the outputs (flagged)
    assert rows["prune_l1"].flag == "fidelity_loss"
    faster = [rows[f] for f in ("conv_bn_fusion", "int8_dynamic", "prune_l1")
              if rows[f].verdict == "faster" and rows[f].flag != "fidelity_loss"]
    assert m.fixes_faster == len(faster)
    assert m.best_speedup == max((f.speedup for f in faster), default=None)  # only a fix surely faster
    best = next((f for f in faster if f.speedup == m.best_speedup), None)
    assert (m.best_speedup_ci_low, m.best_speedup_ci_high) == (best.speedup_ci if best else (None, None))
    assert (m.control_ci_low, m.control_ci_high) == rows["control"].speedup_ci
    assert m.control_verdict == rows["control"].verdict
    for f in faster:  # "faster" clears the A/A control's interval, not only 1
        assert f.speedup_ci[0] > max(1.0, m.control_ci_high)
    assert m.threads == r.threads >= 1
    d = r.disturbance  # a timed job says what the machine did meanwhile
    assert d.disturbed == bool(d.reasons) and d.wall_s > 0 and d.cores >= 1
    for fix in ("conv_bn_fusion", "prune_l1"):
        assert (tmp_path / f"optimized_{fix}.torchscript.pt").exists()
    assert (tmp_path / "optimized_int8_dynamic.recipe.json").exists()


def test_bad_options_name_the_problem(tmp_path):
    with pytest.raises(TorchScopeError, match=r"option fixes: unknown value 'turbo'; choose from amp, "):
        execute(Job("optimize", ModelSpec(name="mlp"), {"fixes": ["turbo"]}), tmp_path)
    with pytest.raises(TorchScopeError, match=r"option params: unknown fix 'turbo'"):
        execute(Job("optimize", ModelSpec(name="mlp"), {"fixes": ["half"], "params": {"turbo": {}}}), tmp_path)
    with pytest.raises(TorchScopeError, match=r"option iters: must be an integer from 1 to 1000, got 0"):
        execute(Job("optimize", ModelSpec(name="mlp"), {"fixes": ["half"], "iters": 0}), tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("g++"), reason="torch.compile on CPU needs a C++ compiler")
def test_torch_compile_fix_matches_eager():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).eval()
    x = (torch.randn(8, 16),)
    c, notes = run_fix("torch_compile", m, x)
    with torch.no_grad():
        torch.testing.assert_close(c(*x), m(*x), atol=1e-5, rtol=1e-5)
    assert hasattr(c, "_orig_mod") and "torch.compile" in notes[0]
