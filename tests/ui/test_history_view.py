"""History's change column: a change of a percentage is in percentage points, other units keep theirs."""

from diagnostics.history import MetricChange
from ui.views.history import _delta_text


def _row(delta, unit, change_pct) -> MetricChange:
    return MetricChange(key="m", label="m", unit=unit, better=None, a=None, b=None, a_text="", b_text="",
                        delta=delta, ratio=None, change_pct=change_pct, verdict="n/a")


def test_percentages_change_in_points_and_times_in_their_unit():
    assert _delta_text(_row(0.046, "fraction", 10.8)) == "+4.6 pp (+10.8 %)"
    assert _delta_text(_row(-4.6, "percent", -9.0)) == "−4.6 pp (-9.0 %)"
    text = _delta_text(_row(-77.61, "ms", -19.0))
    assert text.startswith("−77.6") and " ms (-19.0 %)" in text
    assert _delta_text(_row(None, "ms", None)) == "—"
