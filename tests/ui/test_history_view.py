"""History's change column: a change of a percentage is in percentage points, other units keep theirs."""

from ui.views.history import _delta_text


def test_percentages_change_in_points_and_times_in_their_unit():
    assert _delta_text({"delta": 0.046, "unit": "fraction", "change_pct": 10.8}) == "+4.6 pp (+10.8 %)"
    assert _delta_text({"delta": -4.6, "unit": "percent", "change_pct": -9.0}) == "−4.6 pp (-9.0 %)"
    text = _delta_text({"delta": -77.61, "unit": "ms", "change_pct": -19.0})
    assert text.startswith("−77.6") and " ms (-19.0 %)" in text
    assert _delta_text({"delta": None, "unit": "ms", "change_pct": None}) == "—"
