"""Declarations (diagnostics.declare): options validate and explain themselves, analyses fill in
their defaults and refuse what they do not declare, and units are formatted from the declaration."""

import pytest

from diagnostics.declare import Analysis, Metric, Option, OptionError, Options
from diagnostics.registry import ANALYSES
from diagnostics.units import format_value


def test_options_convert_check_and_name_themselves():
    n = Option("n", "int", 3, "how many", lo=1, hi=10)
    assert n.validate("4") == 4 and n.validate(4.0) == 4
    for bad in (0, 11, 2.5, "x", True):
        with pytest.raises(OptionError, match=rf"^option n: must be an integer from 1 to 10, got {bad!r}$"):
            n.validate(bad)
    lr = Option("lr", "float", 0.1, gt=0)
    assert lr.validate("0.5") == 0.5
    with pytest.raises(OptionError, match=r"option lr: must be a number > 0, got 0"):
        lr.validate(0)
    with pytest.raises(OptionError, match=r"option lr: must be a number > 0, got inf"):
        lr.validate(float("inf"))
    flag = Option("on", "bool", False)
    assert [flag.validate(v) for v in ("true", "off", 1, False)] == [True, False, True, False]
    pick = Option("fixes", "multi", ["a"], choices=("a", "b"))
    assert pick.validate("b") == ["b"] and pick.validate(["a", "b", "a"]) == ["a", "b"]
    with pytest.raises(OptionError, match=r"option fixes: unknown value 'c'; choose from a, b"):
        pick.validate(["a", "c"])
    assert Option("budget", "float", None, optional=True).validate(None) is None
    with pytest.raises(OptionError, match=r"option n: must be an integer"):
        n.validate(None)  # not optional, has a default: None is no value


def test_an_analysis_fills_in_defaults_and_refuses_unknown_keys():
    a = Analysis("demo", "Demo", "x:y", view="m:f",
                 options=(Option("n", "int", 3, lo=1), Option("mode", "choice", "a", choices=("a", "b")),
                          Option("path", "path", None, required=True)))
    assert a.validate({"path": "p", "n": "5"}) == {"n": 5, "mode": "a", "path": "p"}
    with pytest.raises(OptionError, match=r"^unknown options 'nn', 'moed' for demo; valid: n, mode, path$"):
        a.validate({"path": "p", "nn": 1, "moed": "a"})
    with pytest.raises(OptionError, match=r"^option path is required for demo"):
        a.validate({})


def test_validated_options_refuse_reading_what_was_not_declared():
    opts = ANALYSES["memory"].validate({})
    assert isinstance(opts, Options) and opts["timeline"] is True and opts.get("lr") == 1e-3
    with pytest.raises(KeyError, match="option 'steps' is not declared"):
        opts.get("steps")
    with pytest.raises(KeyError, match="option 'steps' is not declared"):
        opts["steps"]


@pytest.mark.parametrize("name", list(ANALYSES))
def test_every_declaration_is_whole(name):
    """Defaults pass their own checks, metrics and table columns have known units, and the analysis'
    function exists where its target says."""
    a = ANALYSES[name]
    required = {o.key: "x" for o in a.options if o.required}
    assert a.validate(required).keys() == set(a.option_keys)
    for o in a.options:
        if o.default is not None:
            assert o.validate(o.default) == o.default or o.kind == "multi", (name, o.key)
        assert o.help, (name, o.key)
    assert a.target.startswith("diagnostics.analyses.") and callable(a.load()), a.target


def test_declarations_import_no_torch():
    import subprocess
    import sys

    code = "import sys, diagnostics.registry; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("value, unit, text", [
    (1536, "bytes", "1.50 KiB"), (0.25, "ms", "250.0 µs"), (2.5, "s", "2.50 s"), (12.0, "us", "12.0 µs"),
    (3e9, "flop", "3 GFLOP"), (2e12, "flop_per_s", "2 TFLOP/s"), (1500, "per_s", "1.5 k/s"),
    (0.125, "fraction", "12.5 %"), (12.5, "percent", "12.5 %"), (1.4249, "ratio", "x1.42"),
    (85.714, "score", "85.7 / 100"), (26122, "count", "26,122"), (None, "ms", "n/a"), (True, "bool", "yes"),
])
def test_units_format_from_the_declared_unit(value, unit, text):
    assert format_value(value, unit) == text


def test_an_unknown_unit_is_refused():
    with pytest.raises(ValueError, match="unknown unit 'furlongs'"):
        format_value(1, "furlongs")
    with pytest.raises(ValueError, match="metric m: unknown unit 'furlongs'"):
        Metric("m", "furlongs", "M")
