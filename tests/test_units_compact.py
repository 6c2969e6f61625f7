"""units.compact: a figure that fits a metric tile, with its unit; one scale per table column."""

import pytest

from diagnostics.units import Scale, column_scale, compact, compact_parts, scale_of

KIB, MIB, GIB = 2**10, 2**20, 2**30


@pytest.mark.parametrize("value, unit, text", [
    # bytes: binary scales, whole bytes without decimals
    (0, "bytes", "0 B"), (512, "bytes", "512 B"), (999, "bytes", "999 B"), (1536, "bytes", "1.50 KiB"),
    (385.88 * MIB, "bytes", "385.9 MiB"), (15.5 * GIB, "bytes", "15.5 GiB"), (3 * 2**40, "bytes", "3.00 TiB"),
    # time, from each declared time unit
    (1.234, "ms", "1.23 ms"), (0.0555, "ms", "55.5 µs"), (2500, "ms", "2.50 s"), (12.345, "us", "12.3 µs"),
    (1500.0, "us", "1.50 ms"), (3.7, "s", "3.70 s"), (0.25, "s", "250.0 ms"), (4000, "s", "4000 s"),
    # counts and rates
    (8, "count", "8"), (94762, "count", "94.8 k"), (2.5, "count", "2.50"), (165.2e6, "flop", "165.2 MFLOP"),
    (1.2e11, "flop_per_s", "120 GFLOP/s"), (2.31e9, "flop_per_s", "2.31 GFLOP/s"), (2.5e10, "bytes_per_s", "25.0 GB/s"), (1234.5, "per_s", "1.23 k/s"),
    # shares, ratios, scores, plain numbers, booleans, text, missing
    (0.0555, "fraction", "5.6 %"), (5.55, "percent", "5.6 %"), (0.004, "fraction", "0.4 %"), (1.4234, "ratio", "x1.42"), (87.5, "score", "88/100"),
    (1234, "number", "1,234"), (0.000123, "number", "0.000123"), (True, "bool", "yes"), ("cpu", "text", "cpu"),
    (None, "bytes", "n/a"),
])
def test_compact_every_unit_family(value, unit, text):
    assert compact(value, unit) == text


@pytest.mark.parametrize("value, unit, text", [
    (1023.9 * KIB, "bytes", "1.00 MiB"),   # rounds to 1024 KiB: the next scale, not four digits
    (999.96 * KIB, "bytes", "0.98 MiB"),   # '1000.0 KiB' would be printed: moves up
    (999.94 * KIB, "bytes", "999.9 KiB"),  # stays
    (1000, "bytes", "0.98 KiB"), (1023, "bytes", "1.00 KiB"),
    (999.99, "ms", "1.00 s"), (999.94, "ms", "999.9 ms"), (0.99996, "ms", "1.00 ms"),
    (999_950, "count", "1.00 M"), (999_949, "count", "999.9 k"),
])
def test_scale_boundaries(value, unit, text):
    assert compact(value, unit) == text


def test_parts_sign_missing_and_forced_scale():
    assert compact_parts(385.88 * MIB, "bytes") == ("385.9", "MiB")
    assert compact(-0.42, "ms") == "-420.0 µs"
    assert compact(0.42, "ms", signed=True) == "+420.0 µs"
    assert compact(None, "flop", missing="not counted") == "not counted"
    assert compact(512 * KIB, "bytes", Scale("MiB", MIB)) == "0.50 MiB"
    assert compact(float("nan"), "ms") == "nan"
    with pytest.raises(ValueError, match="unknown unit 'MB'"):
        compact(1, "MB")


def test_scale_of_picks_the_largest_scale_at_least_one():
    assert scale_of(5 * MIB, "bytes").suffix == "MiB"
    assert scale_of(0.5, "bytes").suffix == "B"
    assert scale_of(0.2, "fraction") == Scale("%", 0.01, 1)


def test_column_scale_one_unit_per_column():
    sc = column_scale([1.2, 385.88, 0.004, None], "ms")
    assert (sc.suffix, sc.factor, sc.decimals) == ("ms", 1, 1)
    sc = column_scale([100 * MIB, 5 * KIB], "bytes")
    assert (sc.suffix, sc.decimals, sc.header("Peak"), sc.number_format()) == ("MiB", 1, "Peak (MiB)", "%.1f")
    sc = column_scale([0.0555, 0.2], "ms")  # all under a millisecond: µs for the whole column
    assert (sc.suffix, sc.factor, sc.decimals) == ("µs", 1e-3, 1)
    assert column_scale([3, 12, 900], "bytes").decimals == 0  # whole bytes
    assert column_scale([], "us").suffix == "µs"
