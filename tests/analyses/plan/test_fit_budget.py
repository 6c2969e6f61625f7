"""The budget answer: which modules to checkpoint so the predicted peak fits, at the least recompute time;
checked against the training step measured for real with that choice (the Memory analysis' own
--checkpoint-modules and the plan's measuring protocol)."""

import pytest
import torch
from torch import nn

from diagnostics.analyses.plan import ANALYSIS
from diagnostics.analyses.plan import fit as fit_mod
from diagnostics.analyses.plan.configs import Config, Setting, parse_bytes
from diagnostics.analyses.plan.planner import Planner
from diagnostics.analyses.plan.targets import resolve
from diagnostics.declare import OptionError
from diagnostics.intake import LoadedModel, default_loss, load_model
from diagnostics.spec import InputSpec, ModelSpec

CPU = resolve("cpu", cpu={"ram_available_bytes": 1 << 36})


def test_the_budget_takes_units_and_refuses_what_is_not_memory():
    assert parse_bytes("6GiB") == 6 * 2**30 and parse_bytes("6 GB") == 6 * 10**9
    assert parse_bytes("1.5MiB") == 3 * 2**19 and parse_bytes("123456") == 123456 and parse_bytes("") is None
    assert ANALYSIS.validate({"budget": " 6GiB "})["budget"] == "6GiB"
    with pytest.raises(OptionError, match=r"option budget: '6 apples' is not an amount of memory \(give e.g. 6GiB"):
        ANALYSIS.validate({"budget": "6 apples"})
    with pytest.raises(OptionError, match="must be more than 0 bytes"):
        ANALYSIS.validate({"budget": "0GiB"})


def _analyze(tmp_path, loaded, options):
    from diagnostics.analyses.plan.job import analyze
    from diagnostics.runner import AnalysisContext, Job

    ctx = AnalysisContext(Job("plan", loaded.spec, options), tmp_path)
    ctx._loaded = loaded
    return analyze(ctx, options)


@pytest.mark.slow
def test_at_75_percent_of_the_transformers_peak_the_choice_fits_when_measured(tmp_path):
    """The transformer sample at a budget of 75 % of its unconstrained training peak: the modules chosen,
    measured by the Memory analysis with --checkpoint-modules, peak under the budget and within 5 % of the
    prediction."""
    from diagnostics.runner import Job, execute

    spec = ModelSpec(name="transformer")
    plain = Planner(load_model(spec), CPU).run(Config(8, 64, Setting()))
    budget = int(0.75 * plain.peak_bytes)
    result = _analyze(tmp_path, load_model(spec), {"budget": str(budget), "sweep": False, "device": "cpu:64GiB"})
    fit = result.fit
    assert fit.fits and fit.budget_bytes == budget and fit.unconstrained_peak_bytes == plain.peak_bytes
    assert fit.checkpoint_modules and set(fit.checkpoint_modules) <= {"encoder.layers.0", "encoder.layers.1"}
    assert fit.predicted_peak_bytes <= budget
    assert fit.recompute_ms is not None and fit.recompute_ms > 0 and "measured on this CPU" in fit.timing
    assert [c.module for c in fit.candidates if c.chosen] == list(fit.checkpoint_modules)
    measured = execute(Job("memory", spec, {"checkpoint_modules": fit.checkpoint_option, "timeline": False}),
                       tmp_path / "m")
    peak = measured.metrics.peak_train_bytes
    assert list(measured.checkpointed) == list(fit.checkpoint_modules)
    assert peak <= budget
    assert abs(peak - fit.predicted_peak_bytes) <= 0.05 * peak, (peak, fit.predicted_peak_bytes)


class Wide(nn.Module):
    """Saves much for backward: a 1024-wide hidden layer."""

    def __init__(self, width=1024):
        super().__init__()
        self.up, self.down = nn.Linear(64, width), nn.Linear(width, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Narrow(nn.Module):
    """Saves little: 64 wide."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Three(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.mid, self.last = Wide(1024), Narrow(), Wide(2048)

    def forward(self, x):
        return self.last(self.mid(self.first(x)))


def _three():
    """Three different children (no repeated blocks): the candidates are first, mid and last."""
    torch.manual_seed(0)
    return LoadedModel(ModelSpec(name="three"), Three(), (InputSpec((256, 64)),), (torch.randn(256, 64),),
                       default_loss, "mse")


C = Config(256, None, Setting(optimizer="sgd"))


def _selected(planner, patterns):
    return planner.run(Config(256, None, Setting(optimizer="sgd", checkpointing="selected")),
                       checkpoint_patterns=patterns).peak_bytes


def test_the_cheapest_recompute_per_byte_saved_is_chosen_and_what_is_unneeded_dropped(monkeypatch):
    planner = Planner(_three(), CPU)
    base, only_first, only_mid = planner.run(C).peak_bytes, _selected(planner, "first"), _selected(planner, "mid")
    assert only_first < only_mid <= base
    # first is cheap per byte it saves: checkpointing it alone meets a budget of its peak
    monkeypatch.setattr(fit_mod, "recompute_times", lambda loaded, config, names: {"first": 2.0, "mid": 50.0,
                                                                                  "last": 1e6})
    fit = fit_mod.fit_budget(planner, C, only_first, [])
    assert fit.fits and fit.checkpoint_modules == ("first",) and fit.predicted_peak_bytes == only_first
    assert fit.recompute_ms == 2.0 and [x.module for x in fit.candidates] == ["first", "mid", "last"]
    # mid ranked first (nearly free) does not fit alone; once first is in, mid is dropped as unneeded
    monkeypatch.setattr(fit_mod, "recompute_times", lambda loaded, config, names: {"first": 2.0, "mid": 1e-6,
                                                                                  "last": 1e6})
    fit = fit_mod.fit_budget(planner, C, only_first, [])
    assert fit.candidates[0].module == "mid" and fit.checkpoint_modules == ("first",) and fit.recompute_ms == 2.0


def test_when_nothing_fits_the_smallest_peak_and_what_else_is_needed(monkeypatch):
    planner = Planner(_three(), CPU)
    every = _selected(planner, "first,mid,last")
    monkeypatch.setattr(fit_mod, "recompute_times", lambda loaded, config, names: dict.fromkeys(names, 1.0))
    budget = every - 4096
    fit = fit_mod.fit_budget(planner, C, budget, [])
    assert not fit.fits and fit.smallest_peak_bytes == every == fit.predicted_peak_bytes
    assert set(fit.checkpoint_modules) == {"first", "mid", "last"}
    assert fit.needed and fit.needed[0].fits and fit.needed[0].peak_bytes <= budget
    assert fit.needed[0].change.startswith("micro-batch")  # the cheapest change: a smaller micro-batch
    assert planner.target == CPU  # the planner's own device is back


def test_a_step_that_fits_needs_no_checkpointing():
    planner = Planner(_three(), CPU)
    fit = fit_mod.fit_budget(planner, C, 1 << 34, [])
    assert fit.fits and fit.checkpoint_modules == () and fit.recompute_ms == 0.0
