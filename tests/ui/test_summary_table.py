"""The Model page's layer table: the 'FLOPs not counted for' column only when some op was left out."""

from ui.views.summary import layer_table


def _result(not_counted):
    return {"layers": [
        {"name": "(model)", "type": "M", "output_shape": [2, 3], "params": 7, "pct_of_total": 100.0, "trainable": 7,
         "flops_forward": 10, "flops_backward": 20, "flops_not_counted": None, "is_leaf": False},
        {"name": "fc", "type": "Linear", "output_shape": [2, 3], "params": 7, "pct_of_total": 100.0, "trainable": 7,
         "flops_forward": None if not_counted else 10, "flops_backward": 20, "flops_not_counted": not_counted,
         "is_leaf": True}]}


def test_the_not_counted_column_shows_only_when_something_was_left_out():
    assert "flops_not_counted" not in layer_table(_result(None), True).columns
    table = layer_table(_result("mylib::mystery_mm"), True)
    assert list(table["flops_not_counted"]) == ["mylib::mystery_mm"] and table["flops_forward"].isna().all()
