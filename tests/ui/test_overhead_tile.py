"""The Profiler page's overhead tile: a recorder cannot make a step faster, so a negative estimate whose
interval reaches 0 reads 'within noise' (seen on a loaded machine: -52.5 % [-94.4 %, 620.9 %] as the
headline), while a measured overhead keeps its figure and interval."""

from types import SimpleNamespace

from ui.views.profiler import _overhead_tile


def _m(pct, low, high):
    return SimpleNamespace(profiler_overhead_pct=pct, profiler_overhead_ci_low=low, profiler_overhead_ci_high=high)


def test_a_negative_estimate_within_its_interval_reads_within_noise():
    t = _overhead_tile(_m(-52.5, -94.4, 620.9))
    assert t.text() == "within noise" and "-52.5 %" in t.detail and "[-94" in t.detail


def test_a_measured_overhead_keeps_its_figure():
    t = _overhead_tile(_m(12.0, 4.0, 20.0))
    assert t.unit == "percent" and t.value == 12.0 and t.text().startswith("+12") and t.detail.startswith("[")
    assert _overhead_tile(_m(None, None, None)).text() == "n/a"
