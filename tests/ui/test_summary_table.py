"""The Model page's layer table: the 'FLOPs not counted for' column only when some op was left out."""

from diagnostics.analyses.summary import SummaryLayer
from ui.views.summary import layer_table


class _Layers:
    """What layer_table reads of a SummaryResult: its typed layers."""

    def __init__(self, layers):
        self.layers = layers


def _result(not_counted):
    common = dict(output_shape=[2, 3], params=7, params_total=7, pct_of_total=100.0, trainable=7, flops_backward=20)
    return _Layers((
        SummaryLayer(name="(model)", parent=None, type="M", depth=0, is_leaf=False, flops_forward=10, **common),
        SummaryLayer(name="fc", parent="(model)", type="Linear", depth=1, is_leaf=True,
                     flops_forward=None if not_counted else 10, flops_not_counted=not_counted, **common)))


def test_the_not_counted_column_shows_only_when_something_was_left_out():
    assert "flops_not_counted" not in layer_table(_result(None), True).columns
    table = layer_table(_result("mylib::mystery_mm"), True)
    assert list(table["flops_not_counted"]) == ["mylib::mystery_mm"] and table["flops_forward"].isna().all()
