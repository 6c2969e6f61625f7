"""settings.env_number: the one reading of a number from the environment (timeouts, memory and disk caps,
upload size, spare workers), each bad value an error naming the variable and what it holds."""

from __future__ import annotations

import pytest

from diagnostics.errors import TorchScopeError
from diagnostics.runner import MAX_SPARE_WORKERS, SPARE_WORKERS, spare_setting
from diagnostics.settings import env_number

NAME = "TORCHSCOPE_TEST_NUMBER"


@pytest.mark.parametrize("raw, kwargs, want", [
    ("", {}, 7.0), ("  ", {}, 7.0), (" 2.5 ", {}, 2.5), ("0", {"zero_ok": True}, 0.0),
    ("3", {"whole": "of things"}, 3.0), ("3.0", {"whole": "of things"}, 3.0), ("0", {"whole": "of things", "zero_ok": True}, 0.0),
])
def test_a_number_is_read(monkeypatch, raw, kwargs, want):
    monkeypatch.setenv(NAME, raw)
    assert env_number(NAME, 7.0, **kwargs) == want


@pytest.mark.parametrize("raw, kwargs, message", [
    ("lots", {}, "TORCHSCOPE_TEST_NUMBER='lots' is not a number"),
    ("0", {}, "TORCHSCOPE_TEST_NUMBER='0' must be above 0"),
    ("-1", {"zero_ok": True}, "TORCHSCOPE_TEST_NUMBER='-1' must be 0 or more"),
    ("nan", {}, "TORCHSCOPE_TEST_NUMBER='nan' must be above 0"),
    ("1.5", {"whole": "of things"}, "TORCHSCOPE_TEST_NUMBER='1.5' must be a whole number of things"),
    ("-2", {"whole": "of things"}, "TORCHSCOPE_TEST_NUMBER='-2' must be a whole number of things"),
    ("two", {"whole": "of things"}, "TORCHSCOPE_TEST_NUMBER='two' must be a whole number of things"),
    ("inf", {"whole": "of things"}, "TORCHSCOPE_TEST_NUMBER='inf' must be a whole number of things"),
])
def test_a_bad_value_names_the_variable_and_the_rule(monkeypatch, raw, kwargs, message):
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(TorchScopeError) as e:
        env_number(NAME, 7.0, **kwargs)
    assert str(e.value) == "the environment variable " + message


def test_the_spare_setting_reads_through_it(monkeypatch):
    monkeypatch.delenv("TORCHSCOPE_SPARE_WORKERS", raising=False)
    assert spare_setting() == SPARE_WORKERS
    for raw, want in (("0", 0), ("2", 2), ("99", MAX_SPARE_WORKERS)):
        monkeypatch.setenv("TORCHSCOPE_SPARE_WORKERS", raw)
        assert spare_setting() == want
    monkeypatch.setenv("TORCHSCOPE_SPARE_WORKERS", "-1")
    with pytest.raises(TorchScopeError, match=r"='-1' must be a whole number of spare workers from 0 \(off\) to 4$"):
        spare_setting()
