"""The memory plan's figures, report sections and CLI text, on a real plan of a small model."""

import pytest

from diagnostics.analyses.plan.result import PART_KEYS
from diagnostics.render.charts import plan as charts


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    import torch
    from torch import nn

    from diagnostics.analyses.plan.job import analyze
    from diagnostics.intake import LoadedModel, default_loss
    from diagnostics.runner import AnalysisContext, Job
    from diagnostics.spec import InputSpec, ModelSpec

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))
    options = {"batch": "4,4096", "device": "cpu:1MB", "max_batch": 8192}
    ctx = AnalysisContext(Job("plan", ModelSpec(name="mlp5"), options), tmp_path_factory.mktemp("plan"))
    ctx._loaded = LoadedModel(ModelSpec(name="mlp5"), model, (InputSpec((4, 32)),), (torch.randn(4, 32),),
                              default_loss, "mse")
    return analyze(ctx, options)


def test_the_breakdown_stacks_each_rows_parts_up_to_its_peak(result):
    fig = charts.build_plan_breakdown_figure(result)
    assert fig.layout.barmode == "stack"
    for i, row in enumerate(result.rows):
        total = sum(tr.y[i] for tr in fig.data)
        assert total == pytest.approx(row.peak_bytes / charts.GIB)
    assert {tr.name for tr in fig.data} <= set(PART_KEYS)


def test_the_grid_marks_each_cell_by_fit(result):
    fig = charts.build_plan_grid_figure(result)
    g = result.grids[0]
    assert list(fig.data[0].z[0]) == [1 if ok else 0 for ok in g.fits[0]]
    assert fig.data[0].x[0] == "b1" and 0 in fig.data[0].z[0] and 1 in fig.data[0].z[0]


def test_timeline_and_suggestions_figures(result):
    tl = charts.build_plan_timeline_figure(result)
    assert tl.data and all(tr.stackgroup == "mem" for tr in tl.data)
    sug = charts.build_plan_suggestions_figure(result)
    assert len(sug.data[0].y) == len(result.suggestions)


def test_report_sections_and_cli_text(result):
    titles = [s.title for s in charts.plan_sections(result)]
    assert titles[:2] == ["Will it fit?", "Batch x sequence"] and "Make it fit" in titles
    text = charts.plan_text(result)
    assert "largest batch that fits:" in text and "make it fit (cheapest first):" in text
    assert "NO" in text and "yes" in text  # batch 4 fits 1 MB, batch 4096 does not
