import pytest

from diagnostics.units import human_bytes, human_count, human_seconds


@pytest.mark.parametrize("n, text", [
    (None, "n/a"), (0, "0 B"), (999, "999 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
    (3 * 2**20, "3.00 MiB"), (123456789, "118 MiB"), (1020 * 1024, "1020 KiB"),
    (15.5 * 2**30, "15.5 GiB"), (2**50 * 3, "3072 TiB"),
])
def test_bytes_three_significant_digits_never_scientific(n, text):
    assert human_bytes(n) == text


@pytest.mark.parametrize("n, unit, text", [
    (26, "", "26"), (1500, "/s", "1.5 k/s"), (2_000_000, "FLOP", "2 MFLOP"),
    (1.234e9, "FLOP", "1.23 GFLOP"), (4.5e15, "FLOP", "4500 TFLOP"),
])
def test_counts(n, unit, text):
    assert human_count(n, unit) == text


def test_seconds():
    assert [human_seconds(x) for x in (2.5, 0.0125, 3e-6)] == ["2.50 s", "12.50 ms", "3.0 µs"]
