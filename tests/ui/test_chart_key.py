"""ui.widgets.chart_key: a chart's widget key from what identifies the result (its path; a ranks result's
alignment and files), the view and the chart's number."""

from ui.widgets import chart_key


def test_one_key_per_result_view_and_chart():
    assert chart_key("ranks", "/runs/a", 1) == chart_key("ranks", "/runs/a", 1)
    assert chart_key("ranks", "/runs/a", 1) != chart_key("ranks", "/runs/b", 1)
    assert chart_key("ranks", "/runs/a", 1) != chart_key("ranks", "/runs/a", 2) != chart_key("hta", "/runs/a", 2)
    assert chart_key("ranks", "/runs/a", 1).startswith("ranks-") and chart_key("ranks", "/runs/a", 1).endswith("-1")
