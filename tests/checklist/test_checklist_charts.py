"""Chart builders for the checklist and the fix trials: data and labelled axes with units."""

from diagnostics.analyses.checklist.job import build_result
from diagnostics.render.charts.checklist import build_score_gauge_figure, build_status_by_category_figure
from diagnostics.render.charts.optimize import (build_fidelity_figure, build_latency_figure, build_size_figure,
                                         build_speedup_figure)
from tests.checklist.sample_facts import healthy, set_path
from tests.typed_samples import typed


def test_checklist_figures():
    r = build_result(set_path(healthy(), "env.cudnn_benchmark", False), "toy", "cuda:0")
    g = build_score_gauge_figure(r)
    assert g.data[0].value == r.score and "points" in g.data[0].title.text
    f = build_status_by_category_figure(r)
    by_name = {t.name: t for t in f.data}
    assert sum(by_name["warn"].x) == r.counts.warn == 1
    assert sum(sum(t.x) for t in f.data) == len(r.findings)
    assert "count" in f.layout.xaxis.title.text


def _row(fix, status="ok", median=10.0, p90=12.0, size=2**20, err=1e-3):
    return {"fix": fix, "title": fix.title(), "status": status, "median_ms": median, "p90_ms": p90,
            "size_bytes": size, "size_kind": "state_dict", "size_ratio": size / 2**20, "speedup": 10.0 / median,
            "max_abs_err": err, "cosine": 0.999, "top1_agreement": 1.0}


def test_optimize_figures():
    r = typed("optimize", {"batch_size": 8, "rows": [_row("baseline", err=0.0), _row("torchscript", median=5.0, p90=6.0),
                                                     _row("int8_dynamic", median=20.0, p90=30.0, size=2**18),
                                                     _row("channels_last", status="not_applicable")]})
    lat = build_latency_figure(r)
    assert list(lat.data[0].x) == [10.0, 5.0, 20.0]
    assert list(lat.data[0].error_x.array) == [2.0, 1.0, 10.0]
    assert lat.layout.xaxis.title.text == "latency (ms)"
    sp = build_speedup_figure(r)
    assert list(sp.data[0].x) == [2.0, 0.5]
    size = build_size_figure(r)
    assert list(size.data[0].x) == [1.0, 1.0, 0.25] and "MiB" in size.layout.xaxis.title.text
    fid = build_fidelity_figure(r)
    assert list(fid.data[0].x) == [1e-3, 1e-3]
    assert "log" in fid.layout.xaxis.title.text
