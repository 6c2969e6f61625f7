"""Optimize charts in training mode: step time, peak memory and the training-fidelity figure carry
the measured numbers, with units in their titles; the report's sections follow the mode."""

from diagnostics.render.charts.optimize import (build_latency_figure, build_peak_figure, build_train_fidelity_figure,
                                                optimize_sections)
from tests.typed_samples import typed

RESULT = typed("optimize", {"mode": "train", "batch_size": 8, "loss": "cross-entropy", "rows": [
    {"fix": "baseline", "title": "Baseline", "status": "ok", "median_ms": 60.0, "p90_ms": 65.0,
     "peak_bytes": 30 * 2**20, "losses": [2.0, 1.5, 1.2], "grad_cosine": 1.0},
    {"fix": "control", "title": "A/A", "status": "ok", "median_ms": 61.0, "p90_ms": 66.0, "peak_bytes": 30 * 2**20,
     "losses": [2.0, 1.5, 1.2], "grad_cosine": 1.0},
    {"fix": "activation_checkpointing", "title": "Checkpointing", "status": "ok", "median_ms": 75.0, "p90_ms": 80.0,
     "peak_bytes": 18 * 2**20, "losses": [2.0, 1.5, 1.2], "grad_cosine": 0.999999},
    {"fix": "amp", "title": "AMP", "status": "failed", "median_ms": None, "p90_ms": None, "peak_bytes": None,
     "losses": None, "grad_cosine": None},
]})


def test_training_charts_show_the_measured_numbers_with_units():
    lat = build_latency_figure(RESULT)
    assert lat.layout.title.text.startswith("Training-step time, batch 8") and lat.layout.xaxis.title.text == "step time (ms)"
    peak = build_peak_figure(RESULT)
    assert list(peak.data[0].y) == ["Baseline", "Checkpointing"] and list(peak.data[0].x) == [30.0, 18.0]
    assert [c[0] for c in peak.data[0].customdata] == [1.0, 0.6] and peak.layout.xaxis.title.text == "peak memory (MiB)"
    fid = build_train_fidelity_figure(RESULT)
    lines = [d for d in fid.data if d.type == "scatter"]
    assert [d.name for d in lines] == ["Baseline", "Checkpointing"] and list(lines[0].y) == [2.0, 1.5, 1.2]
    bars = [d for d in fid.data if d.type == "bar"]
    assert list(bars[0].y) == ["Checkpointing"] and list(bars[0].x) == [0.999999]
    assert fid.layout.yaxis.title.text == "loss (cross-entropy)"


def test_report_sections_follow_the_mode():
    assert [s.title for s in optimize_sections(RESULT)] == ["Trials", "Memory and fidelity"]
