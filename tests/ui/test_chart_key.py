"""ui.widgets.chart_key: a chart's widget key from the result's identity, a typed result's fields or a plain
dict's keys alike (the trace views pass both while the trace layer's parts stay dicts)."""

from diagnostics.results import UNSET, Record, UnsetType
from ui.widgets import chart_key


class Folder(Record, frozen=True, kw_only=True):
    path: str
    name: str | None = None
    files: tuple[str, ...] | UnsetType = UNSET


def test_a_typed_result_and_its_plain_dict_get_one_key_and_other_files_another():
    typed = Folder(path="/runs/a", name="a")
    plain = {"path": "/runs/a", "name": "a", "files": None, "alignment": None}
    assert chart_key("ranks", typed, 1) == chart_key("ranks", plain, 1)  # unset and missing count as None
    assert chart_key("ranks", typed, 1) != chart_key("ranks", Folder(path="/runs/b", name="a"), 1)
    assert chart_key("ranks", typed, 1) != chart_key("ranks", typed, 2) != chart_key("hta", typed, 2)
    assert chart_key("ranks", typed, 1).startswith("ranks-") and chart_key("ranks", typed, 1).endswith("-1")
