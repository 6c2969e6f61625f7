"""Metric tiles: short labels, figures that fit a tile with their unit, one scale per unit on a page."""

import copy
import importlib
import json
import types
import typing
from pathlib import Path

import msgspec
import pytest

from diagnostics.declare import is_record, record_fields
from diagnostics.registry import ANALYSES
from diagnostics.units import UNITS
from ui.widgets import MAX_LABEL_CHARS, MAX_VALUE_CHARS, Tile, tile_texts

#: Results of the CLI's analyses on the samples (cnn, transformer, mlp, graph_break_mlp) and the
#: recorded traces, trimmed to what the tiles read.
SAMPLES = sorted((Path(__file__).parents[1] / "data" / "tiles").glob("*.json"))
TILE_FUNCTIONS = {"batch_scan": ("scan_tiles",), "trace_diff": ("diff_tiles",), "profile": ("tiles", "roofline_tiles")}


def _filled(tp, plain: dict) -> dict:
    """A trimmed sample completed for its typed result: a required field the trim left out gets an empty
    value of its type (the tiles read the metrics and a few fields, which the samples keep)."""
    empty = {tuple: [], list: [], dict: {}, str: "", int: 0, float: 0.0, bool: False}
    required = {f.name for f in msgspec.structs.fields(tp) if f.required}
    out = dict(plain)
    for name, ftype, _ in record_fields(tp):
        inner = next((a for a in typing.get_args(ftype) if a is not type(None)), ftype) \
            if typing.get_origin(ftype) in (typing.Union, types.UnionType) else ftype
        if is_record(inner) and isinstance(out.get(name), dict):
            out[name] = _filled(inner, out[name])
        elif name in required and name not in out:
            out[name] = _filled(inner, {}) if is_record(inner) else empty.get(typing.get_origin(inner) or inner)
    return out


def _tiles(path: Path, result: dict | None = None) -> list[Tile]:
    from diagnostics.results import decode

    analysis = path.stem.split("-")[0]
    decl = ANALYSES[analysis]
    module = importlib.import_module(decl.view.partition(":")[0])
    result = result if result is not None else json.loads(path.read_text())
    if decl.result is not None:  # a typed analysis: its tiles take the typed result
        result = decode(decl, _filled(decl.result, result))
    out = []
    for name in TILE_FUNCTIONS.get(analysis, ("tiles",)):
        out += getattr(module, name)(result)
    return out


def _scaled(x, factor):
    """Every number in the result's metric-like parts times ``factor`` (counts stay whole)."""
    if isinstance(x, bool) or x is None:
        return x
    if isinstance(x, int):
        return int(x * factor) if factor >= 1 else x
    if isinstance(x, float):
        return x * factor
    if isinstance(x, dict):
        return {k: _scaled(v, factor) for k, v in x.items()}
    if isinstance(x, list):
        return [_scaled(v, factor) for v in x]
    return x


def test_every_view_has_sample_results():
    views = {ANALYSES[p.stem.split("-")[0]].view.partition(":")[0].rsplit(".", 1)[-1] for p in SAMPLES}
    assert views >= {"summary", "profiler", "memory", "gradients", "checklist", "optimize", "compile", "traces",
                     "distributed"}


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_tiles_fit_with_their_unit(path):
    tiles = _tiles(path)
    texts = tile_texts(tiles)
    for t, text in zip(tiles, texts):
        assert len(t.label) <= MAX_LABEL_CHARS, f"label too long for a tile: {t.label!r}"
        assert len(text) <= MAX_VALUE_CHARS, f"{t.label}: {text!r} is cut in a tile"
        assert "…" not in text and t.unit in UNITS
        if isinstance(t.value, (int, float)) and not isinstance(t.value, bool) and t.unit in (
                "ms", "us", "s", "bytes", "flop", "flop_per_s", "bytes_per_s", "per_s", "fraction", "percent"):
            assert text.split()[-1].strip("0123456789.,+-") or text.endswith("/s"), f"{t.label}: {text!r} lost its unit"
        if t.value is not None and not isinstance(t.value, str):
            assert t.help, f"{t.label}: a tile's long text belongs in its help"


@pytest.mark.parametrize("factor", [1e-4, 1e3, 1e6])
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_tiles_fit_at_other_magnitudes(path, factor):
    """The same results with every figure 10^-4, 10^3 and 10^6 times as large still fit a tile."""
    result = _scaled(copy.deepcopy(json.loads(path.read_text())), factor)
    tiles = _tiles(path, result)
    for t, text in zip(tiles, tile_texts(tiles)):
        if t.unit != "text":  # text tiles ('3 / 3 fixes faster') are counts of things, not figures that scale
            assert len(text) <= MAX_VALUE_CHARS, f"{t.label}: {text!r} at x{factor:g}"


def test_one_scale_per_unit_on_a_row():
    mib = 2**20
    tiles = [Tile("Peak", 385.88 * mib, "bytes", "h"), Tile("Saved", 12 * mib, "bytes", "h"),
             Tile("Latency", 1.234, "ms", "h"), Tile("Frozen", 0, "count", "h"), Tile("Params", 94762, "count", "h")]
    assert tile_texts(tiles) == ["385.9 MiB", "12.0 MiB", "1.23 ms", "0", "94.8 k"]
    # a figure that the shared scale would show as 0.00 keeps its own scale
    tiles = [Tile("Peak", 385.88 * mib, "bytes", "h"), Tile("Buffers", 1812, "bytes", "h")]
    assert tile_texts(tiles) == ["385.9 MiB", "1.77 KiB"]
    assert tile_texts([Tile("FLOPs", None, "flop", "h", missing="not counted")]) == ["not counted"]


def test_unit_columns_one_scale_and_the_unit_in_the_header():
    import pandas as pd

    from ui.widgets import unit_columns

    df = pd.DataFrame({"op": ["a", "b"], "self_ms": [0.0555, 120.5], "total_ms": [2.0, 300.25],
                       "peak_bytes": [3 * 2**20, 512 * 2**10]})
    out, config = unit_columns(df, {"self_ms": ("Self", "ms"), "total_ms": ("Total", "ms", "with children"),
                                    "peak_bytes": ("Peak", "bytes")})
    assert config["self_ms"]["label"] == "Self (ms)" and config["total_ms"]["label"] == "Total (ms)"
    assert config["total_ms"]["help"] == "with children"
    assert config["self_ms"]["type_config"]["format"] == "%.1f"  # the table's largest is 300 ms
    assert config["peak_bytes"]["label"] == "Peak (MiB)"
    assert out["peak_bytes"].tolist() == [3.0, 0.5]
    assert out["self_ms"].tolist() == [0.0555, 120.5] and df["peak_bytes"].iloc[0] == 3 * 2**20  # input untouched
    out, config = unit_columns(pd.DataFrame({"d_us": [20.0, 40.0]}), {"d_us": ("Δ", "us")})
    assert config["d_us"]["label"] == "Δ (µs)" and config["d_us"]["type_config"]["format"] == "%.2f"


def test_model_page_tiles_carry_units(new_app):
    """The Model page's tiles for the default sample (the small CNN): the parameter memory read
    from the model itself, with its unit, and FLOPs with theirs."""
    from sample_models.convnets import SmallCNN

    model = SmallCNN()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    at = new_app().run()
    assert not at.exception, [e.value for e in at.exception]
    tiles = {m.label: m.value for m in at.metric}
    assert tiles["Parameter memory"] == f"{param_bytes / 1024:.1f} KiB"
    assert tiles["Forward FLOPs"].endswith(" MFLOP")
    assert all(len(v) <= MAX_VALUE_CHARS for v in tiles.values()), tiles


def test_a_missing_number_reads_as_said_not_none():
    """'None' showed where a checklist saving was not estimated: the column says 'not estimated', its
    numbers keep the column's format and unit, right-aligned."""
    import pandas as pd

    from ui.widgets import missing_as, unit_columns

    df, config = unit_columns(pd.DataFrame({"saving": [114.3, 0.031, None]}), {"saving": ("Saving/step", "ms")})
    out, config = missing_as(df, config, {"saving": "not estimated"})
    assert out["saving"].tolist() == ["114.3", "0.0", "not estimated"]
    assert config["saving"]["label"] == "Saving/step (ms)" and config["saving"]["alignment"] == "right"


def test_a_row_holds_only_the_tiles_its_figures_leave_room_for():
    """'481.4 MFLOP' was cut ('481.4 M...') in a row of four at 1280 px: 192 px of figure in a 205 px tile
    less its padding. Rows hold as many tiles as the longest figure leaves room for."""
    from ui.widgets import MAIN_WIDTH_PX, tiles_per_row

    assert tiles_per_row(["94.8 k", "x1.30", "0", "12", "7"]) == 5
    assert tiles_per_row(["94.8 k", "481.4 MFLOP", "370.2 KiB", "0"]) == 3
    assert tiles_per_row(["93/100", "17", "3"], 3, MAIN_WIDTH_PX * 3 // 5) == 3  # the checklist, beside its gauge
    assert tiles_per_row(["a" * 40]) == 1


#: Tiles that show a measured comparison: never a bare figure (issue #31: "Best speed-up x19.22" with no
#: interval; the compile tile's interval only in a chart title).
COMPARISON_TILES = ("Best speed-up", "Speed-up", "Noise floor (A/A)", "Profiler overhead")


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_a_measured_comparison_tile_carries_its_interval(path):
    for t in _tiles(path):
        if t.label in COMPARISON_TILES and t.value is not None:
            assert t.detail and ("[" in t.detail or "no interval" in t.detail), f"{t.label}: {t.detail!r}"


def test_the_best_speed_up_tile_shows_its_interval_and_verdict():
    from ui.views.optimize import tiles

    result = json.loads((Path(__file__).parents[1] / "data" / "tiles" / "optimize-cnn.json").read_text())
    result["metrics"].update(best_fix="channels_last", best_speedup=19.22, best_speedup_ci_low=17.5,
                             best_speedup_ci_high=21.0)
    best = next(t for t in tiles(result) if t.label == "Best speed-up")
    assert tile_texts([best]) == ["x19.22"] and best.detail == "[17.50, 21.00] faster"
